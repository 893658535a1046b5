"""Read an EAGLE-3 drafter (or a target) checkpoint without loading its weights.

``config.json`` is read as JSON. The weight files are the ones vLLM's default loader reads
(``DefaultModelLoader._prepare_weights``, ``vllm/model_executor/model_loader/default_loader.py``, load format
``auto``): the first of ``*.safetensors``, ``*.bin``, ``*.pt`` that matches any file; safetensors files
filtered by ``model.safetensors.index.json`` where there is one; ``*.bin`` / ``*.pt`` without the training
files it leaves out. Tensor names, dtypes and shapes come from the safetensors headers
(``safe_open(...).get_slice``) or, for ``.bin`` / ``.pt``, from ``torch.load(weights_only=True, mmap=True)``
as vLLM loads them (memory-mapped: no data is read); only the small vocabulary maps ``d2t`` / ``t2d`` and
biases are ever read in full.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import safe_open

from kimi.drafter.rawtensors import is_zero, read_one
from kimi.errors import KimiError


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as its safetensors header declares it: dtype name (``BF16``, ``I64``, ``BOOL``), shape, file."""

    dtype: str
    shape: tuple[int, ...]
    file: Path


_MAX_CONFIG_BYTES = 16 << 20


def read_config(path: Path) -> dict:
    """``config.json`` of a checkpoint folder, or the file itself when ``path`` is a JSON file.

    Raises:
        KimiError: no config, an unreadable or oversized file, or not a JSON object.
    """
    file = path / "config.json" if path.is_dir() else path
    try:
        if file.stat().st_size > _MAX_CONFIG_BYTES:
            raise KimiError(f"{file} is {file.stat().st_size >> 20} MB: not a config.json")
        config = json.loads(file.read_bytes())
    except FileNotFoundError:
        raise KimiError(f"no config.json in {path}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise KimiError(f"{file}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise KimiError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(config, dict):
        raise KimiError(f"{file}: the config is not a JSON object")
    return config


def text_config(config: dict) -> dict:
    """The language model's part of a config: ``text_config`` of a multimodal wrapper (Kimi-K2.5), else itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


#: File name patterns vLLM's loader tries, in order; the first that matches any file is used.
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: Training files vLLM's ``filter_files_not_needed_for_inference`` leaves out of ``*.bin`` / ``*.pt``.
TRAINING_FILES = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
#: Weight formats of other frameworks that vLLM's loader does not read, found by name.
UNREAD_WEIGHTS = ("*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack", "*.npz", "*.pkl")
_TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64",
                 "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                 "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def weight_files(path: Path) -> list[Path]:
    """The weight files vLLM loads from the folder ``path`` (see the module docstring); [] when none.

    Raises:
        KimiError: the safetensors index is unreadable or lists a file that is not there.
    """
    for pattern in WEIGHT_PATTERNS:
        files = sorted(path.glob(pattern))
        if files:
            break
    else:
        return []
    if pattern != "*.safetensors":
        return [f for f in files if f.name not in TRAINING_FILES]
    index = path / SAFETENSORS_INDEX
    if not index.is_file():
        return files
    try:
        names = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KimiError(f"{index}: not a safetensors index ({exc}); fix: write it again or remove it") from None
    missing = [n for n in names if not (path / n).is_file()]
    if missing:
        raise KimiError(f"{index} lists {', '.join(missing)}, missing from {path} (vLLM stops on it); fix: add the "
                        "missing shards or write the index for the shards there are")
    return [path / n for n in names]


def _torch_state(file: Path) -> dict:
    """A ``.bin`` / ``.pt`` state dict loaded as vLLM loads it (``torch.load(weights_only=True)``), memory-mapped.

    Raises:
        KimiError: torch is missing, or the file is not a state dict of tensors that loads with
            ``weights_only=True`` (named, with the fix).
    """
    try:
        import torch
    except ImportError:
        raise KimiError(f"{file} is a PyTorch pickle, which only torch reads: run this with torch installed (the "
                        "fork's .venv), or save the weights as safetensors") from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KimiError(f"{file}: torch.load(weights_only=True), as vLLM loads it, refuses it ({first}); fix: "
                        "save the state dict as safetensors (safetensors.torch.save_file)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise KimiError(f"{file}: not a flat state dict of tensors (vLLM iterates name -> tensor pairs); fix: save "
                        "model.state_dict() alone, as safetensors")
    return state


@dataclass
class Checkpoint:
    """A checkpoint folder: its config, the tensors its weight files declare, and tensors named twice.

    ``duplicates`` maps a tensor name written in more than one weight file to those files (vLLM loads each
    copy in turn); ``unread`` names weight files of formats vLLM does not read (when it reads none).
    """

    path: Path
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    duplicates: dict[str, list[Path]] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)
    opened: bool = False
    _states: dict[Path, dict] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: Path) -> Checkpoint:
        """Read ``path/config.json`` and the tensor headers of the weight files vLLM would load (:func:`weight_files`).

        Raises:
            KimiError: ``path`` is not a folder, has no config, the index lists a missing file, or a weight
                file is unreadable as vLLM reads it (named, with the fix).
        """
        if not path.is_dir():
            raise KimiError(f"{path} is not a checkpoint folder")
        checkpoint = cls(path=path, config=read_config(path), opened=True)
        files = weight_files(path)
        for file in files:
            for name, info in checkpoint._headers(file):
                if name in checkpoint.tensors:
                    checkpoint.duplicates.setdefault(name, [checkpoint.tensors[name].file]).append(file)
                checkpoint.tensors[name] = info
        if not files:
            checkpoint.unread = sorted(f.name for pattern in UNREAD_WEIGHTS for f in path.glob(pattern))
        return checkpoint

    def _headers(self, file: Path) -> list[tuple[str, TensorInfo]]:
        if file.suffix != ".safetensors":
            self._states[file] = _torch_state(file)
            return [(name, TensorInfo(_TORCH_DTYPES.get(str(t.dtype).removeprefix("torch."), str(t.dtype)),
                                      tuple(t.shape), file)) for name, t in self._states[file].items()]
        try:
            with safe_open(str(file), framework="numpy") as handle:
                return [(name, TensorInfo(handle.get_slice(name).get_dtype(), tuple(handle.get_slice(name).get_shape()),
                                          file)) for name in handle.keys()]  # noqa: SIM118 (not a dict)
        except Exception as exc:  # safetensors raises its own error types
            raise KimiError(f"{file}: not a readable safetensors file ({exc})") from None

    @property
    def weight_format(self) -> str:
        """``safetensors``, ``bin`` or ``pt`` (the suffix of the files read), or ``none``."""
        suffixes = {info.file.suffix for info in self.tensors.values()}
        return suffixes.pop().lstrip(".") if len(suffixes) == 1 else "none" if not suffixes else "mixed"

    @property
    def files(self) -> list[Path]:
        """The weight files read, in load order."""
        return sorted({info.file for info in self.tensors.values()})

    def load(self, file: Path) -> dict:
        """Every tensor of one of :attr:`files` as torch tensors (needs torch), by name."""
        if file in self._states:
            return dict(self._states[file])
        from safetensors.torch import load_file

        return load_file(str(file))

    @property
    def has_weights(self) -> bool:
        """Whether tensor headers were read (a config-only checkpoint has none)."""
        return bool(self.tensors)

    def shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def read(self, name: str) -> np.ndarray:
        """The values of one small integer or bool tensor (``d2t``, ``t2d``) as a numpy array."""
        info = self.tensors[name]
        if info.file in self._states:
            return self._states[info.file][name].numpy()
        with safe_open(str(info.file), framework="numpy") as handle:
            return handle.get_tensor(name)

    def is_zero(self, name: str) -> bool:
        """Whether every element of the tensor is zero (any dtype; reads only that tensor)."""
        info = self.tensors[name]
        if info.file in self._states:
            return not bool(self._states[info.file][name].any())
        return is_zero(read_one(info.file, name))
