"""EAGLE-3 draft head: draft-vocabulary logits -> target-vocabulary token ids.

An EAGLE-3 drafter predicts over a small draft vocabulary (32000 tokens for the Kimi
drafters) and ``d2t`` (int64 offsets, one per draft token) maps a draft id to the target's
vocabulary (163840 tokens for Kimi): ``target_id = draft_id + d2t[draft_id]``. Upstream vLLM
scatters the draft logits into a target-vocabulary tensor of -inf every draft step and takes the
argmax there; the same ids come from the argmax over the draft vocabulary and one gather.

Two implementations behind one interface:

* the fork's CUDA kernels (``csrc/draft_head.cu``, built by ``kimi kernels build``), one block
  per token row, loaded through ctypes and launched on torch's current stream (so they work
  under CUDA graph capture);
* torch (any device): the fallback, and the definition the kernels are tested against.

``backend="auto"`` (the default) takes the kernel for CUDA tensors when a built library loads
on the device, else torch. Both give the same ids: ties go to the lowest draft index and a NaN
ranks above every number, as in ``torch.argmax``.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Literal

import torch

from kimi.errors import KimiError

Backend = Literal["auto", "cuda", "torch"]

ABI_VERSION = 1
MAX_K = 16
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_lock = threading.Lock()
_state: dict[str, object] = {}


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.kimi_draft_head_abi_version.restype = ctypes.c_int
    abi = lib.kimi_draft_head_abi_version()
    if abi != ABI_VERSION:
        raise KimiError(f"{path} has C interface version {abi}, this module needs {ABI_VERSION}: "
                        "rebuild with `python3 -m kimi kernels build`")
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.kimi_draft_argmax.argtypes = [ptr, i32, i64, i64, i64, ptr, ptr, ptr, i32, ptr]
    lib.kimi_draft_argmax.restype = i32
    lib.kimi_draft_topk.argtypes = [ptr, i32, i64, i64, i64, ptr, ptr, ctypes.c_float, i32, ptr, ptr, ptr, i32, ptr]
    lib.kimi_draft_topk.restype = i32
    lib.kimi_draft_head_error_string.argtypes = [i32]
    lib.kimi_draft_head_error_string.restype = ctypes.c_char_p
    lib.kimi_draft_head_probe.restype = i32
    return lib


def load_library(path: Path | None = None, *, reload: bool = False) -> ctypes.CDLL:
    """Load the built kernel library (default: :func:`kimi.kernels.build.find_library`) and check
    that it has an image for the current CUDA device.

    Raises KimiError naming the fix when there is no library, it does not load, or it was
    built for other GPUs.
    """
    from kimi.kernels import build

    with _lock:
        if "lib" in _state and not reload and path is None:
            return _state["lib"]  # type: ignore[return-value]
        path = path or build.find_library()
        if path is None:
            raise KimiError("the draft-head kernels are not built for this source: run `python3 -m kimi kernels build` "
                            "(needs nvcc), or point KIMI_DRAFT_HEAD_LIB at a built libkimi_draft_head.so")
        try:
            lib = _load(path)
        except OSError as exc:
            raise KimiError(f"cannot load {path}: {exc}") from exc
        if torch.cuda.is_available():
            torch.cuda.init()
            code = lib.kimi_draft_head_probe()
            if code != 0:
                cap = torch.cuda.get_device_capability()
                raise KimiError(f"{path} has no kernel image for this GPU (sm_{cap[0]}{cap[1]}): "
                                f"{lib.kimi_draft_head_error_string(code).decode()}; rebuild with "
                                f"`python3 -m kimi kernels build --arch '{cap[0]}.{cap[1]}a'`")
        _state["lib"], _state["path"] = lib, path
        return lib


def kernel_status() -> dict[str, object]:
    """``{"available": bool, "library": path or None, "reason": text}`` for the current device."""
    try:
        load_library()
    except KimiError as exc:
        return {"available": False, "library": None, "reason": str(exc)}
    ok = torch.cuda.is_available()
    return {"available": ok, "library": str(_state["path"]), "reason": "" if ok else "no CUDA device"}


def warm_up(device: torch.device) -> None:
    """Launch the argmax kernel once per logits dtype on a ``[1, 1]`` tensor on ``device`` and wait for it.

    CUDA loads kernel images lazily, at a function's first launch; vLLM's V2 model runner captures the
    drafting loop (and so the first draft-head launch) in a CUDA graph, where loading a module is not
    allowed on all drivers. Call this after :func:`load_library` and before capture.

    Raises RuntimeError when a launch fails, KimiError when the library is not usable.
    """
    one = torch.zeros(1, dtype=torch.int64, device=device)
    for dtype in _DTYPES:
        draft_argmax(torch.zeros(1, 1, dtype=dtype, device=device), one, backend="cuda")
    torch.cuda.synchronize(device)


def _use_kernel(logits: torch.Tensor, backend: Backend) -> bool:
    if backend == "torch":
        return False
    if backend not in ("auto", "cuda"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'torch', not {backend!r}")
    usable = logits.is_cuda and logits.dtype in _DTYPES
    if backend == "cuda":
        if not usable:
            raise KimiError(f"backend='cuda' needs a CUDA float32/float16/bfloat16 tensor, got {logits.dtype} "
                            f"on {logits.device}")
        load_library()
        return True
    if not usable:
        return False
    if "usable" not in _state:
        try:
            load_library()
            _state["usable"] = True
        except KimiError as exc:
            _state["usable"], _state["reason"] = False, str(exc)
    return bool(_state["usable"])


def _check(logits: torch.Tensor, d2t: torch.Tensor | None) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, draft_vocab], got shape {tuple(logits.shape)}")
    if logits.shape[1] == 0:
        raise ValueError("logits has an empty draft vocabulary")
    if d2t is not None:
        if d2t.dim() != 1 or d2t.shape[0] < logits.shape[1]:
            raise ValueError(f"d2t must be 1-D with at least {logits.shape[1]} entries, got {tuple(d2t.shape)}")
        if d2t.device != logits.device:
            raise ValueError(f"d2t is on {d2t.device}, logits on {logits.device}")


def _stream(device: torch.device) -> int:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device.index) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(1) == 1 else logits.contiguous()


def _d2t64(d2t: torch.Tensor | None) -> torch.Tensor | None:
    if d2t is None:
        return None
    return d2t if d2t.dtype == torch.int64 and d2t.is_contiguous() else d2t.to(torch.int64).contiguous()


def _raise(lib: ctypes.CDLL, what: str, code: int) -> None:
    raise RuntimeError(f"{what} failed: {lib.kimi_draft_head_error_string(code).decode()} (code {code})")


def draft_argmax(logits: torch.Tensor, d2t: torch.Tensor | None = None, *, return_draft_ids: bool = False,
                 backend: Backend = "auto", threads: int = 0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Greedy draft token per row, as a target-vocabulary id.

    Args:
        logits: ``[T, V]`` draft-vocabulary logits, float32 / float16 / bfloat16 (any float on the
            torch path); the last dimension may be strided (it is then copied).
        d2t: ``[>= V]`` offsets (int64; other integer dtypes are converted on every call), same
            device; None: target id = draft id.
        return_draft_ids: also return the draft ids.
        backend: ``"auto"``, ``"cuda"`` (the kernel or KimiError) or ``"torch"``.
        threads: kernel block size (0: automatic); the torch path ignores it.

    Returns ``target_ids`` ``[T]`` int64 (``target_ids, draft_ids`` with ``return_draft_ids``).
    Raises ValueError for bad shapes, KimiError for ``backend="cuda"`` without a usable kernel,
    RuntimeError when the launch fails.
    """
    _check(logits, d2t)
    if not _use_kernel(logits, backend):
        return draft_argmax_torch(logits, d2t, return_draft_ids=return_draft_ids)
    lib: ctypes.CDLL = _state["lib"]  # type: ignore[assignment]
    logits, d2t = _rows(logits), _d2t64(d2t)
    rows, vocab = logits.shape
    target = torch.empty(rows, dtype=torch.int64, device=logits.device)
    draft = torch.empty_like(target) if return_draft_ids else None
    with torch.cuda.device(logits.device):
        code = lib.kimi_draft_argmax(
            logits.data_ptr(), _DTYPES[logits.dtype], rows, vocab, logits.stride(0),
            None if d2t is None else d2t.data_ptr(), target.data_ptr(), None if draft is None else draft.data_ptr(),
            threads, _stream(logits.device))
    if code:
        _raise(lib, "kimi_draft_argmax", code)
    return (target, draft) if draft is not None else target


