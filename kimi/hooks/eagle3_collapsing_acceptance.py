"""Hook of patch ``eagle3-collapsing-acceptance``: under adaptive verification, per-request and per-position
acceptance, the draft back-off of requests whose drafts keep failing, the collapse warning, and the numbers on
``/metrics``; the logic is :mod:`kimi.spec.watch`, :mod:`kimi.spec.backoff`, :mod:`kimi.spec.acceptance`,
:mod:`kimi.spec.collapse` and :mod:`kimi.spec.metrics`."""

from __future__ import annotations

from typing import Any


def check_options(spec_config: Any) -> None:
    """Called by ``SpeculativeConfig._verify_args``: see :func:`kimi.spec.backoff.backoff_options`."""
    from kimi.spec.backoff import backoff_options

    backoff_options(spec_config)


def step_done(model_runner: Any, input_batch: Any, num_sampled: Any, num_rejected: Any,
              model_runner_output: Any) -> None:
    """Called by the V2 model runner's ``sample_tokens`` after the drafter proposed, before adaptive
    verification records the confidences: see :func:`kimi.spec.watch.step_done`."""
    from kimi.spec.watch import step_done as watch_step

    watch_step(model_runner, input_batch, num_sampled, num_rejected, model_runner_output)


def carry_step_stats(scheduler: Any, spec_decoding_stats: Any, model_runner_output: Any) -> Any:
    """Called by ``Scheduler.update_from_output``: see :func:`kimi.spec.metrics.carry`."""
    from kimi.spec.metrics import carry

    return carry(scheduler, spec_decoding_stats, model_runner_output)


def adaptive_verification_prom(speculative_config: Any, labelnames: list[str],
                               per_engine_labelvalues: dict[int, list[object]]) -> Any:
    """Called by ``SpecDecodingProm.__init__``: see :class:`kimi.spec.metrics.AdaptiveVerificationProm`."""
    from kimi.spec.metrics import AdaptiveVerificationProm

    return AdaptiveVerificationProm(speculative_config, labelnames, per_engine_labelvalues)
