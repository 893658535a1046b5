"""Adaptive verification on ``/metrics``: the chosen draft budget per step, estimated against observed
acceptance per draft position, and the draft back-off.

The numbers travel the way vLLM's spec-decode counters do: the model runner's step summary
(:class:`StepSummary`, made by :mod:`kimi.spec.watch`) rides on its ``ModelRunnerOutput``; the scheduler
puts it in that step's ``SpecDecodingStats`` (field ``adaptive_verification``, a ``dict[str, list[float]]``
so that the engine-core-to-frontend msgpack carries it; :func:`carry`); the frontend's ``SpecDecodingProm``
records it in :class:`AdaptiveVerificationProm`.  Metrics, for an engine with adaptive verification
(counters get Prometheus' ``_total`` suffix):

- ``vllm:spec_decode_adaptive_draft_budget`` (histogram): drafts verified per step, the budget chosen;
- ``vllm:spec_decode_adaptive_verified_tokens_per_pos`` (counter, label ``position``): drafts verified;
- ``vllm:spec_decode_adaptive_estimated_accepted_tokens_per_pos`` (counter, ``position``): accepted drafts
  the budget expected (sum of the verified drafts' survival probabilities);
- ``vllm:spec_decode_adaptive_observed_accepted_tokens_per_pos`` (counter, ``position``): accepted drafts;
- ``vllm:spec_decode_adaptive_paused_requests`` (gauge): requests whose drafts the back-off withholds;
- ``vllm:spec_decode_adaptive_pauses`` / ``vllm:spec_decode_adaptive_probes`` (counters): pauses started,
  probes decided.

vLLM's own ``vllm:spec_decode_num_draft_tokens`` still counts the drafts *scheduled* (every draft the
drafter proposed, trimmed or not), so its acceptance rate divides by drafts never verified; the
``verified`` counter is the denominator of the rate the budget acts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The attribute of vLLM's ``ModelRunnerOutput`` that carries a :class:`StepSummary` as a dict.
OUTPUT_ATTR = "kimi_adaptive_verification"
#: Buckets of the budget histogram, in drafts per step.
BUDGET_BUCKETS = [0.0] + [float(1 << i) for i in range(13)]


@dataclass
class StepSummary:
    """Adaptive verification over one or more steps, host numbers (the wire form is :meth:`as_dict`).

    Attributes:
        budget: drafts verified at each step (the budget chosen), one entry per step.
        verified: ``k`` floats, drafts verified per position.
        estimated: ``k`` floats, expected accepted drafts per position.
        observed: ``k`` floats, accepted drafts per position.
        paused: requests paused after the last step.
        pauses: pauses started.
        probes: probes decided.
    """

    budget: list[float] = field(default_factory=list)
    verified: list[float] = field(default_factory=list)
    estimated: list[float] = field(default_factory=list)
    observed: list[float] = field(default_factory=list)
    paused: float = 0.0
    pauses: float = 0.0
    probes: float = 0.0

    def add(self, other: StepSummary) -> None:
        """Fold a later summary into this one (counts add, ``paused`` is the later one's)."""
        self.budget += other.budget
        for name in ("verified", "estimated", "observed"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, [a + b for a, b in zip(mine, theirs, strict=True)] if mine else list(theirs))
        self.paused = other.paused
        self.pauses += other.pauses
        self.probes += other.probes

    def as_dict(self) -> dict[str, list[float]]:
        return {"budget": list(self.budget), "verified": list(self.verified), "estimated": list(self.estimated),
                "observed": list(self.observed), "paused": [self.paused], "pauses": [self.pauses],
                "probes": [self.probes]}


def carry(scheduler: Any, spec_decoding_stats: Any, model_runner_output: Any) -> Any:
    """The scheduler's side: ``spec_decoding_stats`` (vLLM's ``SpecDecodingStats`` or None) with the runner's
    summary put in its ``adaptive_verification`` field; a new one where the step made none and the scheduler
    logs stats; unchanged without a summary."""
    summary = getattr(model_runner_output, OUTPUT_ATTR, None)
    if summary is None or not scheduler.log_stats:
        return spec_decoding_stats
    if spec_decoding_stats is None:
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        spec_decoding_stats = SpecDecodingStats.new(scheduler.num_spec_tokens)
    spec_decoding_stats.adaptive_verification = summary
    return spec_decoding_stats


class AdaptiveVerificationProm:
    """The metrics of the module docstring, for ``vllm.v1.spec_decode.metrics.SpecDecodingProm``; empty (and
    :meth:`observe` a no-op) unless the speculative config enables adaptive verification.

    Args:
        speculative_config: vLLM's ``SpeculativeConfig`` or None.
        labelnames: the logger's label names (``model_name``, ``engine``).
        per_engine_labelvalues: engine index -> label values.
    """

    def __init__(self, speculative_config: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        self.enabled = bool(speculative_config is not None
                            and getattr(speculative_config, "enable_adaptive_verification", False))
        if not self.enabled:
            return
        import prometheus_client
        from vllm.v1.metrics.utils import create_metric_per_engine

        k = speculative_config.num_speculative_tokens
        budget = prometheus_client.Histogram(
            name="vllm:spec_decode_adaptive_draft_budget",
            documentation="Draft tokens verified per step under adaptive verification (the budget chosen).",
            labelnames=labelnames, buckets=BUDGET_BUCKETS)
        self.budget = create_metric_per_engine(budget, per_engine_labelvalues)

        def per_pos(name: str, doc: str) -> dict[int, list[Any]]:
            counter = prometheus_client.Counter(name=name, documentation=doc, labelnames=[*labelnames, "position"])
            return {idx: [counter.labels(*lv, str(pos)) for pos in range(k)]
                    for idx, lv in per_engine_labelvalues.items()}

        self.verified = per_pos("vllm:spec_decode_adaptive_verified_tokens_per_pos",
                                "Draft tokens verified per draft position under adaptive verification.")
        self.estimated = per_pos("vllm:spec_decode_adaptive_estimated_accepted_tokens_per_pos",
                                 "Accepted draft tokens per position that adaptive verification expected.")
        self.observed = per_pos("vllm:spec_decode_adaptive_observed_accepted_tokens_per_pos",
                                "Accepted draft tokens per position among those verified.")
        paused = prometheus_client.Gauge(
            name="vllm:spec_decode_adaptive_paused_requests",
            documentation="Requests whose drafts the draft back-off withholds (their drafts kept failing).",
            multiprocess_mode="mostrecent", labelnames=labelnames)
        self.paused = create_metric_per_engine(paused, per_engine_labelvalues)
        pauses = prometheus_client.Counter(
            name="vllm:spec_decode_adaptive_pauses",
            documentation="Requests paused by the draft back-off (drafts failed too often in a row).",
            labelnames=labelnames)
        self.pauses = create_metric_per_engine(pauses, per_engine_labelvalues)
        probes = prometheus_client.Counter(
            name="vllm:spec_decode_adaptive_probes",
            documentation="Paused requests probed again (drafts verified after a pause).",
            labelnames=labelnames)
        self.probes = create_metric_per_engine(probes, per_engine_labelvalues)

    def observe(self, spec_decoding_stats: Any, engine_idx: int = 0) -> None:
        """Record the summary in ``spec_decoding_stats.adaptive_verification`` (None: nothing)."""
        summary = getattr(spec_decoding_stats, "adaptive_verification", None)
        if not self.enabled or not summary:
            return
        for value in summary["budget"]:
            self.budget[engine_idx].observe(value)
        for name in ("verified", "estimated", "observed"):
            for counter, value in zip(getattr(self, name)[engine_idx], summary[name], strict=False):
                counter.inc(value)
        self.paused[engine_idx].set(summary["paused"][0])
        self.pauses[engine_idx].inc(summary["pauses"][0])
        self.probes[engine_idx].inc(summary["probes"][0])