def draft_topk(logits: torch.Tensor, d2t: torch.Tensor | None, k: int, *,
               temperature: float | torch.Tensor | None = None, return_draft_ids: bool = False,
               backend: Backend = "auto", threads: int = 0) -> tuple[torch.Tensor, ...]:
    """The ``k`` most likely draft tokens per row with their probabilities, as target ids.

    Probabilities are ``softmax(logits / temperature)`` over the whole draft vocabulary, in
    float32. Order: probability descending, ties by lowest draft index, NaN first; the
    temperature does not change which tokens are chosen (selection uses the raw logits).

    Args:
        logits: ``[T, V]`` as in :func:`draft_argmax`.
        d2t: as in :func:`draft_argmax`.
        k: 1 <= k <= V; the kernel takes k <= 16 (larger k runs on torch under ``"auto"``).
        temperature: None (1), a positive float, or a ``[T]`` tensor of positive temperatures
            (not checked on the GPU: a zero or negative entry gives inf/NaN probabilities).
        return_draft_ids: also return the draft ids.
        backend, threads: as in :func:`draft_argmax` (threads at most 512 here).

    Returns ``(probs [T, k] float32, target_ids [T, k] int64)`` and ``draft_ids [T, k]`` with
    ``return_draft_ids``. Raises as :func:`draft_argmax`; ValueError for a bad k or temperature.
    """
    _check(logits, d2t)
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k must be in [1, {logits.shape[1]}], got {k}")
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if isinstance(temperature, torch.Tensor) and temperature.shape != (logits.shape[0],):
        raise ValueError(f"temperature tensor must have shape [{logits.shape[0]}], got {tuple(temperature.shape)}")
    if k > MAX_K and backend == "cuda":
        raise KimiError(f"the draft-head kernel takes k <= {MAX_K}, got {k}: use backend='torch'")
    if k > MAX_K or not _use_kernel(logits, backend):
        return draft_topk_torch(logits, d2t, k, temperature=temperature, return_draft_ids=return_draft_ids)
    lib: ctypes.CDLL = _state["lib"]  # type: ignore[assignment]
    logits, d2t = _rows(logits), _d2t64(d2t)
    rows, vocab = logits.shape
    inv_t: torch.Tensor | None = None
    scalar = 1.0
    if isinstance(temperature, torch.Tensor):
        inv_t = (1.0 / temperature.to(device=logits.device, dtype=torch.float32)).contiguous()
    elif temperature is not None:
        scalar = 1.0 / float(temperature)
    probs = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    target = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    draft = torch.empty_like(target) if return_draft_ids else None
    with torch.cuda.device(logits.device):
        code = lib.kimi_draft_topk(
            logits.data_ptr(), _DTYPES[logits.dtype], rows, vocab, logits.stride(0),
            None if d2t is None else d2t.data_ptr(), None if inv_t is None else inv_t.data_ptr(), scalar, k,
            probs.data_ptr(), target.data_ptr(), None if draft is None else draft.data_ptr(), threads,
            _stream(logits.device))
    if code:
        _raise(lib, "kimi_draft_topk", code)
    return (probs, target, draft) if draft is not None else (probs, target)


