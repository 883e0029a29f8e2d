"""The Speculation Lab window: the experiment form, the runner that measures on its own thread, its charts and results."""
