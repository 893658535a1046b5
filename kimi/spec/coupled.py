"""Seeded requests verified by coupling: the output of a seeded request does not depend on the drafts (the v0.32
line; patch ``0018-seeded-coupled-verification`` has ``RejectionSampler.forward`` of the V1 model runner call
:meth:`CoupledVerification.start`, :meth:`~CoupledVerification.uncoupled` and :meth:`~CoupledVerification.finish`
through :mod:`kimi.hooks.seeded_coupled_verification`).

vLLM's rejection sampler (``vllm/v1/sample/rejection_sampler.py``) verifies a seeded request
(``SamplingParams(seed=...)``, temperature > 0, its own ``torch.Generator``) with the ratio test: it draws from the
request's generator one uniform per scheduled draft token (``generate_uniform_probs``), one exponential row for the
recovered token (``sample_recovered_tokens``), and the bonus token (its ``Sampler``, one draw). How many values a
step takes depends on how many draft tokens were scheduled, and whether a draft is accepted depends on the draft
itself, which is not bit-stable across batch shapes. So with EAGLE-3 the same seeded request gives other tokens
under another scheduler token budget or in another batch, while without speculation it does not.

Here a seeded request whose drafts are greedy (no draft probabilities, not synthetic acceptance) is verified by
coupling (the Gumbel-max / exponential-race coupling): the token at its ``t``-th output position is what the plain
sampler would sample there with the request's generator, i.e. its ``t``-th draw; a draft token is accepted iff it
equals that sample; at the first mismatch the sample is emitted and the step stops; when all ``n`` drafts match, the
bonus token is the ``(n + 1)``-th draw. Every emitted token is a sample of the target's processed distribution
(temperature, top-k / top-p, penalties: the draft rows' logits after ``apply_sampling_constraints``) with noise that
does not depend on the drafts: lossless, and a draft ``x`` is accepted with probability ``p(x)``, as with the ratio
test and a one-hot draft. The request's generator advances by one draw per output token, as without speculation,
so its output is the same under any chunking and, up to the numerics of the target's logits, the same as without
speculation.

A draw is the sampler's own: each draft row is sampled by the ``Sampler``'s ``topk_topp_sampler`` alone with
``{0: generator}`` (on CPU one ``torch.randint`` seed for ``fused_gumbel_argmax``, elsewhere one exponential row of
``random_sample``), with top-k / top-p off because ``apply_sampling_constraints`` applied them already (top-p twice
would cut more). The bonus token is sampled by the ``Sampler`` before the draft rows are processed; so
:meth:`CoupledVerification.start` first moves each coupled generator ``n`` draws on (draws of a dummy row: what a
draw takes from a generator does not depend on the row's values), :meth:`~CoupledVerification.finish` puts the
state back and draws the draft rows, and leaves the generator after the last draw used.
The standard ``rejection_sample`` runs for every request; it sees the coupled requests without their generators
(:meth:`~CoupledVerification.uncoupled`: they take unseeded noise there) and their rows are overwritten.

Greedy and unseeded requests, requests without draft tokens this step (the plain path: the bonus draw only), and
batches with draft probabilities or synthetic acceptance are left to the ratio test. A request whose sample this step
is discarded (a partial prefill, patch 0011) has no draft tokens. The coupling's own draws leave the global random
generators as they were (:func:`_global_rng_kept`), so unseeded requests get vLLM's tokens beside coupled ones.
``KIMI_SEEDED_VERIFICATION=upstream`` turns the coupling off (the ratio test for every request, as upstream vLLM
does); a value it does not know fails when the rejection sampler is built
(:func:`kimi.spec.seeded_mode.check_mode`).

The V2 model runner (the default on CUDA) has its own rejection sampler:
:mod:`kimi.spec.coupled_v2`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from kimi.spec.seeded_mode import mode

__all__ = ["CoupledVerification"]

#: ``TopKTopPSampler.forward``: ``(logits [rows, vocab] float32, {row: generator}, top_k, top_p)`` ->
#: ``(token ids [rows] int64, processed logits or None)``.
RowSampler = Callable[..., tuple[torch.Tensor, Any]]

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def _global_rng_kept(device: torch.device) -> Iterator[None]:
    """The coupling's own draws leave the global random generators (torch's CPU one and, on CUDA, ``device``'s) where
    they were: vLLM's CPU sampler also takes one value from the global generator per row it samples (the seed of an
    unseeded row), so without this an unseeded request batched with a coupled one would get other tokens than
    vLLM gives it (the engine's ``seed`` makes those reproducible)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield


@dataclasses.dataclass(frozen=True)
class _Coupled:
    """One coupled request of this step."""

    index: int  # batch row (key of SamplingMetadata.generators)
    start: int  # its first row in target_logits / draft_token_ids
    num_drafts: int
    before: torch.Tensor  # generator state before this step's first draw (uint8)
    after_drafts: torch.Tensor  # state after num_drafts dummy draws: where the bonus draw started


class CoupledVerification:
    """The coupled requests of one ``RejectionSampler.forward`` call (none: every method does nothing)."""

    def __init__(self, sample: RowSampler | None = None, generators: Mapping[int, torch.Generator] | None = None,
                 requests: tuple[_Coupled, ...] = ()) -> None:
        self._sample = sample
        self._generators = generators or {}
        self.requests = requests

    @classmethod
    def start(cls, sample: RowSampler, metadata: Any, draft_probs: torch.Tensor | None, sampling_metadata: Any,
              synthetic_mode: bool, logits: torch.Tensor) -> CoupledVerification:
        """Before the bonus tokens are sampled: pick the coupled requests, keep their generators' states and move
        each generator ``n`` draws on, so that the bonus draw is the ``(n + 1)``-th.

        Args:
            sample: the ``Sampler``'s ``topk_topp_sampler`` (see :data:`RowSampler`).
            metadata: ``SpecDecodeMetadata``; its ``num_draft_tokens`` (list[int], [batch_size]) is read.
            draft_probs: [num_draft_tokens, vocab] or None; coupling only when None (greedy drafts).
            sampling_metadata: ``SamplingMetadata``; ``generators`` (batch row -> generator, seeded requests only:
                vLLM gives a generator to ``SamplingType.RANDOM_SEED`` requests, temperature > 0) and ``all_greedy``.
            synthetic_mode: the rejection sampler's synthetic acceptance (no coupling then).
            logits: [num_draft_tokens + batch_size, vocab] target logits; only their width and device are used.

        Returns:
            The step's coupling; one without requests when nothing is coupled (the common case: no seeded request).
        """
        generators = sampling_metadata.generators
        if (not generators or draft_probs is not None or synthetic_mode or sampling_metadata.all_greedy
                or mode() != "coupled"):
            return _NONE
        counts = metadata.num_draft_tokens
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        dummy = None
        requests = []
        for index in sorted(generators):
            n = counts[index]
            if n == 0:
                continue
            gen = generators[index]
            before = gen.get_state()
            if dummy is None:
                # a draw takes the same from a generator whatever the row: one finite logit keeps it cheap
                dummy = torch.full((1, logits.shape[-1]), float("-inf"), dtype=torch.float32, device=logits.device)
                dummy[0, 0] = 0.0
            with _global_rng_kept(logits.device):
                for _ in range(n):
                    sample(dummy.clone(), {0: gen}, None, None)
            requests.append(_Coupled(index, starts[index], n, before, gen.get_state()))
        if not requests:
            return _NONE
        return cls(sample, generators, tuple(requests))

    def uncoupled(self, sampling_metadata: Any) -> Any:
        """``sampling_metadata`` for the standard ``rejection_sample``: without the coupled requests' generators
        (their rows there draw unseeded noise and are overwritten by :meth:`finish`)."""
        if not self.requests:
            return sampling_metadata
        coupled = {r.index for r in self.requests}
        kept = {i: g for i, g in sampling_metadata.generators.items() if i not in coupled}
        return dataclasses.replace(sampling_metadata, generators=kept)

    def finish(self, output_token_ids: torch.Tensor, metadata: Any, target_logits: torch.Tensor,
               bonus_token_ids: torch.Tensor) -> None:
        """After ``rejection_sample``: write the coupled requests' rows and leave each generator after its last
        used draw.

        Args:
            output_token_ids: [batch_size, max_spec_len + 1] int32, ``rejection_sample``'s output; the coupled
                requests' rows are rewritten in place: the accepted drafts, then the sample at the first mismatch
                or, all accepted, the bonus token; ``PLACEHOLDER_TOKEN_ID`` (-1) after.
            metadata: ``SpecDecodeMetadata``; its ``draft_token_ids`` ([num_draft_tokens] int32) is read.
            target_logits: [num_draft_tokens, vocab] float32, the draft rows after ``apply_sampling_constraints``
                (temperature, top-k / top-p applied); not modified.
            bonus_token_ids: [batch_size, 1] int32, the bonus tokens the ``Sampler`` drew (the ``(n + 1)``-th draw
                of each coupled request).
        """
        if not self.requests:
            return
        from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

        width = output_token_ids.shape[1]
        for r in self.requests:
            gen = self._generators[r.index]
            after_bonus = gen.get_state()
            gen.set_state(r.before)
            drafts = metadata.draft_token_ids[r.start:r.start + r.num_drafts].tolist()
            tokens = []
            with _global_rng_kept(target_logits.device):
                for j, draft in enumerate(drafts):
                    row = target_logits[r.start + j:r.start + j + 1].clone()
                    tokens.append(int(self._sample(row, {0: gen}, None, None)[0].item()))
                    if tokens[-1] != draft:
                        break
            if len(tokens) == r.num_drafts and tokens[-1] == drafts[-1]:  # every draft accepted
                if not torch.equal(gen.get_state(), r.after_drafts):
                    _log.warning("kimi.spec.coupled: %s draws of the %s generator of batch row "
                                 "%d took other values than %s dummy draws: its bonus token did not use the next draw",
                                 r.num_drafts, gen.device.type, r.index, r.num_drafts)
                tokens.append(int(bonus_token_ids[r.index, 0].item()))
                gen.set_state(after_bonus)
            row_out = torch.full((width,), PLACEHOLDER_TOKEN_ID, dtype=output_token_ids.dtype)
            row_out[:len(tokens)] = torch.tensor(tokens, dtype=output_token_ids.dtype)
            output_token_ids[r.index].copy_(row_out.to(output_token_ids.device))


_NONE = CoupledVerification()