def _to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    draft_ids = draft_ids.to(torch.int64)
    return draft_ids if d2t is None else draft_ids + d2t.to(torch.int64)[draft_ids]


def draft_argmax_torch(logits: torch.Tensor, d2t: torch.Tensor | None = None, *,
                       return_draft_ids: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The torch path of :func:`draft_argmax` (argmax over the draft vocabulary, then d2t)."""
    draft = logits.argmax(dim=-1)
    target = _to_target(draft, d2t)
    return (target, draft) if return_draft_ids else target


def _ranked(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries per row: value descending, ties by lowest index, NaN first
    (a stable descending sort; torch.topk leaves the order of ties unspecified)."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]


def draft_topk_torch(logits: torch.Tensor, d2t: torch.Tensor | None, k: int, *,
                     temperature: float | torch.Tensor | None = None,
                     return_draft_ids: bool = False) -> tuple[torch.Tensor, ...]:
    """The torch path of :func:`draft_topk` (float32 softmax, stable sort)."""
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.to(device=x.device, dtype=torch.float32)[:, None]
    elif temperature is not None:
        x = x / float(temperature)
    probs = torch.softmax(x, dim=-1)
    draft = _ranked(logits, k)
    out = (probs.gather(1, draft), _to_target(draft, d2t))
    return (*out, draft) if return_draft_ids else out


def scatter_argmax_upstream(logits: torch.Tensor, d2t: torch.Tensor, target_vocab: int) -> torch.Tensor:
    """Upstream vLLM's form, for comparison: scatter the draft logits into a ``[T, target_vocab]``
    tensor of -inf at ``arange(V) + d2t``, then argmax over the target vocabulary."""
    vocab = logits.shape[1]
    full = logits.new_full((logits.shape[0], target_vocab), float("-inf"))
    full[:, torch.arange(vocab, device=logits.device) + d2t[:vocab]] = logits
    return full.argmax(dim=-1)


def reference_topk(logits: torch.Tensor, d2t: torch.Tensor | None, k: int,
                   temperature: float | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 reference on the CPU: ``(probs [T, k] float64, target_ids [T, k] int64)``; the
    ranking uses the exact (float64) logits. ``k = 1`` is the argmax reference."""
    x = logits.detach().to("cpu", torch.float64)
    draft = _ranked(x, k)
    if isinstance(temperature, torch.Tensor):
        x = x / temperature.detach().to("cpu", torch.float64)[:, None]
    elif temperature is not None:
        x = x / float(temperature)
    probs = torch.softmax(x, dim=-1).gather(1, draft)
    return probs, _to_target(draft, None if d2t is None else d2t.detach().cpu())
