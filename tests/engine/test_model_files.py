"""No model file can take the process down: damaged files that make llama.cpp abort (GGML_ASSERT)
are refused with a reason, as target, as draft and in the vocabulary-only load; each file is checked
once, in a child process. Loads run in subprocesses here, so an abort fails a test, not the run."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.errors import ModelFileError
from engine.modelfiles import model_check
from engine.modelfiles.gguf_header import metadata_problem, read_gguf_metadata

from support.damaged_models import token_to_duplicate, with_added_key, with_duplicate_token, with_number

ROOT = Path(__file__).resolve().parents[2]
ABORTED = (-6, 134)  # SIGABRT, as a signal or as a shell's exit code

# name -> (how to damage the embedded SmolLM2, what the refusal must say). SmolLM2 (a "llama" file), not Gemma:
# its copies are 98 MB, not 253, and it loads 5x faster, and nothing here depends on which model it is.
ARCH = "llama"
DAMAGE = {
    "no-layers": (lambda src, dst: with_number(src, dst, f"{ARCH}.block_count", 0), "claims 0 layers"),
    "1000-layers": (lambda src, dst: with_number(src, dst, f"{ARCH}.block_count", 1000), "claims 1000 layers"),
    "duplicate-token": (lambda src, dst: with_duplicate_token(src, dst)[0], "twice in its vocabulary"),
    "2000-experts": (lambda src, dst: with_added_key(src, dst, f"{ARCH}.expert_count", 2000), "2000 experts"),
    "100-nextn-layers": (
        lambda src, dst: with_added_key(src, dst, f"{ARCH}.nextn_predict_layers", 100),
        "100 prediction layers",
    ),
    "bogus-rope": (
        lambda src, dst: with_added_key(src, dst, f"{ARCH}.rope.scaling.type", "bogus"),
        "unknown RoPE scaling type 'bogus'",
    ),
    # No header check names these two: only the child process stands between them and an abort.
    "experts-used-of-none": (
        lambda src, dst: with_added_key(src, dst, f"{ARCH}.expert_used_count", 5),
        "llama.cpp crashed reading",
    ),
    "expert-groups": (
        lambda src, dst: with_added_key(src, dst, f"{ARCH}.expert_group_count", 1000),
        "llama.cpp crashed reading",
    ),
}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, smollm_path):
    folder = tmp_path_factory.mktemp("damaged")
    return {name: make(smollm_path, folder / f"{name}.gguf") for name, (make, _) in DAMAGE.items()}


def run_python(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "GGML_NO_BACKTRACE": "1"},
    )


@pytest.mark.slow
def test_llama_cpp_really_aborts_on_these_files(damaged):
    """The premise: loaded directly, each damaged file kills the process that loads it."""
    for name, path in damaged.items():
        done = run_python(f"""
            import llama_cpp as L
            L.llama_backend_init()
            p = L.llama_model_default_params(); p.n_gpu_layers = 0
            L.llama_model_load_from_file({str(path)!r}.encode(), p)
        """)
        assert done.returncode in ABORTED, (name, done.returncode)


@pytest.mark.slow
def test_damaged_files_are_refused_as_target_draft_and_vocabulary(damaged, smollm_path):
    """Each load path gets a ModelFileError with a reason; the process lives on to report it."""
    paths = {name: str(p) for name, p in damaged.items()}
    done = run_python(f"""
        import json
        from engine.errors import EngineError
        from engine.decoding.loader import DecoderSettings, load_draft, load_target
        from engine.decoding.runtime import LoadSettings, Model
        results = {{}}
        target = Model({str(smollm_path)!r}, LoadSettings(n_ctx=256, threads=1))
        for name, path in {paths!r}.items():
            for role, load in (
                ("target", lambda: load_target(DecoderSettings(model=path, n_ctx=256, threads=1))),
                ("draft", lambda: load_draft(DecoderSettings(draft=path, n_ctx=256, threads=1), target)),
                ("vocabulary", lambda: Model(path, LoadSettings(n_gpu_layers=0), vocab_only=True)),
            ):
                try:
                    load()
                    results[name + "/" + role] = "loaded"
                except EngineError as exc:
                    results[name + "/" + role] = type(exc).__name__ + ": " + str(exc)
        print(json.dumps(results))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (_, reason) in DAMAGE.items():
        for role in ("target", "draft", "vocabulary"):
            said = results[f"{name}/{role}"]
            if role == "vocabulary" and reason == "llama.cpp crashed reading":
                assert said == "loaded", (name, said)  # a vocabulary-only load never reads those values
            else:
                assert said.startswith("ModelFileError") and reason in said, (name, role, said)


