"""Screenshots of every window and dialog the menus open, at its default size, into docs/window-<name>.png.

Not a test: run it under a virtual X server, on temporary settings and conversations:
    xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python tests/app/screenshots.py
With `vulkan`, only an answer and the system check, into docs/window-vulkan-*.png, on the Vulkan build over lavapipe:
    GGML_VK_VISIBLE_DEVICES=0 xvfb-run -a -s "-screen 0 1280x900x24" .venv-vulkan/bin/python tests/app/screenshots.py vulkan
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
scratch = tempfile.mkdtemp(prefix="specchat-shots-")
os.environ["SPECCHAT_CONFIG_DIR"] = os.path.join(scratch, "config")  # never the user's own files
os.environ["SPECCHAT_DATA_DIR"] = os.path.join(scratch, "data")
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

# Menu item → picture name; every item that opens a window or a dialog.
SHOTS = {"File → Chat settings…": "chat-settings", "Model → Models…": "models",
         "Model → Speculation lab…": "lab", "Model → Compare plain vs speculation…": "compare",
         "Model → Server…": "server", "Model → Settings…": "settings",
         "Help → About the figures": "figures", "Help → About SpecChat": "about"}


def wait(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(done, timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise TimeoutError("the window did not get there in time")
        wait(50)


def save(widget, name: str) -> None:
    path = DOCS / f"window-{name}.png"
    widget.grab().save(str(path))
    print(f"{path.relative_to(ROOT)}: {widget.width()}x{widget.height()} ({widget.windowTitle()})")


def shoot(window, action, name: str) -> None:
    """Trigger the menu item; picture what it opened, modal (then closed, as Cancel would) or not."""
    before = set(QApplication.topLevelWidgets())

    def modal_shot() -> None:  # modal dialogs block trigger(): pictured from the event loop they run
        box = QApplication.activeModalWidget()
        if box is not None:
            save(box, name)
            box.reject()

    QTimer.singleShot(800, modal_shot)  # time for its layout to settle
    action.trigger()
    wait(1000)
    if QApplication.activeModalWidget() is None:
        opened = [w for w in QApplication.topLevelWidgets()
                  if w.isVisible() and w is not window and w not in before and w.isWindow() and not w.isModal()]
        for shown in opened[:1]:  # a non-modal window stays open: pictured now
            save(shown, name)
    wait_until(lambda: QApplication.activeModalWidget() is None)


def remote_shots(window) -> None:
    """A new chat answered by a SpecChat server on this machine, set up through the chat settings dialog."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
    from remote_server import specchat_server

    from app.chat.engine_picker import REMOTE

    service, model = specchat_server()
    try:
        window.new_chat()
        dialog = window.chat_settings_button.open_dialog()
        dialog.engine.setCurrentIndex(dialog.engine.findData(REMOTE))
        dialog.engine_url.setText(service.url)
        dialog.list_models.click()
        wait_until(lambda: dialog.engine_model.count() > 0, 30)
        wait(300)
        save(dialog, "remote-settings")
        dialog.accept()
        window.input.setPlainText("Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on "
                                  "the island itself.\n\nCopy the passage above word for word.")
        window.send_message()
        wait(200)
        wait_until(lambda: not window.session.busy)
        window.input.setPlainText("Thanks!")
        wait(1500)  # the context meter asks the server
        save(window, "remote-answer")
        remote_lab_shot(service.url)
    finally:
        service.stop()
        model.close()


def remote_lab_shot(lookup_url: str) -> None:
    """The lab window after a small run against two servers: a plain one and the lookup one."""
    from remote_server import specchat_server

    from app.lab.form import SERVERS
    from app.lab.window import LabWindow

    plain, model = specchat_server(plain=True)
    lab = LabWindow()
    try:
        lab.form.engine.setCurrentIndex(lab.form.engine.findData(SERVERS))
        lab.form.servers_edit.setText(f"none={plain.url}, lookup={lookup_url}")
        lab.form.clients_edit.setText("1,2,4")
        lab.max_tokens.setValue(48)
        lab.show()
        lab.run_button.click()
        wait(500)
        wait_until(lambda: not lab.running, 600)
        wait(500)
        save(lab, "lab-remote")
    finally:
        lab.shutdown()
        lab.close()
        plain.stop()
        model.close()


def vulkan_shots(window, actions) -> None:
    """The answer's figures (VRAM and the device's name) and the system check's verdict on a software device."""
    save(window, "vulkan-answer")
    actions["Help → System check…"].trigger()
    check = window._system_check
    wait_until(lambda: not check.running, 600)
    wait(300)
    save(check, "vulkan-system-check")
    check.close()
    window.close()
    shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    app = QApplication([sys.argv[0]])
    app.setApplicationName("SpecChat")
    app.setApplicationDisplayName("SpecChat")
    from app.qt_compat import guard_none_refcount
    guard_none_refcount()
    from app.conversations.store import open_store
    from app.main_window import MainWindow
    from app.settings.values import AppSettings

    sys.path.insert(0, str(Path(__file__).parent))
    from test_every_menu import menu_actions

    store, notices = open_store()
    window = MainWindow(AppSettings(temperature=0.0, max_tokens=64, n_ctx=2048), store, notices)
    states: list[str] = []  # the worker loads, then times the steps: the answer's figures wait for both
    window.engine.worker.working.connect(lambda what: states.append(what))  # runs on its thread: only appends
    window.show()
    wait_until(lambda: len(states) >= 2 and states[-1] == "")
    window.input.setPlainText("What is the capital of France? Answer in one sentence.")
    window.send_message()
    wait(200)
    wait_until(lambda: not window.session.busy)
    wait(500)
    actions = dict(menu_actions(window))
    if sys.argv[1:] == ["vulkan"]:
        return vulkan_shots(window, actions)
    save(window, "main")
    for label, name in SHOTS.items():
        shoot(window, actions[label], name)
    actions["Help → System check…"].trigger()  # pictured after a real bench on the window's model
    check = window._system_check
    wait_until(lambda: not check.running)
    check.measure()
    wait_until(lambda: not check.running)
    wait(300)
    save(check, "system-check")
    check.close()
    remote_shots(window)
    window.close()
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
