"""Torch versions of the Triton kernels in ``vllm/v1/worker/gpu/sample/gumbel.py``, and the
random streams they (and the rejection sampler) draw from.

The random bits are reproduced exactly: murmur3 (Gumbel noise, keyed by seed, position and token)
and Philox-4x32-10 (``tl.rand``, the rejection sampler's acceptance draws) are computed in int64
arithmetic with every intermediate kept below 2**63 and masked to 32 bits.  The uniforms derived
from them are bit-identical to Triton's.  The transcendental functions applied afterwards (log,
exp) are torch's; Triton's interpreter uses numpy's and the GPU its own approximations, which
differ in the last bits, so sampled tokens are identical except where two noised logits tie to
within a few ulps.
"""

from __future__ import annotations

import torch

_UP = "vllm.v1.worker.gpu.sample.gumbel"

MASK32 = 0xFFFFFFFF
# Offset salt of the draft's noise stream (upstream's _DRAFT_NOISE_SALT).
DRAFT_NOISE_SALT = 1 << 30
# Smallest uniform tl_rand32 returns without zero (upstream's _TL_RAND_MIN, as fp32).
TL_RAND_MIN = 4.6566127342e-10


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """``(a * b) mod 2**32`` for 32-bit unsigned values held in int64, without int64 overflow."""
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & MASK32


def _mulhi32(a: torch.Tensor, b: int) -> torch.Tensor:
    """High 32 bits of the 64-bit product of two 32-bit unsigned values (Triton's ``umulhi``)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    middle = a_hi * b_lo + a_lo * b_hi
    return a_hi * b_hi + (((middle << 16) + a_lo * b_lo) >> 32)


def _rotl32(value: torch.Tensor, shift: int) -> torch.Tensor:
    return ((value << shift) | (value >> (32 - shift))) & MASK32


def _murmur3_mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _rotl32(_mul32(key, 0xCC9E2D51), 15)
    key = _mul32(key, 0x1B873593)
    h = _rotl32(h ^ key, 13)
    return (_mul32(h, 5) + 0xE6546B64) & MASK32


def _murmur3_fmix(h: torch.Tensor) -> torch.Tensor:
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur3_hash32(seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor, domain: int = 0) -> torch.Tensor:
    """murmur3 of the words (seed lo, seed hi, pos lo, offset) as unsigned 32-bit values in int64.

    ``seed`` and ``pos`` int64 (broadcast against ``offset``, the token ids).  Matches upstream's
    ``murmur3_hash32`` device function.
    """
    seed = seed.to(torch.int64)
    pos = pos.to(torch.int64)
    h = torch.full_like(seed, domain & MASK32)
    h = _murmur3_mix(h, seed & MASK32)
    h = _murmur3_mix(h, (seed >> 32) & MASK32)
    h = _murmur3_mix(h, pos & MASK32)
    h = _murmur3_mix(h, offset.to(torch.int64) & MASK32)
    return _murmur3_fmix(h ^ 16)


def murmur3_uniform32(seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """fp32 uniform in (0, 1) from the hash: ``(random32 + 0.5) * 2**-32`` rounded once."""
    random32 = murmur3_hash32(seed, pos, offset)
    hi16 = (random32 >> 16).to(torch.float32)
    lo16 = (random32 & 0xFFFF).to(torch.float32)
    return hi16 * 2.0**-16 + (lo16 + 0.5) * 2.0**-32


def murmur3_uniform64(seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """fp64 uniform in (0, 1) from 53 bits of two hashes (the second with domain 0x9E3779B9)."""
    lo = murmur3_hash32(seed, pos, offset)
    hi = murmur3_hash32(seed, pos, offset, domain=0x9E3779B9)
    random53 = (hi << 21) | (lo >> 11)
    uniform = (random53.to(torch.float64) + 0.5) * 2.0**-53
    return torch.where(uniform == 1.0, uniform - 2.0**-53, uniform)


def philox_rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``tl.rand(seed, offset)`` for int64 ``seed`` and ``offset``: Philox-4x32-10 of counter
    (offset lo, offset hi, 0, 0) under key (seed lo, seed hi), first word mapped to fp32 [0, 1)."""
    seed = seed.to(torch.int64)
    offset = offset.to(torch.int64)
    c0, c1 = offset & MASK32, (offset >> 32) & MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(10):
        c0, c1, c2, c3 = (
            _mulhi32(c2, 0xCD9E8D57) ^ c1 ^ k0,
            _mul32(c2, 0xCD9E8D57),
            _mulhi32(c0, 0xD2511F53) ^ c3 ^ k1,
            _mul32(c0, 0xD2511F53),
        )
        k0 = (k0 + 0x9E3779B9) & MASK32
        k1 = (k1 + 0xBB67AE85) & MASK32
    signed = torch.where(c0 >= 2**31, c0 - 2**32, c0)
    signed = torch.where(signed < 0, -signed - 1, signed).to(torch.int32)
    return signed.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)


