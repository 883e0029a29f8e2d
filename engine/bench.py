"""`python -m engine.bench`: a stable command; the code is in engine.measure.bench."""
from .measure.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
