"""Greedy EAGLE-3 draft tokens without target-vocabulary logits (patch ``0009-eagle3-greedy-draft-vocab``, reached
through ``kimi.hooks.eagle3_greedy_draft_vocab``).

Upstream vLLM (``Eagle3LlamaForCausalLM.compute_logits``, ``vllm/model_executor/models/llama_eagle3.py``)
scatters the drafter's ``[T, draft_vocab]`` logits into a ``[T, target_vocab]`` tensor of -inf every
draft step and the proposer takes the argmax there (163840 wide for Kimi, for 32000 real values).
The same ids come from the argmax over the draft vocabulary followed by ``target = draft + d2t[draft]``
(EAGLE-3's ``d2t`` offsets), which :func:`kimi.kernels.draft_head.draft_argmax` computes in one pass
(the fork's CUDA kernel where it is built, torch otherwise). Ties: both pick the lowest draft id,
which is the lowest target id because ``d2t`` maps draft ids to increasing target ids. Both of vLLM's
model runners call it: V1's proposer (``SpecDecodeBaseProposer._greedy_sample``,
``vllm/v1/spec_decode/llm_base_proposer.py``) and V2's speculator (``_greedy_sample_draft``,
``vllm/v1/worker/gpu/spec_decode/speculator.py``), whose drafting loop is captured in CUDA graphs.

Only the greedy path changes; sampled drafts (``temperature > 0`` with probabilistic draft probs)
keep upstream's full-vocabulary logits. ``KIMI_DRAFT_GREEDY`` picks the path: ``auto`` (default: the kernel
on CUDA when built, else torch), ``torch``, ``upstream`` (the hook is off), or ``check``: upstream's ids are
used and the hook's are compared with them at every draft step (:class:`GreedyCheck`; V1 runner only).

On by default since the H200 checks (trained pair, bf16, CUDA graphs, k = 3, 64 requests): 39882
draft rows compared, 0 mismatched (``benchmarks/results/logs/perf-run1``); later 228366 more on the pair and
46080 on the Kimi slice, 0 mismatched (``benchmarks/results/logs/pair-0.26.0/perf_vs_upstream.md``). An earlier H200 run
(``benchmarks/results/gpu_e2e-draft-greedy-*.md``) had seen EAGLE-3 output with the hook differ from the
output without speculation in 5 of 32 sequences where the baseline's top-2 logit margin was 0.0 to 0.09; the
same perf run shows upstream's own EAGLE-3 at 55 of 64 sequences equal to no speculation (bf16 batch
numerics), and with the hook the ids are upstream's, so the hook is not the cause.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from kimi.fork.release import upstream_release

MODE_ENV = "KIMI_DRAFT_GREEDY"
MODES = ("auto", "torch", "upstream", "check")


def greedy_for(model: torch.nn.Module, *, in_cuda_graph: bool = False
               ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A function ``hidden_states [T, hidden] -> target token ids [T] int64`` for ``model``, or None. It reads
    ``model.lm_head``, ``logits_processor`` and ``draft_id_to_target_id`` when called, so it may be made before
    the proposer shares the target's lm_head with the drafter.

    None (upstream's path is kept) when ``KIMI_DRAFT_GREEDY=upstream``, when the drafter has no
    ``draft_id_to_target_id`` (same vocabulary as the target), no ``lm_head``/``logits_processor``, or
    runs with tensor parallelism (upstream's ``use_local_argmax_reduction`` covers that case).

    ``in_cuda_graph``: the caller captures the function in a CUDA graph (vLLM's V2 model runner,
    ``vllm/v1/worker/gpu/spec_decode/speculator.py``): the kernel is launched once here, so that its module
    is loaded before capture (:func:`kimi.kernels.draft_head.warm_up`).

    Raises:
        ValueError: ``KIMI_DRAFT_GREEDY`` is not one of :data:`MODES`, or is ``check`` with ``in_cuda_graph`` for a
            drafter the hook applies to (the check counts rows on the host at every call, which a replayed graph
            does not do).
    """
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    d2t = getattr(model, "draft_id_to_target_id", None)
    lm_head = getattr(model, "lm_head", None)
    processor = getattr(model, "logits_processor", None)
    if mode == "upstream" or d2t is None or lm_head is None or processor is None:
        return None
    from vllm.distributed import get_tensor_model_parallel_world_size

    if get_tensor_model_parallel_world_size() > 1:
        return None
    if mode == "check" and in_cuda_graph:
        raise ValueError(f"{MODE_ENV}=check counts draft rows at every call, which vLLM's V2 model runner does not "
                         f"make (it replays the drafting loop as a CUDA graph): {_v1_runner_fix()}")
    from kimi.kernels.draft_head import draft_argmax, kernel_status, warm_up

    backend = "torch" if mode == "torch" else "auto"
    from vllm.logger import init_logger

    status = kernel_status() if backend == "auto" and d2t.is_cuda else {"available": False}
    if status["available"] and in_cuda_graph:
        warm_up(d2t.device)
    init_logger("vllm.kimi.eagle3").info(
        "EAGLE-3 greedy drafts: argmax over the %d-token draft vocabulary, then d2t (%s), without the "
        "%s-wide target-vocabulary logits%s.", d2t.shape[0], "fork CUDA kernel" if status["available"] else "torch",
        getattr(getattr(model, "config", None), "vocab_size", "target"),
        " (check mode: upstream's ids are used and compared)" if mode == "check" else "")

    greedy = DraftGreedy(model, backend, draft_argmax)
    return GreedyCheck(model, greedy) if mode == "check" else greedy


