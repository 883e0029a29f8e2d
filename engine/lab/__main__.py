"""`python -m engine.lab`: a stable command; the code is in engine.lab.cli."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
