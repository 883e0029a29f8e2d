"""Downloads through the real huggingface_hub client against a local hub (hub_server.py).

Covers progress, a pair as one job, cancel then resume, a cut connection (resumed by the client
itself, and across a restart of the CLI), a wrong checksum, HTTP errors, a full disk, path
traversal, the token staying off the CDN, two downloads of one file at once, an error page from a
mirror that sends no content hash, and a malformed HF_ENDPOINT.
"""

import errno
import hashlib
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.modelfiles import downloads, model_folder
from engine.modelfiles.downloads import DownloadJob, download
from engine.modelfiles.hub_files import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadError,
    FileRequest,
    NotEnoughDiskSpace,
    UnsafePathError,
)
from engine.modelfiles.model_folder import local_path, partial_bytes

from support.hub_server import COMMIT, Fault, LocalHub
from support.tiny import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
REPO = "tester/tiny-GGUF"
BIG = 3_000_000  # several 256 KiB pieces


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hubfiles")
    return {
        "target.gguf": write_tiny_gguf(folder / "target.gguf", payload_bytes=BIG, seed=1),
        "draft.gguf": write_tiny_gguf(folder / "draft.gguf", payload_bytes=BIG // 3, seed=2),
    }


@pytest.fixture
def hub(files, tmp_path, monkeypatch):
    hub = LocalHub().start()
    for name, path in files.items():
        hub.add_file(REPO, name, path)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.stop()


@pytest.fixture
def every_progress(monkeypatch):
    """On loopback a file arrives in milliseconds: report every piece, not ten a second."""
    monkeypatch.setattr(downloads, "_PROGRESS_INTERVAL_S", 0.0)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_downloads_a_file_with_progress_and_records_where_it_came_from(hub, files, every_progress):
    events = []
    path = download(REPO, "target.gguf", on_progress=events.append)

    assert path == local_path(REPO, "target.gguf") and path.read_bytes() == files["target.gguf"].read_bytes()
    phases = [e.phase for e in events]
    assert phases[0] == "checking" and "downloading" in phases and "verifying" in phases and phases[-1] == "done"
    size = files["target.gguf"].stat().st_size
    downloading = [e for e in events if e.phase == "downloading"]
    assert [e.done_bytes for e in downloading] == sorted(e.done_bytes for e in downloading)
    assert 0 < downloading[1].done_bytes < size  # progress arrives while the file is still coming
    assert events[-1].done_bytes == events[-1].total_bytes == size and events[-1].fraction == 1.0
    assert any(e.speed_bps > 0 and e.eta_s is not None for e in downloading)
    record = model_folder.read_source_record(path)
    assert record["commit"] == COMMIT and record["etag"] == sha256(path) and record["size"] == size

    again = download(REPO, "target.gguf")  # already there: asks the hub, fetches nothing
    assert again == path and len(hub.byte_requests()) == 1


def test_a_pair_downloads_as_one_job_with_one_progress_stream(hub, files):
    events = []
    paths = DownloadJob([FileRequest(REPO, "target.gguf"), FileRequest(REPO, "draft.gguf")], events.append).run()

    assert [p.name for p in paths] == ["target.gguf", "draft.gguf"]
    total = sum(f.stat().st_size for f in files.values())
    assert {e.total_bytes for e in events if e.phase != "checking"} == {total}
    assert [e.file_index for e in events if e.phase == "verifying"] == [0, 1]
    assert events[-1].done_bytes == total


def test_cancel_then_resume_continues_where_it_stopped(hub, files, every_progress):
    def cancel_midway(progress):
        if progress.phase == "downloading" and progress.file_done > 500_000:
            job.cancel()

    job = DownloadJob([FileRequest(REPO, "target.gguf")], cancel_midway)
    with pytest.raises(DownloadCancelled, match="kept"):
        job.run()
    request = FileRequest(REPO, "target.gguf")
    kept = partial_bytes(request)
    assert 500_000 < kept < files["target.gguf"].stat().st_size
    assert not local_path(REPO, "target.gguf").exists()  # nothing looks finished

    path = DownloadJob([request]).run()
    assert path[0].read_bytes() == files["target.gguf"].read_bytes()
    assert hub.byte_requests()[-1].range == f"bytes={kept}-"
    assert partial_bytes(request) == 0


@pytest.mark.slow
def test_a_cut_connection_is_resumed_by_the_client_within_the_job(hub, files):
    hub.add_fault("target.gguf", Fault(cut_after=1_000_000))
    path = download(REPO, "target.gguf")
    assert path.read_bytes() == files["target.gguf"].read_bytes()
    first, second = hub.byte_requests()
    assert first.range is None and second.range.startswith("bytes=")


@pytest.mark.slow
def test_a_download_cut_for_good_resumes_after_a_restart_of_the_cli(hub, files):
    hub.add_fault("target.gguf", Fault(cut_after=1_000_000))
    hub.add_fault("target.gguf", Fault(status=500))  # the client's own retry fails too
    with pytest.raises(DownloadError, match="HTTP 500.*kept"):
        download(REPO, "target.gguf")
    kept = partial_bytes(FileRequest(REPO, "target.gguf"))
    assert kept > 0

    result = subprocess.run(
        [sys.executable, "-m", "engine.models", "download", REPO, "target.gguf"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip().splitlines()[-1])
    assert path == local_path(REPO, "target.gguf") and sha256(path) == sha256(files["target.gguf"])
    assert hub.byte_requests()[-1].range == f"bytes={kept}-"


def test_a_wrong_checksum_rejects_the_file_and_leaves_nothing_that_looks_valid(hub, files, tmp_path):
    hub.add_file(REPO, "bad.gguf", files["draft.gguf"], advertised_sha256="ab" * 32)
    with pytest.raises(ChecksumMismatch, match="damaged"):
        download(REPO, "bad.gguf")
    folder = local_path(REPO, "bad.gguf").parent
    assert sorted(p.name for p in folder.iterdir()) == []  # no file, no part, no record


def test_a_small_non_lfs_file_is_checked_by_its_git_hash(hub):
    hub.add_file(REPO, "notes/README.md", b"# tiny\n" * 10, lfs=False)
    path = download(REPO, "notes/README.md")
    assert path.read_bytes() == b"# tiny\n" * 10 and path.parent.name == "notes"


@pytest.mark.parametrize(
    "repo, filename, fault, message",
    [
        (REPO, "missing.gguf", None, "missing.gguf is not in tester/tiny-GGUF"),
        ("tester/nowhere", "x.gguf", None, "Repository tester/nowhere was not found"),
        (REPO, "target.gguf", Fault(status=500, on="resolve"), "answered HTTP 500"),
        (REPO, "target.gguf", Fault(status=503), "answered HTTP 503"),
    ],
)
def test_http_errors_give_clear_messages_and_write_nothing(hub, repo, filename, fault, message):
    if fault:
        hub.add_fault(filename, fault)
    with pytest.raises(DownloadError, match=message):
        download(repo, filename)
    assert not any(p.is_file() and p.suffix == ".gguf" for p in model_folder.models_dir().rglob("*"))


def test_a_revision_that_does_not_exist_is_named(hub):
    with pytest.raises(DownloadError, match="Revision 'v9' does not exist"):
        download(REPO, "target.gguf", revision="v9")
    assert download(REPO, "draft.gguf", revision=COMMIT).is_file()


def test_not_enough_disk_space_is_said_before_anything_is_fetched(hub, monkeypatch):
    monkeypatch.setattr(downloads, "free_bytes", lambda folder: 2_000_000)
    with pytest.raises(NotEnoughDiskSpace, match=r"Not enough free disk space.*2\.0 MB is free"):
        DownloadJob([FileRequest(REPO, "target.gguf"), FileRequest(REPO, "draft.gguf")]).run()
    assert hub.byte_requests() == []


def test_a_disk_that_fills_up_midway_keeps_what_arrived(hub, monkeypatch):
    real_write = downloads._CountingFile.write
    calls = []

    def write_until_full(self, data):
        calls.append(len(data))
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(downloads._CountingFile, "write", write_until_full)
    with pytest.raises(DownloadError, match="disk filled up.*kept"):
        download(REPO, "target.gguf")
    assert partial_bytes(FileRequest(REPO, "target.gguf")) == sum(calls[:2])


@pytest.mark.parametrize(
    "repo, filename",
    [
        (REPO, "../evil.gguf"),
        (REPO, "a/../../evil.gguf"),
        (REPO, "/etc/passwd"),
        (REPO, "C:/evil.gguf"),
        (REPO, "..\\evil.gguf"),
        (REPO, ""),
        (REPO, "a//b.gguf"),
        ("../tiny", "x.gguf"),
        ("tester/../../x", "x.gguf"),
        ("lonely", "x.gguf"),
    ],
)
def test_names_that_would_escape_the_models_folder_are_refused_before_asking_the_hub(hub, repo, filename):
    with pytest.raises(UnsafePathError):
        download(repo, filename)
    assert not [r for r in hub.requests if "/resolve/" in r.path]


def test_a_symlinked_folder_pointing_outside_is_refused(hub, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (model_folder.models_dir() / "tester").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        download(REPO, "target.gguf")


def test_the_token_goes_to_the_hub_but_not_to_the_cdn(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_localtesttoken")
    download(REPO, "draft.gguf")
    head = [r for r in hub.requests if r.method == "HEAD"][0]
    assert head.authorization == "Bearer hf_localtesttoken"
    assert hub.byte_requests()[0].authorization is None


def test_a_partial_file_of_an_older_upload_is_not_continued(hub, files):
    path = local_path(REPO, "draft.gguf")
    path.parent.mkdir(parents=True)
    path.with_name("draft.gguf.part").write_bytes(b"old bytes" * 1000)
    path.with_name("draft.gguf.part.json").write_text('{"etag": "' + "cd" * 32 + '", "size": 9000}')
    assert download(REPO, "draft.gguf").read_bytes() == files["draft.gguf"].read_bytes()
    assert hub.byte_requests()[0].range is None


def test_two_downloads_of_one_file_at_once_are_refused(hub, files):
    hub.add_fault("target.gguf", Fault(hold_after=500_000))
    first = DownloadJob([FileRequest(REPO, "target.gguf")])
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(first.run()))
    worker.start()
    try:
        while not partial_bytes(FileRequest(REPO, "target.gguf")):
            worker.join(0.05)
        with pytest.raises(DownloadError, match="already being downloaded"):
            download(REPO, "target.gguf")
    finally:
        hub.release()
        worker.join(30)
    assert outcome and outcome[0][0].read_bytes() == files["target.gguf"].read_bytes()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.models", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


MIRROR_ETAG = "66e1f2a0-2d5c"  # what nginx and most plain servers send: mtime and size, no content hash


def test_an_error_page_from_a_mirror_is_refused_and_nothing_is_installed(hub):
    page = b"<html><body>Too many requests, try again later.</body></html>\n"
    page += b" " * (50_000 - len(page))  # exactly the advertised size, so the size check passes
    hub.add_file(REPO, "mirror.gguf", page, lfs=False, etag=MIRROR_ETAG)

    result = run_cli("download", REPO, "mirror.gguf")

    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        f"mirror.gguf from {hub.url} is not a GGUF model (it starts with b'<htm'): the server sent "
        "something else, perhaps an error page. Nothing was installed."
    ) in result.stderr
    folder = local_path(REPO, "mirror.gguf").parent
    assert sorted(p.name for p in folder.iterdir()) == []  # no model, no part to resume, no record
    assert partial_bytes(FileRequest(REPO, "mirror.gguf")) == 0


def test_a_gguf_header_of_an_unsupported_version_is_refused_too(hub):
    header = struct.pack("<4sIQQ", b"GGUF", 99, 1, 1)  # magic, version, tensors, metadata keys
    hub.add_file(REPO, "future.gguf", header + bytes(5000), lfs=False, etag=MIRROR_ETAG)
    with pytest.raises(
        DownloadError,
        match=r"future\.gguf from .* is not a usable GGUF model \(future\.gguf .*"
        r"version 99.*\)\. Nothing was installed\.$",
    ):
        download(REPO, "future.gguf")
    assert list(local_path(REPO, "future.gguf").parent.iterdir()) == []


@pytest.mark.parametrize("lfs", [False, True])
def test_a_real_gguf_from_a_mirror_without_content_hashes_still_installs(hub, files, lfs):
    hub.add_file(REPO, "mirrored.gguf", files["draft.gguf"], lfs=lfs, etag=MIRROR_ETAG)
    path = download(REPO, "mirrored.gguf")
    assert path.read_bytes() == files["draft.gguf"].read_bytes()
    assert model_folder.read_source_record(path)["etag"] == MIRROR_ETAG


BAD_ENDPOINTS = ["not a url", "http://", "ftp://x", "http://[::1", "http://127.0.0.1:99999", "huggingface.co"]


@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_a_malformed_hf_endpoint_is_named_before_anything_is_asked(hub, monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(DownloadError, match=r"HF_ENDPOINT is set to .* https://huggingface\.co"):
        DownloadJob([FileRequest(REPO, "target.gguf")]).run()
    assert hub.requests == []


@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_the_cli_says_what_is_wrong_with_hf_endpoint_without_a_traceback(hub, endpoint):
    result = run_cli("download", REPO, "target.gguf", env={"HF_ENDPOINT": endpoint})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: HF_ENDPOINT is set to {endpoint!r}"), result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_a_malformed_hf_endpoint_keeps_a_partial_download_for_later(hub, monkeypatch, files):
    hub.add_fault("target.gguf", Fault(cut_after=1_000_000))
    hub.add_fault("target.gguf", Fault(status=500))
    with pytest.raises(DownloadError, match="kept"):
        download(REPO, "target.gguf")
    request = FileRequest(REPO, "target.gguf")
    kept = partial_bytes(request)

    monkeypatch.setenv("HF_ENDPOINT", "http://[::1")
    with pytest.raises(DownloadError, match="HF_ENDPOINT"):
        download(REPO, "target.gguf")
    assert partial_bytes(request) == kept

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    assert download(REPO, "target.gguf").read_bytes() == files["target.gguf"].read_bytes()
    assert hub.byte_requests()[-1].range == f"bytes={kept}-"


@pytest.mark.slow
def test_the_embedded_gemma_downloads_from_the_local_hub_and_loads(hub, tmp_path):
    from engine.decoding.runtime import Model
    from engine.modelfiles.embedded import embedded_gemma_path

    gemma = embedded_gemma_path()
    hub.add_file("google/gemma-3-270m-GGUF", gemma.name, gemma)
    path = download("google/gemma-3-270m-GGUF", gemma.name)
    assert path.stat().st_size == gemma.stat().st_size
    model = Model(path, vocab_only=True)
    try:
        assert model.n_vocab == 262144
    finally:
        model.close()
