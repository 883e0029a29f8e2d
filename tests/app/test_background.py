"""The one helper for work off the GUI thread (app/background.py): each answer comes on the GUI thread and never
inside the call that started the job, a lane keeps its jobs in order, a failure is an answer too, a stopped job's
answer still comes while a cancelled one's and an owner-less one's do not, and progress is reported on the way."""

from __future__ import annotations

import threading
import time

from PySide6.QtCore import QObject

from app.background import Job, run_in_background


def answers(qtbot, jobs: list[Job], heard: list) -> None:
    qtbot.waitUntil(lambda: not any(job.running for job in jobs), timeout=10_000)
    qtbot.wait(50)  # the answers are queued to this thread once the work returned


def test_answers_come_on_the_gui_thread_after_the_call_and_a_lane_keeps_its_order(qapp, qtbot):
    gui = threading.get_ident()
    heard: list = []

    def note(result) -> None:
        heard.append((result, threading.get_ident() == gui))

    jobs = [
        run_in_background(lambda i=i: time.sleep(0.02 * (4 - i)) or i, lane="test-lane", done=note) for i in range(4)
    ]
    assert heard == []  # never inside the call that asked
    answers(qtbot, jobs, heard)
    assert heard == [(0, True), (1, True), (2, True), (3, True)]


def test_a_failure_is_an_answer_and_the_work_runs_off_the_gui_thread(qapp, qtbot):
    ran_on: list[str] = []
    failures: list[BaseException] = []

    def work() -> None:
        ran_on.append(threading.current_thread().name)
        raise ValueError("no such file")

    job = run_in_background(work, lane="reading", done=lambda _r: None, failed=failures.append)
    answers(qtbot, [job], failures)
    assert ran_on == ["reading"] and threading.current_thread() is threading.main_thread()
    assert [str(f) for f in failures] == ["no such file"]


def test_a_stopped_job_still_answers_and_reports_on_its_way(qapp, qtbot):
    heard: list = []
    job = Job(done=lambda r: heard.append(("done", r)), progress=lambda v: heard.append(("progress", v)))

    def work() -> str:
        job.report(1)
        while not job.stopped():
            time.sleep(0.005)
        return "stopped"

    job.start(work)
    qtbot.waitUntil(lambda: ("progress", 1) in heard, timeout=10_000)
    job.stop()
    answers(qtbot, [job], heard)
    assert heard == [("progress", 1), ("done", "stopped")]


def test_a_cancelled_job_and_one_whose_owner_is_gone_answer_no_one(qapp, qtbot):
    heard: list = []
    cancelled = Job(done=heard.append)
    cancelled.start(lambda: time.sleep(0.05) or "stale")
    cancelled.cancel()
    assert cancelled.stopped()
    owner = QObject()
    owned = run_in_background(lambda: time.sleep(0.05) or "late", done=heard.append, owner=owner)
    owner.deleteLater()
    qtbot.wait(10)  # the owner goes first
    answers(qtbot, [cancelled, owned], heard)
    assert heard == [] and owned.stopped()  # its work was asked to stop too


def test_a_daemon_job_answers_the_same_way(qapp, qtbot):
    heard: list = []
    job = run_in_background(lambda: threading.current_thread().name, done=heard.append, daemon=True, name="asking")
    answers(qtbot, [job], heard)
    assert heard == ["asking"]