def tl_rand32(seed: torch.Tensor, offset: torch.Tensor, includes_zero: bool) -> torch.Tensor:
    """Upstream's ``tl_rand32``: ``tl.rand``, floored at the smallest positive draw unless
    ``includes_zero``."""
    u = philox_rand(seed, offset)
    return u if includes_zero else u.clamp_min(torch.tensor(TL_RAND_MIN, dtype=torch.float32))


def spec_step_seed(seed: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """Upstream's ``spec_step_seed``: the step mixed into the seed's high 32 bits."""
    if isinstance(step, torch.Tensor):
        step = step.to(torch.int64)
    return seed.to(torch.int64) ^ (step << 32)


def _log1p_neg_stable(value: torch.Tensor) -> torch.Tensor:
    """``log(1 - value)`` as upstream computes it: a degree-8 series below 0.25, else direct."""
    polynomial = value * 0.125 + 1.0 / 7.0
    for coefficient in (1.0 / 6.0, 1.0 / 5.0, 1.0 / 4.0, 1.0 / 3.0, 1.0 / 2.0, 1.0):
        polynomial = value * polynomial + coefficient
    series = -value * polynomial
    direct = torch.log(torch.clamp_min(1.0 - value, 5.960464477539063e-08))
    return torch.where(value < 0.25, series, direct)


def gumbel_block_argmax(
    logits: torch.Tensor,
    vocab_size: int,
    block_size: int,
    seed: torch.Tensor,
    pos: torch.Tensor,
    temp: torch.Tensor,
    is_drafting: bool,
    use_fp64: bool,
    apply_temperature: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per vocab block, the max and argmax (global token id) of the Gumbel-noised logits.

    logits [n, num_blocks * block_size] fp32, -inf past ``vocab_size``; seed, pos [n] int64;
    temp [n] fp32.  Rows with ``temp == 0`` take the plain argmax.  Returns values [n, num_blocks]
    (fp64 if ``use_fp64``) and token ids [n, num_blocks] int64.  Mirrors upstream's
    ``gumbel_noised_argmax`` applied block by block.
    """
    num_rows, width = logits.shape
    sampling = temp != 0.0
    scale = torch.where(sampling, temp, 1.0)[:, None]
    if apply_temperature:
        logits = torch.where(sampling[:, None], logits / scale, logits)
    if use_fp64:
        logits = logits.to(torch.float64)
    rows = sampling.nonzero().squeeze(1)
    if rows.numel():
        keys = torch.arange(width, device=logits.device)[None, :]
        row_pos = pos[rows].to(torch.int64)
        if is_drafting:
            row_pos = row_pos + DRAFT_NOISE_SALT
        row_seed = seed[rows].to(torch.int64)[:, None]
        if use_fp64:
            u = murmur3_uniform64(row_seed, row_pos[:, None], keys)
            noise = -torch.log(-torch.log(u))
        else:
            u = murmur3_uniform32(row_seed, row_pos[:, None], keys)
            noise = -torch.log(-_log1p_neg_stable(u))
        noised = torch.where(keys < vocab_size, logits[rows] + noise, float("-inf"))
        logits = logits.index_copy(0, rows, noised)
    blocks = logits.view(num_rows, -1, block_size)
    # NaN is skipped by the reduction (as Triton's interpreter does).
    values, index = torch.where(blocks.isnan(), float("-inf"), blocks).max(dim=-1)
    token_ids = index + torch.arange(blocks.shape[1], device=logits.device)[None, :] * block_size
    return values, token_ids


def _padded_rows(x: torch.Tensor, rows: int, width: int, padded_width: int, fill: float) -> torch.Tensor:
    out = torch.full((rows, padded_width), fill, dtype=torch.float32, device=x.device)
    out[:, :width] = x[:rows, :width].to(torch.float32)
    return out


def temperature(
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """In place: divide each logits row by its request's temperature (fp32 division, stored in
    the logits dtype); rows at temperature 0 or 1 are left as they are.

    logits [num_tokens, vocab]; expanded_idx_mapping [num_tokens]; temperature [max_num_reqs].
    Replaces ``vllm.v1.worker.gpu.sample.gumbel._temperature_kernel``.
    """
    num_tokens = logits_ptr.shape[0]
    temp = temperature_ptr[expanded_idx_mapping_ptr[:num_tokens].to(torch.int64)].to(torch.float32)
    rows = ((temp != 0.0) & (temp != 1.0)).nonzero().squeeze(1)
    if rows.numel():
        scaled = logits_ptr[rows, :vocab_size].to(torch.float32) / temp[rows, None]
        logits_ptr[rows, :vocab_size] = scaled.to(logits_ptr.dtype)


def gumbel_sample(
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    logits_cache_row_mapping_ptr: torch.Tensor | None,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    bias_ptr: torch.Tensor | None,
    bias_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    IS_DRAFTING: bool,
    APPLY_TEMPERATURE: bool,
    USE_FP64: bool,
    PER_TOKEN_COL: bool,
    HAS_BIAS: bool,
) -> None:
    """Gumbel-max sampling, first stage: per token and vocab block, the max of the (temperature
    scaled, Gumbel-noised) logits and its token id.  Optionally caches the pre-temperature logits
    (bias included) into ``logits_cache[row, col]`` for the rejection sampler.

    local_argmax [num_tokens, num_blocks] int64; local_max [num_tokens, num_blocks] fp32/fp64;
    logits [num_tokens, vocab]; bias like logits; expanded_idx_mapping, pos [num_tokens];
    seeds, temp [max_num_reqs]; logits_cache [rows, cols, >= vocab] with col a scalar tensor or
    [num_tokens] (PER_TOKEN_COL); row mapping [max_num_reqs] or None (row = request state).
    Replaces ``vllm.v1.worker.gpu.sample.gumbel._gumbel_sample_kernel``.
    """
    num_tokens = logits_ptr.shape[0]
    num_blocks = local_argmax_ptr.shape[1]
    width = num_blocks * BLOCK_SIZE
    logits = logits_ptr[:, :vocab_size]
    if HAS_BIAS:
        logits = (logits.to(torch.float32) + bias_ptr[:num_tokens, :vocab_size].to(torch.float32)).to(logits.dtype)
    logits = _padded_rows(logits, num_tokens, vocab_size, width, float("-inf"))

    req = expanded_idx_mapping_ptr[:num_tokens].to(torch.int64)
    valid = req >= 0
    safe_req = req.clamp_min(0)
    temp = torch.where(valid, temp_ptr[safe_req].to(torch.float32), 0.0)
    seed = torch.where(valid, seeds_ptr[safe_req].to(torch.int64), 0)
    if logits_cache_ptr is not None:
        if PER_TOKEN_COL:
            col = logits_cache_col_ptr[:num_tokens].to(torch.int64)
        else:
            col = logits_cache_col_ptr.reshape(-1)[0].to(torch.int64).expand(num_tokens)
        source = logits if logits_cache_source_ptr is None else logits_cache_source_ptr
        if logits_cache_row_mapping_ptr is None:
            row = req
        else:
            row = torch.where(valid, logits_cache_row_mapping_ptr[safe_req].to(torch.int64), -1)
        keep = row >= 0
        logits_cache_ptr[row[keep], col[keep], :vocab_size] = source[:num_tokens, :vocab_size][keep].to(
            logits_cache_ptr.dtype
        )
        seed = spec_step_seed(seed, col)

    values, token_ids = gumbel_block_argmax(
        logits,
        vocab_size,
        BLOCK_SIZE,
        seed,
        pos_ptr[:num_tokens],
        temp,
        is_drafting=IS_DRAFTING,
        use_fp64=USE_FP64,
        apply_temperature=APPLY_TEMPERATURE,
    )
    local_argmax_ptr[:num_tokens, :num_blocks] = token_ids
    local_max_ptr[:num_tokens, :num_blocks] = values.to(local_max_ptr.dtype)


def gumbel_combine(
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    sampled_ptr: torch.Tensor,
    num_blocks: int,
    PADDED_NUM_BLOCKS: int,
) -> None:
    """Gumbel-max sampling, second stage: the token of each row's winning block (the first NaN
    block, else the first block holding the maximum, as ``torch.argmax`` picks).

    local_argmax [num_rows, num_blocks] int64; local_max [num_rows, num_blocks];
    sampled [num_rows] int64.
    Replaces ``vllm.v1.worker.gpu.sample.gumbel._gumbel_combine_kernel``.
    """
    num_rows = sampled_ptr.shape[0]
    winner = local_max_ptr[:num_rows, :num_blocks].argmax(dim=1, keepdim=True)
    sampled_ptr[:num_rows] = local_argmax_ptr[:num_rows].gather(1, winner).squeeze(1).to(sampled_ptr.dtype)


OVERRIDES = {
    f"{_UP}._temperature_kernel": temperature,
    f"{_UP}._gumbel_sample_kernel": gumbel_sample,
    f"{_UP}._gumbel_combine_kernel": gumbel_combine,
}
