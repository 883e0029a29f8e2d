"""Models other apps already keep here (issue 53): found in place, named as each app names them, bad ones said.

The trees are built the way each app lays them out, in tmp_path, from the real embedded models: hard links
(separate paths to one file, so nothing is copied and dedupe by resolved path still tells them apart), symlinks
where the app itself uses them (the HF cache), and one real copy where a link could hide a bug (the Ollama
blob that is added and loaded: add_local_model resolves links, which would turn it back into a .gguf name).
"""

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from engine.modelfiles import local_discovery, model_store
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.local_discovery import Discovery, FoundModel, discover_models
from engine.modelfiles.model_check import VERDICTS_FILE, check_model_file
from engine.modelfiles.model_folder import models_dir
from engine.models import main

from support.tiny import write_tiny_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def smol():
    return embedded_model_path()


@pytest.fixture(scope="module")
def gemma():
    return embedded_gemma_path()  # resolved before any test points SPECCHAT_CACHE_DIR elsewhere


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No real model folder of this machine leaks in; SpecChat's own folders are the test's."""
    for name in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "specchat-data"))


def link(source: Path, target: Path) -> Path:
    """target as a second name of source (a hard link: no bytes copied), or a copy across file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target)
    return target


def hf_repo(cache: Path, repo_id: str, files: dict[str, Path], kind: str = "models") -> Path:
    """A real huggingface_hub cache entry: blobs/<etag>, refs/main, snapshots/<commit>/<file> -> ../../blobs."""
    repo = cache / f"{kind}--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    for filename, source in files.items():
        etag = hashlib.sha256(filename.encode()).hexdigest()  # stands in for the LFS sha256
        link(source, repo / "blobs" / etag)
        snapshot = repo / "snapshots" / COMMIT / filename
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.symlink_to(os.path.relpath(repo / "blobs" / etag, snapshot.parent))
    return repo


def ollama_model(
    models: Path,
    name: str,
    tag: str,
    blob_source: Path | None,
    *,
    registry="registry.ollama.ai",
    namespace="library",
    copy=False,
    projector: Path | None = None,
) -> Path | None:
    """A pulled model as Ollama stores it: a manifest of config/model/template/params layers, blobs by digest.
    blob_source None: the manifest names a model blob that is not there. Returns the model blob's path."""
    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)

    def layer(media_type: str, data: bytes | None = None, source: Path | None = None, place=True) -> dict:
        digest = hashlib.sha256(data if data is not None else source.read_bytes()).hexdigest()
        blob = blobs / f"sha256-{digest}"
        if place and not blob.exists():
            if data is not None:
                blob.write_bytes(data)
            elif copy:
                shutil.copyfile(source, blob)
            else:
                link(source, blob)
        return {
            "mediaType": media_type,
            "digest": f"sha256:{digest}",
            "size": len(data) if data is not None else source.stat().st_size,
        }

    config = layer("application/vnd.docker.container.image.v1+json", json.dumps({"model_format": "gguf"}).encode())
    if blob_source is None:
        model = layer("application/vnd.ollama.image.model", b"never written", place=False)
    else:
        model = layer("application/vnd.ollama.image.model", source=blob_source)
    layers = [model]
    if projector is not None:
        layers.append(layer("application/vnd.ollama.image.projector", source=projector))
    layers += [
        layer("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
        layer("application/vnd.ollama.image.params", json.dumps({"stop": ["<|im_end|>"]}).encode()),
    ]
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": config,
        "layers": layers,
    }
    path = models / "manifests" / registry / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return None if blob_source is None else blobs / f"sha256-{model['digest'].split(':')[1]}"


@pytest.fixture(scope="module")
def tiny_copies(tmp_path_factory):
    """Small real GGUF files with contents of their own: Ollama keeps one blob per content, so two pulls of
    the same bytes are one file (and one model) there."""
    folder = tmp_path_factory.mktemp("tiny")
    return [write_tiny_gguf(folder / f"tiny{i}.gguf", seed=i, payload_bytes=2048) for i in range(3)]


