"""Patch ``0004-eagle3-drafter-checks``: vLLM's ``SpeculativeConfig`` checks an EAGLE-3 drafter before any weight
loads, with :mod:`kimi.drafter.serve_checks` (what the checks are and the errors they raise)."""

from __future__ import annotations

from kimi.drafter.serve_checks import check_drafter_architectures, prepare_eagle3_drafter

__all__ = ["check_drafter_architectures", "prepare_eagle3_drafter"]
