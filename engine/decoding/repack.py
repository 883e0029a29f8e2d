"""llama.cpp's repacked CPU weights, without its AMX ones.

llama.cpp copies some weight types into layouts that its CPU kernels multiply several rows at a time with
("extra buffer types": AMX where the CPU has it, then CPU_REPACK). On an AMX CPU its AMX kernels crash the
process (hardware.cpu_uses_amx), and a load can only turn both kinds off together (use_extra_bufts). So there
SpecChat turns both off and hands CPU_REPACK, by name (tensor_buft_overrides), the weights it would have taken.
Verifying a draft is a step of several rows, which this makes cheaper: Qwen2.5-Coder 1.5B Q4_K_M on this 2-core
CPU, 2 threads, one row 90 ms unpacked and 86 repacked; 4 rows 2.57 one-row steps unpacked, 1.65 repacked; 8 rows
4.33 against 3.14; 12 rows 4.53 against 3.97 (Gemma 3 270M, fewer Q4_K weights: 4 rows 2.20 against 1.73).
"""

from __future__ import annotations

import ctypes
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from ..errors import ModelFileError
from ..hardware import ggml_library
from ..modelfiles.gguf_header import TensorInfo, read_gguf_tensors

log = logging.getLogger(__name__)

# The types ggml's CPU_REPACK takes on x86 (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type, as pinned):
# with AVX2 Q4_0, Q4_K, IQ4_NL and MXFP4, with AVX512 also Q2_K, each only with rows in eights. A type it does not
# take would abort the load, so the list is theirs, not a guess (Q6_K, repacked on ARM only, crashed it here).
GGML_Q4_0, GGML_Q2_K, GGML_Q4_K, GGML_IQ4_NL, GGML_MXFP4 = 2, 10, 12, 20, 39
AVX2_TYPES = frozenset({GGML_Q4_0, GGML_Q4_K, GGML_IQ4_NL, GGML_MXFP4})
AVX512_TYPES = frozenset({GGML_Q2_K})
ROWS_MULTIPLE = 8
# Only weights that every architecture multiplies (MUL_MAT): CPU_REPACK's layout serves nothing else, and
# token_embd, read row by row, must stay as it is.
MATMUL_WEIGHT = re.compile(r"^(blk\.\d+\.(attn_(q|k|v|qkv|output)|ffn_(up|gate|down)(_shexp)?)|output)\.weight$")


def repack_types(system_info: bytes) -> frozenset[int]:
    """The weight types CPU_REPACK takes on this CPU, read from llama_print_system_info()."""
    types: frozenset[int] = frozenset()
    if b"AVX2 = 1" in system_info:
        types |= AVX2_TYPES
    if b"AVX512 = 1" in system_info:
        types |= AVX512_TYPES
    return types


def repacked_tensors(tensors: list[TensorInfo], types: frozenset[int]) -> list[str]:
    """The names of the matrices CPU_REPACK would take."""
    return [
        t.name
        for t in tensors
        if len(t.shape) == 2
        and t.ggml_type in types
        and t.shape[1] % ROWS_MULTIPLE == 0
        and MATMUL_WEIGHT.match(t.name)
    ]


def name_patterns(names: list[str]) -> list[str]:
    """Few regular expressions that match exactly these names: llama.cpp compiles every pattern again for every
    tensor of the file, so one per name (169 for the 1.5B) would be 57,000 compilations. Grouped by role, the
    layers as an alternation."""
    layers: dict[str, list[str]] = {}
    exact = []
    for name in names:
        m = re.match(r"^blk\.(\d+)\.(.+)$", name)
        if m:
            layers.setdefault(m.group(2), []).append(m.group(1))
        else:
            exact.append(re.escape(name))
    patterns = [rf"^blk\.({'|'.join(ids)})\.{re.escape(role)}$" for role, ids in layers.items()]
    return patterns + [f"^{name}$" for name in exact]


class _Override(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@lru_cache(maxsize=1)
def cpu_repack_buffer_type() -> int | None:
    """ggml's CPU_REPACK buffer type, from the CPU backend's extra buffer types; None where this build has none."""
    try:
        g = ggml_library()
        cpu = g.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        address = cpu and g.ggml_backend_reg_get_proc_address(
            g.ggml_backend_dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts"
        )
        if not address:
            return None
        extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(cpu)
        i = 0
        while extra and extra[i]:
            if g.ggml_backend_buft_name(extra[i]) == b"CPU_REPACK":
                return cast(int, extra[i])  # a buffer type's address (ctypes reads a void* as an int)
            i += 1
    except (OSError, AttributeError) as exc:  # an old or unusual build
        log.warning("cannot find llama.cpp's CPU_REPACK buffer type: %s", exc)
    return None


_kept: dict[str, ctypes.Array[Any]] = {}  # the override arrays llama.cpp reads while a load runs, kept alive


def repack_overrides(path: str | Path, system_info: bytes) -> tuple[int | None, int]:
    """(the address of a llama_model_tensor_buft_override list that sends this file's repackable weights to
    CPU_REPACK, how many weights that is); (None, 0) when there are none or this build has no CPU_REPACK."""
    buft = cpu_repack_buffer_type()
    try:
        names = repacked_tensors(read_gguf_tensors(path), repack_types(system_info)) if buft else []
    except ModelFileError as exc:  # the load that follows says what is wrong, in its own words
        log.warning("cannot list %s's tensors: %s", Path(path).name, exc)
        names = []
    if not names:
        return None, 0
    patterns = name_patterns(names)
    array = (_Override * (len(patterns) + 1))()  # NULL-terminated
    for slot, pattern in zip(array, patterns):
        slot.pattern, slot.buft = pattern.encode(), buft
    _kept[str(path)] = array
    return ctypes.addressof(array), len(names)
