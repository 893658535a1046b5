"""Kimi-K2.5 image requests with EAGLE-3: what the drafter reads at image positions, and lossless output.

Two checks over the reference Kimi-K2.5 wrapper (``kimi models make``: ``kimi-k25/``, a random vision tower,
placeholder ``<|media_pad|>`` = id 2) and each drafter style (``drafter-llama``, ``drafter-mla``):

* :func:`drafter_inputs`: one engine, requests one at a time, the rows the drafter read at every image
  position against the target's (:mod:`kimi.e2e.draft_inputs`), per scenario: a whole prefill, prefix-cache
  hits that start inside and after the image, a chunked prefill that splits the image, and a chunk that ends
  right before the image;
* :func:`lossless`: greedy output with EAGLE-3 against the same engine settings without speculation, per
  scenario: one image, two images in one request, a batch mixing text-only and image requests, an image in a
  later turn of a conversation whose earlier turn is in the prefix cache, an image whose tokens cross a chunk
  boundary (``max_num_batched_tokens`` 32).

Both run vLLM in this process (import vLLM, torch and PIL when called).  ``benchmarks/multimodal.py`` writes
their results (:func:`write_results`); ``tests/test_multimodal_drafter.py`` asserts on them.
"""

from __future__ import annotations

from functools import partial

from kimi.e2e.engine import close_engine, model_runner
from kimi.e2e.presets import CPU_EAGER, GPU_E2E
from kimi.models.kimi_k25 import MEDIA_TOKEN
from kimi_lab.bench.results import header, write_json, write_lines

#: The CPU engine of the checks: float32, eager, a 32-token KV block so that prefix-cache hits fall inside and
#: after a 64-token image (EAGLE keeps the last matched block out of a hit: a hit ends 32 tokens early).
ENGINE = {**CPU_EAGER, "max_model_len": 512, "kv_cache_memory_bytes": 256 << 20, "block_size": 32,
          "enable_prefix_caching": True}
#: The GPU engine of the checks: bfloat16, the same KV blocks and prefix caching, CUDA graphs on (vLLM's default
#: there, V2 model runner) for a few batch sizes only, to keep each engine's start short. Hopper's MLA backend
#: (FLASH_ATTN_MLA) takes 32-token blocks as two kernel blocks of 16.
GPU_ENGINE = {**GPU_E2E, "block_size": 32, "enable_prefix_caching": True,
              "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8]}}
#: Prefill chunks of 32 tokens (a 64-token image spans at least two chunks), added to either engine.
CHUNK = {"max_num_batched_tokens": 32}
#: The CPU engine prefilling in chunks (:data:`CHUNK`).
CHUNKED = {**ENGINE, **CHUNK}
#: One plain 224 x 224 image per color: 16 x 16 patches of 14 pixels merged 2 x 2, 64 image tokens.
COLORS = ("red", "blue", "green", "white")
K = 3
TOKENS = 16


def image(color: str):
    """A plain 224 x 224 RGB image (PIL)."""
    from PIL import Image

    return Image.new("RGB", (224, 224), color)


def image_request(prompt: str, colors: tuple[str, ...]) -> dict:
    """A vLLM prompt dict: ``prompt`` (holding one ``<|media_pad|>`` per image) and its images, in order."""
    assert prompt.count(MEDIA_TOKEN) == len(colors), (prompt, colors)
    return {"prompt": prompt, "multi_modal_data": {"vision_chunk": [{"type": "image", "image": image(c)}
                                                                     for c in colors]}}


def prefix_of(tokenizer, text: str, tokens: int) -> str:
    """The shortest start of ``text`` after which the placeholder sits at position ``tokens`` (BOS counted).

    Raises:
        ValueError: no start of ``text`` gives that position.
    """
    media_id = tokenizer.convert_tokens_to_ids(MEDIA_TOKEN)
    for n in range(1, len(text) + 1):
        ids = tokenizer(text[:n] + MEDIA_TOKEN).input_ids
        if ids.index(media_id) == tokens:
            return text[:n]
    raise ValueError(f"no start of the text puts the image at position {tokens}")


def prompts(tokenizer) -> dict[str, str]:
    """The prompts of the checks (text around placeholders, from held-out code): ``short`` (about 80 tokens with
    its image, a hit inside the image), ``long`` (about 160, a hit after it), ``at_chunk`` (the image starts at
    position 32, a chunk boundary of :data:`CHUNKED`), ``two`` (two images) and ``text`` (no image)."""
    from kimi.models.prompts import code_prompts

    code = code_prompts(4)
    return {"short": f"# an image: {MEDIA_TOKEN}\ndef describe(image):\n",
            "long": f"# an image: {MEDIA_TOKEN}\n{code[1]}",
            "at_chunk": f"{prefix_of(tokenizer, code[0], 32)}{MEDIA_TOKEN}\ndef describe(image):\n",
            "two": f"# before: {MEDIA_TOKEN}\n# after: {MEDIA_TOKEN}\ndef diff(a, b):\n",
            "text": code[2]}


def _params(logprobs: int | None = None):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=logprobs)


