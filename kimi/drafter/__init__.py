"""EAGLE-3 drafter tooling: inspect and convert published checkpoints, and the checks vLLM runs at start-up.

``checkpoint`` reads configs and safetensors headers; ``conventions`` knows
the two aux-layer-id conventions; ``inspect`` and ``convert`` are the
``kimi drafter`` commands; ``other_tools`` writes our drafter as speculators and SpecForge
do; ``layout`` holds a checkpoint's tensors against what vLLM builds from its config (``rawtensors``: safetensors
as bytes); ``assumptions`` lists what vLLM assumes about a drafter, with lying copies; the checks vLLM runs at
start-up are in ``serve_checks`` (called by the hook ``kimi.hooks.eagle3_drafter_checks``).
"""
