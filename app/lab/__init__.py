"""The speculation lab window's parts (app/lab_window.py puts them together): the experiment form,
the runner that measures on its own thread, the charts and the results table."""
