"""The Models dialog's parts (app/models_dialog.py puts them together): the catalog pairs tab and its
download runner, the installed-models tab, and the target + draft picker with its compatibility check."""