def named(found: Discovery) -> list[tuple[str, str]]:
    return [(m.source, m.name) for m in found.models]


# --- every app's layout -------------------------------------------------------------------------------------
def test_each_app_s_models_are_found_in_place_with_the_app_s_names(tmp_path, smol, gemma, tiny_copies):
    home, cache = tmp_path / "home", tmp_path / "hf-cache"
    hf = hf_repo(
        cache,
        "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
        {
            "smollm2-135m-instruct-q4_1.gguf": smol,
            "mmproj-f16.gguf": gemma,
            "README.md": smol,
            "Q4_K_M/gemma-00001-of-00002.gguf": gemma,
            "Q4_K_M/gemma-00002-of-00002.gguf": tiny_copies[0],
        },
    )
    hf_repo(cache, "someone/a-dataset", {"data.gguf": gemma}, kind="datasets")  # not a model repo
    lms = link(smol, home / ".lmstudio/models/lmstudio-community/SmolLM2-GGUF/SmolLM2-135M-Q4_1.gguf")
    link(gemma, home / ".lmstudio/models/lmstudio-community/SmolLM2-GGUF/mmproj-model-f16.gguf")  # a projector
    old_lms = link(gemma, home / ".cache/lm-studio/models/google/gemma-3-270m/gemma-3-270m-Q4_K_M.gguf")
    split = link(smol, home / ".lmstudio/models/big/Big-GGUF/big-00001-of-00002.gguf")
    link(gemma, home / ".lmstudio/models/big/Big-GGUF/big-00002-of-00002.gguf")  # a later part: not a model
    ollama = home / ".ollama/models"
    qwen = ollama_model(ollama, "qwen2.5-coder", "1.5b", smol, projector=tiny_copies[0])  # a projector: not a model
    mine = ollama_model(ollama, "tiny_copies", "latest", tiny_copies[1], namespace="someone")
    hf_pulled = ollama_model(ollama, "SmolLM2-GGUF", "Q4_1", tiny_copies[2], registry="hf.co", namespace="bartowski")
    jan_old = link(smol, home / "jan/models/smollm2-135m/smollm2-135m.Q4_1.gguf")
    jan_new = link(gemma, home / ".config/Jan/data/models/huggingface.co/google/gemma-GGUF/gemma.gguf")
    jan_cpp = link(smol, home / ".config/Jan/data/models/llamacpp/smol/model.gguf")
    gpt4all = link(gemma, home / ".local/share/nomic.ai/GPT4All/gemma-3-270m.Q4_K_M.gguf")

    found = discover_models(home=home, hf_cache=cache)

    assert found.problems == []
    assert named(found) == [
        ("huggingface", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/Q4_K_M/gemma-00001-of-00002.gguf"),
        ("huggingface", "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-instruct-q4_1.gguf"),
        ("lmstudio", "big/Big-GGUF/big-00001-of-00002.gguf"),
        ("lmstudio", "google/gemma-3-270m/gemma-3-270m-Q4_K_M.gguf"),
        ("lmstudio", "lmstudio-community/SmolLM2-GGUF/SmolLM2-135M-Q4_1.gguf"),
        ("ollama", "hf.co/bartowski/SmolLM2-GGUF:Q4_1"),
        ("ollama", "qwen2.5-coder:1.5b"),
        ("ollama", "someone/tiny_copies:latest"),
        ("jan", "gemma.gguf"),
        ("jan", "model.gguf"),
        ("jan", "smollm2-135m.Q4_1.gguf"),
        ("gpt4all", "gemma-3-270m.Q4_K_M.gguf"),
    ]
    paths = [m.path for m in found.models]
    snapshot = cache.resolve() / hf.name / "snapshots" / COMMIT
    assert paths[:2] == [snapshot / "Q4_K_M/gemma-00001-of-00002.gguf", snapshot / "smollm2-135m-instruct-q4_1.gguf"]
    assert paths[1].is_symlink()  # the snapshot link, used where it is
    assert paths[2:] == [split, old_lms, lms, hf_pulled, qwen, mine, jan_new, jan_cpp, jan_old, gpt4all]
    sizes = {m.name: m.size_bytes for m in found.models}
    assert sizes["qwen2.5-coder:1.5b"] == smol.stat().st_size
    assert sizes["someone/tiny_copies:latest"] == tiny_copies[1].stat().st_size
    assert sizes["big/Big-GGUF/big-00001-of-00002.gguf"] == smol.stat().st_size + gemma.stat().st_size
    split_hf = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/Q4_K_M/gemma-00001-of-00002.gguf"
    assert sizes[split_hf] == gemma.stat().st_size + tiny_copies[0].stat().st_size  # all parts of a split model
    assert all(isinstance(m, FoundModel) for m in found.models)


def test_a_file_reached_twice_is_listed_once(tmp_path, smol):
    home, cache = tmp_path / "home", tmp_path / "hf-cache"
    repo = hf_repo(cache, "owner/Model-GGUF", {"model.gguf": smol})
    snapshot = repo / "snapshots" / COMMIT / "model.gguf"
    (home / ".lmstudio/models/owner/Model-GGUF").mkdir(parents=True)
    (home / ".lmstudio/models/owner/Model-GGUF/model.gguf").symlink_to(snapshot)  # LM Studio pointed at the cache
    (home / "jan").mkdir()
    (home / "jan/models").symlink_to(home / ".lmstudio/models", target_is_directory=True)

    found = discover_models(home=home, hf_cache=cache)

    assert named(found) == [("huggingface", "owner/Model-GGUF/model.gguf")]
    assert found.problems == []


def test_the_default_locations_follow_home_and_the_environment(tmp_path, monkeypatch, smol, gemma):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    link(smol, home / ".lmstudio/models/pub/repo/a.gguf")
    link(gemma, home / ".local/share/nomic.ai/GPT4All/b.gguf")
    link(smol, home / ".config/Jan/data/models/c/c.gguf")
    hf_repo(home / ".cache/huggingface/hub", "owner/default-GGUF", {"d.gguf": gemma})
    ollama_model(home / ".ollama/models", "e", "latest", smol)
    ollama_model(tmp_path / "elsewhere", "moved", "latest", smol)
    hf_repo(tmp_path / "hub-cache", "owner/moved-GGUF", {"f.gguf": smol})
    hf_repo(tmp_path / "hf-home/hub", "owner/home-GGUF", {"g.gguf": smol})

    def ours(found: Discovery) -> list[tuple[str, str]]:  # a real /usr/share/ollama of this machine is not ours
        return [
            (m.source, m.name)
            for m in found.models
            if m.path.is_relative_to(tmp_path.resolve()) or m.path.is_relative_to(tmp_path)
        ]

    assert ours(discover_models()) == [
        ("huggingface", "owner/default-GGUF/d.gguf"),
        ("lmstudio", "pub/repo/a.gguf"),
        ("ollama", "e:latest"),
        ("jan", "c.gguf"),
        ("gpt4all", "b.gguf"),
    ]
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    moved = ours(discover_models())
    assert ("ollama", "moved:latest") in moved and ("ollama", "e:latest") not in moved
    assert ("huggingface", "owner/moved-GGUF/f.gguf") in moved and len(moved) == 5
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert ("huggingface", "owner/home-GGUF/g.gguf") in ours(discover_models())
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # Jan's data folder moves with it
    link(gemma, tmp_path / "config/Jan/data/models/h/h.gguf")
    assert ("jan", "h.gguf") in ours(discover_models())


def test_roots_replace_the_folders_of_the_sources_they_name(tmp_path, smol):
    link(smol, tmp_path / "mine/pub/repo/x.gguf")
    link(smol, tmp_path / "home/.local/share/nomic.ai/GPT4All/y.gguf")
    found = discover_models(
        home=tmp_path / "home", hf_cache=tmp_path / "none", roots={"lmstudio": [tmp_path / "mine"], "gpt4all": []}
    )
    assert named(found) == [("lmstudio", "pub/repo/x.gguf")]


# --- what is skipped, and said ------------------------------------------------------------------------------
def test_bad_files_and_manifests_are_problems_not_errors(tmp_path, smol, gemma):
    home = tmp_path / "home"
    ollama = home / ".ollama/models"
    ollama_model(ollama, "good", "latest", smol)
    ollama_model(ollama, "gone", "7b", None)  # the manifest names a blob that is not there
    broken = ollama / "manifests/registry.ollama.ai/library/broken/latest"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"schemaVersion": 2, "layers": [')
    odd = ollama / "manifests/registry.ollama.ai/library/odd/latest"
    odd.parent.mkdir(parents=True)
    odd.write_text(
        json.dumps(
            {"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../../../etc/passwd"}]}
        )
    )
    (ollama / "manifests/registry.ollama.ai/library/good/.DS_Store").write_bytes(b"\0\0\0\1Bud1")  # not a tag
    huge = ollama / "manifests/registry.ollama.ai/library/huge/latest"
    huge.parent.mkdir(parents=True)
    huge.write_bytes(b" " * (local_discovery.MAX_MANIFEST_BYTES + 10))
    tensors = ollama / "manifests/registry.ollama.ai/library/safetensors/latest"
    tensors.parent.mkdir(parents=True)
    tensors.write_text(
        json.dumps(
            {"layers": [{"mediaType": "application/vnd.ollama.image.tensor; name=x", "digest": "sha256:" + "0" * 64}]}
        )
    )
    lms = home / ".lmstudio/models/pub/repo"
    link(gemma, lms / "fine.gguf")
    (lms / "notes.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 4000)  # a zip named .gguf
    (lms / "cut.gguf").write_bytes(smol.read_bytes()[:600])  # a download cut off inside the header
    (lms / "loop.gguf").symlink_to("loop.gguf")  # a symlink to itself
    (lms / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (lms / "back").symlink_to("..", target_is_directory=True)  # a folder loop

    found = discover_models(home=home, hf_cache=tmp_path / "no-cache")

    assert named(found) == [("lmstudio", "pub/repo/fine.gguf"), ("ollama", "good:latest")]
    problems = "\n".join(found.problems)
    assert len(found.problems) == 10, problems
    assert "Ollama model huge:latest" in problems and "too big for a manifest" in problems
    assert "Ollama model gone:7b" in problems and "which is missing" in problems
    assert "Ollama model broken:latest" in problems and "not valid JSON" in problems
    assert "Ollama model odd:latest" in problems and "names no valid blob" in problems
    assert "Ollama model safetensors:latest" in problems and "no GGUF model layer" in problems
    assert f"{lms / 'notes.gguf'} (LM Studio): notes.gguf is not a GGUF model" in problems
    assert f"{lms / 'cut.gguf'} (LM Studio): cut.gguf is truncated" in problems
    assert f"{lms / 'loop.gguf'} (LM Studio): it cannot be opened" in problems
    assert f"{lms / 'dangling.gguf'} (LM Studio): it cannot be opened" in problems
    assert f"Skipped {lms / 'back'}: it leads back to a folder already searched" in problems
    assert all(p.endswith((".", ")")) for p in found.problems)  # sentences


def test_a_folder_that_cannot_be_read_is_said(tmp_path, monkeypatch, smol):
    home = tmp_path / "home"
    link(smol, home / ".lmstudio/models/pub/open/a.gguf")
    link(smol, home / ".lmstudio/models/pub/shut/b.gguf")
    real_scandir = os.scandir

    def scandir(path):  # root may read any folder, so the refusal a user would get is made here
        if Path(path).name == "shut":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    found = discover_models(home=home, hf_cache=tmp_path / "none")
    assert named(found) == [("lmstudio", "pub/open/a.gguf")]
    assert found.problems == [f"Could not look inside {home / '.lmstudio/models/pub/shut'}: Permission denied."]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any folder")
def test_a_folder_without_read_permission_is_said(tmp_path, smol):
    shut = tmp_path / "home/.lmstudio/models/pub/shut"
    link(smol, shut / "b.gguf")
    shut.chmod(0)
    try:
        found = discover_models(home=tmp_path / "home", hf_cache=tmp_path / "none")
    finally:
        shut.chmod(0o755)
    assert found.models == [] and "Could not look inside" in found.problems[0]


def test_the_walk_is_bounded_in_depth_and_in_entries(tmp_path, monkeypatch, smol):
    home = tmp_path / "home"
    link(smol, home / "jan/models/a/b/c/d/e/f/g/h/deep.gguf")  # below MAX_DEPTH: not looked for
    link(smol, home / "jan/models/m/shallow.gguf")
    assert named(discover_models(home=home, hf_cache=tmp_path / "none")) == [("jan", "shallow.gguf")]
    for i in range(30):
        (home / f"jan/models/many/{i:02d}.txt").parent.mkdir(parents=True, exist_ok=True)
        (home / f"jan/models/many/{i:02d}.txt").write_text("x")
    monkeypatch.setattr(local_discovery, "MAX_ENTRIES", 10)
    found = discover_models(home=home, hf_cache=tmp_path / "none")
    assert len(found.problems) == 1 and found.problems[0].startswith("Stopped searching at ")


def test_a_damaged_hf_cache_entry_is_said_and_the_rest_found(tmp_path, smol, gemma):
    cache = tmp_path / "hf-cache"
    hf_repo(cache, "owner/good-GGUF", {"good.gguf": smol})
    bad = hf_repo(cache, "owner/bad-GGUF", {"bad.gguf": gemma})
    next((bad / "blobs").iterdir()).unlink()  # the snapshot link now points at nothing
    found = discover_models(home=tmp_path / "home", hf_cache=cache)
    assert named(found) == [("huggingface", "owner/good-GGUF/good.gguf")]
    assert len(found.problems) == 1 and "Blob missing" in found.problems[0]


# --- from discovery to the model list, in place --------------------------------------------------------------
@pytest.mark.slow
def test_a_discovered_ollama_model_is_added_by_name_and_loads_where_it_is(tmp_path, monkeypatch, smol):
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))  # a fresh verdict: llama.cpp really loads it
    ollama = tmp_path / "home/.ollama/models"
    blob = ollama_model(ollama, "smollm2", "135m", smol, copy=True)  # a real file named sha256-<hex>, no suffix
    [found] = discover_models(home=tmp_path / "home", hf_cache=tmp_path / "none").models
    assert found.path == blob and found.name == "smollm2:135m" and not blob.is_symlink()
    before = blob.stat()

    added = model_store.add_local_model(found.path, found.name)

    assert (added.path, added.name, added.origin) == (blob, "smollm2:135m", model_store.LOCAL)
    [listed] = model_store.list_models()
    assert (listed.path, listed.name, listed.size_bytes) == (blob, "smollm2:135m", smol.stat().st_size)
    assert check_model_file(listed.path) is None  # llama.cpp loads it whole, in the checking child
    verdicts = json.loads((tmp_path / "cache" / VERDICTS_FILE).read_text())
    assert [v["ok"] for k, v in verdicts.items() if k.startswith(f"{blob}|")] == [True]  # a real check, now
    after = blob.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert not any(models_dir().rglob("*"))  # nothing was copied into SpecChat's models folder
    registry = json.loads((tmp_path / "specchat-data" / model_store.REGISTRY_FILE).read_text())
    assert registry == [{"path": str(blob), "name": "smollm2:135m"}]


