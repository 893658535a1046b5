"""safetensors files as bytes: read one tensor's raw data, write a file from raw data (any dtype, no numpy/torch).

The format (its specification): an 8-byte little-endian header length, a JSON header mapping each name to
``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), an optional ``__metadata__``
entry, then the data. Working on bytes keeps bf16 tensors exact without a framework that knows bf16.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError

#: Bytes per element of the safetensors dtypes EAGLE-3 checkpoints use.
ITEM_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class RawTensor:
    """One tensor: safetensors dtype name, shape and its bytes (row-major, little-endian)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


def _header(path: Path) -> tuple[dict, int]:
    """(header without ``__metadata__``, offset of the data) of a safetensors file.

    Raises:
        KimiError: the file is too short or its header is not a JSON object.
    """
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise KimiError(f"{path}: not a safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise KimiError(f"{path}: not a safetensors file (header of {size} bytes)")
        try:
            header = json.loads(fh.read(size))
        except ValueError as exc:
            raise KimiError(f"{path}: not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise KimiError(f"{path}: not a safetensors file (the header is not an object)")
    header.pop("__metadata__", None)
    return header, 8 + size


def read_all(path: Path) -> dict[str, RawTensor]:
    """Every tensor of a safetensors file, in file order.

    Raises:
        KimiError: not a safetensors file.
    """
    header, base = _header(path)
    blob = path.read_bytes()
    out = {}
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        start, end = entry["data_offsets"]
        out[name] = RawTensor(entry["dtype"], tuple(entry["shape"]), blob[base + start:base + end])
    return out


def read_one(path: Path, name: str) -> RawTensor:
    """One tensor of a safetensors file, reading only its bytes.

    Raises:
        KimiError: not a safetensors file; KeyError: no tensor ``name``.
    """
    header, base = _header(path)
    entry = header[name]
    start, end = entry["data_offsets"]
    with open(path, "rb") as fh:
        fh.seek(base + start)
        return RawTensor(entry["dtype"], tuple(entry["shape"]), fh.read(end - start))


def write_all(path: Path, tensors: dict[str, RawTensor]) -> None:
    """Write ``tensors`` as a safetensors file (``{"format": "pt"}`` metadata, as torch's writer).

    Raises:
        ValueError: a tensor's byte count does not match its dtype and shape.
    """
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        count = 1
        for dim in tensor.shape:
            count *= dim
        if len(tensor.data) != count * ITEM_SIZE[tensor.dtype]:
            raise ValueError(f"{name}: {len(tensor.data)} bytes for {tensor.dtype}{list(tensor.shape)}")
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(tensor.data)]}
        offset += len(tensor.data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for tensor in tensors.values():
            fh.write(tensor.data)


def is_zero(tensor: RawTensor) -> bool:
    """Whether every element is zero (for floats, +0.0 or -0.0)."""
    size = ITEM_SIZE[tensor.dtype]
    if tensor.dtype.startswith(("F", "BF")):
        sign = 1 << (8 * size - 1)
        return all(int.from_bytes(tensor.data[i:i + size], "little") & ~sign == 0
                   for i in range(0, len(tensor.data), size))
    return not any(tensor.data)
