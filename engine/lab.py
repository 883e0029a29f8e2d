"""`python -m engine.lab`: a stable command; the code is in engine.measure.lab."""
from .measure.lab import main

if __name__ == "__main__":
    raise SystemExit(main())
