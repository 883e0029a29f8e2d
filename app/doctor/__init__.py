"""Help → System check…: engine.doctor's report in a window, run in a child process."""
