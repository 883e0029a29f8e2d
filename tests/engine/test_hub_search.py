"""Hub search through the real huggingface_hub client against a local hub (hub_server.py) that
serves the embedded models' real GGUF bytes.

Covers matching and sort orders, the listing facts of a result, a repo's files grouped (split parts
as one model, incomplete sets, projectors and non-GGUF files left out), a found file downloading
and reading as GGUF, a gated repo, a repo without GGUF, and a hub that is offline, refuses, hangs or
answers HTML or JSON of another shape.
"""

import socket
from urllib.parse import urlsplit

import pytest
from huggingface_hub import constants as hub_constants

from engine.errors import InvalidSettingError
from engine.modelfiles.downloads import download
from engine.modelfiles.embedded import embedded_gemma_path, embedded_model_path
from engine.modelfiles.gguf_header import read_gguf_metadata
from engine.modelfiles.hub_files import DownloadError, HubUnreachable
from engine.modelfiles.hub_search import (
    GGUFFile,
    gated_message,
    group_gguf_files,
    quantization_of,
    repo_files,
    search_repos,
)

from support.hub_server import COMMIT, LocalHub
from support.tiny import write_tiny_gguf

try:  # huggingface_hub 2.x: the registry of AI agents it fetches once a process (and caches for a day)
    from huggingface_hub.utils import _detect_agent as hub_agent_registry
except ImportError:  # a hub client without it
    hub_agent_registry = None

SMOL = "bartowski/SmolLM2-135M-Instruct-GGUF"
GEMMA = "unsloth/gemma-3-270m-GGUF"
GATED = "google/gemma-3-270m-qat-GGUF"
NO_GGUF = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROJECTOR_ONLY = "someone/SmolVLM-projector-GGUF"
SPLIT = [f"F16/SmolLM2-135M-Instruct-F16-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hubsearch")
    gemma = embedded_gemma_path()
    # The split parts carry Gemma's bytes in three slices: here only their names and sizes matter.
    data = gemma.read_bytes()
    third = len(data) // 3
    parts = []
    for i, piece in enumerate((data[:third], data[third : 2 * third], data[2 * third :])):
        path = folder / f"part{i}.gguf"
        path.write_bytes(piece)
        parts.append(path)
    return {
        "smol": embedded_model_path(),
        "gemma": gemma,
        "parts": parts,
        "tiny": write_tiny_gguf(folder / "tiny.gguf", payload_bytes=200_000),
    }


