"""Stage b, capture: the target's aux hidden states at the served ids, and its final hidden state, via vLLM.

The fork's vLLM computes the aux states itself: the DeepSeek-V3 model of vLLM (``deepseek_v2.py``,
SupportsEagle3) appends ``hidden_states + residual`` entering each layer in ``aux_hidden_state_layers`` -
the ``layer_input`` convention the server uses. This stage sets exactly those ids on the target's model
inside an in-process engine, prefills every sample (one output token), and keeps the model's outputs:
``aux`` = the states concatenated in layer order [T, num_aux * H] and ``final`` = the normed last hidden
state that the LM head reads [T, H]. Rows are matched to samples by their token ids, so the scheduler's
batching and chunking cannot mislabel them.

Shards of about ``shard_mb`` MB are written as they fill (memory stays bounded by one shard) and
listed in ``capture/index.json``; an interrupted capture resumes after the last finished shard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kimi.drafter.conventions import check_ids, default_ids
from kimi.errors import KimiError
from kimi.train.engine import engine_settings, say
from kimi.train.store import read_json, read_samples, write_json, write_shard

DTYPES = ("bfloat16", "float16", "float32")


def target_shape(target: str) -> tuple[int, int]:
    """(num_hidden_layers, hidden_size) of a target folder (text config of a multimodal wrapper too)."""
    config = json.loads((Path(target) / "config.json").read_text())
    text = config.get("text_config", config)
    return int(text["num_hidden_layers"]), int(text["hidden_size"])


def resolve_ids(target: str, ids: list[int] | None) -> tuple[int, ...]:
    """The aux ids to capture (vLLM's convention), sorted: given ones, else vLLM's defaults for the target."""
    layers, _ = target_shape(target)
    chosen = tuple(sorted(ids)) if ids else default_ids(layers)
    problems = check_ids(chosen, layers, None)
    if problems:
        raise KimiError("; ".join(problems))
    return chosen


def bytes_per_token(num_aux: int, hidden: int, dtype: str) -> int:
    """Stored bytes per token: aux + final states, int64 id, uint8 mask (Kimi-K2, 3 aux, bf16: 57 353)."""
    itemsize = 4 if dtype == "float32" else 2
    return (num_aux + 1) * hidden * itemsize + 9


class _Sink:
    """Collects prefilled rows per sample. ``expected`` are the ``(index, token ids)`` still to come, in any order
    (V2's runner does not keep the submission order in its batch); ``done`` maps an index to its rows."""

    def __init__(self) -> None:
        self.expected: list[tuple[int, list[int]]] = []
        self.open: list[dict] = []
        self.done: dict[int, dict] = {}

    def take(self, input_ids, positions, aux, final) -> None:
        import torch

        pos = positions.tolist()
        starts = [i for i in range(len(pos)) if i == 0 or pos[i] != pos[i - 1] + 1] + [len(pos)]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            ids = input_ids[a:b].tolist()
            if pos[a] == 0:  # a sequence's first chunk: the expected one it starts (a whole sample before one it
                # is a prefix of); the capture engine does not chunk a prefill (max_num_batched_tokens >= the longest)
                matches = [i for i, (_, want) in enumerate(self.expected) if want[:len(ids)] == ids]
                at = next((i for i in matches if len(self.expected[i][1]) == len(ids)), matches[0] if matches else None)
                if at is None:
                    raise KimiError("capture: the engine prefilled a sequence that was not asked for")
                index, want = self.expected.pop(at)
                self.open.append({"index": index, "want": want, "ids": [], "aux": [], "final": []})
            seq = next((s for s in self.open if len(s["ids"]) == pos[a]
                        and s["want"][pos[a]:pos[a] + len(ids)] == ids), None)
            if seq is None:
                raise KimiError(f"capture: rows at position {pos[a]} match no open sequence")
            seq["ids"] += ids
            seq["aux"].append(aux[a:b].float().cpu())
            seq["final"].append(final[a:b].float().cpu())
            if len(seq["ids"]) >= len(seq["want"]):
                n = len(seq["want"])
                self.open.remove(seq)
                self.done[seq["index"]] = {"aux": torch.cat(seq["aux"])[:n], "final": torch.cat(seq["final"])[:n]}


def _install(model, ids: tuple[int, ...], sink: _Sink) -> None:
    """Make ``model.model`` (vLLM's DeepseekV2Model) compute aux states at ``ids`` and hand rows to ``sink``."""
    import torch

    inner = model.model
    inner.aux_hidden_state_layers = ids
    original = inner.forward

    def forward(input_ids, positions, *args, **kwargs):
        out = original(input_ids, positions, *args, **kwargs)
        hidden, aux = out
        n = positions.shape[-1]
        sink.take(input_ids[:n], positions[:n], torch.cat(aux, -1)[:n], hidden[:n])
        return hidden

    inner.forward = forward


def _make_llm(target: str, max_len: int):
    """An in-process engine (one process: the capture hook's rows stay here), eager, no prefix cache."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    settings = engine_settings(eager=True)
    settings["max_model_len"] = max(settings["max_model_len"], max_len + 1)
    return LLM(model=target, enable_prefix_caching=False, distributed_executor_backend="uni",
               max_num_batched_tokens=max(4096, max_len + 1), **settings)


def capture(work: Path, target: str, ids: list[int] | None = None, dtype: str = "bfloat16", shard_mb: int = 256,
            batch: int = 16) -> dict:
    """Capture every sample of ``work/samples.jsonl`` into ``work/capture``; returns the index.

    Raises:
        KimiError: no samples, ids that do not fit the target, or an index made with other ids/target.
    """
    import torch
    from tqdm import tqdm

    samples = read_samples(work / "samples.jsonl")
    if not samples:
        raise KimiError(f"no samples in {work / 'samples.jsonl'}: run `kimi train regenerate` first")
    chosen = resolve_ids(target, ids)
    _, hidden = target_shape(target)
    folder = work / "capture"
    index = read_json(folder / "index.json")
    header = {"target": str(Path(target).resolve()), "aux_layer_ids": list(chosen), "convention": "layer_input",
              "hidden": hidden, "dtype": dtype}
    if index and any(index.get(k) != v for k, v in header.items()):
        raise KimiError(f"{folder} was captured with {[index.get(k) for k in header]}, not {list(header.values())}; "
                        "use another --work folder or delete it")
    index = index or {**header, "shards": [], "sequences": 0, "tokens": 0}
    per_token = bytes_per_token(len(chosen), hidden, dtype)
    total_tokens = sum(len(s["input_ids"]) for s in samples)
    say(f"capture: {len(samples)} sequences, {total_tokens} tokens, {per_token / 1e3:.1f} KB per token "
        f"({len(chosen)} aux states at ids {list(chosen)} + the final state, {hidden} wide, {dtype}): "
        f"about {total_tokens * per_token / 1e6:.1f} MB in shards of {shard_mb} MB "
        f"(Kimi-K2, 7168 wide: {bytes_per_token(3, 7168, 'bfloat16') / 1e3:.0f} KB per token)")
    if index["sequences"] >= len(samples):
        say(f"capture: all {len(samples)} sequences captured already ({folder})")
        return index
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "index.json", index)
    llm = _make_llm(target, max(len(s["input_ids"]) for s in samples))
    sink = _Sink()
    llm.apply_model(lambda model: _install(model, chosen, sink))
    from vllm import SamplingParams

    store = getattr(torch, dtype)
    shard: list[tuple[dict, dict]] = []
    shard_rows, limit = 0, max(1, shard_mb * 1_000_000 // per_token)

    def flush() -> None:
        nonlocal shard, shard_rows
        name = f"shard-{len(index['shards']):05d}.safetensors"
        lengths = torch.tensor([len(s["input_ids"]) for s, _ in shard])
        write_shard(folder / name, {
            "aux": torch.cat([c["aux"] for _, c in shard]).to(store),
            "final": torch.cat([c["final"] for _, c in shard]).to(store),
            "input_ids": torch.tensor([t for s, _ in shard for t in s["input_ids"]], dtype=torch.int64),
            "loss_mask": torch.tensor([m for s, _ in shard for m in s["loss_mask"]], dtype=torch.uint8),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])})
        index["shards"].append({"file": name, "sequences": len(shard), "tokens": shard_rows})
        index["sequences"] += len(shard)
        index["tokens"] += shard_rows
        write_json(folder / "index.json", index)
        shard, shard_rows = [], 0

    params = SamplingParams(temperature=0, max_tokens=1)
    try:
        with tqdm(total=len(samples), initial=index["sequences"], desc="capture", unit="seq") as bar:
            for first in range(index["sequences"], len(samples), batch):
                chunk = samples[first:first + batch]
                sink.expected = [(i, s["input_ids"]) for i, s in enumerate(chunk)]
                llm.generate([{"prompt_token_ids": s["input_ids"]} for s in chunk], params, use_tqdm=False)
                if len(sink.done) != len(chunk):
                    raise KimiError(f"capture: {len(sink.done)} of {len(chunk)} sequences came back")
                for i, sample in enumerate(chunk):
                    shard.append((sample, sink.done[i]))
                    shard_rows += len(sample["input_ids"])
                sink.done = {}
                if shard_rows >= limit:
                    flush()
                bar.update(len(chunk))
            if shard:
                flush()
    finally:
        llm.llm_engine.engine_core.shutdown()
    say(f"capture: {index['sequences']} sequences, {index['tokens']} tokens in {len(index['shards'])} shards")
    return index
