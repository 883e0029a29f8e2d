"""Model → Settings… → GPU layers, through the real window on this build: the setting reloads the model, and the next
answer's memory figure follows where its layers went. On the CPU build here the field says n/a and the figure is RAM
either way; packaging/vulkan_check.sh runs this file on Vulkan over lavapipe, where 0 layers show RAM and all
layers show VRAM with the device's name, as the stats line under the answer reads it."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.settings.values import AppSettings
from engine import hardware
from engine.modelfiles.embedded import EMBEDDED

from support.this_build import GPU_OFFLOAD, MEMORY_KIND

pytestmark = pytest.mark.slow  # the model reloaded with its layers moved


def set_gpu_layers_in_the_dialog(qtbot, window, layers: int) -> None:
    """Open Model → Settings…, set GPU layers, press OK (the dialog is modal: set from its own event loop)."""

    def fill_in() -> None:
        dialog = QApplication.activeModalWidget()
        assert dialog.n_gpu_layers.isVisibleTo(dialog) is GPU_OFFLOAD  # n/a on a build that cannot offload
        dialog.n_gpu_layers.setValue(layers)
        dialog.accept()

    QTimer.singleShot(300, fill_in)
    with qtbot.waitSignal(window.modelLoaded, timeout=180_000):
        window.tools.open_settings()


def answer_memory(qtbot, window, wait_response) -> tuple[dict, str]:
    window.input.setPlainText("Name one river.")
    window.send_message()
    qtbot.waitUntil(lambda: window.session.busy, timeout=10_000)
    reply = wait_response(window, timeout=300_000)
    shown = window.view.widget_for(len(window.session.model.items) - 1).stats.text()
    return reply.stats, shown


def test_gpu_layers_from_the_settings_dialog_move_the_model_and_its_memory_figure(qtbot, make_window, wait_response):
    window = make_window(
        AppSettings(model=EMBEDDED, temperature=0.0, max_tokens=8, n_ctx=1024, threads=2, n_gpu_layers=0)
    )
    stats, shown = answer_memory(qtbot, window, wait_response)
    assert stats["backend"] == "CPU" and stats["memory_kind"] == "RAM"
    assert stats["memory_label"] in shown and stats["memory_label"].startswith("RAM ")

    set_gpu_layers_in_the_dialog(qtbot, window, -1)
    assert window.settings.n_gpu_layers == -1  # kept as chosen
    stats, shown = answer_memory(qtbot, window, wait_response)
    assert stats["memory_kind"] == MEMORY_KIND and stats["memory_label"] in shown
    if MEMORY_KIND == "VRAM":  # a GPU build: every layer there, the figure named after the device
        assert stats["backend"] == hardware.backend_name() != "CPU"
        assert shown.count(f"({hardware.gpu_name()})") == 1
