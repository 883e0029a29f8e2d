"""The Compare window: one prompt answered with and without speculation, side by side."""
