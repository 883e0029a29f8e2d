"""Model files and the hub: GGUF checks, the catalog, downloads, the embedded models."""
