"""The main window's parts, by concern. MainWindow (app/main_window.py) makes the widgets, lays them out, wires the
chat to them and closes; the rest is here, each part a plain object holding the window:

- chat.py: what the person does in the chat (send, stop, edit and resend, copy, the conversation list);
- files.py: exporting and importing conversations;
- models.py: the models and the engine (loading, a crash while loading, settings, speculation, the server);
- status.py: what the status bar says about them;
- tools.py: the other windows (settings, models, the lab, Compare, the server, the system check);
- menus.py: the menu bar, the theme, and the help texts.
"""
