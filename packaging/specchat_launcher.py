"""Entry point of the PyInstaller bundle: the same `main()` as the `specchat` gui-script.

A bundle has no `python -m`, so the model-file check's child process (engine/model_check.py) runs
as `specchat --check-model-file FILE [--vocab-only]`, handled here before Qt or torch is imported."""
import sys

if __name__ == "__main__":
    from engine.modelfiles.model_check import FROZEN_FLAG, child_main

    if len(sys.argv) >= 3 and sys.argv[1] == FROZEN_FLAG:
        sys.exit(child_main(sys.argv[2:]))
    from app.__main__ import main

    sys.exit(main())
