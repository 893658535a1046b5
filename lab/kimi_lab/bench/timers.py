"""Step timers patched into vLLM's model runner: the target's forward and logits, the drafter's forward and
its draft head, each call timed between two device synchronizations (GPU time plus launch overhead, without
the scheduler).

Installed and collected through ``LLM.collective_rpc`` (:func:`install_timer`, :func:`collect_timer`), so it
works whether the executor runs the worker in this process or in another. vLLM's V2 model runner has none of
the wrapped methods (its drafting loop runs as one CUDA graph): nothing is timed there. Imports torch only in
:func:`install_timer`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict


class StepTimer:
    """Wraps the model runner's target forward and logits, the drafter's forward and its draft head, timing
    each call between two device synchronizations; records ``(tokens, seconds)`` per call and name."""

    def __init__(self, sync) -> None:
        self.sync = sync
        self.calls: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.undo: list = []

    def timed(self, name: str, fn, tokens):
        def call(*args, **kwargs):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.calls[name].append((tokens(args, kwargs), time.perf_counter() - t0))
            return out
        return call

    def install(self, worker) -> None:
        """Wrap what this runner has; vLLM's V2 model runner (its drafting loop runs as one CUDA graph) has none of
        these methods, so nothing is timed there."""
        runner = worker.model_runner
        if not hasattr(runner, "_model_forward"):
            return

        def forward_tokens(args, kwargs) -> int:
            for key in ("positions", "input_ids", "inputs_embeds"):
                if kwargs.get(key) is not None:
                    return int(kwargs[key].shape[-1] if key == "positions" else kwargs[key].shape[0])
            return -1

        def rows(args, kwargs) -> int:
            return int((args[0] if args else next(iter(kwargs.values()))).shape[0])

        self._swap(runner, "_model_forward", self.timed("target_forward", runner._model_forward, forward_tokens))
        self._swap(runner.model, "compute_logits", self.timed("target_logits", runner.model.compute_logits, rows))
        drafter = getattr(runner, "drafter", None)
        if drafter is not None and hasattr(drafter, "_greedy_sample"):
            inner = drafter.model
            self._swap(drafter, "model", _Proxy(inner, self.timed("draft_forward", inner, forward_tokens)))
            self._swap(drafter, "_greedy_sample", self.timed("draft_head", drafter._greedy_sample, rows))

    def _swap(self, obj, name: str, value) -> None:
        had = name in vars(obj)
        old = vars(obj).get(name)
        setattr(obj, name, value)
        self.undo.append((obj, name, had, old))

    def uninstall(self) -> None:
        for obj, name, had, old in reversed(self.undo):
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        self.undo.clear()


class _Proxy:
    """Calls go to ``call``; attributes to the wrapped module (the drafter's ``compute_logits``, ``lm_head``...);
    ``isinstance`` sees the wrapped module's class (the proposer asserts the drafter's type)."""

    def __init__(self, inner, call) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_call", call)

    @property
    def __class__(self):  # noqa: D105 - isinstance() falls back to __class__
        return type(self._inner)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def install_timer(worker) -> None:
    """``collective_rpc`` target: a :class:`StepTimer` on the worker's model runner (kept on the worker, so the
    call works whether the executor runs it in this process or ships it pickled to another)."""
    import torch

    worker.kimi_step_timer = StepTimer(torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    worker.kimi_step_timer.install(worker)


def collect_timer(worker) -> dict[str, list[tuple[int, float]]]:
    """``collective_rpc`` target: remove the worker's :class:`StepTimer` and return its records."""
    timer = worker.kimi_step_timer
    timer.uninstall()
    del worker.kimi_step_timer
    return dict(timer.calls)


def step_times(calls: dict[str, list[tuple[int, float]]]) -> dict:
    """Step times in ms from :class:`StepTimer` records.

    ``target_ms``: forward + logits at the most frequent forward size (the steady decode or verification batch;
    prefill calls have other sizes); ``draft_per_token_ms``: all drafter forward and draft-head time divided by
    the number of draft-head calls (one per draft token), None without a drafter.
    """
    forward = calls.get("target_forward", [])
    if not forward:
        return {}
    shape = Counter(t for t, _ in forward).most_common(1)[0][0]
    fwd = [s for t, s in forward if t == shape]
    logit_calls = calls.get("target_logits", [])
    # logits run once per forward; pair them by order with the forwards of the steady size
    paired = [lg for (t, _), (_, lg) in zip(forward, logit_calls, strict=False) if t == shape]
    out = {"target_tokens": shape, "target_ms": 1e3 * (statistics.mean(fwd) + (statistics.mean(paired)
                                                                               if paired else 0.0)),
           "target_calls": len(fwd)}
    heads = calls.get("draft_head", [])
    if heads:
        drafted = sum(s for _, s in calls.get("draft_forward", [])) + sum(s for _, s in heads)
        out["draft_per_token_ms"] = 1e3 * drafted / len(heads)
        out["draft_heads"] = len(heads)
    return out