@pytest.fixture
def hub(model_files, tmp_path, monkeypatch):
    hub = LocalHub().start()
    hub.add_file(SMOL, "SmolLM2-135M-Instruct-Q4_1.gguf", model_files["smol"])
    for name, part in zip(SPLIT, model_files["parts"]):
        hub.add_file(SMOL, name, part)
    hub.add_file(SMOL, "SmolLM2-135M-Instruct-BF16-00001-of-00002.gguf", b"GGUF half a set")  # part 2 missing
    hub.add_file(SMOL, "mmproj-SmolLM2-f16.gguf", b"GGUF projector")
    hub.add_file(SMOL, "README.md", b"# SmolLM2 GGUF\n", lfs=False)
    hub.set_info(
        SMOL,
        downloads=500,
        likes=7,
        last_modified="2026-02-01T10:00:00.000Z",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
    )
    hub.add_file(GEMMA, "gemma-3-270m-Q4_K_M.gguf", model_files["gemma"])
    hub.set_info(
        GEMMA,
        downloads=900,
        likes=3,
        last_modified="2026-03-01T10:00:00.000Z",
        base_model=["google/gemma-3-270m", "google/gemma-3-270m-it"],
    )
    hub.add_file(GATED, "gemma-3-270m-qat-Q4_0.gguf", model_files["tiny"])
    hub.set_info(GATED, downloads=100, likes=50, last_modified="2026-05-01T10:00:00.000Z", gated="manual")
    hub.add_file(NO_GGUF, "model.safetensors", b"\x00" * 64)
    hub.add_file(NO_GGUF, "config.json", b"{}", lfs=False)
    hub.set_info(NO_GGUF, downloads=10_000, likes=99)
    hub.add_file(PROJECTOR_ONLY, "mmproj-model-f16.gguf", b"GGUF projector")
    hub.set_info(PROJECTOR_ONLY, downloads=1, likes=0, last_modified="2025-06-01T10:00:00.000Z")
    monkeypatch.setenv("SPECCHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    hub.stop()


def ids(results):
    return [r.repo_id for r in results]


@pytest.fixture
def connections(tmp_path, monkeypatch) -> list[tuple[str, int]]:
    """Every address a connection is opened to from now on (httpcore's way in: socket.create_connection). What
    the hub client fetches once a process or once a day (its agent registry: in memory, and in a file under
    HF_HOME) is forgotten first, so that any such fetch shows here whichever test ran before."""
    if hub_agent_registry is not None:
        monkeypatch.setattr(hub_agent_registry, "_registry", None)
    monkeypatch.setattr(hub_constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agent-harnesses.json"), raising=False)
    tries, real_connect = [], socket.create_connection
    monkeypatch.setattr(
        socket, "create_connection", lambda address, *a, **k: tries.append(address) or real_connect(address, *a, **k)
    )
    return tries


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- search -------------------------------------------------------------------------------------
def test_search_needs_every_word_in_any_case_and_lists_only_gguf_repos(hub):
    assert ids(search_repos("GEMMA 270m")) == [GEMMA, GATED]  # most downloaded first
    assert ids(search_repos("smollm2")) == [SMOL]  # not the safetensors repo of the same name
    assert ids(search_repos("smollm2 qat")) == []
    assert ids(search_repos("  ")) == [GEMMA, SMOL, GATED, PROJECTOR_ONLY]  # no words: every GGUF repo
    listing = [r for r in hub.requests if r.path.startswith("/api/models?")]
    assert listing and all("filter=gguf" in r.path for r in listing)


def test_a_hub_that_matches_the_search_as_one_substring_still_finds_every_word(hub):
    hub.phrase_search = True  # as huggingface.co documents its search parameter
    try:
        assert ids(search_repos("GEMMA 270m")) == [GEMMA, GATED]  # asked again for "GEMMA", then filtered
        assert ids(search_repos("smollm2 qat")) == []
        phrases = [r.path for r in hub.requests if r.path.startswith("/api/models?") and "search=GEMMA" in r.path]
        assert len(phrases) == 2  # the phrase, then its longest word
    finally:
        hub.phrase_search = False


def test_a_result_carries_the_listing_facts_and_no_files(hub):
    (smol,) = search_repos("smollm2")
    assert (smol.downloads, smol.likes, smol.gated) == (500, 7, False)
    assert smol.last_modified == "2026-02-01T10:00:00+00:00"
    assert smol.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and smol.files == ()
    gemma, gated = search_repos("gemma")
    assert gemma.base_model == "google/gemma-3-270m"  # the first of the card's list
    assert gated.gated == "manual" and gated.base_model is None


def test_sort_orders_and_limit(hub):
    assert ids(search_repos("", sort="downloads")) == [GEMMA, SMOL, GATED, PROJECTOR_ONLY]
    assert ids(search_repos("", sort="likes")) == [GATED, SMOL, GEMMA, PROJECTOR_ONLY]
    assert ids(search_repos("", sort="recent")) == [GATED, GEMMA, SMOL, PROJECTOR_ONLY]
    assert ids(search_repos("", sort="likes", limit=2)) == [GATED, SMOL]


def test_an_unknown_sort_or_an_empty_limit_is_refused_before_asking(hub):
    with pytest.raises(InvalidSettingError, match="downloads, likes, recent"):
        search_repos("gemma", sort="stars")
    with pytest.raises(InvalidSettingError, match="at least one"):
        search_repos("gemma", limit=0)
    assert hub.requests == []


def test_an_endpoint_argument_wins_over_HF_ENDPOINT(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    assert ids(search_repos("gemma", endpoint=hub.url + "/")) == [GEMMA, GATED]
    assert repo_files(GEMMA, endpoint=hub.url).repo_id == GEMMA


@pytest.mark.parametrize("named_by", ["HF_ENDPOINT", "argument"])
def test_no_request_goes_to_any_host_but_the_hub_asked(hub, connections, named_by, monkeypatch):
    """huggingface_hub 2.x fetched its registry of AI agents (for its User-Agent) from the hub it read from
    HF_ENDPOINT at import, huggingface.co here, the first time it built a request's headers: to a host nobody
    asked for, wherever HF_ENDPOINT read at the request (as SpecChat reads it) or the endpoint argument pointed."""
    endpoint = None
    if named_by == "argument":
        monkeypatch.delenv("HF_ENDPOINT")
        endpoint = hub.url
    assert ids(search_repos("gemma", endpoint=endpoint)) == [GEMMA, GATED]
    assert repo_files(GEMMA, endpoint=endpoint).files
    hub_address = urlsplit(hub.url)
    assert connections and set(connections) == {(hub_address.hostname, hub_address.port)}, connections


# --- a repo's files -----------------------------------------------------------------------------
def test_repo_files_gives_one_entry_per_model_smallest_first(hub, model_files):
    result = repo_files(SMOL)
    assert (result.repo_id, result.downloads, result.likes) == (SMOL, 500, 7)
    single, split = result.files
    assert single == GGUFFile(("SmolLM2-135M-Instruct-Q4_1.gguf",), model_files["smol"].stat().st_size, "Q4_1")
    assert split.parts == tuple(SPLIT) and split.filename == SPLIT[0]  # in order; the incomplete BF16 set is out
    assert split.size == model_files["gemma"].stat().st_size and split.quantization == "F16"
    assert hub.requests[-1].path == "/api/models/" + SMOL + "/revision/main?blobs=true"


def test_repo_files_at_a_commit_and_at_a_revision_that_does_not_exist(hub):
    assert repo_files(GEMMA, revision=COMMIT).files[0].quantization == "Q4_K_M"
    with pytest.raises(DownloadError, match="Revision 'v9' does not exist in " + GEMMA):
        repo_files(GEMMA, revision="v9")


@pytest.mark.slow
def test_a_found_file_downloads_and_reads_as_the_model(hub, model_files):
    (gemma,) = search_repos("unsloth gemma")
    found = repo_files(gemma.repo_id).files[0]
    path = download(gemma.repo_id, found.filename)
    assert path.stat().st_size == found.size
    assert read_gguf_metadata(path)["general.name"] == read_gguf_metadata(model_files["gemma"])["general.name"]


def test_a_repo_without_gguf_files_says_so(hub):
    with pytest.raises(DownloadError, match=f"{NO_GGUF} has no GGUF model to download \\(no .gguf file\\)"):
        repo_files(NO_GGUF)
    with pytest.raises(
        DownloadError, match="only mmproj-model-f16.gguf: projector, importance-matrix or incomplete split files"
    ):
        repo_files(PROJECTOR_ONLY)


def test_a_missing_repo_or_a_bad_repo_id_says_so(hub):
    with pytest.raises(DownloadError, match="Repository nobody/nothing-GGUF was not found on " + hub.url):
        repo_files("nobody/nothing-GGUF")
    with pytest.raises(DownloadError, match="not a valid Hugging Face repo id"):
        repo_files("../etc")


def test_a_gated_repo_is_listed_with_what_to_do_and_downloads_only_with_a_token(hub, monkeypatch):
    result = repo_files(GATED)
    assert result.gated == "manual" and result.files[0].quantization == "Q4_0"
    note = gated_message(GATED)  # what to do, as the search says it
    assert "accept its terms" in note and "HF_TOKEN" in note and "hf auth login" in note
    with pytest.raises(DownloadError, match="is gated"):
        download(GATED, result.files[0].filename)
    monkeypatch.setenv("HF_TOKEN", "hf_accepted_terms")
    assert download(GATED, result.files[0].filename).stat().st_size == result.files[0].size


def test_a_refused_token_says_so(hub, monkeypatch):
    hub.valid_tokens = {"hf_current"}
    monkeypatch.setenv("HF_TOKEN", "hf_revoked")
    for call in (lambda: search_repos("gemma"), lambda: repo_files(GEMMA)):
        with pytest.raises(DownloadError, match="refused the token SpecChat sent \\(HF_TOKEN"):
            call()
    monkeypatch.setenv("HF_TOKEN", "hf_current")
    assert ids(search_repos("gemma")) == [GEMMA, GATED] and repo_files(GEMMA).files


# --- a hub that does not answer, or not like a hub ----------------------------------------------
def test_offline_mode_asks_nothing_and_says_the_hub_cannot_be_reached(hub, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    for call in (lambda: search_repos("gemma"), lambda: repo_files(GEMMA)):
        with pytest.raises(HubUnreachable, match=f"hub at {hub.url} cannot be reached: HF_HUB_OFFLINE is set"):
            call()
    assert hub.requests == []


def test_a_refused_connection_says_the_hub_cannot_be_reached_at_once(connections, monkeypatch):
    dead = closed_port_url()
    monkeypatch.setenv("HF_ENDPOINT", dead)
    for call in (lambda: search_repos("gemma"), lambda: repo_files(GEMMA)):
        with pytest.raises(HubUnreachable, match=f"hub at {dead} cannot be reached.*HF_ENDPOINT"):
            call()
        # One try at the dead hub (no retries, no back-off) and none anywhere else.
        assert [f"http://{host}:{port}" for host, port in connections] == [dead], connections
        connections.clear()


@pytest.mark.parametrize("fault", ["html", "not-json", "wrong-shape"])
def test_an_answer_that_is_not_the_hubs_json_says_so(hub, fault):
    hub.api_fault = fault
    for call in (lambda: search_repos("gemma"), lambda: repo_files(GEMMA)):
        with pytest.raises(DownloadError, match="did not answer like a Hugging Face hub.*HF_ENDPOINT") as caught:
            call()
        assert not isinstance(caught.value, HubUnreachable)


@pytest.mark.slow
def test_a_hub_that_hangs_is_given_up_on_after_the_timeout(hub):
    hub.api_fault = "hang"
    for call in (lambda: search_repos("gemma", timeout_s=0.5), lambda: repo_files(GEMMA, timeout_s=0.5)):
        with pytest.raises(HubUnreachable, match=f"hub at {hub.url} did not answer within 0.5 s") as caught:
            call()
        # The request gave up at its own 0.5 s (the hub holds it for 30 s), not at the client's default.
        timed_out = caught.value.__cause__
        assert timed_out.request.extensions["timeout"]["read"] == 0.5, timed_out.request.extensions


# --- names --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, quant",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"),
        ("ggml-model-q8_0.gguf", "Q8_0"),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "F16"),
        ("gemma-3-270m-BF16.gguf", "BF16"),
        ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q6_K/Meta-Llama-3.1-70B-Instruct-Q6_K-00001-of-00002.gguf", "Q6_K"),
        ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
        ("model.gguf", "unknown"),
        ("SQ4_K_M-free.gguf", "unknown"),  # letters glued to it: not a quantization name
    ],
)
def test_the_quantization_is_read_from_the_file_name(name, quant):
    assert quantization_of(name) == quant


def test_split_sets_group_by_folder_and_stem_and_leave_out_incomplete_ones():
    files = group_gguf_files(
        [
            ("a/m-Q8_0-00002-of-00002.gguf", 5),
            ("a/m-Q8_0-00001-of-00002.gguf", 6),
            ("b/m-Q8_0-00001-of-00002.gguf", 1),  # its part 2 is missing
            ("m-Q2_K-00001-of-00003.gguf", 1),
            ("m-Q2_K-00003-of-00003.gguf", 1),  # so is this one's part 2
            ("m-Q4_K_M.gguf", 7),
            ("m.imatrix.gguf", 1),
            ("notes.txt", 1),
        ]
    )
    assert files == (
        GGUFFile(("m-Q4_K_M.gguf",), 7, "Q4_K_M"),  # smallest first
        GGUFFile(("a/m-Q8_0-00001-of-00002.gguf", "a/m-Q8_0-00002-of-00002.gguf"), 11, "Q8_0"),
    )
