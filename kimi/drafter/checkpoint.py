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


@dataclass
class Checkpoint:
    """A checkpoint folder: its config and the tensors its safetensors files declare."""

    path: Path
    config: dict
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> Checkpoint:
        """Read ``path/config.json`` and the safetensors headers of the checkpoint's weight files.

        With ``model.safetensors.index.json`` the files it lists are read (as
        loaders do); otherwise every ``*.safetensors`` in ``path``.

        Raises:
            KimiError: ``path`` is not a folder, has no config, the index lists
                a missing file, or a safetensors file is unreadable (named).
        """
        if not path.is_dir():
            raise KimiError(f"{path} is not a checkpoint folder")
        checkpoint = cls(path=path, config=read_config(path))
        for file in checkpoint.weight_files():
            try:
                with safe_open(str(file), framework="numpy") as handle:
                    for name in handle.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                        piece = handle.get_slice(name)
                        checkpoint.tensors[name] = TensorInfo(piece.get_dtype(), tuple(piece.get_shape()), file)
            except Exception as exc:  # safetensors raises its own error types
                raise KimiError(f"{file}: not a readable safetensors file ({exc})") from None
        return checkpoint

    def weight_files(self) -> list[Path]:
        """The safetensors files a loader would read (see ``open``)."""
        index = self.path / "model.safetensors.index.json"
        if not index.is_file():
            return sorted(self.path.glob("*.safetensors"))
        try:
            weight_map = json.loads(index.read_bytes())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KimiError(f"{index}: not a safetensors index ({exc})") from None
        missing = [n for n in names if not (self.path / n).is_file()]
        if missing:
            raise KimiError(f"{index} lists {', '.join(missing)}, missing from {self.path}")
        return [self.path / n for n in names]

    @property
    def has_weights(self) -> bool:
        """Whether tensor headers were read (a config-only checkpoint has none)."""
        return bool(self.tensors)

    def shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def read(self, name: str) -> np.ndarray:
        """The values of one (small) tensor as a numpy array."""
        info = self.tensors[name]
        with safe_open(str(info.file), framework="numpy") as handle:
            return handle.get_tensor(name)
