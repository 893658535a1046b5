"""EAGLE-3 drafter tooling: inspect and convert published checkpoints, and the checks vLLM runs at start-up.

``checkpoint`` reads configs and safetensors headers; ``conventions`` knows
the two aux-layer-id conventions; ``inspect`` and ``convert`` are the
``kimi drafter`` commands; the checks vLLM runs at start-up are in ``kimi.hooks.eagle3_drafter_checks``.
"""
