"""`python -m engine.doctor`: a stable command; the code is in engine.measure.doctor."""
from .measure.doctor import main

if __name__ == "__main__":
    raise SystemExit(main())
