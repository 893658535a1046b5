"""Read an EAGLE-3 drafter (or a target) checkpoint without loading its weights.

``config.json`` is read as JSON; tensor names, dtypes and shapes come from the
safetensors headers (``safetensors.safe_open(...).get_slice``); only the small
vocabulary maps ``d2t`` / ``t2d`` are ever read in full.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import safe_open

from kimi.errors import KimiError


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as its safetensors header declares it: dtype name (``BF16``, ``I64``, ``BOOL``), shape, file."""

    dtype: str
    shape: tuple[int, ...]
    file: Path


def read_config(path: Path) -> dict:
    """``config.json`` of a checkpoint folder, or the file itself when ``path`` is a JSON file.

    Raises:
        KimiError: no config, or not a JSON object.
    """
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_bytes())
    except FileNotFoundError:
        raise KimiError(f"no config.json in {path}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise KimiError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise KimiError(f"{file}: the config is not a JSON object")
    return config


def text_config(config: dict) -> dict:
    """The language model's part of a config: ``text_config`` of a multimodal wrapper (Kimi-K2.5), else itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


@dataclass
class Checkpoint:
    """A checkpoint folder: its config and the tensors its safetensors files declare."""

    path: Path
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> Checkpoint:
        """Read ``path/config.json`` and every ``*.safetensors`` header in ``path``.

        Raises:
            KimiError: ``path`` is not a folder, has no config, or a
                safetensors file is unreadable (the file is named).
        """
        if not path.is_dir():
            raise KimiError(f"{path} is not a checkpoint folder")
        checkpoint = cls(path=path, config=read_config(path))
        for file in sorted(path.glob("*.safetensors")):
            try:
                with safe_open(str(file), framework="numpy") as handle:
                    for name in handle.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                        piece = handle.get_slice(name)
                        checkpoint.tensors[name] = TensorInfo(piece.get_dtype(), tuple(piece.get_shape()), file)
            except Exception as exc:  # safetensors raises its own error types
                raise KimiError(f"{file}: not a readable safetensors file ({exc})") from None
        return checkpoint

    def shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def read(self, name: str) -> np.ndarray:
        """The values of one (small) tensor as a numpy array."""
        info = self.tensors[name]
        with safe_open(str(info.file), framework="numpy") as handle:
            return handle.get_tensor(name)
