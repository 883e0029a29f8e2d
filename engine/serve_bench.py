"""`python -m engine.serve_bench`: a stable command; the code is in engine.measure.serve_bench."""
from .measure.serve_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
