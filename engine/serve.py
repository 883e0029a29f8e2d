"""`python -m engine.serve`: a stable command; the code is in engine.serving.cli."""

from .serving.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