def test_a_discovered_hf_cache_model_is_added_under_its_repo_name(tmp_path, smol):
    cache = tmp_path / "hf-cache"
    hf_repo(cache, "owner/Smol-GGUF", {"smol.gguf": smol})
    [found] = discover_models(home=tmp_path / "home", hf_cache=cache).models
    added = model_store.add_local_model(found.path, found.name)
    # add_local_model remembers the resolved file (the blob the snapshot link points at), under the repo's name
    assert added.path == found.path.resolve() and added.path.parent.name == "blobs"
    assert [(m.path, m.name) for m in model_store.list_models()] == [(added.path, "owner/Smol-GGUF/smol.gguf")]
    assert added.path.stat().st_ino == smol.stat().st_ino or added.path.stat().st_size == smol.stat().st_size


def test_the_list_of_added_models_reads_the_old_format_and_keeps_what_it_cannot_read(tmp_path, smol, gemma):
    data = tmp_path / "specchat-data"
    data.mkdir(parents=True, exist_ok=True)
    a, b = link(smol, tmp_path / "files/a.gguf"), link(gemma, tmp_path / "files" / ("sha256-" + "b" * 64))
    registry = data / model_store.REGISTRY_FILE
    registry.write_text(json.dumps([str(a), 42, {"path": 7}, {"future": "entry"}]))  # a list of paths, and damage
    assert [(m.path, m.name) for m in model_store.list_models()] == [(a, "a.gguf")]

    model_store.add_local_model(b, "gemma:270m")
    model_store.add_local_model(a)  # again, without a name: kept once, still unnamed
    assert [(m.path, m.name) for m in model_store.list_models()] == [(a, "a.gguf"), (b, "gemma:270m")]
    model_store.add_local_model(b, "  gemma3:270m  ")  # a new name renames
    model_store.add_local_model(b)  # no name: the kept one stays
    assert {m.name for m in model_store.list_models()} == {"a.gguf", "gemma3:270m"}
    assert json.loads(registry.read_text()) == [
        str(a),
        {"path": str(b), "name": "gemma3:270m"},
        42,
        {"path": 7},
        {"future": "entry"},
    ]
    assert model_store.delete_model(b) is False and b.is_file()
    assert json.loads(registry.read_text()) == [str(a), 42, {"path": 7}, {"future": "entry"}]


