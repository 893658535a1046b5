"""Tooling of the Kimi / DeepSeek-V3 EAGLE-3 vLLM fork.

The fork is stored as a pin of an upstream vLLM release, a patch series and
this package; ``kimi sync`` materializes the patched upstream tree at the
repository root.  See ``README.md`` and ``python -m kimi --help``.

Everything needed by ``kimi sync`` uses only the Python standard library and
git, so a fresh clone can be materialized before anything is installed.
"""
