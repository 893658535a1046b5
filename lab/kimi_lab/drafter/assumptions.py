"""What vLLM (the v0.32 line's release) assumes about an EAGLE-3 drafter checkpoint, as data: one :class:`Assumption`
per thing a checkpoint can get wrong, and the valid variants that must not be refused.

Each entry names what upstream reads (the field or tensor, the file and function of that release), what upstream
does when a checkpoint breaks it (:data:`OUTCOMES`), a way to break it in a copy of a good drafter folder
(``lie``: edits ``config.json`` or ``model.safetensors`` in place), and the words ``kimi drafter inspect`` must
say about that copy (``needle``; empty for a valid variant, which inspect must pass). ``refused`` says whether
``vllm serve`` on the fork stops at start-up (:mod:`kimi.drafter.serve_checks`, before any weight
loads) or serves it (translated ids, a ``t2d`` vLLM never reads, a valid variant).
:func:`assumption_table` runs inspect on every lying copy; ``docs/drafter-assumptions.md`` is the prose form.

Sources (the v0.32 line's vLLM): ``model_executor/models/llama_eagle3.py`` (``Eagle3LlamaForCausalLM``, ``LlamaModel``,
``LlamaDecoderLayer``), ``deepseek_eagle3.py`` (``Eagle3DeepseekV2ForCausalLM``), ``models/utils.py``
(``AutoWeightsLoader``), ``v1/spec_decode/llm_base_proposer.py`` (``load_model``, ``_maybe_share_embeddings``,
``_maybe_share_lm_head``), ``v1/worker/gpu_model_runner.py`` and ``v1/worker/gpu/spec_decode/eagle/`` (aux layer
ids), ``config/speculative.py`` (the draft config), ``model_executor/layers/rotary_embedding/__init__.py``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kimi.drafter.checkpoint import SAFETENSORS_INDEX, read_config, text_config
from kimi.drafter.conventions import CONVENTION_FIELD, IDS_FIELD
from kimi.drafter.inspect import inspect
from kimi.drafter.layout import DEFAULTS, LLAMA, MLA, drafter_class
from kimi.drafter.rawtensors import RawTensor, read_all, write_all
from kimi.errors import KimiError

#: What upstream does with a checkpoint that breaks an assumption, worst first.
FAILS_AT_LOAD = "fails after the target's weights load"
FAILS_AT_STEP = "fails in the first step"
SERVES_WRONG = "serves wrong drafts without an error"
FAILS_AT_START = "fails at start-up, before any weight loads"
IGNORES = "serves it as if the tensor were not there"
SERVES_SAME = "serves it as the original"
SERVES = "serves it"
OUTCOMES = (FAILS_AT_LOAD, FAILS_AT_STEP, SERVES_WRONG, FAILS_AT_START, IGNORES, SERVES_SAME, SERVES)

#: Edits a copy of a good drafter folder in place; gets the target's folder.
Lie = Callable[[Path, Path], None]


@dataclass(frozen=True)
class Assumption:
    """One assumption of vLLM (the v0.32 line's release) about a drafter checkpoint, or a valid variant
    (``needle == ""``).

    Attributes:
        name: short name.
        reads: what upstream reads, with the file and function.
        upstream: what upstream does with ``lie``'s copy, in words; ``outcome`` is one of :data:`OUTCOMES`.
        lie: edits a copy of a good drafter folder in place (:data:`Lie`).
        needle: what inspect's message for the copy contains ("" for a valid variant: no problem at all).
        refused: whether ``vllm serve`` on the fork stops at start-up.
        layout: ``llama``, ``mla`` or ``any``: the drafter classes it applies to.
        fits: more conditions on (drafter config, target text config), if any.
        fix: what the fix of the finding that holds ``needle`` says ("" where nothing is refused).
    """

    name: str
    reads: str
    upstream: str
    outcome: str
    lie: Lie
    needle: str
    refused: bool
    layout: str = "any"
    fits: Callable[[dict, dict], bool] | None = None
    fix: str = ""

    @property
    def valid(self) -> bool:
        return not self.needle

    def applies(self, drafter: Path, target: Path) -> bool:
        """Whether the entry fits the drafter's class (``layout``) and ``fits``."""
        cfg = read_config(drafter)
        found = drafter_class(cfg)
        if self.layout != "any" and (found is None or found[1] != self.layout):
            return False
        return self.fits is None or self.fits(cfg, _target(target))


# -- editing a copy -------------------------------------------------------------------------------------------

_DROP = object()


def _target(target: Path) -> dict:
    return text_config(read_config(target))


def _weights(folder: Path) -> Path:
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1 or (folder / "model.safetensors.index.json").exists():
        raise KimiError(f"{folder}: the lies are written into a single model.safetensors, not {len(files)} files")
    return files[0]


def _config(**changes) -> Lie:
    """Set (or, with ``_DROP``, remove) config fields; a callable value gets (the original config, the target's
    text config)."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        values = {key: value(dict(cfg), _target(target)) if callable(value) else value
                  for key, value in changes.items()}
        for key, value in values.items():
            if value is _DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return lie


def _tensors(edit: Callable[[dict[str, RawTensor], dict, Path], None]) -> Lie:
    """Edit the tensors (a dict of :class:`RawTensor`, in place) with the drafter's config and the target folder."""
    def lie(folder: Path, target: Path) -> None:
        path = _weights(folder)
        tensors = read_all(path)
        edit(tensors, read_config(folder), target)
        write_all(path, tensors)
    return lie


def _both(*lies: Lie) -> Lie:
    def lie(folder: Path, target: Path) -> None:
        for one in lies:
            one(folder, target)
    return lie


def _ids(cfg: dict) -> list[int]:
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


def _drop(*names: str) -> Lie:
    def edit(tensors: dict, cfg: dict, target: Path) -> None:
        for name in names:
            tensors.pop(name, None)
    return _tensors(edit)


def _add_vector(name: str, width: Callable[[dict], int], one: bool) -> Lie:
    """Add a 1-D tensor ``name`` of ones (or zeros) in the dtype of ``norm.weight``."""
    def edit(tensors: dict, cfg: dict, target: Path) -> None:
        dtype = tensors["norm.weight"].dtype
        n = width(cfg)
        tensors[name] = RawTensor(dtype, (n,), _filled(dtype, n, one))
    return _tensors(edit)


def _not_default(field: str) -> Callable[[dict, dict], bool]:
    """The drafter's ``field`` differs from its config class default (so that leaving it out changes something)."""
    def fits(cfg: dict, target: dict) -> bool:
        known = DEFAULTS.get(cfg.get("model_type"))
        return known is not None and field in cfg and cfg[field] != known[1].get(field)
    return fits


def _hidden(cfg: dict) -> int:
    return cfg["hidden_size"]


def _target_hidden(cfg: dict) -> int:
    return cfg.get("target_hidden_size", cfg["hidden_size"])


def _fc_narrower(tensors: dict, cfg: dict, target: Path) -> None:
    """Cut the last input column of ``fc.weight``: its width is no longer a multiple of the target's hidden size."""
    fc = tensors["fc.weight"]
    rows, cols = fc.shape
    size = len(fc.data) // (rows * cols)
    data = b"".join(fc.data[r * cols * size:(r * cols + cols - 1) * size] for r in range(rows))
    tensors["fc.weight"] = RawTensor(fc.dtype, (rows, cols - 1), data)


def _d2t_outside(tensors: dict, cfg: dict, target: Path) -> None:
    offsets = _from_int64(tensors["d2t"].data)
    offsets[-1] += _target(target)["vocab_size"]
    tensors["d2t"] = RawTensor("I64", (len(offsets),), _int64(offsets))


def _vocab_at_top_d2t_id(folder: Path, target: Path) -> None:
    """Set ``vocab_size`` to the largest target id d2t maps to (draft id + offset), which is then out of range."""
    offsets = _from_int64(read_all(_weights(folder))["d2t"].data)
    _config(vocab_size=max(i + offset for i, offset in enumerate(offsets)))(folder, target)


def _d2t_shorter(tensors: dict, cfg: dict, target: Path) -> None:
    offsets = _from_int64(tensors["d2t"].data)[:-1]
    tensors["d2t"] = RawTensor("I64", (len(offsets),), _int64(offsets))


def _d2t_int32(tensors: dict, cfg: dict, target: Path) -> None:
    offsets = _from_int64(tensors["d2t"].data)
    tensors["d2t"] = RawTensor("I32", (len(offsets),), b"".join(v.to_bytes(4, "little", signed=True)
                                                                 for v in offsets))


def _identity_maps(tensors: dict, cfg: dict, target: Path) -> None:
    """A full-vocabulary drafter that still ships maps: an all-zero ``d2t`` and an all-true ``t2d``."""
    vocab = _target(target)["vocab_size"]
    tensors.pop("lm_head.weight", None)
    tensors["d2t"] = RawTensor("I64", (vocab,), _int64([0] * vocab))
    tensors["t2d"] = RawTensor("BOOL", (vocab,), b"\x01" * vocab)


def _t2d_empty(tensors: dict, cfg: dict, target: Path) -> None:
    t2d = tensors["t2d"]
    tensors["t2d"] = RawTensor("BOOL", t2d.shape, bytes(len(t2d.data)))


def _embed_narrow(tensors: dict, cfg: dict, target: Path) -> None:
    vocab, width = _target(target)["vocab_size"], cfg["hidden_size"] // 2
    dtype = tensors["norm.weight"].dtype
    tensors["embed_tokens.weight"] = RawTensor(dtype, (vocab, width), _filled(dtype, vocab * width, False))


def _embed_from_target(tensors: dict, cfg: dict, target: Path) -> None:
    """The target's own input embedding as the drafter's ``embed_tokens``."""
    for path in sorted(target.glob("*.safetensors")):
        found = read_all(path).get("model.embed_tokens.weight")
        if found is not None:
            tensors["embed_tokens.weight"] = found
            return
    raise KimiError(f"{target}: no model.embed_tokens.weight")


def _float32(tensors: dict, cfg: dict, target: Path) -> None:
    """Every bf16 tensor as float32 (exact: a bf16 value is the high half of its float32)."""
    for name, t in list(tensors.items()):
        if t.dtype == "BF16":
            data = b"".join(b"\x00\x00" + t.data[i:i + 2] for i in range(0, len(t.data), 2))
            tensors[name] = RawTensor("F32", t.shape, data)


def _wider_heads(tensors: dict, cfg: dict, target: Path) -> None:
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


def _head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _pinned_head_dim(cfg: dict, target: dict) -> object:
    """A Llama drafter's head_dim written out, so that a new hidden_size leaves it as it was (MLA has none)."""
    return _DROP if "kv_lora_rank" in cfg else _head_dim(cfg)


def _as_layer_outputs(folder: Path, target: Path) -> None:
    """The vLLM ids rewritten as 'output of layer k' ids, where SpecForge writes them (nested, starting at 1)."""
    cfg = read_config(folder)
    ids = [i - 1 for i in _ids(cfg)]
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


def _shards(suffix: str, index: str | None) -> Lie:
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


def _stale_shard(indexed: bool) -> Lie:
    """Two shards (with their index when ``indexed``) and an extra file ``model-stale.safetensors`` left from an
    earlier save, holding an ``fc.weight`` for one more aux state."""
    def lie(folder: Path, target: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        fc = load_file(str(_weights(folder)))["fc.weight"]
        _shards("safetensors", SAFETENSORS_INDEX if indexed else None)(folder, target)
        stale = torch.cat([fc, fc[:, : fc.shape[1] // 3]], dim=1)
        save_file({"fc.weight": stale}, str(folder / "model-stale.safetensors"))
    return lie


def _index_missing_shard(folder: Path, target: Path) -> None:
    _shards("safetensors", SAFETENSORS_INDEX)(folder, target)
    (folder / "model-00002-of-00002.safetensors").unlink()


def _no_weights(folder: Path, target: Path) -> None:
    _weights(folder).unlink()


def _renamed(name: str) -> Lie:
    """The weight file renamed ``name`` (a suffix vLLM's loader does not glob)."""
    def lie(folder: Path, target: Path) -> None:
        path = _weights(folder)
        path.rename(folder / name)
    return lie


class _Opaque:
    """An object ``torch.load(weights_only=True)`` refuses to unpickle (what a pickled training state may hold)."""


def _bin_with_objects(folder: Path, target: Path) -> None:
    import torch

    torch.save({**_state(folder), "training_state": _Opaque()}, folder / "pytorch_model.bin")


def _lm_head_rows(tensors: dict, cfg: dict, target: Path) -> None:
    """An ``lm_head`` with half the rows ``draft_vocab_size`` gives (a head cut for another draft vocabulary)."""
    head = tensors["lm_head.weight"]
    rows, cols = head.shape
    size = len(head.data) // (rows * cols)
    tensors["lm_head.weight"] = RawTensor(head.dtype, (rows // 2, cols), head.data[:rows // 2 * cols * size])


def _both_ids(nested: Callable[[list[int]], list[int]]) -> Lie:
    """Keep the top-level ids and add nested ``eagle_config`` ids made from them by ``nested``."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        cfg["eagle_config"] = {**(cfg.get("eagle_config") or {}), IDS_FIELD: nested(_ids(cfg))}
        cfg.pop(CONVENTION_FIELD, None)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return lie


def _final_layer(convention: str) -> Lie:
    """The last aux id made the target's last layer output (vLLM id L), written in ``convention``: top-level
    ``layer_input``, nested SpecForge (``layer_output``, first id 1), or top-level with the convention stated."""
    def lie(folder: Path, target: Path) -> None:
        cfg = read_config(folder)
        layers = _target(target)["num_hidden_layers"]
        ids = [*_ids(cfg)[:-1], layers]
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


# -- the entries ----------------------------------------------------------------------------------------------

_IDS = ("eagle_aux_hidden_state_layer_ids (top level, else eagle_config's): v1/worker/gpu_model_runner.py "
        "GPUModelRunner._get_eagle3_aux_layers_from_config (V2: v1/worker/gpu/spec_decode/eagle/eagle3_utils.py "
        "get_eagle3_aux_layers_from_config); models/interfaces.py EagleModelMixin._set_aux_hidden_state_layers "
        "keeps sorted(set(ids))")
_FC = ("num_aux_hidden_states (else len(eagle_config ids), else 3) x target_hidden_size (else hidden_size) -> "
       "fc input width: llama_eagle3.py LlamaModel.__init__, deepseek_eagle3.py DeepseekV2Eagle3Model.__init__")
_LAYER = ("{field} -> the decoder layer's tensor shapes: llama_eagle3.py LlamaDecoderLayer.__init__ (llama.py "
          "LlamaAttention, LlamaMLP), deepseek_eagle3.py DeepseekV2Eagle3DecoderLayer.__init__; missing fields take "
          "the transformers config class defaults (LlamaConfig, DeepseekV3Config)")
_LOAD = ("load_weights of Eagle3LlamaForCausalLM / Eagle3DeepseekV2ForCausalLM -> models/utils.py AutoWeightsLoader; "
         "they return None, so model_loader/default_loader.py DefaultModelLoader.load_weights checks no missing "
         "tensor")
_VOCAB = ("draft_vocab_size (else vocab_size) -> lm_head rows and draft_id_to_target_id, built only when it differs "
          "from the target's vocabulary: Eagle3LlamaForCausalLM.__init__ / Eagle3DeepseekV2ForCausalLM.__init__")
_SHARE = ("v1/spec_decode/llm_base_proposer.py SpecDecodeBaseProposer._maybe_share_lm_head / "
          "_maybe_share_embeddings (V2: v1/worker/gpu/spec_decode/eagle/utils.py load_eagle_model)")
_WIDTH = ("vocab_size -> embed_tokens rows and the width compute_logits scatters the draft logits into: "
          "Eagle3LlamaForCausalLM.compute_logits, Eagle3DeepseekV2ForCausalLM.compute_logits")
_FILES = ("weight files: model_loader/default_loader.py DefaultModelLoader._prepare_weights (the first of "
          "*.safetensors, *.bin, *.pt that matches; model.safetensors.index.json filters the safetensors files; "
          "weight_utils.filter_files_not_needed_for_inference), weight_utils.pt_weights_iterator "
          "(torch.load(weights_only=True))")
_ROPE = ("max_position_embeddings, rope_scaling / rope_parameters: config/speculative.py "
         "_maybe_override_draft_max_position_embeddings raises max_position_embeddings to the target's "
         "max_model_len; layers/rotary_embedding/__init__.py get_rope sizes a YaRN cache from "
         "original_max_position_embeddings x factor")


ASSUMPTIONS: tuple[Assumption, ...] = (
    # aux layer ids
    Assumption("aux-ids-outside-target", _IDS,
               "an id past the target's last layer is never captured; the drafter's fc gets fewer states than it "
               "takes and the first draft step fails with a shape error", FAILS_AT_STEP,
               _config(**{IDS_FIELD: lambda c, t: [*_ids(c)[:-1], t["num_hidden_layers"] + 1]}),
               "outside the target's layers", True, fix="in vLLM's convention (the state entering layer k)"),
    Assumption("aux-ids-repeated", _IDS,
               "repeated ids are captured once (sorted(set(ids))); fc gets fewer states and the first draft step "
               "fails with a shape error", FAILS_AT_STEP,
               _config(**{IDS_FIELD: lambda c, t: [*_ids(c)[:-1], _ids(c)[-2]]}), "repeat [", True,
               fix="write each layer the drafter was trained on once"),
    Assumption("aux-ids-fewer-than-fc", f"{_IDS}; {_FC}",
               "fc is sized from num_aux_hidden_states or eagle_config's ids, else 3, never from the top-level ids: "
               "it loads, the target captures fewer states and the first draft step fails with a shape error",
               FAILS_AT_STEP, _config(**{IDS_FIELD: lambda c, t: _ids(c)[:-1], "num_aux_hidden_states": _DROP}),
               "but the drafter's fc takes", True, fix="ids the drafter's fc was trained on"),
    Assumption("aux-ids-not-integers", _IDS,
               "string ids match no layer index: no state is captured and the first draft step fails",
               FAILS_AT_STEP, _config(**{IDS_FIELD: lambda c, t: [str(i) for i in _ids(c)]}),
               "must be a non-empty list of integer layer ids", True, fix="write the ids as a JSON list of integers"),
    Assumption("aux-ids-output-convention", _IDS,
               "SpecForge's nested 'output of layer k' ids are read literally: every state comes from one layer "
               "too early and the acceptance collapses (vllm#50170, #43671)", SERVES_WRONG, _as_layer_outputs,
               "are 'output of layer k'", False),
    Assumption("num-aux-hidden-states-disagrees", _FC,
               "fc is built for num_aux_hidden_states states, not for the ids': shape error at load",
               FAILS_AT_LOAD, _config(num_aux_hidden_states=lambda c, t: len(_ids(c)) + 1),
               "sizes the drafter's fc for", False),
    # widths
    Assumption("target-hidden-size", _FC,
               "fc is built for the stated target width, the checkpoint's fc for the real one: shape error at load",
               FAILS_AT_LOAD, _config(target_hidden_size=lambda c, t: 2 * _target_hidden(c)),
               "expects target hidden states of width", True, fix="use the drafter made for this target (hidden size"),
    Assumption("hidden-size", _LAYER.format(field="hidden_size"),
               "every layer is built for the stated width: shape error at load", FAILS_AT_LOAD,
               _config(hidden_size=lambda c, t: 2 * c["hidden_size"], target_hidden_size=lambda c, t: _target_hidden(c),
                       head_dim=_pinned_head_dim),
               "(hidden_size)", True, fix="in config.json the values the tensors were made with"),
    Assumption("hidden-size-absent", _LAYER.format(field="hidden_size"),
               "silent default (LlamaConfig 4096, DeepseekV3Config 7168), then a shape error at load",
               FAILS_AT_LOAD, _config(target_hidden_size=lambda c, t: _target_hidden(c),
                                      head_dim=_pinned_head_dim, hidden_size=_DROP),
               "hidden_size is not in config.json", True, fits=_not_default("hidden_size"),
               fix="write hidden_size in the drafter's config.json"),
    Assumption("intermediate-size", _LAYER.format(field="intermediate_size"),
               "the MLP is built for the stated width; the weight loaders cut a wider checkpoint tensor down to it "
               "without a word (a narrower one fails at load)", SERVES_WRONG,
               _config(intermediate_size=lambda c, t: c["intermediate_size"] - 64),
               "(intermediate_size, hidden_size)", True, fix="make hidden_size, intermediate_size in config.json"),
    Assumption("num-key-value-heads", _LAYER.format(field="num_key_value_heads (else num_attention_heads)"),
               "k/v projections are built for the stated heads; QKVParallelLinear.weight_loader keeps the first rows "
               "of the checkpoint's wider k/v without a word", SERVES_WRONG,
               _config(num_key_value_heads=lambda c, t: max(1, c["num_attention_heads"] // 2)),
               "(num_key_value_heads x head_dim", True, LLAMA, fix="num_key_value_heads in config.json the values"),
    Assumption("head-dim", _LAYER.format(field="head_dim (else hidden_size / num_attention_heads)"),
               "q/k/v/o are built for the stated head_dim: shape error at load", FAILS_AT_LOAD,
               _config(head_dim=lambda c, t: 2 * _head_dim(c)), "x head_dim", True, LLAMA, fix="head_dim"),
    Assumption("kv-lora-rank", _LAYER.format(field="kv_lora_rank"),
               "the MLA projections are built for the stated rank: shape error at load", FAILS_AT_LOAD,
               _config(kv_lora_rank=lambda c, t: c["kv_lora_rank"] // 2), "kv_lora_rank", True, MLA,
               fix="kv_lora_rank"),
    Assumption("q-lora-rank-absent", _LAYER.format(field="q_lora_rank"),
               "silent default (DeepseekV3Config 1536), then a shape error at load", FAILS_AT_LOAD,
               _config(q_lora_rank=_DROP), "q_lora_rank is not in config.json", True, MLA, _not_default("q_lora_rank"),
               fix="write q_lora_rank in the drafter's config.json"),
    Assumption("num-hidden-layers", f"num_hidden_layers -> decoder layers built; {_LOAD}",
               "the extra layer is built and served uninitialised, without an error", SERVES_WRONG,
               _config(num_hidden_layers=lambda c, t: c.get("num_hidden_layers", 1) + 1), "no tensors for layer",
               True, fix="write num_hidden_layers as the number of decoder layers"),
    Assumption("num-hidden-layers-absent", f"num_hidden_layers -> decoder layers built; {_LOAD}",
               "silent default (LlamaConfig 32, DeepseekV3Config 61 layers), all but the first served "
               "uninitialised", SERVES_WRONG, _config(num_hidden_layers=_DROP), "num_hidden_layers is not in config",
               True, fits=_not_default("num_hidden_layers"),
               fix="write num_hidden_layers as the number of decoder layers"),
    # vocabulary
    Assumption("draft-vocab-size", _VOCAB, "lm_head and d2t are built for the stated size: shape error at load",
               FAILS_AT_LOAD, _config(draft_vocab_size=lambda c, t: 2 * c["draft_vocab_size"]),
               "(draft_vocab_size, hidden_size)", True, fix="write draft_vocab_size: "),
    Assumption("draft-vocab-size-absent", _VOCAB,
               "silent default to vocab_size: lm_head is built for the full vocabulary, no draft-to-target map: "
               "fails at load", FAILS_AT_LOAD, _config(draft_vocab_size=_DROP),
               "draft_vocab_size is not in config.json", True, fix="write draft_vocab_size: "),
    Assumption("vocab-size", _WIDTH, "d2t's target ids past vocab_size fail the first draft step (index error)",
               FAILS_AT_STEP, _vocab_at_top_d2t_id, "but the drafter's vocab_size is", True,
               fits=lambda c, t: c.get("draft_vocab_size", t["vocab_size"]) < t["vocab_size"],
               fix="set the drafter's vocab_size to the target's"),
    Assumption("d2t-absent", f"{_VOCAB}; {_LOAD}",
               "draft_id_to_target_id stays all zeros: draft id i is proposed as target id i, without an error",
               SERVES_WRONG, _drop("d2t"), "no d2t tensor", True, fix="ship the drafter's d2t"),
    Assumption("d2t-outside-target", "d2t -> draft_id_to_target_id: Eagle3LlamaForCausalLM.compute_logits scatters "
               "the draft logits to draft id + d2t", "an index past the target vocabulary fails the first draft step",
               FAILS_AT_STEP, _tensors(_d2t_outside), "outside the target vocabulary", True,
               fix="use the drafter made for this target's vocabulary"),
    Assumption("d2t-length", _VOCAB, "draft_id_to_target_id has draft_vocab_size entries: shape error at load",
               FAILS_AT_LOAD, _tensors(_d2t_shorter), "d2t has", True, fix="else ship the d2t made with this lm_head"),
    Assumption("d2t-without-draft-vocabulary", _VOCAB,
               "no draft_id_to_target_id is built for a full vocabulary; loading d2t fails (\"There is no module "
               "or parameter named 'draft_id_to_target_id'\")", FAILS_AT_LOAD,
               _both(_config(draft_vocab_size=lambda c, t: t["vocab_size"]), _tensors(_identity_maps)),
               "a d2t tensor although the draft vocabulary is the target's", True, fix="remove d2t and t2d"),
    Assumption("t2d-inconsistent", "t2d: skipped by both classes' load_weights (\"t2d\" in name: continue)",
               "never read", IGNORES, _tensors(_t2d_empty), "t2d marks 0 target ids",
               False),
    Assumption("lm-head-absent", f"lm_head.weight; {_SHARE}",
               "the target's lm_head is put on the drafter and LogitsProcessor keeps its first draft_vocab_size rows: "
               "wrong drafts, without an error", SERVES_WRONG, _drop("lm_head.weight"),
               "no lm_head.weight but a draft vocabulary", True, fix="ship the drafter's own lm_head.weight"),
    Assumption("embed-tokens-shape", f"embed_tokens.weight: vocab_size x hidden_size; {_SHARE}",
               "shape error at load", FAILS_AT_LOAD, _tensors(_embed_narrow), "embed_tokens.weight is", True,
               fix="leave embed_tokens out"),
    # tensors
    Assumption("tensor-absent", _LOAD, "served uninitialised, without an error", SERVES_WRONG,
               _drop("midlayer.mlp.down_proj.weight"), "no midlayer.mlp.down_proj.weight", True,
               fix="ship the missing tensors"),
    Assumption("tensor-unknown", _LOAD,
               "fails at load (\"There is no module or parameter named ...\")", FAILS_AT_LOAD,
               _add_vector("midlayer.self_attn.rotary_scale.weight", _hidden, True), "have no parameter in vLLM's",
               True, fix="remove those tensors, or rename them"),
    Assumption("bias-dropped", f"attention_bias / mlp_bias; {_LOAD}: names ending in .bias without a parameter "
               "are ignored (ignore_unexpected_suffixes)", "dropped without a word", IGNORES,
               _add_vector("midlayer.self_attn.o_proj.bias", _hidden, True), "holds non-zero values", True,
               fix="set attention_bias in config.json"),
    Assumption("fc-absent", f"fc.weight; {_LOAD}", "fc served uninitialised, without an error", SERVES_WRONG,
               _drop("fc.weight"), "no fc.weight tensor", True, fix="ship the EAGLE-3 drafter's fc.weight"),
    Assumption("fc-width", _FC, "shape error at load", FAILS_AT_LOAD, _tensors(_fc_narrower),
               "does not take a whole number of", True, fix="its fc takes k states of the target's hidden size"),
    Assumption("input-norm-dropped", "norm_before_fc (top level or eagle_config): llama_eagle3.py "
               "Eagle3LlamaForCausalLM.load_weights maps input_norm.* to nothing without it",
               "dropped without a word", IGNORES,
               _add_vector("input_norm.weight", lambda c: 3 * _target_hidden(c), True), "norm_before_fc is not set",
               True, LLAMA, fix="set norm_before_fc in config.json"),
    Assumption("rope-yarn-short", _ROPE,
               "no error: positions past original_max_position_embeddings x factor index past the drafter's "
               "cos/sin cache", SERVES_WRONG, _config(max_position_embeddings=128, rope_scaling={
                   "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}),
               "RoPE (yarn) covers 128 positions", True, fix="serve with a --max-model-len the drafter's RoPE covers"),
    # weight files
    Assumption("weights-absent", _FILES, "\"Cannot find any model weights\" after the target's weights have loaded",
               FAILS_AT_LOAD, _no_weights, "no weight file vLLM reads", True,
               fix="ship the drafter's weights beside config.json"),
    Assumption("weights-other-format", _FILES, "a model.pth is not globbed: \"Cannot find any model weights\" after "
               "the target's weights have loaded", FAILS_AT_LOAD, _renamed("model.pth"),
               "model.pth, which vLLM's loader does not read", True, fix="save the weights as model.safetensors"),
    Assumption("weights-bin-with-objects", _FILES, "torch.load(weights_only=True) refuses the pickled object after "
               "the target's weights have loaded", FAILS_AT_LOAD, _bin_with_objects,
               "torch.load(weights_only=True), as vLLM loads it, refuses it", True,
               fix="save the state dict as safetensors"),
    Assumption("weights-index-missing-shard", _FILES, "FileNotFoundError (\"Weight files referenced in index but "
               "missing\") after the target's weights have loaded", FAILS_AT_LOAD, _index_missing_shard,
               "missing from", True, fix="add the missing shards"),
    Assumption("weights-stale-shard", _FILES, "both fc.weight copies are loaded in turn: a shape error after the "
               "target's weights have loaded", FAILS_AT_LOAD, _stale_shard(indexed=False),
               "written in more than one weight file: fc.weight in", True, fix="delete the stale file"),
    Assumption("weights-bin-fc-shape", f"{_FILES}; {_FC}", "a bare AssertionError in the fc's weight loader after "
               "the target's weights have loaded", FAILS_AT_LOAD, _both(_tensors(_fc_narrower),
                                                                        as_torch("pytorch_model.bin")),
               "does not take a whole number of", True, fix="its fc takes k states of the target's hidden size"),
    Assumption("weights-bin-lm-head-rows", f"{_FILES}; {_VOCAB}", "shape error at load, after the target's weights",
               FAILS_AT_LOAD, _both(_tensors(_lm_head_rows), as_torch("pytorch_model.bin")), "lm_head.weight is",
               True, fix="write draft_vocab_size: "),
    # sources that disagree, fields vLLM needs
    Assumption("aux-ids-two-sources-disagree", _IDS, "the top-level ids are served and the nested ones ignored "
               "without a word", SERVES, _both_ids(lambda ids: [1, *ids[:-1]]), "name different layers", True,
               fix="keep the ids the drafter was trained on in one place"),
    Assumption("architectures-absent", "architectures: config/model.py ModelConfig (the model registry) -> "
               "EAGLEConfig renames it Eagle3*", "\"Model architectures [...] are not supported\" with every class "
               "vLLM has, at start-up", FAILS_AT_START, _config(architectures=_DROP), "no architectures in config.json",
               True, fix="write architectures: ["),
    Assumption("draft-vocab-larger-than-target", _VOCAB, "lm_head and its map are built for more ids than the "
               "target has: shape error at load", FAILS_AT_LOAD,
               _both(_drop("d2t", "t2d"), _config(draft_vocab_size=lambda c, t: t["vocab_size"] + 64)),
               "is larger than the target's", True, fix="use the drafter made for this target"),
    # valid variants: must not be refused
    Assumption("weights-bin", _FILES, "pytorch_model.bin is read with torch.load(weights_only=True)", SERVES_SAME,
               as_torch("pytorch_model.bin"), "", False),
    Assumption("weights-pt", _FILES, "model.pt is read when there is no *.safetensors or *.bin", SERVES_SAME,
               as_torch("model.pt"), "", False),
    Assumption("weights-sharded-index", _FILES, "the shards the index lists", SERVES_SAME,
               _shards("safetensors", SAFETENSORS_INDEX), "", False),
    Assumption("weights-sharded-no-index", _FILES, "every *.safetensors", SERVES_SAME, _shards("safetensors", None),
               "", False),
    Assumption("weights-bin-sharded", _FILES, "every *.bin (their index is not read)", SERVES_SAME,
               _shards("bin", "pytorch_model.bin.index.json"), "", False),
    Assumption("weights-index-stale-shard", _FILES, "a shard the index does not list is not read", SERVES_SAME,
               _stale_shard(indexed=True), "", False),
    Assumption("aux-ids-final-layer", _IDS, "id L is the output of the last layer, captured after the layer loop "
               "(vllm#46973)", SERVES, _final_layer("layer_input"), "", False),
    Assumption("aux-ids-final-layer-specforge", _IDS, "SpecForge's L-1 ('output of layer k', nested) is vLLM's L: "
               "the fork translates it", SERVES, _final_layer("specforge"), "", False),
    Assumption("aux-ids-final-layer-stated-output", _IDS, "top-level L-1 with the convention stated layer_output is "
               "vLLM's L", SERVES, _final_layer("layer_output"), "", False),
    Assumption("aux-ids-two-sources-agree", _IDS, "top-level ids and SpecForge-style nested ids naming the same "
               "layers: the top-level ones are served", SERVES_SAME, _both_ids(lambda ids: [i - 1 for i in ids]),
               "", False),
    Assumption("lm-head-shared", f"{_VOCAB}; {_SHARE}",
               "a full-vocabulary drafter without lm_head, d2t or t2d gets the target's lm_head", SERVES,
               _both(_drop("lm_head.weight", "d2t", "t2d"),
                     _config(draft_vocab_size=lambda c, t: t["vocab_size"])), "", False),
    Assumption("embed-tokens-own", f"embed_tokens.weight; {_SHARE}",
               "its own embed_tokens equal to the target's: shared, as without one", SERVES_SAME,
               _tensors(_embed_from_target), "", False,
               fits=lambda cfg, target: cfg.get("hidden_size") == target.get("hidden_size")),
    Assumption("extra-config-keys", "config.json keys no drafter class reads (tie_word_embeddings, torch_dtype: "
               "the drafter runs in the target's dtype, config/speculative.py)", "ignored", SERVES_SAME,
               _config(tie_word_embeddings=True, torch_dtype="float16", transformers_version="4.57.1",
                       use_cache=True, training={"epochs": 3, "lr": 1e-4}), "", False),
    Assumption("head-dim-own", _LAYER.format(field="head_dim"),
               "a head_dim other than hidden_size / num_attention_heads, with tensors to match", SERVES,
               _both(_tensors(_wider_heads), _config(head_dim=lambda c, t: 2 * _head_dim(c))), "", False, LLAMA),
    Assumption("bias-zero", f"{_LOAD}: .bias names without a parameter are ignored",
               "an all-zero bias is dropped, which changes nothing", SERVES_SAME,
               _add_vector("midlayer.self_attn.o_proj.bias", _hidden, False), "", False),
    Assumption("t2d-absent", "t2d: never read", "served as the original", SERVES_SAME, _drop("t2d"), "", False),
    Assumption("aux-ids-unsorted", _IDS, "the states are captured in layer order whatever the ids' order",
               SERVES_SAME, _config(**{IDS_FIELD: lambda c, t: list(reversed(_ids(c)))}), "", False),
    Assumption("vocab-size-larger", _WIDTH, "a vocab_size above the target's only widens the -inf logits row",
               SERVES_SAME, _config(vocab_size=lambda c, t: 2 * t["vocab_size"]), "", False),
    Assumption("weights-float32", "tensor dtypes: default_weight_loader copies into the drafter's parameters, in "
               "the target's dtype", "float32 copies of bf16 weights load to the same values", SERVES_SAME,
               _tensors(_float32), "", False),
    Assumption("d2t-int32", "d2t dtype: copied into the int64 draft_id_to_target_id", "same offsets", SERVES_SAME,
               _tensors(_d2t_int32), "", False),
    Assumption("rope-yarn-long", _ROPE,
               "a YaRN drafter whose max_position_embeddings is short but whose factor covers the context",
               SERVES, _config(max_position_embeddings=128, rope_scaling={
                   "rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 128}), "", False),
)


def entries(drafter: Path, target: Path) -> list[Assumption]:
    """The entries of :data:`ASSUMPTIONS` that apply to the good drafter folder ``drafter`` and ``target``."""
    return [entry for entry in ASSUMPTIONS if entry.applies(drafter, target)]


def make_copy(entry: Assumption, drafter: Path, target: Path, dest: Path) -> Path:
    """Copy the good drafter folder to ``dest`` and apply the entry's ``lie`` there; returns ``dest``.

    Raises:
        KimiError: the drafter is not a single-file checkpoint with top-level aux ids.
    """
    shutil.copytree(drafter, dest)
    entry.lie(dest, target)
    return dest


def message(report) -> str:
    """What inspect says about a copy: its problems and notes, joined ('' when it says nothing)."""
    return "; ".join(report.problems + report.notes)


def assumption_table(drafter: Path, target: Path) -> list[dict]:
    """One row per entry for a good drafter folder and its target folder.

    Rows: ``name``, ``reads``, ``upstream_behaviour`` (outcome: detail), ``message`` (``kimi drafter
    inspect``'s problems and notes for the lying copy, or why it cannot read it; '' when it says nothing), ``valid``
    (a valid variant),
    ``refused`` (whether ``vllm serve`` on the fork stops, by the same findings).

    Raises:
        KimiError: unreadable folders, or a drafter the lies cannot be written into (see :func:`make_copy`).
    """
    from kimi.drafter.serve_checks import SERVE_BLOCKING

    rows = []
    with tempfile.TemporaryDirectory(prefix="kimi-assumptions-") as tmp:
        for entry in entries(drafter, target):
            try:
                report = inspect(make_copy(entry, drafter, target, Path(tmp) / entry.name), target)
            except KimiError as exc:  # weight files it cannot read: refused as they are
                said, refused = str(exc), True
            else:
                said, refused = message(report), bool(report.blocking(SERVE_BLOCKING))
            rows.append({"name": entry.name, "reads": entry.reads,
                         "upstream_behaviour": f"{entry.outcome}: {entry.upstream}", "message": said,
                         "valid": entry.valid, "refused": refused})
    return rows
