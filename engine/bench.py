"""`python -m engine.bench`: a stable command; the code is in engine.lab.bench."""

from .lab.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
