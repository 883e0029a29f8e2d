"""One GGUF model in one llama.cpp context, through llama-cpp-python's low-level API.

Only what the decode loop needs: tokenize, detokenize, decode a batch asking for logits only on
the rows that will be read, read those rows as a zero-copy numpy view, and roll the KV cache back.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp import llama_cpp_ext as X

from ..errors import ContextOverflowError, EngineError, GenerationCancelled, ModelFileError
from ..hardware import (
    allowed_cpus,
    backend_name,
    cpu_uses_amx,
    devices,
    forget_device_buffers,
    gpu_offload_supported,
    note_device_buffers,
    physical_cores,
)
from ..modelfiles.model_check import check_model_file
from ..modelfiles.model_inspect import HEAD_ARCHS
from . import step_timings
from .drafter_feeds import DrafterFeeds
from .hidden_rows import HiddenRows
from .layer_inputs import LayerInputs
from .load_log import llama_log, placement
from .mtp_check import mtp_problem
from .repack import repack_overrides
from .vocabulary import Vocabulary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadSettings:
    n_ctx: int = 4096  # 0 = the model's training context
    n_gpu_layers: int = -1  # -1 = every layer the build can offload
    threads: int | None = None  # None = physical cores
    n_batch: int = 512
    n_seq_max: int = 1  # several sequences share the context in the lab
    flash_attention: bool | None = None  # None = llama.cpp's choice (flash_attention_type)
    mtp: bool = False  # load the model's MTP (nextn) layers and keep its hidden rows (the mtp method)
    n_rs_seq: int = 0  # a recurrent state's snapshots: a hybrid model may roll back this many tokens of a decode

    def resolved_threads(self) -> int:
        # Never more threads than CPUs this process may use: llama.cpp's threads wait for each other at every
        # graph node, so two threads sharing one CPU make each step several times slower.
        return min(self.threads or physical_cores(), allowed_cpus())


@cache
def _init_backend() -> None:
    from llama_cpp import _logger

    _logger.set_verbose(bool(os.environ.get("SPECCHAT_LLAMA_VERBOSE")))  # llama.cpp's load chatter
    L.llama_backend_init()


def model_params(path: str | Path | None = None, n_gpu_layers: int = 0) -> tuple[L.llama_model_params, int]:
    """llama.cpp's default model parameters, less what crashes, and how many weights are repacked for its CPU
    kernels. Extra buffer types repack weights for faster CPU kernels, but with AMX among them multi-row steps
    crash the process (hardware.py): there they are off, and the file at `path` (if given) has its weights
    repacked as on a CPU without AMX (repack.py), unless a GPU build is to offload them."""
    params = L.llama_model_default_params()
    if not cpu_uses_amx():
        return params, -1  # llama.cpp's own choice, not counted
    params.use_extra_bufts = False
    if path is None or (n_gpu_layers != 0 and gpu_offload_supported()):
        return params, 0
    overrides, repacked = repack_overrides(path, L.llama_print_system_info() or b"")
    if overrides:
        params.tensor_buft_overrides = overrides
    return params, repacked


def flash_attention_type(settings: LoadSettings) -> int:
    """Flash attention as asked, else llama.cpp's choice (auto: on where the backend has it, the CPU included).
    Off is offered for the CPU, whose flash-attention kernel gets slower the longer the context (llama.cpp issue
    27137; SmolLM2 135M at position 1500: one row 44 ms with it, 24 without; 49 rows 1874 ms against 483). It is
    not the default because without it a verify batch rounds differently from one row from 2 rows on, so greedy
    answers part from plain decoding's at near-ties far more often (with it, rows were bit-identical up to 6-12)."""
    if settings.flash_attention is None:
        return L.LLAMA_FLASH_ATTN_TYPE_AUTO
    return L.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings.flash_attention else L.LLAMA_FLASH_ATTN_TYPE_DISABLED


# llama.cpp's loads, context opens and frees must not overlap: a model freed by the garbage collector on the GUI
# thread while the lab's thread opened a context crashed the process (a test run, 5 December). They take this
# lock; a collector's free that would have to wait for it leaves the model to the next one instead.
_lifecycle = threading.RLock()
_unfreed: list[Model] = []


