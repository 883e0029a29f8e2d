"""`python -m engine.models`: a stable command; the code is in engine.modelfiles.cli."""

from .modelfiles.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
