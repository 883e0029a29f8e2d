"""The app's settings and presets, and the Settings dialog that edits them."""