@pytest.mark.slow
def test_the_pair_check_command_refuses_a_damaged_draft(damaged):
    done = subprocess.run(
        [sys.executable, "-m", "engine.models", "check", "embedded", str(damaged["duplicate-token"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode not in ABORTED
    assert done.returncode != 0
    assert "twice in its vocabulary" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_header_checks_name_the_damage(damaged, smollm_path):
    assert metadata_problem(read_gguf_metadata(smollm_path), "model.gguf") is None
    problem = metadata_problem(read_gguf_metadata(damaged["duplicate-token"]), "dup.gguf")
    twice = token_to_duplicate(smollm_path)[1].capitalize().decode()
    assert f"'{twice}' twice" in problem and "ids " in problem


@pytest.fixture
def child_checks(tmp_path, monkeypatch):
    """Verdicts in a cache of this test's own; the list of the checks that really started a child."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    children = []
    real = model_check._check_in_child
    monkeypatch.setattr(model_check, "_check_in_child", lambda *args: children.append(args) or real(*args))
    return children


def test_a_verdict_is_remembered_until_the_file_changes(tmp_path, damaged, child_checks):
    children = child_checks
    path = tmp_path / "model.gguf"
    path.write_bytes(damaged["bogus-rope"].read_bytes())
    for _ in range(2):
        with pytest.raises(ModelFileError, match="bogus"):
            model_check.check_model_file(path)
    assert len(children) == 1
    os.utime(path, ns=(0, 12345))  # a new mtime: the file may have been replaced
    with pytest.raises(ModelFileError, match="bogus"):
        model_check.check_model_file(path)
    assert len(children) == 2
    assert json.loads((tmp_path / "cache" / model_check.VERDICTS_FILE).read_text())  # kept on disk


@pytest.mark.slow
def test_a_small_context_with_a_longer_prompt_decodes(smollm_path):
    """llama.cpp lowers its batch to a small context; prefill chunks follow, instead of aborting."""
    done = run_python(f"""
        from engine.decoding.speculation_config import SpeculationConfig
        from engine.decoding.generate import SpeculativeDecoder
        from engine.decoding.proposers.lookup import LookupProposer
        from engine.decoding.runtime import LoadSettings, Model
        from engine.decoding.sampling import SamplingParams
        for n_ctx in (1, 100, 255):
            model = Model({str(smollm_path)!r}, LoadSettings(n_ctx=n_ctx, threads=2))
            prompt = model.tokenize("one two three four five six seven eight nine ten " * 15)[:200]
            # Fixed draft lengths: drafts are verified in the small batch, and no step sizes are timed first.
            decoder = SpeculativeDecoder(model, LookupProposer(), SpeculationConfig(max_draft=8, adaptive=False))
            out = [t for d in decoder.generate(prompt, SamplingParams(temperature=0), max_tokens=8) for t in d.tokens]
            print(n_ctx, model.n_ctx, model.n_batch, len(out))
            model.close()
    """)
    assert done.returncode == 0, done.stderr[-1500:]
    rows = [line.split() for line in done.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["1", "100", "255"]
    for requested, n_ctx, n_batch, produced in rows:
        assert int(n_batch) <= max(int(requested), 1) and int(n_ctx) >= 256 and produced == "8"


def test_empty_tokens_are_not_duplicates_but_repeated_text_is():
    meta = {"general.architecture": b"llama", "llama.block_count": 2, "tokenizer.ggml.tokens": [b"a", b"", b"b", b""]}
    assert metadata_problem(meta, "m.gguf") is None  # llama.cpp names empty tokens [EMPTY_i]
    meta["tokenizer.ggml.tokens"] = [b"a", b"", b"a"]
    assert "'a' twice" in metadata_problem(meta, "m.gguf")


def test_a_copy_that_keeps_size_and_mtime_is_checked_again(tmp_path, damaged, child_checks):
    children = child_checks
    first = tmp_path / "model.gguf"
    shutil.copy2(damaged["bogus-rope"], first)
    with pytest.raises(ModelFileError):
        model_check.check_model_file(first)
    replacement = tmp_path / "replacement.gguf"
    shutil.copy2(first, replacement)  # same size and mtime (cp -p), another file
    os.replace(replacement, first)
    with pytest.raises(ModelFileError):
        model_check.check_model_file(first)
    assert len(children) == 2


@pytest.mark.parametrize("how, remembered", [("SIGABRT", True), ("SIGKILL", False)])
def test_only_a_crash_is_remembered_against_a_file(tmp_path, monkeypatch, smollm_path, how, remembered):
    """A child killed from outside (out of memory, logout) says nothing about the file: checked again next time."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    dies = f"import os, signal; os.kill(os.getpid(), signal.{how})"
    monkeypatch.setattr(model_check, "_child_command", lambda path, vocab_only: [sys.executable, "-c", dies])
    path = tmp_path / "model.gguf"
    shutil.copyfile(smollm_path, path)
    with pytest.raises(ModelFileError, match=how):
        model_check.check_model_file(path)
    verdicts = tmp_path / "cache" / model_check.VERDICTS_FILE
    assert verdicts.exists() == remembered


@pytest.mark.slow
def test_a_file_whose_full_load_passed_needs_no_second_child_for_its_vocabulary(tmp_path, smollm_path, child_checks):
    path = tmp_path / "model.gguf"
    shutil.copyfile(smollm_path, path)
    model_check.check_model_file(path)  # the target's load
    model_check.check_model_file(path, vocab_only=True)  # the context meter's or the draft picker's
    assert [vocab_only for _, vocab_only in child_checks] == [False]
