"""Files of a training work folder: the stage state, the regenerated samples and the captured shards.

A work folder (``kimi train ... --work DIR``) holds::

    samples.jsonl        regenerate: one {"input_ids": [...], "loss_mask": [...]} per line (1 = response token)
    capture/index.json   capture: ids, target, widths, dtype and the finished shards
    capture/shard-NNNNN.safetensors
                         "aux" [N, num_aux * H] and "final" [N, H] (dtype of the index), "input_ids" int64 [N],
                         "loss_mask" uint8 [N], "offsets" int64 [S + 1] (sequence s is rows offsets[s]:offsets[s+1])
    vocab.safetensors    vocab: "d2t" int64 [draft_vocab], "t2d" bool [vocab], "counts" int64 [vocab]
    train/               train: checkpoint.pt, log.jsonl
    drafter/             export: the vLLM-ready drafter
    report/              report: report.md, curves (PNG where matplotlib is present, CSV always)

Each stage writes its files atomically or appends whole records, so an interrupted stage resumes where it
stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from kimi.fork.fsutil import write_atomic


def read_samples(path: Path) -> list[dict]:
    """The complete lines of ``samples.jsonl`` (a torn last line from an interruption is dropped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def append_samples(path: Path, samples: list[dict]) -> None:
    """Append records to ``samples.jsonl`` and fsync (a record is either whole or dropped on read)."""
    with open(path, "a") as f:
        for sample in samples:
            f.write(json.dumps(sample, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def write_shard(path: Path, tensors: dict) -> None:
    """Write one safetensors shard atomically (temporary name, then rename)."""
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path)


def iter_sequences(capture: Path) -> Iterator[dict]:
    """Each captured sequence, shard by shard (one shard in memory at a time).

    Yields:
        {"input_ids": int64 [T], "loss_mask": uint8 [T], "aux": [T, num_aux * H], "final": [T, H]}.
    """
    from safetensors.torch import load_file

    index = read_json(capture / "index.json") or {"shards": []}
    for shard in index["shards"]:
        tensors = load_file(str(capture / shard["file"]))
        offsets = tensors["offsets"].tolist()
        for a, b in zip(offsets[:-1], offsets[1:], strict=True):
            yield {name: tensors[name][a:b] for name in ("input_ids", "loss_mask", "aux", "final")}
