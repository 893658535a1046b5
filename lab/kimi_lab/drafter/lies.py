"""Ways to break a copy of a good drafter folder, the ``lie`` of each entry of
:data:`kimi_lab.drafter.assumptions.ASSUMPTIONS`: edits of ``config.json``, of the tensors in ``model.safetensors``
(in place), and the weights written out in other files and formats, as other trainers save them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kimi.drafter.checkpoint import SAFETENSORS_INDEX, read_config, text_config
from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD
from kimi.drafter.layout import DEFAULTS
from kimi.drafter.rawtensors import RawTensor, read_all, write_all
from kimi.errors import KimiError

#: Edits a copy of a good drafter folder in place; gets the target's folder.
Lie = Callable[[Path, Path], None]

#: A value for :func:`config` that removes the field.
DROP = object()


def target_config(target: Path) -> dict:
    """The target folder's text config."""
    return text_config(read_config(target))


def _weights(folder: Path) -> Path:
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1 or (folder / "model.safetensors.index.json").exists():
        raise KimiError(f"{folder}: the lies are written into a single model.safetensors, not {len(files)} files")
    return files[0]


def config(**changes) -> Lie:
    """Set (or, with ``DROP``, remove) config fields; a callable value gets (the original config, the target's
    text config)."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        values = {key: value(dict(cfg), target_config(target)) if callable(value) else value
                  for key, value in changes.items()}
        for key, value in values.items():
            if value is DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return lie


def tensors(edit: Callable[[dict[str, RawTensor], dict, Path], None]) -> Lie:
    """Edit the tensors (a dict of :class:`RawTensor`, in place) with the drafter's config and the target folder."""
    def lie(folder: Path, target: Path) -> None:
        path = _weights(folder)
        tensors = read_all(path)
        edit(tensors, read_config(folder), target)
        write_all(path, tensors)
    return lie


def both(*lies: Lie) -> Lie:
    """The lies applied one after the other."""
    def lie(folder: Path, target: Path) -> None:
        for one in lies:
            one(folder, target)
    return lie


def aux_ids(cfg: dict) -> list[int]:
    """The good drafter's top-level aux layer ids (:class:`KimiError` when it names none)."""
    ids = cfg.get(IDS_FIELD)
    if not isinstance(ids, list) or len(ids) < 2:
        raise KimiError(f"the good drafter must name its aux layer ids at the top level ({IDS_FIELD}), not {ids!r}")
    return ids


def _int64(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(8, "little", signed=True) for v in values)


def _from_int64(data: bytes) -> list[int]:
    return [int.from_bytes(data[i:i + 8], "little", signed=True) for i in range(0, len(data), 8)]


def _filled(dtype: str, count: int, one: bool) -> bytes:
    """``count`` elements of 1.0 (or 0) in a float dtype."""
    if not one:
        return bytes(count * {"BF16": 2, "F16": 2, "F32": 4}[dtype])
    unit = {"BF16": b"\x80\x3f", "F16": b"\x00\x3c", "F32": b"\x00\x00\x80\x3f"}[dtype]
    return unit * count


def drop(*names: str) -> Lie:
    """Remove the named tensors."""
    def edit(tensors: dict, cfg: dict, target: Path) -> None:
        for name in names:
            tensors.pop(name, None)
    return tensors(edit)


def add_vector(name: str, width: Callable[[dict], int], one: bool) -> Lie:
    """Add a 1-D tensor ``name`` of ones (or zeros) in the dtype of ``norm.weight``."""
    def edit(tensors: dict, cfg: dict, target: Path) -> None:
        dtype = tensors["norm.weight"].dtype
        n = width(cfg)
        tensors[name] = RawTensor(dtype, (n,), _filled(dtype, n, one))
    return tensors(edit)


def not_default(field: str) -> Callable[[dict, dict], bool]:
    """The drafter's ``field`` differs from its config class default (so that leaving it out changes something)."""
    def fits(cfg: dict, target: dict) -> bool:
        known = DEFAULTS.get(cfg.get("model_type"))
        return known is not None and field in cfg and cfg[field] != known[1].get(field)
    return fits


def hidden(cfg: dict) -> int:
    """The drafter's hidden size."""
    return cfg["hidden_size"]


def target_hidden(cfg: dict) -> int:
    """The target hidden size the drafter states (else its own hidden size)."""
    return cfg.get("target_hidden_size", cfg["hidden_size"])


def fc_narrower(tensors: dict, cfg: dict, target: Path) -> None:
    """Cut the last input column of ``fc.weight``: its width is no longer a multiple of the target's hidden size."""
    fc = tensors["fc.weight"]
    rows, cols = fc.shape
    size = len(fc.data) // (rows * cols)
    data = b"".join(fc.data[r * cols * size:(r * cols + cols - 1) * size] for r in range(rows))
    tensors["fc.weight"] = RawTensor(fc.dtype, (rows, cols - 1), data)


