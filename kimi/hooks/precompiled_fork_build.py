"""Hook of patch ``precompiled-fork-build`` (build time only: :data:`kimi.hooks.BUILD_TIME`): the fork's build
settings, called by the patched ``setup.py`` before it reads vLLM's env, and the ``kimi`` console script; the logic
is :mod:`kimi.fork.precompiled`."""

from __future__ import annotations

from pathlib import Path


def configure_build(root: Path) -> None:
    """Called by the patched ``setup.py`` at its top: :func:`kimi.fork.precompiled.configure_build`."""
    from kimi.fork.precompiled import configure_build as configure

    configure(root)


def kimi_command() -> int:
    """The ``kimi`` console script the fork's install adds (``pyproject.toml``): :func:`kimi.cli.main`."""
    from kimi.cli import main

    return main()
