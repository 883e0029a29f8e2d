"""Saved conversations: the database, the sidebar that lists them, and export and import."""
