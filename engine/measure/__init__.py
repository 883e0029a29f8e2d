"""Research tools, run from a checkout (`python -m engine.measure.X`) and left out of the wheel: the offline replay
and its recordings, the GPU kit, bench_compare, versus_server, the real pair, fairness and the backend check.
They may import engine.lab (what the app measures with); nothing in app/ or the rest of engine imports them."""
