"""The measurement lab: what measures the fork and carries it to the GPU host, outside the installed ``kimi``.

* :mod:`kimi_lab.bench`: the harness the ``benchmarks/*.py`` scripts share;
* :mod:`kimi_lab.gpukit`: the offline GPU host's install kit (standard library only), run as a script; the work is
  in :mod:`kimi_lab.kit`;
* :mod:`kimi_lab.drafter`: the drafter-assumption table, its lying copies and the corpus built from them, and our
  drafter as other tools write it.

It imports ``kimi`` (the product); nothing in ``kimi`` imports it (``tests/test_layering.py``). ``pyproject.toml``
installs ``vllm*`` and ``kimi*`` from the repository root, and this package sits one folder down, in ``lab/``,
which holds nothing else importable: a script or a worker puts ``lab/`` first on its path (:data:`PATH`) and
finds the lab without the root, whose laid ``vllm/`` would shadow an installed vLLM.
"""

from __future__ import annotations

from pathlib import Path

#: ``lab/``, the folder holding this package and nothing else importable: the entry a child process's
#: ``PYTHONPATH`` needs to import the lab.
PATH = Path(__file__).resolve().parent.parent
