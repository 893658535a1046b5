"""Seeded requests verified by coupling on the V2 model runner (patch ``0019-seeded-coupled-verification-v2``;
``RejectionSampler._verify`` of ``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`` calls :func:`check_mode` when
built, then :func:`coupled_requests_v2` and :func:`couple_v2` each step, through
``kimi.hooks.seeded_coupled_verification_v2``). The V1 runner's counterpart, and the
argument that coupling is lossless, is :mod:`kimi.spec.coupled`.

V2 has no per-request generators: its sampler draws Gumbel noise keyed by the request's seed, the row's position and
the token (``gumbel_sample``, ``vllm/v1/worker/gpu/sample/gumbel.py``), so without speculation a seeded request's
tokens do not depend on the batch. But V2 verifies by a ratio test and resamples a rejected position from the residual
distribution, so with EAGLE-3 the tokens follow the drafts. Here every logits row of a coupled request is sampled by
``gumbel_sample`` exactly as the plain sampler samples that position without speculation, and the drafts are compared
with those samples. The same :data:`~kimi.spec.seeded_mode.MODE_ENV` turns it off.
"""

from __future__ import annotations

import numpy as np
import torch

from kimi.spec.seeded_mode import mode


def coupled_requests_v2(seeds_set: np.ndarray, temperature: np.ndarray, idx_mapping_np: np.ndarray,
                        has_draft_logits: bool, synthetic: bool, watermark: bool) -> np.ndarray | None:
    """Which requests of a V2 verification chunk are verified by coupling: seeded (``SamplingParams.seed`` set) and
    not greedy, when the drafts are one-hot (greedy drafting, no draft logits), acceptance is not synthetic, no
    watermark reshapes the sampler's draws, and :data:`MODE_ENV` is ``coupled``.

    Args:
        seeds_set: [max_num_reqs] bool, ``SamplingStates.seeds_set`` (the seed was given by the user).
        temperature: [max_num_reqs] float32, ``SamplingStates.temperature.np``.
        idx_mapping_np: [num_reqs] int, the chunk's request-state indices.

    Returns:
        [num_reqs] bool, or None when no request is coupled (the common case; nothing else is computed then).
    """
    if has_draft_logits or synthetic or watermark or mode() != "coupled":
        return None
    coupled = seeds_set[idx_mapping_np] & (temperature[idx_mapping_np] != 0.0)
    return coupled if coupled.any() else None


def couple_v2(samples: torch.Tensor, drafts: torch.Tensor, cu_num_logits: torch.Tensor, coupled: torch.Tensor,
              sampled: torch.Tensor, num_sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The coupled requests' output of a V2 verification chunk: the longest prefix of drafts equal to the samples of
    the rows before them, then the sample at the first mismatch (or, all accepted, the last row's sample, the bonus
    token). Every emitted token is the plain sampler's sample at its position, so the request's output does not
    depend on its drafts. Runs on the device without a host sync.

    Args:
        samples: [num_logits] int64, every row's sample (``gumbel_sample`` of the processed logits, as the plain
            sampler draws: ``apply_temperature=False``, not drafting).
        drafts: [num_logits] int64, each row's input token; row ``j > 0`` of a request holds its ``j``-th draft,
            ``-1`` for a draft that must not be accepted (placeholders, structured-output rejections).
        cu_num_logits: [num_reqs + 1] int32/int64, the rows of each request.
        coupled: [num_reqs] bool, the requests to rewrite (:func:`coupled_requests_v2`).
        sampled: [num_reqs, k + 1] int64, the ratio test's output (``rejection_sample``); kept for the others.
        num_sampled: [num_reqs] int32, its counts; kept for the others.

    Returns:
        ``(sampled, num_sampled)`` with the coupled requests' rows replaced (new tensors).
    """
    num_reqs, width = sampled.shape
    cu = cu_num_logits.to(torch.int64)
    rows = torch.arange(samples.shape[0], device=samples.device)
    request = torch.searchsorted(cu[1:], rows, right=True)
    local = rows - cu[request]
    grid = samples.new_full((num_reqs, width), -1)
    grid[request, local] = samples
    grid_drafts = drafts.new_full((num_reqs, width), -1)
    grid_drafts[request, local] = drafts
    num_drafts = (cu[1:] - cu[:-1] - 1).unsqueeze(1)
    steps = torch.arange(width - 1, device=samples.device).unsqueeze(0)
    accepted = (grid[:, :-1] == grid_drafts[:, 1:]) & (steps < num_drafts)
    num_accepted = accepted.to(torch.int32).cumprod(dim=1).sum(dim=1)
    return (torch.where(coupled.unsqueeze(1), grid, sampled),
            torch.where(coupled, (num_accepted + 1).to(num_sampled.dtype), num_sampled))