def _engine(target: str, drafter: str | None, engine: dict):
    from vllm import LLM

    spec = {"method": "eagle3", "model": drafter, "num_speculative_tokens": K} if drafter else None
    return LLM(model=target, speculative_config=spec, disable_log_stats=False, **engine)


def settings(device: str, chunked: bool = False, eager: bool = False) -> dict:
    """The ``LLM`` settings of a check on ``device`` ("cpu": :data:`ENGINE`, always eager; "gpu":
    :data:`GPU_ENGINE`, eager when ``eager``), prefilling in chunks (:data:`CHUNK`) when ``chunked``.

    Raises:
        ValueError: ``device`` is neither.
    """
    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be cpu or gpu, not {device!r}")
    base = ENGINE if device == "cpu" else {**GPU_ENGINE, **({"enforce_eager": True} if eager else {})}
    return {**base, **(CHUNK if chunked else {})}


def drafter_inputs(target: str, drafter: str, chunked: bool = False, device: str = "cpu") -> dict:
    """The drafter's rows at image positions against the target's, per scenario, on one engine.

    ``chunked`` False (:data:`ENGINE`): ``prefill`` (``short``, cold), ``prefix_hit_inside`` (``short`` again:
    the hit ends inside the image), ``prefill_long`` and ``prefix_hit_after`` (``long`` twice: the hit ends
    after it). True (:data:`CHUNKED`): ``chunked`` (``short``: chunks split the image) and
    ``chunk_ends_before_image`` (``at_chunk``: the first chunk ends right before the image). On a GPU
    (``device`` "gpu") the engine is :data:`GPU_ENGINE` run eagerly (the hooks read modules that a CUDA graph
    would replay without calling).

    Returns:
        ``{"engine": {"model_runner": "v1"|"v2", "drafter": class name}, "scenarios": {name:
        :func:`kimi.e2e.draft_inputs.compare`'s dict plus "prompt_tokens" and "image_tokens"}}``.
    """
    from transformers import AutoTokenizer

    from kimi.e2e import draft_inputs

    tokenizer = AutoTokenizer.from_pretrained(target)
    media_id = tokenizer.convert_tokens_to_ids(MEDIA_TOKEN)
    texts = prompts(tokenizer)
    # a new image for each cold scenario: neither the encoder cache nor the prefix cache holds it yet
    plan = ([("chunked", "short", "green"), ("chunk_ends_before_image", "at_chunk", "white")] if chunked else
            [("prefill", "short", "red"), ("prefix_hit_inside", "short", "red"), ("prefill_long", "long", "blue"),
             ("prefix_hit_after", "long", "blue")])
    llm = _engine(target, drafter, settings(device, chunked, eager=True))
    try:
        installed = llm.collective_rpc(draft_inputs.install)[0]
        row = llm.collective_rpc(partial(draft_inputs.token_row, token_id=media_id))[0]
        out = {"engine": {"model_runner": model_runner(llm.llm_engine.vllm_config),
                          "drafter": installed["drafter"]}, "scenarios": {}}
        for name, key, color in plan:
            done = llm.generate([image_request(texts[key], (color,))], _params(), use_tqdm=False)
            records = llm.collective_rpc(draft_inputs.take)[0]
            ids = list(done[0].prompt_token_ids)
            result = draft_inputs.compare(records, ids, media_id, row)
            out["scenarios"][name] = {"prompt_tokens": len(ids), "image_tokens": ids.count(media_id), **result}
    finally:
        close_engine(llm)
    return out


