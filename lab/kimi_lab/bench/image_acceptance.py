"""τ on image prompts with the target's image rows passed to the EAGLE-3 drafter, against the placeholder's.

The target is ``pair-k25`` (:mod:`kimi.models.pair_k25`: the shipped pair's target with a trained vision tower
that memorised images of held-in code lines), the drafter ``models/pair/drafter`` (k = 3). The prompts are the
tower's training snippets as images (``<|media_pad|>\\n``), the same lines as text (``a\\n``, through the same
wrapper: its text model is the pair's target) and a blank image (the control). Greedy, ``TOKENS`` tokens each.

Each mode runs in its own process (the fork's hook reads ``KIMI_DRAFT_IMAGE_EMBEDS`` when the engine loads), with
its own ``VLLM_CACHE_ROOT``: :func:`measure_modes` starts ``python -m kimi_lab.bench.image_acceptance MODE`` per
mode (``lab/`` first on its ``PYTHONPATH``), where :func:`measure` runs the engine and prints one JSON line:

* ``fork``: the fork's path (the drafter reads the target's image rows); also the image rows vLLM computed,
  read inside the engine (:mod:`kimi.e2e.draft_inputs`), against :func:`kimi.models.vision.image_rows`;
* ``upstream``: ``KIMI_DRAFT_IMAGE_EMBEDS=upstream`` (the drafter reads the placeholder's embedding);
* ``baseline``: the same engine without speculation (the lossless reference of both modes).

τ = 1 + accepted / drafts from vLLM's spec-decode counters, per prompt set (counters read before and after each
``generate``). Needs vLLM, torch and PIL (imported when called).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kimi.e2e.presets import CPU_EAGER, GPU_E2E
from kimi_lab import PATH as LAB_PATH

MODES = ("fork", "upstream", "baseline")
SETS = ("image", "text", "blank")
K = 3
TOKENS = 64
#: Engines per device: float32 on CPU (comparable numerics), bf16 on a GPU; eager on both, because the fork mode
#: reads the image rows with module hooks (:func:`rows_check`) that a compiled model never calls (τ does not
#: depend on it).
ENGINES = {"cpu": {**CPU_EAGER, "max_model_len": 512, "kv_cache_memory_bytes": 256 << 20},
           "gpu": {**GPU_E2E, "enforce_eager": True}}


def requests(texts: list[str]) -> dict[str, list[dict]]:
    """The prompt sets: ``image`` (each line rendered, :func:`kimi.models.vision.render`), ``text`` (each line
    written out) and ``blank`` (one blank image per line, the same prompt)."""
    from kimi.models.vision import IMAGE_PROMPT, render

    def image(text: str) -> dict:
        return {"prompt": IMAGE_PROMPT, "multi_modal_data": {"vision_chunk": [{"type": "image",
                                                                                "image": render(text)}]}}

    return {"image": [image(t) for t in texts], "text": [{"prompt": f"{t}\n"} for t in texts],
            "blank": [image("") for _ in texts]}


def rows_check(llm, tensors: dict, text: str) -> dict:
    """vLLM's image rows for one image of ``text`` (the target's first decoder layer input at the image
    positions, :mod:`kimi.e2e.draft_inputs`) against :func:`kimi.models.vision.image_rows` (float32).

    The request carries a ``cache_salt`` of its own: an engine with prefix caching whose blocks fit inside the
    prompt (a GPU's 16-64 tokens, not the CPU's 128) would otherwise serve the image positions from the cache of
    an earlier identical request, and the target would read none of them.

    Returns:
        ``{"positions": image positions read, "max_abs_diff": float, "max_abs_row": largest |value|}``.
    """
    import torch
    from vllm import SamplingParams

    from kimi.e2e import draft_inputs
    from kimi.models.vision import image_rows, patches, render

    llm.collective_rpc(draft_inputs.install)
    request = {**requests([text])["image"][0], "cache_salt": "kimi-rows-check"}
    llm.generate([request], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    records = llm.collective_rpc(draft_inputs.take)[0]["target"]
    rows = {}
    for positions, values, _ in records:
        for i, pos in enumerate(positions.tolist()):
            rows.setdefault(pos, values[i])
    mine = image_rows(tensors, patches([render(text)]))[0]
    theirs = torch.stack([rows[p] for p in range(mine.shape[0])])  # the image fills positions 0..63
    return {"positions": int(mine.shape[0]), "max_abs_diff": float((mine - theirs).abs().max()),
            "max_abs_row": float(mine.abs().max())}


def measure(mode: str, wrapper: str, drafter: str, texts: list[str], device: str = "cpu",
            vision: str | None = None) -> dict:
    """Serve ``wrapper`` in THIS process in ``mode`` (:data:`MODES`; the caller sets ``KIMI_DRAFT_IMAGE_EMBEDS``
    first) and greedy-decode every prompt set of :func:`requests`.

    Returns:
        ``{"mode", "sets": {set: {"tokens": [[ids]], plus with a drafter "tau", "per_position", "counters"}},
        "rows": :func:`rows_check` (mode ``fork`` with ``vision`` given)}``.

    Raises:
        ValueError: an unknown mode or device.
    """
    from vllm import LLM, SamplingParams

    from kimi.e2e.engine import close_engine, spec_metrics, spec_metrics_since
    from kimi.train.acceptance import summarize

    if mode not in MODES or device not in ENGINES:
        raise ValueError(f"mode {mode!r} / device {device!r}: one of {MODES} / {tuple(ENGINES)} wanted")
    spec = None if mode == "baseline" else {"method": "eagle3", "model": drafter, "num_speculative_tokens": K}
    llm = LLM(model=wrapper, speculative_config=spec, disable_log_stats=False, **ENGINES[device])
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
    out: dict = {"mode": mode, "sets": {}}
    try:
        for name, batch in requests(texts).items():
            before = spec_metrics(llm.get_metrics())
            done = llm.generate(batch, params, use_tqdm=False)
            result = {"tokens": [list(o.outputs[0].token_ids) for o in done]}
            if spec:
                result.update(summarize(spec_metrics_since(spec_metrics(llm.get_metrics()), before), K))
            out["sets"][name] = result
        if mode == "fork" and vision:
            from kimi.models.pair_k25 import load_vision

            out["rows"] = rows_check(llm, load_vision(Path(vision))[0], texts[0])
    finally:
        close_engine(llm)
    return out


def measure_modes(wrapper: Path, drafter: Path, vision: Path, texts: list[str], work: Path, device: str = "cpu",
                  modes: tuple[str, ...] = MODES, say=print) -> dict[str, dict]:
    """:func:`measure` for each of ``modes``, each in a fresh ``python -m kimi_lab.bench.image_acceptance`` process
    with its own ``VLLM_CACHE_ROOT`` under ``work``; ``KIMI_DRAFT_IMAGE_EMBEDS=upstream`` for ``upstream``.

    Raises:
        RuntimeError: a process failed (its last output lines in the message).
    """
    results = {}
    for mode in modes:
        env = {**os.environ, "VLLM_CACHE_ROOT": str(work / f"vllm-cache-{mode}"),
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env.pop("KIMI_DRAFT_IMAGE_EMBEDS", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(LAB_PATH), os.environ.get("PYTHONPATH")) if p)
        if mode == "upstream":
            env["KIMI_DRAFT_IMAGE_EMBEDS"] = "upstream"
        args = [sys.executable, "-m", "kimi_lab.bench.image_acceptance", mode, str(wrapper), str(drafter), str(vision),
                device, json.dumps(texts)]
        say(f"image acceptance: {mode} (its own process)")
        done = subprocess.run(args, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise RuntimeError(f"{mode} failed (exit {done.returncode}):\n" + "\n".join(
                (done.stdout + done.stderr).splitlines()[-30:]))
        results[mode] = json.loads(lines[-1])
    return results


def summary(results: dict[str, dict]) -> dict:
    """The numbers of a :func:`measure_modes` run: τ per mode and set, lossless counts per mode and set (greedy
    with EAGLE-3 = the baseline's), and whether the target's image output follows the image: how many image
    prompts (and blank prompts) give the text prompt's output (baseline), and the mean common prefix."""
    from kimi.e2e.engine import common_prefix
    from kimi_lab.bench.gpu_e2e.summary import compare

    base = results["baseline"]["sets"]
    n = len(base["text"]["tokens"])
    follows = {name: {"identical": compare(base[name]["tokens"], base["text"]["tokens"])["identical"], "total": n,
                      "mean_common_prefix": sum(map(common_prefix, base[name]["tokens"], base["text"]["tokens"])) / n}
               for name in ("image", "blank")}
    out: dict = {"image_follows_text": follows, "modes": {}}
    for mode in ("fork", "upstream"):
        if mode not in results:
            continue
        sets = results[mode]["sets"]
        out["modes"][mode] = {name: {"tau": round(s["tau"], 4), "per_position": [round(p, 4) for p in
                                                                                  s["per_position"]],
                                     "counters": s["counters"],
                                     "lossless": {"identical": compare(s["tokens"], base[name]["tokens"])["identical"],
                                                  "total": len(s["tokens"])}}
                              for name, s in sets.items()}
        if "rows" in results[mode]:
            out["rows_check"] = results[mode]["rows"]
    return out


#: What the numbers mean and what they do not (the result's markdown and docs/multimodal.md say the same).
MEANING = (
    ("- The target is the shipped pair's, frozen; its vision tower was trained (`kimi models train-vision`) to make "
     "an image of a code line act like the line: it memorised these {snippets} images (held-in stdlib `def` lines). "
     "The image prompts are those training images; no unseen image was measured."),
    ("- The drafter (`models/pair/drafter`) was trained on text only: it never saw an image row, nor the "
     "placeholder (`<|media_pad|>` is the target's `<|pad|>`, id 2, a special token no text encodes to)."),
    ("- The modes differ only in the drafter's token-embedding input at the 64 image positions of the prompt (and "
     "the drafter KV written from them). Its other input, the target's aux hidden states (layers 2, 4, 5), carries "
     "the image through the target's attention in both modes; every decode step reads text tokens in both."),
    ("- `text` is the same lines written out, on the same wrapper (its text model is the pair's target): no image "
     "rows, so both modes run the same path there."),
    "- `blank` is a white image (the control): what the target writes when the image carries nothing.",
    "- Output is lossless in both modes (drafts are verified); τ is the only thing the mode changes.",
)


def markdown(summ: dict, snippets: int, tokens: int = TOKENS) -> list[str]:
    """The result's section for ``benchmarks/results/multimodal.md`` (lines), with what the numbers mean."""
    lines = ["## Acceptance with images: the target's image rows to the drafter, or the placeholder's", "",
             "| prompts | drafter reads at image positions | τ (k = 3) | acceptance per position | drafts | lossless |",
             "|---|---|---|---|---|---|"]
    reads = {"fork": "the target's image rows (the fork)", "upstream": "the placeholder's embedding (upstream)"}
    for name in SETS:
        for mode, sets in summ["modes"].items():
            s, read = sets[name], reads[mode] if name != "text" else f"{mode} (no image)"
            per_pos = ", ".join(f"{p:.2f}" for p in s["per_position"])
            lines.append(f"| {name} | {read} | {s['tau']:.3f} | {per_pos} | {s['counters']['num_drafts']:.0f} | "
                         f"{s['lossless']['identical']} / {s['lossless']['total']} |")
    f = summ["image_follows_text"]
    image, blank = f["image"], f["blank"]
    lines += ["", "What the numbers mean, and what they do not:", "",
              *(line.format(snippets=snippets) for line in MEANING), "",
              (f"Image path carries the line (no speculation, {tokens} greedy tokens per prompt, {snippets} snippets): "
               f"the image prompt gives the text prompt's output for {image['identical']} / {image['total']} (mean "
               f"common prefix {image['mean_common_prefix']:.1f} tokens); the blank image for {blank['identical']} / "
               f"{blank['total']} (mean common prefix {blank['mean_common_prefix']:.1f}).")]
    if "rows_check" in summ:
        r = summ["rows_check"]
        lines += ["", (f"vLLM's image rows (read inside the engine) against the torch reproduction used in training: "
                       f"{r['positions']} positions, max |difference| {r['max_abs_diff']:.2e} (rows up to "
                       f"{r['max_abs_row']:.2f}).")]
    return lines


def main(argv: list[str]) -> int:
    """``python -m kimi_lab.bench.image_acceptance MODE WRAPPER DRAFTER VISION DEVICE TEXTS_JSON``: one JSON line."""
    mode, wrapper, drafter, vision, device, texts = argv
    if mode == "upstream" and os.environ.get("KIMI_DRAFT_IMAGE_EMBEDS") != "upstream":
        raise SystemExit("mode upstream needs KIMI_DRAFT_IMAGE_EMBEDS=upstream in the environment")
    result = measure(mode, wrapper, drafter, json.loads(texts), device, vision)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