def d2t_outside(tensors: dict, cfg: dict, target: Path) -> None:
    """Push the last ``d2t`` offset past the target's vocabulary."""
    offsets = _from_int64(tensors["d2t"].data)
    offsets[-1] += target_config(target)["vocab_size"]
    tensors["d2t"] = RawTensor("I64", (len(offsets),), _int64(offsets))


def vocab_at_top_d2t_id(folder: Path, target: Path) -> None:
    """Set ``vocab_size`` to the largest target id d2t maps to (draft id + offset), which is then out of range."""
    offsets = _from_int64(read_all(_weights(folder))["d2t"].data)
    config(vocab_size=max(i + offset for i, offset in enumerate(offsets)))(folder, target)


def d2t_shorter(tensors: dict, cfg: dict, target: Path) -> None:
    """Drop the last entry of ``d2t``."""
    offsets = _from_int64(tensors["d2t"].data)[:-1]
    tensors["d2t"] = RawTensor("I64", (len(offsets),), _int64(offsets))


def d2t_int32(tensors: dict, cfg: dict, target: Path) -> None:
    """``d2t`` as int32 instead of int64."""
    offsets = _from_int64(tensors["d2t"].data)
    tensors["d2t"] = RawTensor("I32", (len(offsets),), b"".join(v.to_bytes(4, "little", signed=True)
                                                                 for v in offsets))


def identity_maps(tensors: dict, cfg: dict, target: Path) -> None:
    """A full-vocabulary drafter that still ships maps: an all-zero ``d2t`` and an all-true ``t2d``."""
    vocab = target_config(target)["vocab_size"]
    tensors.pop("lm_head.weight", None)
    tensors["d2t"] = RawTensor("I64", (vocab,), _int64([0] * vocab))
    tensors["t2d"] = RawTensor("BOOL", (vocab,), b"\x01" * vocab)


def t2d_empty(tensors: dict, cfg: dict, target: Path) -> None:
    """A ``t2d`` with no draft token marked."""
    t2d = tensors["t2d"]
    tensors["t2d"] = RawTensor("BOOL", t2d.shape, bytes(len(t2d.data)))


def embed_narrow(tensors: dict, cfg: dict, target: Path) -> None:
    """An ``embed_tokens`` half the drafter's hidden size wide."""
    vocab, width = target_config(target)["vocab_size"], cfg["hidden_size"] // 2
    dtype = tensors["norm.weight"].dtype
    tensors["embed_tokens.weight"] = RawTensor(dtype, (vocab, width), _filled(dtype, vocab * width, False))


def embed_from_target(tensors: dict, cfg: dict, target: Path) -> None:
    """The target's own input embedding as the drafter's ``embed_tokens``."""
    for path in sorted(target.glob("*.safetensors")):
        found = read_all(path).get("model.embed_tokens.weight")
        if found is not None:
            tensors["embed_tokens.weight"] = found
            return
    raise KimiError(f"{target}: no model.embed_tokens.weight")


def float32(tensors: dict, cfg: dict, target: Path) -> None:
    """Every bf16 tensor as float32 (exact: a bf16 value is the high half of its float32)."""
    for name, t in list(tensors.items()):
        if t.dtype == "BF16":
            data = b"".join(b"\x00\x00" + t.data[i:i + 2] for i in range(0, len(t.data), 2))
            tensors[name] = RawTensor("F32", t.shape, data)


def wider_heads(tensors: dict, cfg: dict, target: Path) -> None:
    """q/k/v/o projections for twice the head_dim (zero-padded), as a drafter with its own head_dim has them."""
    for proj in ("q_proj", "k_proj", "v_proj"):
        t = tensors[f"midlayer.self_attn.{proj}.weight"]
        tensors[f"midlayer.self_attn.{proj}.weight"] = RawTensor(t.dtype, (2 * t.shape[0], t.shape[1]),
                                                                 t.data + bytes(len(t.data)))
    o = tensors["midlayer.self_attn.o_proj.weight"]
    rows, cols = o.shape
    size = len(o.data) // (rows * cols)
    data = b"".join(o.data[r * cols * size:(r + 1) * cols * size] + bytes(cols * size) for r in range(rows))
    tensors["midlayer.self_attn.o_proj.weight"] = RawTensor(o.dtype, (rows, 2 * cols), data)


def head_dim(cfg: dict) -> int:
    """The drafter's head_dim (else hidden_size / num_attention_heads)."""
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def pinned_head_dim(cfg: dict, target: dict) -> object:
    """A Llama drafter's head_dim written out, so that a new hidden_size leaves it as it was (MLA has none)."""
    return DROP if "kv_lora_rank" in cfg else head_dim(cfg)