class DraftGreedy:
    """Greedy EAGLE-3 drafts from the draft vocabulary: ``hidden_states [T, hidden] -> target ids [T]`` int64.

    The drafter's modules are read at each call: the proposer loads the drafter, then may replace its lm_head
    with the target's (``_maybe_share_lm_head``: a checkpoint without lm_head weights, or with the target's); a
    head bound at construction would keep the deleted one and give other ids than upstream's.
    """

    def __init__(self, model: torch.nn.Module, backend: str, argmax: Callable[..., torch.Tensor]) -> None:
        self.model, self.backend, self.argmax = model, backend, argmax

    def ids_and_logits(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target ids [T] int64, draft-vocabulary logits [T, draft_vocab])``.

        The logits are upstream's ``compute_logits`` without its scatter into a ``[T, target_vocab]`` tensor of
        -inf, so their softmax has the same maximum: vLLM's acceptance estimator (adaptive verification) reads
        its confidence feature, ``logit(max softmax)``, from them as from the scattered ones.
        """
        logits = self.model.logits_processor(self.model.lm_head, hidden_states)
        return self.argmax(logits, self.model.draft_id_to_target_id, backend=self.backend), logits

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.ids_and_logits(hidden_states)[0]


def _v1_runner_fix() -> str:
    """How to get vLLM's V1 model runner, where check mode runs: an environment variable where this vLLM has one,
    else the fork's v0.32 line (later releases removed that runner)."""
    import vllm.envs

    if "VLLM_USE_V2_MODEL_RUNNER" in vllm.envs.environment_variables:
        return "set VLLM_USE_V2_MODEL_RUNNER=0"
    return (f"this vLLM has no V1 model runner (none in {upstream_release()}); run check mode on the fork's v0.32 "
            f"line, or set {MODE_ENV}=auto")


class GreedyCheck:
    """``KIMI_DRAFT_GREEDY=check``: returns upstream's greedy draft ids (``compute_logits(h).argmax(-1)``, the
    full-vocabulary scatter) and counts, on the device, the rows where the hook's ids differ.

    Attributes:
        rows: draft rows compared so far (tokens x draft steps).
        mismatched: int64 scalar tensor on the drafter's device (None before the first call); read it with
            :meth:`counts`, which synchronizes.
    """

    def __init__(self, model: torch.nn.Module, hook: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.model, self.hook = model, hook
        self.rows = 0
        self.mismatched: torch.Tensor | None = None

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``hidden_states [T, hidden]`` -> upstream's target token ids ``[T]`` int64."""
        ids = self.model.compute_logits(hidden_states).argmax(dim=-1)
        differ = (self.hook(hidden_states) != ids).sum()
        self.mismatched = differ if self.mismatched is None else self.mismatched + differ
        self.rows += int(hidden_states.shape[0])
        return ids

    def counts(self) -> dict[str, int]:
        """``{"rows": compared rows, "mismatched": rows where the hook's id differs from upstream's}``."""
        return {"rows": self.rows, "mismatched": 0 if self.mismatched is None else int(self.mismatched)}
