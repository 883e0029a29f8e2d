"""`python -m engine.doctor`: a stable command; the code is in engine.lab.doctor."""

from .lab.doctor import main

if __name__ == "__main__":
    raise SystemExit(main())