def _free_unfreed() -> None:
    while _unfreed:
        _unfreed.pop().close()


class Model(Vocabulary, DrafterFeeds):
    """A loaded model and its context: its vocabulary (tokens and text, vocabulary.py), the decodes and the KV
    cache's sequences. Not thread-safe: one worker drives it."""

    def __init__(self, path: str | Path, settings: LoadSettings = LoadSettings(), vocab_only: bool = False):
        # first: __del__ runs even when a check below raises
        self._model: L.llama_model_p | None = None
        self._ctx: L.llama_context_p | None = None
        self._batch: L.llama_batch | None = None
        self._attached: weakref.WeakSet[Any] = weakref.WeakSet()  # contexts on these weights (an MTP head's)
        self.hidden: HiddenRows | None = None  # the hidden rows of every decode, where an MTP head reads them
        self.layer_inputs: LayerInputs | None = None  # some layers' inputs of every decode (an EAGLE-3 head's food)
        self._context_users: weakref.WeakSet[Any] = weakref.WeakSet()  # contexts borrowing this one (EAGLE-3 heads')
        self.head_kind: str | None = None  # "eagle3" / "dflash": a draft head, its context opened beside its target's
        self.placement: dict[str, Any] = {}  # where llama.cpp put the layers and its buffers (load_log.placement)
        self.path = Path(path)
        self.settings = settings
        # In a child process first: llama.cpp aborts on some files. Its chat template is probe-rendered there too.
        self.template_problem = check_model_file(self.path, vocab_only)
        with _lifecycle:
            _free_unfreed()
            self._load(settings, vocab_only)

    def _load(self, settings: LoadSettings, vocab_only: bool) -> None:
        _init_backend()
        mparams, self.repacked_weights = model_params(None if vocab_only else self.path, settings.n_gpu_layers)
        mparams.n_gpu_layers = settings.n_gpu_layers
        mparams.vocab_only = vocab_only
        mparams.load_mtp = settings.mtp and not vocab_only
        with llama_log() as lines:
            self._model = L.llama_model_load_from_file(str(self.path).encode(), mparams)
        self._weights_log = "".join(lines)
        if not self._model:
            raise ModelFileError(
                f"llama.cpp could not load {self.path.name}: the file may be damaged, or its architecture "
                "is newer than this llama.cpp build (upgrade llama-cpp-python)."
            )
        self._open_vocabulary(L.llama_model_get_vocab(self._model))
        # Recurrent and hybrid models (Mamba, RWKV, LFM2, Granite 4 H) keep a state that cannot be cut
        # back part-way, so a rejected draft could not be undone: they decode without speculation.
        self.can_roll_back = not (L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))
        # (threads, rows) -> seconds (calibration.time_steps), shared by every load of this file with these settings
        self.step_timings = step_timings.table_for(
            self.path, settings.n_gpu_layers, settings.n_batch, settings.flash_attention, self.repacked_weights
        )
        if vocab_only:
            return
        arch = self.meta("general.architecture")
        if arch in HEAD_ARCHS:  # llama.cpp opens its context only beside a target's (ctx_other)
            self.head_kind = arch
            self._open_head(settings)
            return
        try:
            self._open_context(settings)
        except ModelFileError:
            self.close()
            raise

    def _open_context(self, settings: LoadSettings) -> None:
        train_ctx = L.llama_model_n_ctx_train(self._model)
        cparams = L.llama_context_default_params()
        cparams.n_ctx = min(settings.n_ctx or train_ctx, train_ctx)
        cparams.n_batch = settings.n_batch
        cparams.n_ubatch = settings.n_batch
        cparams.n_seq_max = settings.n_seq_max
        cparams.n_threads = cparams.n_threads_batch = self.threads = settings.resolved_threads()
        cparams.flash_attn_type = flash_attention_type(settings)
        cparams.swa_full = True  # sliding-window models (Gemma 3) must keep full KV to roll back
        cparams.kv_unified = True
        cparams.no_perf = True
        cparams.n_rs_seq = settings.n_rs_seq
        with llama_log() as lines:
            self._ctx = L.llama_init_from_model(self._model, cparams)
        self._note_placement(self._weights_log + "".join(lines))
        if not self._ctx:
            raise ModelFileError(
                f"Could not create a context of {cparams.n_ctx} tokens for {self.path.name} "
                "(out of memory? try a smaller context size or fewer GPU layers)."
            )
        self.n_ctx: int = L.llama_n_ctx(self._ctx)
        # llama.cpp lowers the batch to a small requested context (and aborts on a bigger batch).
        self.n_batch: int = L.llama_n_batch(self._ctx)
        self._memory: L.llama_memory_t | None = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.n_batch, 0, settings.n_seq_max)
        # Writable numpy views over the batch's arrays, so filling a batch is a few vector copies.
        self._b_token: np.ndarray = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._b_pos: np.ndarray = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._b_nseq: np.ndarray = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))
        self._b_logits: np.ndarray = np.ctypeslib.as_array(self._batch.logits, shape=(self.n_batch,))
        self._b_nseq[:] = 1
        self._b_seq: list[Any] = [self._batch.seq_id[i] for i in range(self.n_batch)]  # ctypes int pointers
        for row in self._b_seq:
            row[0] = 0
        self._seq_filled: int = 0  # rows whose seq_id may be non-zero
        self._interrupt: Any = None  # ctypes callback that lets a long decode stop mid-way
        self._interrupt_installed: bool = False
        self._logits_views: dict[tuple[int, int], np.ndarray] = {}  # (address, rows) -> view of llama.cpp's logits
        self.backend: str = backend_name() if settings.n_gpu_layers != 0 else "CPU"
        self._open_hidden(settings)
        if self.layer_inputs is not None:  # a reopened context: switched on again, and empty
            self.layer_inputs.switch_on(self._ctx)

    def _open_hidden(self, settings: LoadSettings) -> None:
        """With mtp on a model that has MTP layers, every decode emits its hidden rows, kept in self.hidden. A hybrid
        model may roll back max_rollback tokens of its last decode (its recurrent state's snapshots, n_rs_seq)."""
        self.rollback_room: dict[int, int] = {}  # seq -> tokens of its last decode it may still roll back
        self.max_rollback: int | None = None if self.can_roll_back else int(L.llama_n_rs_seq(self._ctx))
        self.hidden = None
        # why its own MTP head cannot draft (mtp_check.py); None where it can
        assert self._model is not None  # its context is open
        self.mtp_problem: str | None = mtp_problem(self._model, settings.mtp)
        if self.mtp_problem is None:
            X.llama_set_embeddings_nextn(self._ctx, True, False)  # unmasked: a row for every token decoded
            self.hidden = HiddenRows()
            self.n_embd_out = int(L.llama_model_n_embd_out(self._model))

    def _note_placement(self, log_text: str) -> None:
        """Where the layers went and what llama.cpp allocated on GPU devices, read from its log; the allocations
        count towards the VRAM figure while this model is open (hardware.read_memory)."""
        self.placement = placement(log_text, [d.name for d in devices() if d.is_gpu])
        on_gpu = sum(self.placement["device_bytes"].values())
        if on_gpu:
            note_device_buffers(self, on_gpu)
        else:
            forget_device_buffers(self)

    def reopen(self, n_seq_max: int) -> None:
        """A new context for this many sequences, the weights kept (the server batches several; the chat
        needs one). The KV cache starts empty."""
        if n_seq_max == self.settings.n_seq_max:
            return
        settings = replace(self.settings, n_seq_max=n_seq_max)
        threads = self.threads
        with _lifecycle:
            self._close_context()
            try:
                self._open_context(settings)
            except ModelFileError:  # no memory for the wider context: keep the one that worked
                self._open_context(self.settings)
                raise
        self.settings = settings
        if threads != self.threads:
            self.set_threads(threads)

    # --- metadata -----------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def chat_template(self) -> str | None:
        raw = L.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None

    @property
    def name(self) -> str:
        return self.meta("general.name") or self.path.stem

    @property
    def size_bytes(self) -> int:
        return int(L.llama_model_size(self._model))

    # --- decoding -----------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], start_pos: int, logits_rows: int, seq_id: int = 0) -> np.ndarray:
        """Decode tokens at positions start_pos.. in one sequence; logits on the last logits_rows rows.

        Returns a [logits_rows, n_vocab] float32 view, valid until the next decode.
        """
        n = len(tokens)
        if start_pos + n > self.n_ctx:
            raise ContextOverflowError(f"{start_pos + n} tokens do not fit the {self.n_ctx}-token context.")
        positions = np.arange(start_pos, start_pos + n)
        self._fill(n, tokens, positions, logits_rows)
        if seq_id or self._seq_filled:
            self._set_seq_ids([seq_id] * n)
        return self._run_rows(n, logits_rows, positions, [seq_id] * n)

    def decode_multi(
        self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[int], want_logits: Sequence[bool]
    ) -> np.ndarray:
        """Decode rows from several sequences at once; logits for rows where want_logits is true."""
        n = len(tokens)
        self._fill(n, tokens, positions, 0)
        self._b_logits[:n] = want_logits
        self._set_seq_ids(seq_ids)
        return self._run_rows(n, int(sum(bool(x) for x in want_logits)), positions, seq_ids)

    def _run_rows(
        self, n: int, logits_rows: int, positions: Sequence[int] | np.ndarray, seq_ids: Sequence[int]
    ) -> np.ndarray:
        """_run, then the hidden rows kept (mtp) and what each sequence may roll back noted (a hybrid model). A
        recurrent state that an interrupt cut part-way cannot be trusted: its sequences are emptied."""
        try:
            logits = self._run(n, logits_rows)
        except GenerationCancelled:
            if not self.can_roll_back:
                for seq in set(seq_ids):
                    self.forget_from(0, seq)
            raise
        self._keep_feeds(n, positions, seq_ids)
        if not self.can_roll_back:  # a roll-back reaches the decode's snapshots: its rows but the first
            for seq in set(seq_ids):
                self.rollback_room[seq] = min(self.max_rollback or 0, sum(1 for s in seq_ids if s == seq) - 1)
        return logits

    def _fill(self, n: int, tokens: Sequence[int], positions: Sequence[int] | np.ndarray, logits_rows: int) -> None:
        if n > self.n_batch:
            raise EngineError(f"batch of {n} rows exceeds n_batch={self.n_batch}")
        self._b_token[:n] = tokens
        self._b_pos[:n] = positions
        self._b_logits[:n] = 0
        if logits_rows:
            self._b_logits[n - logits_rows : n] = 1
        assert self._batch is not None  # decodes run on an open context
        self._batch.n_tokens = n

    def _set_seq_ids(self, seq_ids: Sequence[int]) -> None:
        for row, seq in zip(self._b_seq, seq_ids):
            row[0] = seq
        # Rows past len(seq_ids) keep older ids: only a write that covers all of them clears the mark.
        if any(seq_ids):
            self._seq_filled = max(self._seq_filled, len(seq_ids))
        elif len(seq_ids) >= self._seq_filled:
            self._seq_filled = 0

    def set_threads(self, threads: int) -> None:
        """Threads for the next decodes (one-row and batched alike)."""
        L.llama_set_n_threads(self._ctx, threads, threads)
        self.threads = threads

    def set_interrupt(self, should_stop: Callable[[], bool] | None) -> None:
        """While set, a multi-row decode checks should_stop() between graph nodes and stops early
        (raising GenerationCancelled), so Stop is honoured within milliseconds even mid-verify."""
        self._interrupt = L.ggml_abort_callback(lambda _data: bool(should_stop())) if should_stop else None
        self._install_interrupt(False)

    def _install_interrupt(self, on: bool) -> None:
        # Only multi-row decodes get the check: it costs a Python call per graph node.
        if on != self._interrupt_installed:
            callback = self._interrupt if on else L.ggml_abort_callback(0)
            L.llama_set_abort_callback(self._ctx, callback, None)
            self._interrupt_installed = on

    def _run(self, n: int, logits_rows: int) -> np.ndarray:
        self._install_interrupt(self._interrupt is not None and n > 1)
        rc = L.llama_decode(self._ctx, self._batch)
        if rc == 2:
            raise GenerationCancelled("stopped during a decode")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} (context full or invalid batch)")
        if not logits_rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        # A numpy view costs ~40 µs to make (ctypes builds an array type): one per buffer and row count is kept.
        # llama.cpp writes each decode's logits into its output buffer, which moves only when it grows.
        ptr = L.llama_get_logits(self._ctx)
        key = (ctypes.addressof(ptr.contents), logits_rows)
        view = self._logits_views.get(key)
        if view is None:
            if len(self._logits_views) > 4 * self.n_batch:  # buffers that moved
                self._logits_views.clear()
            view = self._logits_views[key] = np.ctypeslib.as_array(ptr, shape=(logits_rows, self.n_vocab))
        return view

    def prefill(
        self,
        tokens: Sequence[int],
        start_pos: int = 0,
        seq_id: int = 0,
        chunk: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> np.ndarray | None:
        """Decode a long run of tokens in chunks; logits for the last token only (None for no tokens)."""
        if start_pos + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {start_pos + len(tokens)} tokens; the context holds {self.n_ctx}. "
                "Shorten it or raise the context size in Settings."
            )
        chunk = min(chunk or self.n_batch, self.n_batch)
        logits = None
        for begin in range(0, len(tokens), chunk):
            if should_stop is not None and should_stop():
                raise GenerationCancelled("stopped during prompt processing")
            part = tokens[begin : begin + chunk]
            last = begin + chunk >= len(tokens)
            logits = self.decode(part, start_pos + begin, 1 if last else 0, seq_id)
        return logits

    def forget_from(self, pos: int, seq_id: int = 0) -> None:
        """Roll the KV cache of seq_id back so it holds positions < pos only. A hybrid model's recurrent state goes
        back only within its last decode's snapshots, once (llama.cpp would take a deeper roll-back and read a stale
        snapshot): beyond them this raises, as a roll-back llama.cpp refuses does."""
        if not self.can_roll_back and pos > 0:
            back = self.next_position(seq_id) - pos
            if back > self.rollback_room.get(seq_id, 0):
                raise EngineError(f"could not roll the recurrent state back {back} tokens to position {pos}")
            if back > 0:
                self.rollback_room[seq_id] = 0
        if not L.llama_memory_seq_rm(self._memory, seq_id, pos, -1):
            raise EngineError(f"could not roll the KV cache back to position {pos}")
        self._forget_feeds(pos, seq_id)

    def next_position(self, seq_id: int = 0) -> int:
        """The position after the last one seq_id holds in the KV cache (0 when it holds none)."""
        return int(L.llama_memory_seq_pos_max(self._memory, seq_id)) + 1

    def share_prefix(self, source: int, seq_id: int, n: int) -> None:
        """Give seq_id the first n positions of source's KV cache: the cells are shared, nothing is copied."""
        L.llama_memory_seq_cp(self._memory, source, seq_id, 0, n)
        self._share_feeds(source, seq_id, n)

    def forget_all(self) -> None:
        L.llama_memory_clear(self._memory, True)
        self._forget_all_feeds()

    def _close_context(self) -> None:
        self._close_borrowers()
        if self._batch is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        self._interrupt_installed = False

    def close(self) -> None:
        with _lifecycle:
            forget_device_buffers(self)
            self._close_attached()
            self._close_context()
            if self._model:
                L.llama_model_free(self._model)
                self._model = None
            _free_unfreed()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not (self._model or self._ctx):
            return
        if not _lifecycle.acquire(blocking=False):  # another thread loads or frees: never wait in a collector
            _unfreed.append(self)
            return
        try:
            self.close()
        except Exception:
            pass
        finally:
            _lifecycle.release()


def common_prefix(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the shared start of two token lists: how much of a KV cache can be reused. start: a length the
    caller knows they share, so only what follows it is compared."""
    n = min(len(a), len(b))
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n