def sees_target_embeddings(runs: list[dict]) -> bool:
    """True when, over :func:`drafter_inputs` results ``runs``, the drafter read image rows, every image row it
    read equalled the target's, and the target's own rows there were never the placeholder's (a prefix-cache
    hit may leave a scenario with none read: its rows came from the cached request)."""
    scenarios = [s for run in runs for s in run["scenarios"].values()]
    return sum(s["image_positions"] for s in scenarios) > 0 and all(
        s["image_equal"] == s["image_positions"] and s["image_target_is_placeholder"] == 0 for s in scenarios)


def lossless_requests(texts: dict[str, str]) -> dict[str, list[dict]]:
    """The lossless scenarios' requests (each list is one ``generate`` call, in this order on one engine):
    ``one_image``, ``two_images`` (one request), ``mixed_batch`` (two text-only and two image requests),
    ``chat_turn_1`` (a text-only first turn) then ``chat_turn_2_image`` (that turn, an answer and a second turn
    with an image: served from the prefix cache up to the new turn), ``image_across_chunks`` (run on
    :data:`CHUNKED`)."""
    turn_1 = f"# user:\n{texts['text']}\n"
    turn_2 = f"{turn_1}# assistant:\n    return None\n# user: and this one? {MEDIA_TOKEN}\ndef describe(image):\n"
    return {"one_image": [image_request(texts["short"], ("red",)), image_request(texts["long"], ("blue",))],
            "two_images": [image_request(texts["two"], ("red", "blue")),
                           image_request(texts["two"], ("green", "white"))],
            "mixed_batch": [{"prompt": texts["text"]}, image_request(texts["short"], ("green",)),
                            {"prompt": texts["long"].replace(MEDIA_TOKEN, "image")},
                            image_request(texts["long"], ("white",))],
            "chat_turn_1": [{"prompt": turn_1}],
            "chat_turn_2_image": [image_request(turn_2, ("green",))],
            "image_across_chunks": [image_request(texts["short"], ("red",)), image_request(texts["at_chunk"],
                                                                                           ("blue",))]}


def _greedy(llm, requests: list[dict], margins: bool) -> dict:
    """``{"tokens": per request its greedy tokens, "margins": per request and position the top-1 minus top-2
    logprob (only when ``margins``, else None)}``."""
    from kimi_lab.bench.gpu_e2e.job import margin

    outputs = llm.generate(requests, _params(2 if margins else None), use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outputs],
            "margins": [[margin(step) for step in o.outputs[0].logprobs] for o in outputs] if margins else None}


def _run_all(target: str, drafter: str | None, plan: dict[str, list[dict]], device: str) -> tuple[dict, dict]:
    """``({scenario: _greedy's dict or None}, {scenario: error or None})`` on the engine of ``device``
    (:func:`settings`) and the same prefilling in chunks (``image_across_chunks``), with ``drafter`` or without
    speculation (then with the margins); a failed call is kept as its error and counts as a crash."""
    tokens: dict = {}
    errors: dict = {}
    for chunked, names in ((False, [n for n in plan if n != "image_across_chunks"]),
                           (True, ["image_across_chunks"])):
        llm = _engine(target, drafter, settings(device, chunked))
        try:
            for name in names:
                try:
                    tokens[name], errors[name] = _greedy(llm, plan[name], margins=drafter is None), None
                except Exception as exc:  # recorded as a crash of this scenario
                    tokens[name], errors[name] = None, f"{type(exc).__name__}: {exc}"[:500]
        finally:
            close_engine(llm)
    return tokens, errors


