"""EAGLE-3 drafter tooling: inspect and convert published checkpoints, and the checks vLLM runs at start-up.

``checkpoint`` reads configs and safetensors headers; ``conventions`` knows
the two aux-layer-id conventions; ``inspect`` and ``convert`` are the
``kimi drafter`` commands; ``layout`` holds a checkpoint's tensors against what vLLM builds from its config
(``rawtensors``: safetensors as bytes); the checks vLLM runs at start-up are in ``serve_checks`` (called by the
hook ``kimi.hooks.eagle3_drafter_checks``). The assumption table with its lying copies, the corpus and other tools'
writers are the lab's (``lab/kimi_lab/drafter/``).
"""
