"""`python -m engine.serve_bench`: a stable command; the code is in engine.lab.serve_bench."""

from .lab.serve_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
