"""Hook of patch ``eagle3-adaptive-verification``: the mainline release's adaptive verification for EAGLE-3 on an
eager engine (the torch-only CPU platform); the logic is :mod:`kimi.spec.adaptive`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def serves_eager(vllm_config: VllmConfig) -> bool:
    """Called by ``VllmConfig._validate_adaptive_verification``: see :func:`kimi.spec.adaptive.check_config`."""
    from kimi.spec.adaptive import check_config

    return check_config(vllm_config)


def profile_costs(model_runner: Any) -> None:
    """Called by the CPU worker once its kernels are warm: see :func:`kimi.spec.adaptive.profile_eager_costs`."""
    from kimi.spec.adaptive import profile_eager_costs

    profile_eager_costs(model_runner)