def lossless(target: str, drafters: dict[str, str], device: str = "cpu") -> dict:
    """Greedy output with each drafter (``{style: folder}``) against the output without speculation, on the
    engines of ``device`` (:func:`settings`: CUDA graphs on a GPU).

    Returns:
        ``{scenario: {style: {"requests", "identical", "total", "crashes", "error", "first_divergence",
        "divergence_margins"}}}``: ``total`` the sequences compared, ``crashes`` 1 when the call failed (with
        speculation or in the baseline); for each sequence that differs the token index where it parts from
        the baseline and the baseline's top-1 minus top-2 logprob there (a near-tie flipped by numerics is a
        few hundredths; :func:`kimi_lab.bench.gpu_e2e.summary.compare`).
    """
    from transformers import AutoTokenizer

    from kimi_lab.bench.gpu_e2e.summary import compare

    plan = lossless_requests(prompts(AutoTokenizer.from_pretrained(target)))
    base, base_errors = _run_all(target, None, plan, device)
    out: dict = {name: {} for name in plan}
    for style, folder in drafters.items():
        spec, errors = _run_all(target, folder, plan, device)
        for name, requests in plan.items():
            a, b = spec[name], base[name]
            parts = compare(a["tokens"], b["tokens"], b["margins"]) if a is not None and b is not None else {}
            out[name][style] = {"requests": len(requests), "identical": parts.get("identical", 0),
                                "total": len(requests), "crashes": int(a is None or b is None),
                                "error": errors[name] or base_errors[name],
                                "first_divergence": parts.get("first_divergence"),
                                "divergence_margins": parts.get("divergence_margins")}
    return out


def write_results(out_dir, result: dict) -> None:
    """``multimodal.json`` and ``multimodal.md`` in ``out_dir`` (atomically): the checks' sections when ``result``
    holds them, then the ``image_acceptance`` section (``benchmarks/multimodal.py --tau``) when it holds that."""
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "multimodal.json", result)
    lines = _checks_lines(result) if "lossless" in result else ["# Kimi-K2.5 image requests with EAGLE-3"]
    if "image_acceptance" in result:
        from kimi_lab.bench.image_acceptance import markdown

        section = result["image_acceptance"]
        lines += ["", *markdown(section, section["snippets"]), "", f"- command: `{section['command']}`",
                  f"- date: {section['date']}", f"- device: {section['device']}", f"- vLLM: {section['vllm']}",
                  f"- seconds: {section['seconds']}"]
    write_lines(out_dir / "multimodal.md", lines)


def _checks_lines(result: dict) -> list[str]:
    lines = [*header("Kimi-K2.5 image requests with EAGLE-3", result["command"], result["date"]),
             f"- device: {result['device']}", f"- vLLM: {result['vllm']}",
             f"- drafter_sees_target_embeddings: {result['drafter_sees_target_embeddings']}", "",
             "## Lossless (greedy with EAGLE-3 = without)", "",
             ("| scenario | drafter | requests | identical / total | crashes | where they part (token index: "
              "baseline's top-1 minus top-2 logprob there) |"), "|---|---|---|---|---|---|"]
    for name, styles in result["lossless"].items():
        for style, r in styles.items():
            parts = ", ".join(f"{i}: {m}" for i, m in zip(r.get("first_divergence") or [],
                                                          r.get("divergence_margins") or [], strict=False))
            lines.append(f"| {name} | {style} | {r['requests']} | {r['identical']} / {r['total']} | {r['crashes']} "
                         f"| {parts} |")
    lines += ["", "## What the drafter read at image positions", "",
              ("| drafter | scenario | image positions read | equal to the target's | placeholder's | not read "
               "(cached) | positions not the target's |"), "|---|---|---|---|---|---|---|"]
    for style, runs in result["drafter_inputs"].items():
        for run in runs:
            for name, s in run["scenarios"].items():
                lines.append(f"| {style} ({run['engine']['model_runner']}) | {name} | {s['image_positions']} | "
                             f"{s['image_equal']} | {s['image_placeholder']} | {s['image_not_read']} | "
                             f"{', '.join(map(str, s.get('image_unequal_at') or []))} |")
    histories = [(style, name, position, passes) for style, runs in result["drafter_inputs"].items() for run in runs
                 for name, s in run["scenarios"].items()
                 for position, passes in (s.get("image_unequal_history") or {}).items()]
    if histories:
        lines += ["", ("Where a drafter row was not the target's, every drafter pass that recorded one there (pass "
                       "index: rows from first position, KV slot, the row read):"), ""]
        lines += [f"- {style} {name}, position {position}: " + "; ".join(
            f"pass {h['pass']}: {h['pass_rows']} from {h['pass_first']}, slot {h['slot']}, {h['row']}" for h in passes)
            for style, name, position, passes in histories]
    return lines