# --- the command line ------------------------------------------------------------------------------------------
def test_discover_json_ends_with_one_json_line(tmp_path, monkeypatch, capsys, smol, gemma):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    lms = link(gemma, home / ".lmstudio/models/google/gemma-GGUF/gemma.gguf")
    blob = ollama_model(home / ".ollama/models", "smollm2", "135m", smol)
    ollama_model(home / ".ollama/models", "gone", "latest", None)

    assert main(["discover", "--json"]) == 0

    out = capsys.readouterr().out
    readable, last = out.rstrip("\n").rsplit("\n", 1)
    report = json.loads(last)
    ours = [m for m in report["models"] if not m["path"].startswith("/usr/share/ollama")]
    assert ours == [
        {
            "path": str(lms),
            "source": "lmstudio",
            "name": "google/gemma-GGUF/gemma.gguf",
            "size_bytes": gemma.stat().st_size,
        },
        {"path": str(blob), "source": "ollama", "name": "smollm2:135m", "size_bytes": smol.stat().st_size},
    ]
    assert len(report["problems"]) == 1 and "gone:latest" in report["problems"][0]
    assert "smollm2:135m" in readable and str(blob) in readable and "gone:latest" in readable

    assert main(["discover"]) == 0
    plain = capsys.readouterr().out
    assert "google/gemma-GGUF/gemma.gguf" in plain and not plain.rstrip().endswith("}")
