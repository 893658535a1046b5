"""Hook of patch ``torch-cpu-platform``: the ``vllm.platform_plugins`` entry point of the fork's install.

vLLM asks every platform plugin at start-up which platform class to use; this one answers with the
torch-only CPU platform (:mod:`kimi.cpu_platform`) where it applies, else None.
"""

from __future__ import annotations


def activate() -> str | None:
    """The torch-only CPU platform's class path where vLLM has no compiled kernels and no GPU, else None."""
    from kimi.cpu_platform import activate as platform_for_this_host

    return platform_for_this_host()