def as_layer_outputs(folder: Path, target: Path) -> None:
    """The vLLM ids rewritten as 'output of layer k' ids, where SpecForge writes them (nested, starting at 1)."""
    cfg = read_config(folder)
    ids = [i - 1 for i in aux_ids(cfg)]
    for key in (IDS_FIELD, CONVENTION_FIELD):
        cfg.pop(key, None)
    if ids[0] == 1:
        cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), IDS_FIELD: ids}
    else:  # not SpecForge's shape: state the convention of top-level ids instead
        cfg[IDS_FIELD], cfg[CONVENTION_FIELD] = ids, "layer_output"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def _state(folder: Path) -> dict:
    """The single ``model.safetensors`` as torch tensors, the file removed."""
    from safetensors.torch import load_file

    path = _weights(folder)
    state = load_file(str(path))
    path.unlink()
    return state


def as_torch(name: str) -> Lie:
    """The weights saved with ``torch.save`` as ``name`` (``pytorch_model.bin``, ``model.pt``), as PyTorch trainers
    write them."""
    def lie(folder: Path, target: Path) -> None:
        import torch

        torch.save(_state(folder), folder / name)
    return lie


def _halves(state: dict) -> tuple[dict, dict]:
    names = sorted(state)
    return {n: state[n] for n in names[::2]}, {n: state[n] for n in names[1::2]}


def shards(suffix: str, index: str | None) -> Lie:
    """The weights in two shards ``model-0000{1,2}-of-00002.<suffix>`` (``pytorch_model-...`` for ``bin``), with the
    index file ``index`` (None: without one), as transformers' ``save_pretrained`` shards them."""
    def lie(folder: Path, target: Path) -> None:
        import torch
        from safetensors.torch import save_file

        stem = "pytorch_model" if suffix == "bin" else "model"
        weight_map = {}
        for i, part in enumerate(_halves(_state(folder)), 1):
            name = f"{stem}-{i:05d}-of-00002.{suffix}"
            if suffix == "safetensors":
                save_file(part, str(folder / name), metadata={"format": "pt"})
            else:
                torch.save(part, folder / name)
            weight_map.update(dict.fromkeys(part, name))
        if index:
            (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return lie


def stale_shard(indexed: bool) -> Lie:
    """Two shards (with their index when ``indexed``) and an extra file ``model-stale.safetensors`` left from an
    earlier save, holding an ``fc.weight`` for one more aux state."""
    def lie(folder: Path, target: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        fc = load_file(str(_weights(folder)))["fc.weight"]
        shards("safetensors", SAFETENSORS_INDEX if indexed else None)(folder, target)
        stale = torch.cat([fc, fc[:, : fc.shape[1] // 3]], dim=1)
        save_file({"fc.weight": stale}, str(folder / "model-stale.safetensors"))
    return lie


def index_missing_shard(folder: Path, target: Path) -> None:
    """Two shards and their index, the second shard removed."""
    shards("safetensors", SAFETENSORS_INDEX)(folder, target)
    (folder / "model-00002-of-00002.safetensors").unlink()


def no_weights(folder: Path, target: Path) -> None:
    """Remove the weight file."""
    _weights(folder).unlink()


def renamed(name: str) -> Lie:
    """The weight file renamed ``name`` (a suffix vLLM's loader does not glob)."""
    def lie(folder: Path, target: Path) -> None:
        path = _weights(folder)
        path.rename(folder / name)
    return lie


class _Opaque:
    """An object ``torch.load(weights_only=True)`` refuses to unpickle (what a pickled training state may hold)."""


def bin_with_objects(folder: Path, target: Path) -> None:
    """The weights as ``pytorch_model.bin`` with an object ``torch.load(weights_only=True)`` refuses."""
    import torch

    torch.save({**_state(folder), "training_state": _Opaque()}, folder / "pytorch_model.bin")


def lm_head_rows(tensors: dict, cfg: dict, target: Path) -> None:
    """An ``lm_head`` with half the rows ``draft_vocab_size`` gives (a head cut for another draft vocabulary)."""
    head = tensors["lm_head.weight"]
    rows, cols = head.shape
    size = len(head.data) // (rows * cols)
    tensors["lm_head.weight"] = RawTensor(head.dtype, (rows // 2, cols), head.data[:rows // 2 * cols * size])


def both_ids(nested: Callable[[list[int]], list[int]]) -> Lie:
    """Keep the top-level ids and add nested ``eagle_config`` ids made from them by ``nested``."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), IDS_FIELD: nested(aux_ids(cfg))}
        cfg.pop(CONVENTION_FIELD, None)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return lie


def final_layer(convention: str) -> Lie:
    """The last aux id made the target's last layer output (vLLM id L), written in ``convention``: top-level
    ``layer_input``, nested SpecForge (``layer_output``, first id 1), or top-level with the convention stated."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        layers = target_config(target)["num_hidden_layers"]
        ids = [*aux_ids(cfg)[:-1], layers]
        for key in (IDS_FIELD, CONVENTION_FIELD):
            cfg.pop(key, None)
        if convention == "specforge":
            cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), IDS_FIELD: [i - 1 for i in ids]}
        elif convention == "layer_output":
            cfg[IDS_FIELD], cfg[CONVENTION_FIELD] = [i - 1 for i in ids], "layer_output"
        else:
            cfg[IDS_FIELD] = ids
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return lie
