"""What the app measures with, and the commands beside it: the concurrency lab (local.py; remote.py against
running servers; cli.py is `python -m engine.lab`), its metrics and report, the system check (doctor.py), the
bench and serve_bench. Research tools live in engine.measure, which may import this package, never the reverse."""
