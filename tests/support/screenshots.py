"""Screenshots of every window and dialog the menus open, at its default size, into docs/window-<name>.png.

Not a test: run it under a virtual X server, on temporary settings and conversations:
    xvfb-run -a -s "-screen 0 1280x900x24" .venv/bin/python -m tests.support.screenshots
With `models`, only the Models dialog's "Search the hub" (a local hub serving real GGUF files) and "On this machine"
(a made-up LM Studio and Ollama folder), into docs/window-models-search.png and docs/window-models-local.png.
With `vulkan`, only an answer and the system check, into docs/window-vulkan-*.png, on the Vulkan build over lavapipe:
    GGML_VK_VISIBLE_DEVICES=0 xvfb-run -a -s "-screen 0 1280x900x24" .venv-vulkan/bin/python -m tests.support.screenshots vulkan
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

from PySide6.QtCore import QEventLoop, QTimer  # noqa: E402 - after the folders are set
from PySide6.QtWidgets import QApplication  # noqa: E402 - after the folders are set

# Menu item → picture name; every item that opens a window or a dialog.
SHOTS = {
    "File → Chat settings…": "chat-settings",
    "Model → Models…": "models",
    "Model → Speculation lab…": "lab",
    "Model → Compare plain vs speculation…": "compare",
    "Model → Server…": "server",
    "Model → Settings…": "settings",
    "Help → About the figures": "figures",
    "Help → About SpecChat": "about",
}


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
        opened = [
            w
            for w in QApplication.topLevelWidgets()
            if w.isVisible() and w is not window and w not in before and w.isWindow() and not w.isModal()
        ]
        for shown in opened[:1]:  # a non-modal window stays open: pictured now
            save(shown, name)
    wait_until(lambda: QApplication.activeModalWidget() is None)


def remote_shots(window) -> None:
    """A new chat answered by a SpecChat server on this machine, set up through the chat settings dialog."""
    from app.chat.engine_picker import REMOTE

    from .remote_server import specchat_server

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
        window.input.setPlainText(
            "Passage: The lighthouse at Point Arden was built in 1871 from granite quarried on "
            "the island itself.\n\nCopy the passage above word for word."
        )
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
    from app.lab.form import SERVERS
    from app.lab.window import LabWindow

    from .remote_server import specchat_server

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
    check = window.tools.system_check
    wait_until(lambda: not check.running, 600)
    wait(300)
    save(check, "vulkan-system-check")
    check.close()
    window.close()
    shutil.rmtree(scratch, ignore_errors=True)


def models_shots() -> None:
    """The hub search with its draft list, and the models other apps keep; on a local hub and a made-up home."""
    import json

    from app.models.dialog import ModelsDialog
    from engine.measure.real_pair import DRAFT, TARGET, pair_dir
    from engine.modelfiles.embedded import embedded_model_path

    from .hub_server import LocalHub
    from .tiny import write_tiny_gguf

    smol, pairs = embedded_model_path(), pair_dir()
    hub = LocalHub().start()
    target = ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", TARGET.file_name)
    hub.add_file(*target, pairs / TARGET.file_name)
    hub.set_info(target[0], downloads=184_000, likes=120)
    hub.add_file("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", DRAFT.file_name, pairs / DRAFT.file_name)
    hub.add_file(
        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q8_0.gguf", pairs / TARGET.file_name
    )
    hub.add_file("decoy/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-q8_0.gguf", smol)
    hub.add_file(
        "someone/Qwen2.5-Coder-1.5B-GGUF",
        "qwen2.5-coder-1.5b-q2_k.gguf",
        write_tiny_gguf(Path(scratch) / "tiny.gguf", payload_bytes=1000),
    )
    os.environ["HF_ENDPOINT"] = hub.url
    home = Path(scratch) / "home"
    studio = home / ".lmstudio" / "models" / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    studio.mkdir(parents=True)
    shutil.copyfile(smol, studio / "SmolLM2-135M-Instruct-Q4_1.gguf")
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    (ollama / "blobs" / ("sha256-" + "b" * 64)).symlink_to(pairs / DRAFT.file_name)
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "qwen2.5-coder" / "0.5b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "b" * 64}]})
    )
    os.environ["HOME"] = str(home)
    os.environ["HF_HUB_CACHE"] = str(home / "no-hf-cache")

    dialog = ModelsDialog("embedded", None)
    dialog.show()
    tab = dialog.search_tab
    dialog.tabs.setCurrentWidget(tab)
    tab.query_edit.setText("qwen2.5 coder 1.5b")
    tab.search()
    wait_until(lambda: tab.repos_table.rowCount() > 0)
    tab.repos_table.selectRow(0)
    wait_until(lambda: tab.files_table.rowCount() > 0)
    found = []
    tab.draftsFound.connect(lambda: found.append(1))
    tab.files_table.selectRow(0)
    wait_until(lambda: found)
    wait(300)
    save(dialog, "models-search")
    dialog.tabs.setCurrentWidget(dialog.local_tab)
    wait_until(lambda: dialog.local_tab.table.rowCount() > 0)
    wait(300)
    save(dialog, "models-local")
    dialog.close()
    hub.stop()


def main() -> None:
    app = QApplication([sys.argv[0]])
    app.setApplicationName("SpecChat")
    app.setApplicationDisplayName("SpecChat")
    from app.qt_compat import guard_none_refcount

    guard_none_refcount()
    if sys.argv[1:] == ["models"]:
        return models_shots()
    from app.conversations.store import open_store
    from app.main_window import MainWindow
    from app.settings.values import AppSettings

    from .window import menu_actions

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
    check = window.tools.system_check
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
