"""The upstream vLLM release that the fork's messages name when they say what vLLM itself does.

Messages take the release from here, never from a literal: it is the installed ``vllm``'s (where the fork is
installed or served), else the release of the line laid in this checkout (``.kimi/state.json``), else the default
line's (``kimi/lines/<line>/pin.json``). Standard library only; ``kimi install-into`` copies it with the modules
that name it.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from kimi.fork.layout import DEFAULT_LINE, Layout
from kimi.fork.pin import line_pin
from kimi.fork.state import SyncState


@functools.cache
def upstream_release() -> str:
    """``X.Y.Z``: the installed ``vllm``'s release without the fork's local part (``+kimi.<n>.<device>``), else the
    laid line's, else the default line's.

    Raises:
        KimiError: no ``vllm`` is installed and this checkout's lines cannot say (a missing or malformed pin).
    """
    try:
        return version("vllm").split("+", 1)[0]
    except PackageNotFoundError:
        layout = Layout.of()
        state = SyncState.load(layout.state_file)
        return state.version if state else line_pin(layout, DEFAULT_LINE).version
