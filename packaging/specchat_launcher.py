"""Entry point of the PyInstaller bundle: the same `main()` as the `specchat` gui-script.

A bundle has no `python -m`, so the child processes run as the bundle's own executable, handled here
before Qt or torch is imported: the model-file check (engine/modelfiles/model_check.py) as
`specchat --check-model-file FILE [--vocab-only]`, and the chat-template sandbox
(engine/template_sandbox.py) as `specchat --template-sandbox`."""

import sys

if __name__ == "__main__":
    from engine import template_sandbox
    from engine.modelfiles import model_check

    if len(sys.argv) >= 3 and sys.argv[1] == model_check.FROZEN_FLAG:
        sys.exit(model_check.child_main(sys.argv[2:]))
    if len(sys.argv) == 2 and sys.argv[1] == template_sandbox.FROZEN_FLAG:
        sys.exit(template_sandbox.child_main())
    from app.__main__ import main

    sys.exit(main())
