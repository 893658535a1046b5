"""Adaptive verification for EAGLE-3 on vLLM's Model Runner V2, on upstream's machinery.

The mainline's vLLM already sizes a draft-token budget per step (``AdaptiveVerificationManager``,
``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``): cost tables of draft and verification
time, per-request survival probabilities from ``speculator.draft_token_confidence_probs``, the budget
``argmax(estimated accepted tokens / cost)``, 0 meaning that no draft is verified that step.  Every
draft-model speculator, EAGLE-3's included, fills those confidences from its draft logits through
``OnlineAcceptanceEstimator`` (``acceptance_estimator.py``): a logistic map of ``logit(max softmax)`` with
a shared slope and one intercept per draft position, refitted online against the acceptance the engine
observes - the calibration.  What upstream lacks for EAGLE-3 on the fork's CPU path is:

- the config: adaptive verification is refused without full CUDA graphs, which a CPU never has
  (:func:`check_config` lets the torch-only CPU platform through, and refuses, before any weights load,
  the methods that have no draft confidences - upstream ignores the flag for them silently);
- the cost curves: upstream profiles them while it captures CUDA graphs, and prices drafting from graph
  replays only; an eager engine never captures, so :func:`profile_eager_costs` times eager dummy steps
  of the sizes :func:`profile_token_counts` names, on the machine the engine runs on.

Reached through ``kimi.hooks.eagle3_adaptive_verification`` (patch ``0025-eagle3-adaptive-verification``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(f"vllm.{__name__}")  # under vllm's logger, whose handler prints INFO

#: Methods whose speculator has draft confidences without a draft model's logits.
CONFIDENCES_WITHOUT_DRAFT_MODEL = frozenset({"suffix"})
#: What the torch-only CPU platform serves adaptive verification for (the method tested there).
CPU_METHODS = frozenset({"eagle3"})


def _on_torch_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    from kimi.cpu_platform.platform import TorchCpuPlatform

    return isinstance(current_platform, TorchCpuPlatform)


def check_config(vllm_config: VllmConfig) -> bool:
    """Check ``enable_adaptive_verification`` against the method and platform, before any weights load.

    Returns True where the engine verifies adaptively without CUDA graphs (the torch-only CPU platform,
    which runs eager and profiles its costs in eager steps), False where upstream's requirement of full
    CUDA graphs stands.

    Raises:
        ValueError: the method has no draft confidences to size a budget from (ngram, hidden-state
            extraction), or the torch-only CPU platform does not serve it adaptively; the message names
            the fix.
    """
    from vllm.v1.worker.gpu.spec_decode.speculator_config import DraftModelSpeculatorConfig

    spec = vllm_config.speculative_config
    speculator = spec.speculator_config
    method = spec.method
    has_confidences = speculator.proposes_draft_tokens and (
        isinstance(speculator, DraftModelSpeculatorConfig) or speculator.base_method in CONFIDENCES_WITHOUT_DRAFT_MODEL)
    if not has_confidences:
        raise ValueError(
            f"enable_adaptive_verification: speculative method {method!r} gives no per-draft confidence to size "
            f"a draft budget from (vLLM would verify every draft and ignore the option); use method 'eagle3' "
            "(or another draft-model method), or remove enable_adaptive_verification from the speculative config")
    if not _on_torch_cpu_platform():
        return False
    if method not in CPU_METHODS:
        raise ValueError(
            f"enable_adaptive_verification with speculative method {method!r}: the torch-only CPU platform "
            f"serves it for {', '.join(sorted(CPU_METHODS))} only; use method 'eagle3', or remove "
            "enable_adaptive_verification from the speculative config")
    return True


def profile_token_counts(max_num_reqs: int, decode_query_len: int, max_num_tokens: int) -> list[int]:
    """Token counts of the dummy steps that price verification and drafting in an eager engine.

    Powers of two from 1 up to the largest decode step (``max_num_reqs`` requests of ``decode_query_len``
    tokens, at most ``max_num_tokens``), and that step itself.  Up to ``max_num_reqs`` tokens a dummy step
    has one request per token, so the same runs price drafting per request count.  Steps larger than the
    last count (prefill chunks) are priced by upstream's linear extrapolation of the last two points.

    Raises:
        ValueError: a non-positive argument.
    """
    if min(max_num_reqs, decode_query_len, max_num_tokens) < 1:
        raise ValueError(f"profile_token_counts needs positive sizes, got {max_num_reqs=}, {decode_query_len=}, "
                         f"{max_num_tokens=}")
    largest = min(max_num_reqs * decode_query_len, max_num_tokens)
    counts = {1 << i for i in range(largest.bit_length()) if 1 << i <= largest}
    counts.add(largest)
    return sorted(counts)


def median_curve(points: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """``(size, milliseconds)`` samples to one ``(size, median ms)`` point per size, sizes ascending."""
    grouped: defaultdict[int, list[float]] = defaultdict(list)
    for size, ms in points:
        grouped[size].append(ms)
    return [(size, float(np.median(values))) for size, values in sorted(grouped.items())]


def dense_curve(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """``curve`` (sizes ascending) interpolated linearly at every integer size from its first to its last.

    Upstream's cost tables price a size between two profiled points at the next point up (a CUDA graph pads
    to its captured size); an eager step does not pad, so the eager curve is handed over dense.
    """
    if len(curve) < 2:
        return list(curve)
    sizes, ms = np.asarray(curve, dtype=np.float64).T
    every = np.arange(int(sizes[0]), int(sizes[-1]) + 1)
    return [(int(size), float(cost)) for size, cost in zip(every, np.interp(every, sizes, ms), strict=True)]


Curve = list[tuple[int, float]]


def per_request_curves(one_token: Curve, decode: Curve, draft: Curve, drafts_per_request: int,
                       max_tokens: int) -> tuple[Curve, Curve, float]:
    """Draft and verification curves that price a decode step of ``r`` requests and ``t`` tokens at its own shape.

    Upstream's budget prices a step as ``draft[requests] + verify[tokens]``.  An eager CPU step's cost follows its
    requests (each reads its whole context) far more than its tokens: ``one_token`` (requests of one token each,
    ``(r, ms)``) and ``decode`` (the same ``r`` requests of ``1 + drafts_per_request`` tokens, ``(r, ms)``) measure
    both.  The per-token cost is the median over ``r`` of ``(decode - one_token) / (r x drafts_per_request)``
    (at least 0); the verification curve is that cost per token, and the rest of a step without drafts (the
    target's per-request part) moves to the draft curve, so ``draft[r] + verify[r + d]`` is the step of ``r``
    requests without drafts plus ``d`` drafts at the per-token cost.  Sizes: ``draft``'s, and 1 to ``max_tokens``
    for verification.  Returns ``(draft curve, verification curve, ms per token)``.
    """
    forward_one = dict(one_token)
    extra = dict(decode)
    slopes = [(extra[r] - forward_one[r]) / (r * drafts_per_request)
              for r in forward_one if r in extra] if drafts_per_request > 0 else []
    per_token = max(0.0, float(np.median(slopes))) if slopes else 0.0
    sizes, forward_ms = zip(*one_token, strict=True)
    draft_curve = [(r, ms + max(0.0, forward_one.get(r, float(np.interp(r, sizes, forward_ms))) - per_token * r))
                   for r, ms in draft]
    verify_curve = [(n, per_token * n) for n in range(1, max_tokens + 1)]
    return draft_curve, verify_curve, per_token


def profile_eager_costs(runner: Any) -> None:
    """Seed ``runner.adaptive_verification``'s cost tables from timed eager dummy steps; no-op without it.

    ``runner`` is vLLM's ``GPUModelRunner`` (the CPU worker's ``CPUModelRunner``) after its KV cache is
    allocated and its kernels warmed up.  Each size of :func:`profile_token_counts` runs upstream's
    ``_PROFILE_REPLAYS`` times with ``VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN`` tokens of context
    (capped by the model length, as upstream's profiling is), and so does each decode step of ``r`` requests of
    ``decode_query_len`` tokens for the request counts among them; the target forward's cost is split into a part
    per request and one per token (:func:`per_request_curves`: upstream's curves price a draft token as the
    target's cost of one more request, about three times a real decode step's on the CPU) and the curves are
    handed over dense (:func:`dense_curve`).  The acceptance estimator's statistics, which the dummy steps fed,
    are dropped afterwards, and so is what the collapse
    watch (:mod:`kimi.spec.watch`) and the draft depth (:mod:`kimi.spec.depth`) saw during warm-up.
    """
    manager = runner.adaptive_verification
    if manager is None:
        return
    import torch
    import vllm.envs as envs
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import _PROFILE_REPLAYS

    from kimi.cpu_platform.timing import host_clock_events

    context_len = envs.VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN
    query_len = runner.decode_query_len
    counts = profile_token_counts(runner.max_num_reqs, query_len, runner.max_num_tokens)
    decode_reqs = [n for n in counts if n <= runner.max_num_reqs and n * query_len <= runner.max_num_tokens]
    with torch.inference_mode(), host_clock_events(), runner.step_timing.collect() as samples:
        for num_tokens in counts:
            for _ in range(_PROFILE_REPLAYS):
                runner._dummy_run(num_tokens, context_len=context_len, skip_eplb=True)
    with torch.inference_mode(), host_clock_events(), runner.step_timing.collect() as decode_samples:
        for num_reqs in decode_reqs if query_len > 1 else ():
            for _ in range(_PROFILE_REPLAYS):
                runner._dummy_run(num_reqs * query_len, context_len=context_len, skip_eplb=True,
                                  uniform_decode=True)
    draft = median_curve((s.num_reqs, s.drafter_ms) for s in samples)
    verify = median_curve((s.num_target_tokens, s.forward_ms) for s in samples)
    one_token = median_curve((s.num_reqs, s.forward_ms) for s in samples if s.num_target_tokens == s.num_reqs)
    decode = median_curve((s.num_reqs, s.forward_ms) for s in decode_samples)
    draft_curve, verify_curve, per_token = per_request_curves(one_token, decode, draft, query_len - 1, max(counts))
    logger.info("adaptive verification, eager cost curves (ms): drafting by requests %s, target forward by tokens "
                "(one per request) %s, by requests of %d tokens %s; priced as %.3f ms per token and the rest per "
                "request", [(n, round(ms, 2)) for n, ms in draft], [(n, round(ms, 2)) for n, ms in verify], query_len,
                [(n, round(ms, 2)) for n, ms in decode], per_token)
    manager.set_cost_curves(dense_curve(draft_curve), verify_curve)
    estimator = getattr(runner.speculator, "acceptance_estimator", None)
    if estimator is not None:
        estimator.warmup()
    from kimi.spec.watch import RUNNER_ATTR

    watch = getattr(runner, RUNNER_ATTR, None)
    if watch is not None:
        watch.reset()
    from kimi.spec.depth import reset

    reset(runner)
