"""The Models dialog: catalog pairs and their downloads, installed models, and the target + draft picker."""
