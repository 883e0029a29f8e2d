"""The Server panel: the window's engine served to editors and scripts, and its request log."""
