"""A problem ``kimi drafter inspect`` finds in a drafter: its kind, the problem and the fix, each for its own cause.

The kinds decide who stops on a finding: ``kimi drafter convert`` (``CONVERT_BLOCKING`` in
:mod:`kimi.drafter.inspect`) and ``vllm serve``'s start-up check (``SERVE_BLOCKING`` in
:mod:`kimi.drafter.serve_checks`). A check that knows the remedy of its cause names it; the rest take
the kind's fix from :data:`FIXES`.
"""

from __future__ import annotations

from typing import NamedTuple

#: The fix of a finding whose check names none of its own, by kind.
FIXES = {
    "config": "correct the named field in the drafter's config.json",
    "architectures": "write the drafter class in architectures (`kimi drafter convert` writes it)",
    "ids": "write the ids of the layers the drafter was trained on as eagle_aux_hidden_state_layer_ids in the "
           "drafter's config.json, in vLLM's convention (`kimi drafter convert` writes them), or use the drafter "
           "made for this target",
    "conflict": "keep one source of the value and remove the other (`kimi drafter inspect` names both)",
    "shape": "use the drafter made for this target, or make config.json give the shapes its tensors have",
    "vocab": "use the drafter made for this target's vocabulary",
    "convention": "state the convention with `kimi drafter convert --convention layer_input|layer_output`",
    "format": "write the drafter in a layout vLLM's EAGLE-3 classes load (`kimi drafter convert` maps "
              "speculators checkpoints)",
    "rope": "serve with a --max-model-len the drafter's RoPE covers, or use a drafter made for the longer context",
    "t2d": "write t2d again from d2t (one true entry per draft id), or leave it out",
    "weights": "ship the drafter's weights beside config.json as model.safetensors (or shards with their index)",
}


class Finding(NamedTuple):
    """A problem: its kind (a key of :data:`FIXES`), what is wrong and the fix, in words."""

    kind: str
    text: str
    fix: str


def finding(kind: str, text: str, fix: str = "") -> Finding:
    """A :class:`Finding` with ``fix``, or the kind's fix from :data:`FIXES` when none is given.

    Raises:
        KeyError: an unknown kind.
    """
    return Finding(kind, text, fix or FIXES[kind])
