"""The CPU platform's torch kernel overrides (``kimi.cpu_platform.kernels``) against vLLM 0.34.0's
Triton kernels run in Triton's interpreter.

Each test drives an upstream launcher (or the launch its caller makes) on realistic random batches:
padded request tables, requests without drafts, ragged query lengths, greedy and seeded requests.
Most kernels are compared through ``Compare``, installed in place of the upstream kernel: every
launch runs the Triton kernel on the caller's tensors and the override (through the dispatcher's
``KernelOverride``, as the platform registers it) on copies, then checks every tensor argument;
the caller goes on with Triton's results, so each kernel sees the inputs the real pipeline gives it.
Kernels reading pointer tables (block tables, the fused staged writer) are compared on two copies
of the owning object instead.

Integer and selection outputs must be identical.  Floats that go through exp/log/sum (Triton's
interpreter uses numpy's, the override torch's, which differ in the last bits and in summation
order) are compared with a tight tolerance; the random bits behind them (murmur3, Philox) are
checked bit for bit.
"""

from __future__ import annotations

import copy
import inspect
import os
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from conftest import installed_line

pytestmark = pytest.mark.line("mainline")
NEXT_INSTALLED = installed_line() == "mainline"

if NEXT_INSTALLED:
    # Triton picks the interpreter when a kernel is decorated: set before vLLM's kernels import.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    from vllm.triton_utils import dispatcher
    from vllm.v1.worker.gpu import block_table as up_block_table
    from vllm.v1.worker.gpu import buffer_utils as up_buffer_utils
    from vllm.v1.worker.gpu import input_batch as up_input_batch
    from vllm.v1.worker.gpu.sample import gumbel as up_gumbel
    from vllm.v1.worker.gpu.spec_decode import adaptive_verification as up_adaptive
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as up_rejection_sampler
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils as up_rejection_utils
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar import speculator as up_speculator

    from kimi.cpu_platform.kernels import OVERRIDES
    from kimi.cpu_platform.kernels import gumbel as our_gumbel


# ---------------------------------------------------------------------------------------------
# Harness


def upstream_kernel(name: str):
    """The upstream Triton kernel ``name`` (the original, also once the platform registered its
    overrides)."""
    host, attr = dispatcher._resolve_kernel(name)
    kernel = getattr(host, attr)
    if not dispatcher._is_triton_kernel(kernel):
        kernel = dispatcher._registry[name][0]
    return kernel


def clone_arg(value):
    """A copy of a launch argument; tensors keep their layout (strides and offset into a copied
    storage), so the override sees the same views."""
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage().clone()
        return torch.empty(0, dtype=value.dtype).set_(storage, value.storage_offset(), value.size(), value.stride())
    return value


def assert_same(name: str, arg: str, expected: torch.Tensor, actual: torch.Tensor, tolerant: bool) -> None:
    assert expected.shape == actual.shape and expected.dtype == actual.dtype, (name, arg)
    if expected.is_floating_point() and tolerant:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=2e-6, equal_nan=True, msg=f"{name}: {arg}")
        return
    if expected.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
        expected, actual = expected.view(bits), actual.view(bits)
    mismatch = (expected != actual).nonzero()
    assert not mismatch.numel(), f"{name}: {arg} differs at {mismatch[:8].tolist()}"


class Compare:
    """Stands in for an upstream kernel: runs it and the override on copies, compares every tensor
    argument, and leaves Triton's results in the caller's tensors."""

    def __init__(self, name: str, tolerant: frozenset[str] = frozenset()):
        self.name = name
        self.kernel = upstream_kernel(name)
        self.override = dispatcher.KernelOverride(self.kernel, OVERRIDES[name])
        self.tolerant = tolerant
        self.arg_names = self.kernel.arg_names
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            ours_args = [clone_arg(a) for a in args]
            ours_kwargs = {k: clone_arg(v) for k, v in kwargs.items()}
            self.kernel[grid](*args, **kwargs)
            self.override[grid](*ours_args, **ours_kwargs)
            names = list(self.arg_names)
            for i, (theirs, ours) in enumerate(zip(args, ours_args, strict=True)):
                if isinstance(theirs, torch.Tensor):
                    assert_same(self.name, names[i], theirs, ours, names[i] in self.tolerant)
            for key, theirs in kwargs.items():
                if isinstance(theirs, torch.Tensor):
                    assert_same(self.name, key, theirs, ours_kwargs[key], key in self.tolerant)
            self.launches += 1

        return launch


@contextmanager
def comparing(monkeypatch, name: str, tolerant: frozenset[str] = frozenset()):
    """Install ``Compare`` for kernel ``name``; fails unless it was launched."""
    compare = Compare(name, tolerant)
    host, attr = dispatcher._resolve_kernel(name)
    with monkeypatch.context() as patch:
        patch.setattr(host, attr, compare)
        yield compare
    assert compare.launches, f"{name} was not launched"


@contextmanager
def using(monkeypatch, names, impl: bool):
    """Point kernels at the upstream Triton kernel (``impl=False``) or the override."""
    with monkeypatch.context() as patch:
        for name in names:
            host, attr = dispatcher._resolve_kernel(name)
            kernel = upstream_kernel(name)
            patch.setattr(host, attr, dispatcher.KernelOverride(kernel, OVERRIDES[name]) if impl else kernel)
        yield


# ---------------------------------------------------------------------------------------------
# Batches

IB = "vllm.v1.worker.gpu.input_batch"
BT = "vllm.v1.worker.gpu.block_table"
BU = "vllm.v1.worker.gpu.buffer_utils"
GB = "vllm.v1.worker.gpu.sample.gumbel"
RS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
RU = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
SP = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"
AV = "vllm.v1.worker.gpu.spec_decode.adaptive_verification"
AE = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"

# (num_reqs, max_num_reqs, num_speculative_steps, seed)
SHAPES = [(1, 4, 0, 0), (3, 8, 3, 1), (5, 5, 2, 2), (7, 16, 4, 3), (32, 40, 3, 4)]
SHAPE_IDS = [f"reqs{n}-of{m}-spec{s}" for n, m, s, _ in SHAPES]


def make_batch(num_reqs: int, max_num_reqs: int, num_spec: int, seed: int, max_len: int = 96):
    """A step's batch: requests in random state slots, some prefilling (chunked or finishing the
    prompt), others decoding with 0..num_spec drafts; query lengths ragged."""
    g = torch.Generator().manual_seed(seed)

    def randint(low, high, size=()):
        return torch.randint(low, high, size, generator=g)

    idx_mapping = torch.randperm(max_num_reqs, generator=g)[:num_reqs].to(torch.int64)
    prefill_len = randint(2, 40, (max_num_reqs,)).to(torch.int32)
    num_computed = torch.zeros(max_num_reqs, dtype=torch.int32)
    query_len = torch.zeros(num_reqs, dtype=torch.int64)
    num_drafts = torch.zeros(num_reqs, dtype=torch.int64)
    for b in range(num_reqs):
        s = int(idx_mapping[b])
        kind = int(randint(0, 3))
        if kind == 0:  # prefill chunk (maybe the prompt's last)
            num_computed[s] = int(randint(0, int(prefill_len[s])))
            query_len[b] = int(randint(1, int(prefill_len[s] - num_computed[s]) + 1))
        else:  # decode with drafts
            num_computed[s] = int(prefill_len[s]) + int(randint(0, 20))
            num_drafts[b] = int(randint(0, num_spec + 1)) if kind == 2 else 0
            query_len[b] = 1 + num_drafts[b]
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(query_len, 0)
    past_prompt = num_computed[idx_mapping].to(torch.int64) + query_len >= prefill_len[idx_mapping]
    num_logits = torch.where(past_prompt, 1 + num_drafts, 1)
    num_drafts = num_logits - 1
    cu_num_logits = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu_num_logits[1:] = torch.cumsum(num_logits, 0)
    all_token_ids = randint(0, 1000, (max_num_reqs, max_len)).to(torch.int32)
    seq_lens = (num_computed[idx_mapping].to(torch.int64) + query_len).to(torch.int32)
    return SimpleNamespace(
        g=g, num_reqs=num_reqs, max_num_reqs=max_num_reqs, num_spec=num_spec, idx_mapping=idx_mapping,
        prefill_len=prefill_len, num_computed=num_computed, query_len=query_len, query_start_loc=query_start_loc,
        num_tokens=int(query_start_loc[-1]), num_drafts=num_drafts, num_logits=num_logits, cu_num_logits=cu_num_logits,
        total_logits=int(cu_num_logits[-1]), all_token_ids=all_token_ids, seq_lens=seq_lens, max_len=max_len,
    )


# ---------------------------------------------------------------------------------------------
# Registry


def test_every_override_names_an_upstream_kernel_with_its_parameters():
    assert len(OVERRIDES) >= 20
    for name, impl in OVERRIDES.items():
        kernel = upstream_kernel(name)
        assert dispatcher._is_triton_kernel(kernel), name
        params = inspect.signature(impl).parameters.values()
        names = tuple(p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD)
        assert names == tuple(kernel.arg_names), name
        assert impl.__doc__ and name in " ".join(impl.__doc__.split()), f"{name}: docstring names its kernel"


# ---------------------------------------------------------------------------------------------
# input_batch.py


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prepare_prefill_inputs(monkeypatch, shape):
    b = make_batch(*shape)
    input_ids = torch.randint(0, 9, (b.num_tokens + 5,), dtype=torch.int32)
    for num_lookahead in (1, 3):
        next_prefill_tokens = torch.full((num_lookahead, b.max_num_reqs), -7, dtype=torch.int32)
        with comparing(monkeypatch, f"{IB}._prepare_prefill_inputs_kernel"):
            up_input_batch.prepare_prefill_inputs(
                input_ids, next_prefill_tokens, b.idx_mapping, b.query_start_loc, b.all_token_ids, b.prefill_len,
                b.num_computed,
            )


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prepare_pos_seq_lens(monkeypatch, shape):
    b = make_batch(*shape)
    pos = torch.full((b.num_tokens + 8,), -1, dtype=torch.int64)
    seq_lens = torch.full((b.max_num_reqs,), 99, dtype=torch.int32)
    with comparing(monkeypatch, f"{IB}._prepare_pos_seq_lens_kernel"):
        up_input_batch.prepare_pos_seq_lens(b.idx_mapping, b.query_start_loc, b.num_computed, pos, seq_lens)


@pytest.mark.parametrize("num_new_sampled", [1, 0])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_combine_sampled_and_draft_tokens(monkeypatch, shape, num_new_sampled):
    b = make_batch(*shape)
    input_ids = torch.randint(0, 50, (b.num_tokens + 3,), dtype=torch.int32)
    last_sampled = torch.randint(1000, 2000, (b.max_num_reqs,), dtype=torch.int32)
    draft_tokens = torch.randint(2000, 3000, (b.max_num_reqs, max(b.num_spec, 1)), dtype=torch.int32)
    num_logits = b.total_logits
    cu_num_logits = b.cu_num_logits
    if num_new_sampled == 0:  # no bonus logits: one logit fewer per request with drafts
        counts = (b.num_logits - 1).clamp_min(0)
        cu_num_logits = torch.zeros_like(b.cu_num_logits)
        cu_num_logits[1:] = torch.cumsum(counts, 0)
        num_logits = int(cu_num_logits[-1])
    with comparing(monkeypatch, f"{IB}._combine_sampled_and_draft_tokens_kernel"):
        up_input_batch.combine_sampled_and_draft_tokens(
            input_ids, b.idx_mapping, last_sampled, b.query_start_loc, b.seq_lens, b.prefill_len, draft_tokens,
            cu_num_logits, num_logits, num_new_sampled_tokens=num_new_sampled,
        )


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_get_num_sampled_and_rejected(monkeypatch, shape):
    b = make_batch(*shape)
    num_sampled = (torch.randint(0, 100, (b.num_reqs,)) % (b.num_logits + 1)).clamp_min(1).to(torch.int32)
    with comparing(monkeypatch, f"{IB}._get_num_sampled_and_rejected_kernel"):
        up_input_batch.get_num_sampled_and_rejected(
            num_sampled, b.seq_lens, b.cu_num_logits, b.idx_mapping, b.prefill_len)


@pytest.mark.parametrize("with_drafts", [False, True])
@pytest.mark.parametrize("with_bin_counts", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_post_update(monkeypatch, shape, with_bin_counts, with_drafts):
    b = make_batch(*shape)
    num_spec = max(b.num_spec, 1)
    idx_mapping = b.idx_mapping.clone()
    idx_mapping[torch.rand(b.num_reqs, generator=b.g) < 0.2] = -1  # rows to skip
    vocab = 64
    sampled = torch.randint(0, vocab, (b.num_reqs, num_spec + 1), dtype=torch.int64)
    num_sampled = torch.randint(0, num_spec + 2, (b.num_reqs,), dtype=torch.int32)
    num_rejected = torch.randint(0, num_spec + 1, (b.num_reqs,), dtype=torch.int32)
    total_len = torch.randint(0, 40, (b.max_num_reqs,), dtype=torch.int32)
    with comparing(monkeypatch, f"{IB}._post_update_kernel"):
        up_input_batch.post_update(
            idx_mapping,
            b.num_computed.clone(),
            torch.randint(0, vocab, (b.max_num_reqs,), dtype=torch.int32),
            torch.randint(0, 3, (b.max_num_reqs, vocab), dtype=torch.int32) if with_bin_counts else None,
            sampled,
            num_sampled,
            num_rejected,
            b.query_start_loc if shape[0] % 2 else None,
            b.all_token_ids.clone(),
            total_len,
            torch.randint(0, vocab, (b.num_reqs, num_spec), dtype=torch.int32) if with_drafts else None,
            torch.full((b.max_num_reqs, num_spec), -1, dtype=torch.int32) if with_drafts else None,
        )


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_post_update_num_computed_tokens(monkeypatch, shape):
    b = make_batch(*shape)
    with comparing(monkeypatch, f"{IB}._post_update_num_computed_tokens_kernel"):
        up_input_batch.post_update_num_computed_tokens(b.idx_mapping, b.num_computed.clone(), b.query_start_loc)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_expand_idx_mapping(monkeypatch, shape):
    b = make_batch(*shape)
    with comparing(monkeypatch, f"{IB}._expand_idx_mapping_kernel"):
        up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits, b.num_spec + 1)


# ---------------------------------------------------------------------------------------------
# block_table.py and buffer_utils.py (pointer tables: compared on two copies of the tables)


@pytest.fixture
def no_uva(monkeypatch):
    """Host buffers without pinned memory (torch's CPU build has no pinned allocator)."""
    monkeypatch.setattr(up_buffer_utils, "is_uva_available", lambda: False)


def make_block_tables(block_sizes, max_num_reqs, max_blocks, seed, reach=None):
    g = torch.Generator().manual_seed(seed)
    tables = up_block_table.BlockTables(
        block_sizes, max_num_reqs, 2048, max_blocks, torch.device("cpu"), sliding_window_reach=reach
    )
    for req in range(max_num_reqs):
        new = tuple(torch.randint(1, 500, (int(torch.randint(0, m + 1, (), generator=g)),), generator=g).tolist()
                    for m in max_blocks)
        tables.append_block_ids(req, new, overwrite=True)
    return tables


def block_table_state(tables) -> list[torch.Tensor]:
    return [b.gpu.clone() for b in tables.block_tables] + [t.clone() for t in tables.input_block_tables] + [
        tables.slot_mappings.clone(), tables.num_blocks.gpu.clone()]


@pytest.mark.parametrize("groups", [[16], [16, 32]], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_apply_write(monkeypatch, no_uva, groups, seed):
    """Single group: StagedWriteTensor.apply_write; two: FusedStagedWriter (pointer table)."""
    states = []
    for impl in (False, True):
        with using(monkeypatch, [f"{BU}._apply_write_kernel"], impl):
            tables = make_block_tables(groups, 6, [12] * len(groups), seed)
            tables.apply_staged_writes()
            # Appends to existing rows.
            extra = tuple([7, 8, 9][: 12 - int(tables.num_blocks.np[i, 2])] for i in range(len(groups)))
            tables.append_block_ids(2, extra,
                                    overwrite=False)
            tables.apply_staged_writes()
            states.append(block_table_state(tables))
    for i, (theirs, ours) in enumerate(zip(*states, strict=True)):
        assert_same("apply_write", f"state {i}", theirs, ours, tolerant=False)


@pytest.mark.parametrize("sliding", [False, True])
@pytest.mark.parametrize("groups", [[16], [16, 32]], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=SHAPE_IDS[:4])
def test_gather_block_tables_and_slot_mappings(monkeypatch, no_uva, shape, groups, sliding):
    b = make_batch(*shape)
    assert b.num_tokens + 4 <= 2048  # the slot mappings' width (the kernels write unchecked)
    reach = [40 if sliding else 0] + [0] * (len(groups) - 1)
    positions = torch.zeros(b.num_tokens + 4, dtype=torch.int64)
    up_input_batch.prepare_pos_seq_lens(b.idx_mapping, b.query_start_loc, b.num_computed, positions,
                                        torch.zeros(b.max_num_reqs, dtype=torch.int32))
    positions = positions.clamp_max(12 * min(groups) - 1)
    idx_mapping = b.idx_mapping.clone()
    if b.num_reqs > 2:
        idx_mapping[-1] = -1  # a dummy request owns no blocks (slot mappings only)
    states = []
    for impl in (False, True):
        tables = make_block_tables(groups, b.max_num_reqs, [12] * len(groups), shape[3], reach=reach)
        tables.apply_staged_writes()
        with using(monkeypatch, [f"{BT}._gather_block_tables_kernel", f"{BT}._compute_slot_mappings_kernel"], impl):
            # A larger batch first, leaving rows the next gather must clear.
            tables.gather_block_tables(torch.arange(b.max_num_reqs), num_reqs_padded=b.max_num_reqs)
            tables.gather_block_tables(b.idx_mapping, num_reqs_padded=min(b.num_reqs + 1, b.max_num_reqs),
                                       num_computed_tokens=b.num_computed)
            tables.compute_slot_mappings(idx_mapping, b.query_start_loc, positions, num_tokens_padded=b.num_tokens + 4)
        states.append(block_table_state(tables))
    for i, (theirs, ours) in enumerate(zip(*states, strict=True)):
        assert_same("block tables", f"state {i}", theirs, ours, tolerant=False)


# ---------------------------------------------------------------------------------------------
# sample/gumbel.py


def test_murmur3_and_philox_are_bit_identical():
    """The hash, both uniforms and tl.rand, through upstream's device functions in a tiny kernel."""
    import triton
    import triton.language as tl

    @triton.jit
    def draws(seed_ptr, pos_ptr, h_ptr, u32_ptr, u64_ptr, rand_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        seed = tl.load(seed_ptr + i)
        pos = tl.load(pos_ptr + i)
        tl.store(h_ptr + i, up_gumbel.murmur3_hash32(seed, pos, i * 977).to(tl.int64))
        tl.store(u32_ptr + i, up_gumbel.murmur3_uniform32(seed, pos, i * 977))
        tl.store(u64_ptr + i, up_gumbel.murmur3_uniform64(seed, pos, i * 977))
        tl.store(rand_ptr + i, up_gumbel.tl_rand32(seed, pos, False))

    n = 256
    g = torch.Generator().manual_seed(0)
    seed = torch.randint(-(2**62), 2**62, (n,), generator=g)
    seed[:4] = torch.tensor([0, -1, 2**40 + 5, 1])
    pos = torch.randint(0, 2**33, (n,), generator=g)
    h, rand, u32 = torch.zeros(n, dtype=torch.int64), torch.zeros(n), torch.zeros(n)
    u64 = torch.zeros(n, dtype=torch.float64)
    draws[(1,)](seed, pos, h, u32, u64, rand, N=n)
    keys = torch.arange(n) * 977
    assert torch.equal(our_gumbel.murmur3_hash32(seed, pos, keys), h)
    assert torch.equal(our_gumbel.murmur3_uniform32(seed, pos, keys), u32)
    assert torch.equal(our_gumbel.murmur3_uniform64(seed, pos, keys), u64)
    assert torch.equal(our_gumbel.tl_rand32(seed, pos, includes_zero=False), rand)


def sampling_state(b, greedy_share: float):
    temperature = torch.rand(b.max_num_reqs, generator=b.g) * 1.5 + 0.1
    temperature[torch.rand(b.max_num_reqs, generator=b.g) < greedy_share] = 0.0
    temperature[0] = 1.0
    seeds = torch.randint(-(2**62), 2**62, (b.max_num_reqs,), generator=b.g)
    return temperature, seeds


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_temperature(monkeypatch, shape):
    b = make_batch(*shape)
    temperature, _ = sampling_state(b, 0.3)
    expanded, _ = up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits, b.num_spec + 1)
    logits = torch.randn(b.total_logits, 9000, generator=b.g) * 4
    with comparing(monkeypatch, f"{GB}._temperature_kernel"):
        up_gumbel.apply_temperature(logits, expanded, temperature)


GUMBEL_CASES = {
    "greedy": dict(greedy=1.0),
    "seeded": dict(greedy=0.0),
    "mixed": dict(greedy=0.4),
    "mixed-fp64": dict(greedy=0.4, use_fp64=True),
    "temperature-applied": dict(greedy=0.3, apply_temperature=True),
    "bias": dict(greedy=0.3, bias=True),
    "draft-cache": dict(greedy=0.3, drafting=True, cache=True),
    "draft-cache-rows-percol": dict(greedy=0.3, drafting=True, cache=True, row_mapping=True, per_token_col=True),
    "draft-cache-source": dict(greedy=0.3, cache=True, source=True),
}


@pytest.mark.parametrize("case", list(GUMBEL_CASES))
@pytest.mark.parametrize("shape", SHAPES[1::2], ids=SHAPE_IDS[1::2])
def test_gumbel_sample(monkeypatch, shape, case):
    opts = GUMBEL_CASES[case]
    if opts.get("cache"):
        pytest.xfail("upstream's logits-cache store fails in Triton's interpreter ('mask has unsupported dtype'): "
                     "the cache path is not compared yet")
    b = make_batch(*shape)
    temperature, seeds = sampling_state(b, opts["greedy"])
    expanded, _ = up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits, b.num_spec + 1)
    if b.total_logits > 2:
        expanded[-1] = -1  # a padded row
    vocab = 2500  # three blocks, the last partial
    logits = torch.randn(b.total_logits, vocab, generator=b.g) * 3
    logits[:, 100:200] = float("-inf")  # masked tokens
    logits[0, :] = float("-inf")
    logits[0, 2400] = 0.0
    pos = torch.randint(0, 4000, (b.total_logits,), generator=b.g)
    num_cols = max(b.num_spec, 1)
    kwargs = {}
    if opts.get("cache"):
        rows = b.max_num_reqs
        row_mapping = None
        if opts.get("row_mapping"):
            row_mapping = torch.randperm(b.max_num_reqs, generator=b.g).to(torch.int32)
            row_mapping[row_mapping >= b.max_num_reqs // 2] = -1
        kwargs = dict(
            logits_cache=torch.full((rows, num_cols, vocab + 4), -5.0),
            logits_cache_col=(torch.randint(0, num_cols, (b.total_logits,), generator=b.g) if opts.get("per_token_col")
                              else torch.tensor(num_cols - 1)),
            logits_cache_row_mapping=row_mapping,
        )
        if opts.get("source"):
            kwargs["logits_cache_source"] = torch.randn(b.total_logits, vocab, generator=b.g)
    if opts.get("bias"):
        kwargs["bias"] = torch.randn(b.total_logits, vocab, generator=b.g)
    tolerant = frozenset({"local_max_ptr"})
    with comparing(monkeypatch, f"{GB}._gumbel_sample_kernel", tolerant), \
            comparing(monkeypatch, f"{GB}._gumbel_combine_kernel"):
        up_gumbel.gumbel_sample(
            logits, expanded, temperature, seeds, pos, apply_temperature=opts.get("apply_temperature", False),
            is_drafting=opts.get("drafting", False), use_fp64=opts.get("use_fp64", False), **kwargs,
        )


# ---------------------------------------------------------------------------------------------
# spec_decode/rejection_sampler*.py


def verification_batch(shape, greedy_share: float, vocab: int, accept_share: float = 0.6):
    """A decode step with drafts: target logits, drafts that often equal the target argmax, one
    placeholder (-1) draft, positions."""
    b = make_batch(*shape)
    temperature, seeds = sampling_state(b, greedy_share)
    expanded, local_pos = up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits,
                                                            b.num_spec + 1)
    target_logits = torch.randn(b.total_logits, vocab, generator=b.g) * 2
    argmax = target_logits.argmax(dim=1)
    draft_sampled = torch.randint(0, vocab, (b.total_logits,), generator=b.g)
    agree = torch.rand(b.total_logits, generator=b.g) < accept_share
    # The draft at row i + 1 is verified by the logits of row i.
    draft_sampled[1:] = torch.where(agree[1:], argmax[:-1], draft_sampled[1:])
    draft_sampled[local_pos == 0] = 0
    with_drafts = (local_pos > 0).nonzero().squeeze(1)
    if with_drafts.numel() > 2:
        draft_sampled[with_drafts[-1]] = -1
    pos = torch.randint(0, 3000, (b.total_logits,), generator=b.g)
    return b, temperature, seeds, expanded, local_pos, target_logits, draft_sampled, pos


REJECTION_CASES = {
    "greedy": dict(greedy=1.0),
    "seeded-one-hot": dict(greedy=0.0),
    "mixed-one-hot": dict(greedy=0.5),
    "mixed-draft-logits": dict(greedy=0.5, draft_logits=True),
    "seeded-draft-logits-rows": dict(greedy=0.0, draft_logits=True, row_mapping=True, interpreter_fails=True),
    "mixed-draft-logits-fp64-skip-masked": dict(greedy=0.3, draft_logits=True, use_fp64=True, skip_masked=True,
                                                interpreter_fails=True),
    "synthetic": dict(greedy=0.5, synthetic=True),
}


@pytest.mark.parametrize("case", list(REJECTION_CASES))
@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_rejection_sample(monkeypatch, shape, case):
    """Every kernel rejection_sample launches, compared launch by launch."""
    from vllm.v1.worker.gpu.spec_decode.draft_logits import DraftLogitsCache

    opts = REJECTION_CASES[case]
    if opts.get("interpreter_fails") and shape[0] > 3:
        pytest.xfail("upstream's kernels fail in Triton's interpreter on this batch "
                     "(AttributeError in an add of None); "
                     "not yet investigated")
    vocab = 9000  # two stats blocks of 8192, nine resample blocks of 1024
    b, temperature, seeds, expanded, local_pos, target_logits, draft_sampled, pos = verification_batch(
        shape, opts["greedy"], vocab)
    if opts.get("skip_masked"):
        target_logits[:, 1024:3072] = float("-inf")
    cache = None
    if opts.get("draft_logits"):
        cache = DraftLogitsCache(b.max_num_reqs, max(b.num_spec, 1), vocab, dtype=torch.float32, fill=0.0, device="cpu")
        cache.values.copy_(torch.randn(cache.values.shape, generator=b.g) * 2)
        if opts.get("row_mapping"):
            cache.row_mapping = torch.arange(b.max_num_reqs, dtype=torch.int32).flip(0)
    rates = torch.tensor([0.9, 0.5, 0.3, 0.7][: max(b.num_spec, 1)]) if opts.get("synthetic") else None
    tolerant_stats = frozenset({"target_local_sumexp_ptr", "draft_local_sumexp_ptr", "draft_local_max_ptr"})
    tolerant_rejection = frozenset({"target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"})
    with comparing(monkeypatch, f"{RU}._compute_local_logits_stats_kernel", tolerant_stats), \
            comparing(monkeypatch, f"{RU}._rejection_kernel", tolerant_rejection), \
            comparing(monkeypatch, f"{RU}._resample_kernel", frozenset({"resampled_local_max_ptr"})), \
            comparing(monkeypatch, f"{RU}._insert_resampled_kernel"):
        up_rejection_utils.rejection_sample(
            target_logits, cache, draft_sampled, b.cu_num_logits, pos, b.idx_mapping, expanded, local_pos,
            temperature, seeds, max(b.num_spec, 1), synthetic_conditional_rates=rates,
            use_fp64=opts.get("use_fp64", False), skip_masked_vocab_blocks=opts.get("skip_masked", False),
        )


def assert_verifies_as_triton(monkeypatch, greedy_share: float, shape, forbidden: dict[str, str] | None = None):
    """Run the whole verification of a :func:`verification_batch` with the Triton kernels, then with every
    override in place (``forbidden``: attributes of ``kimi.cpu_platform.kernels.rejection`` that fail the test
    if called, mapped to the failure's message) and assert both sampled the same tokens.  ``greedy_share`` 1.0
    makes every request greedy (slot 0 included)."""
    import kimi.cpu_platform.kernels.rejection as torch_rejection

    b, temperature, seeds, expanded, local_pos, target_logits, draft_sampled, pos = verification_batch(
        shape, greedy_share, 3000)
    if greedy_share == 1.0:
        temperature.zero_()  # sampling_state keeps slot 0 sampled
    names = [n for n in OVERRIDES if n.startswith(RU)]
    results = []
    for impl in (False, True):
        with using(monkeypatch, names, impl), monkeypatch.context() as patch:
            for attr, message in (forbidden or {}).items() if impl else ():
                patch.setattr(torch_rejection, attr, lambda *a, message=message, **k: pytest.fail(message))
            sampled, num_sampled = up_rejection_utils.rejection_sample(
                target_logits, None, draft_sampled, b.cu_num_logits, pos, b.idx_mapping, expanded, local_pos,
                temperature, seeds, max(b.num_spec, 1))
        keep = torch.arange(sampled.shape[1])[None, :] < num_sampled[:, None].to(torch.int64)
        results.append((num_sampled, torch.where(keep, sampled, -1)))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_rejection_sample_end_to_end(monkeypatch, shape):
    """The whole verification with every override in place samples what the Triton kernels do."""
    assert_verifies_as_triton(monkeypatch, 0.4, shape)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_greedy_verification_draws_nothing(monkeypatch, shape):
    """A batch of greedy requests only is verified by the target argmax: the torch rejection kernel draws no
    random number and reads no log-probability (on CPU the Philox draws were most of its time, ~1.5 ms a
    step at one request), and samples what the Triton kernels do."""
    assert_verifies_as_triton(monkeypatch, 1.0, shape, forbidden={
        "tl_rand32": "a greedy batch drew", "_global_logsumexp": "a greedy batch read log-probabilities"})


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gather_draft_sampled(monkeypatch, shape):
    b = make_batch(*shape)
    expanded, local_pos = up_input_batch.expand_idx_mapping(b.idx_mapping, b.total_logits, b.cu_num_logits,
                                                            b.num_spec + 1)
    logits_indices = up_input_batch.combine_sampled_and_draft_tokens(
        torch.randint(0, 100, (b.num_tokens,), dtype=torch.int32), b.idx_mapping,
        torch.zeros(b.max_num_reqs, dtype=torch.int32), b.query_start_loc, b.seq_lens, b.prefill_len,
        torch.randint(0, 100, (b.max_num_reqs, max(b.num_spec, 1)), dtype=torch.int32), b.cu_num_logits,
        b.total_logits)
    input_ids = torch.randint(0, 100, (b.num_tokens,), dtype=torch.int32)
    positions = torch.zeros(b.num_tokens, dtype=torch.int64)
    up_input_batch.prepare_pos_seq_lens(b.idx_mapping, b.query_start_loc, b.num_computed, positions,
                                        torch.zeros(b.max_num_reqs, dtype=torch.int32))
    with comparing(monkeypatch, f"{RS}._gather_draft_sampled_kernel"):
        up_rejection_sampler.gather_draft_sampled(input_ids, positions, logits_indices, expanded, local_pos,
                                                  b.prefill_len)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_flatten_sampled(monkeypatch, shape):
    """Launched as RejectionSampler._get_logprobs_tensors launches it."""
    b = make_batch(*shape)
    sampled = torch.randint(0, 100, (b.num_reqs, b.num_spec + 1))
    num_sampled = (torch.randint(1, b.num_spec + 2, (b.num_reqs,)).clamp_max(b.num_logits)).to(torch.int32)
    flat = torch.zeros(b.total_logits, dtype=sampled.dtype)
    with comparing(monkeypatch, f"{RS}._flatten_sampled_kernel"):
        up_rejection_sampler._flatten_sampled_kernel[(b.num_reqs,)](
            flat, sampled, sampled.stride(0), num_sampled, b.cu_num_logits, num_warps=1)


# ---------------------------------------------------------------------------------------------
# spec_decode/target_dependent_ar/speculator.py


def draft_buffers(max_num_reqs: int, max_num_tokens: int):
    return up_input_batch.InputBuffers(max_num_reqs, max_num_tokens, torch.device("cpu"))


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_speculator_prepare_prefill_inputs(monkeypatch, shape):
    b = make_batch(*shape)
    buffers = draft_buffers(b.max_num_reqs, b.num_tokens + 8)
    buffers.input_ids.random_(0, 50)
    buffers.query_start_loc.fill_(-3)
    batch = SimpleNamespace(
        num_reqs=b.num_reqs, input_ids=torch.randint(100, 200, (b.num_tokens,), dtype=torch.int32),
        positions=torch.randint(0, 500, (b.num_tokens,)), idx_mapping=b.idx_mapping,
        query_start_loc=b.query_start_loc, seq_lens=b.seq_lens)
    num_sampled = torch.where(b.seq_lens >= b.prefill_len[b.idx_mapping], 1 + torch.randint(0, 2, (b.num_reqs,)), 0)
    num_rejected = torch.minimum(torch.randint(0, b.num_spec + 1, (b.num_reqs,)), b.num_drafts).to(torch.int32)
    with comparing(monkeypatch, f"{SP}._prepare_prefill_inputs_kernel"):
        up_speculator.prepare_prefill_inputs(
            torch.full((b.max_num_reqs,), -1, dtype=torch.int64), torch.tensor([5], dtype=torch.int32), buffers, batch,
            num_sampled.to(torch.int32), num_rejected, torch.randint(0, 99, (b.max_num_reqs,), dtype=torch.int64),
            torch.randint(0, 99, (b.max_num_reqs,), dtype=torch.int32), b.max_num_reqs)


@pytest.mark.parametrize("advance", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_speculator_prepare_decode_inputs(monkeypatch, shape, advance):
    """Launched as TargetDependentARSpeculator._prepare_decode_inputs launches it."""
    b = make_batch(*shape)
    num_spec = max(b.num_spec, 1)
    max_model_len = 60
    buffers = draft_buffers(b.max_num_reqs, b.max_num_reqs * (num_spec + 1))
    buffers.positions.random_(50, 60)
    buffers.seq_lens.fill_(7)
    draft_tokens = torch.randint(0, 100, (b.max_num_reqs, num_spec), dtype=torch.int64)
    sample_src_positions = torch.randint(0, 100, (b.max_num_reqs,))
    num_rejected = torch.randint(0, num_spec + 1, (b.num_reqs,), dtype=torch.int32)
    target_seq_lens = torch.randint(num_spec + 1, max_model_len + 1, (b.num_reqs,), dtype=torch.int32)
    with comparing(monkeypatch, f"{SP}._prepare_decode_inputs_kernel"):
        up_speculator._prepare_decode_inputs_kernel[(b.num_reqs + 1,)](
            draft_tokens[: b.num_reqs, 0], draft_tokens.stride(0), target_seq_lens, num_rejected, buffers.input_ids,
            buffers.positions, sample_src_positions, buffers.query_start_loc, buffers.seq_lens, max_model_len,
            b.max_num_reqs, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=advance)


@pytest.mark.parametrize("advance", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_speculator_update_draft_inputs(monkeypatch, shape, advance):
    b = make_batch(*shape)
    num_spec = max(b.num_spec, 2)
    max_model_len = 60
    buffers = draft_buffers(b.max_num_reqs, b.max_num_reqs * (num_spec + 1))
    buffers.positions.random_(50, 60)
    buffers.seq_lens.random_(50, 61)
    hidden_size = 24
    for step in (0, num_spec - 1):
        with comparing(monkeypatch, f"{SP}._update_draft_inputs_kernel"):
            up_speculator.update_draft_inputs(
                torch.randint(0, 100, (b.num_reqs,)), torch.tensor(step, dtype=torch.int32),
                torch.randn(b.num_reqs + 3, hidden_size), torch.full((b.max_num_reqs, num_spec), -1, dtype=torch.int64),
                torch.zeros(b.max_num_reqs * (num_spec + 1), hidden_size), buffers,
                torch.randint(0, 99, (b.max_num_reqs,)),
                b.num_reqs, torch.tensor(max_model_len, dtype=torch.int32), num_spec, advance_draft_positions=advance)


# ---------------------------------------------------------------------------------------------
# spec_decode/adaptive_verification.py


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_assign_draft_token_budget(monkeypatch, shape, ties):
    """Every budget from none to all scheduled drafts but one, on requests with 0..k scheduled drafts;
    with ``ties`` the confidences take three values, so thresholds tie across requests."""
    b = make_batch(*shape)
    confidences = torch.rand(b.max_num_reqs, b.num_spec, generator=b.g)
    if ties:
        confidences = torch.tensor([0.5, 0.9, 1.0])[torch.randint(0, 3, confidences.shape, generator=b.g)]
    scheduled = torch.randint(0, b.num_spec + 1, (b.num_reqs,), generator=b.g, dtype=torch.int32)
    scheduled[0] = b.num_spec
    survival = torch.empty(b.max_num_reqs * b.num_spec, dtype=torch.int32)
    with comparing(monkeypatch, f"{AV}._assign_draft_token_budget_kernel") as compare:
        for budget in range(int(scheduled.sum())):
            capacities = scheduled.clone()
            up_adaptive.assign_draft_token_budget(confidences, b.idx_mapping, capacities, budget, survival)
            assert int(capacities.sum()) == budget and bool((capacities <= scheduled).all())
    assert compare.launches == int(scheduled.sum())


def estimator_batch(shape, per_token_step: bool, vocab: int = 5000):
    """An estimator and one draft step's inputs: logits over ``vocab`` entries (5000: two vocabulary blocks;
    1536: one, a draft vocabulary's size), one row carrying its max twice, one padded row (request state -1),
    greedy and sampled temperatures."""
    b = make_batch(*shape)
    estimator = OnlineAcceptanceEstimator(b.max_num_reqs, b.num_spec, torch.device("cpu"))
    estimator.slope.fill_(0.7)
    estimator.intercepts.copy_(torch.linspace(-0.5, 0.5, b.num_spec))
    rows = b.num_reqs * b.num_spec if per_token_step else b.num_reqs
    logits = torch.randn(rows, vocab, generator=b.g) * 3
    logits[0, 17] = logits[0, vocab - 900] = logits[0].max() + 1.0
    idx_mapping = b.idx_mapping.repeat_interleave(b.num_spec) if per_token_step else b.idx_mapping.clone()
    idx_mapping[-1] = -1
    step = (torch.arange(rows) % b.num_spec) if per_token_step else torch.tensor(b.num_spec - 1)
    temperature = torch.where(torch.rand(b.max_num_reqs, generator=b.g) < 0.5, 0.0, 0.8)
    confidences = torch.zeros(b.max_num_reqs, b.num_spec)
    return b, estimator, (logits, idx_mapping, step, confidences, temperature)


@pytest.mark.parametrize("vocab", [5000, 1536], ids=["two-blocks", "one-block"])
@pytest.mark.parametrize("per_token_step", [False, True], ids=["one-step", "per-row-step"])
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=SHAPE_IDS[1:4])
def test_acceptance_estimator_predict(monkeypatch, shape, per_token_step, vocab):
    _, estimator, args = estimator_batch(shape, per_token_step, vocab)
    floats = frozenset({"local_max_ptr", "local_excl_sumexp_ptr", "features_ptr", "pred_ptr", "conf_ptr"})
    with comparing(monkeypatch, f"{AE}._local_max_sumexp_kernel", floats), \
            comparing(monkeypatch, f"{AE}._predict_kernel", floats):
        estimator.predict(*args)


@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_acceptance_estimator_accumulate(monkeypatch, shape):
    b, estimator, args = estimator_batch(shape, per_token_step=False)
    for step in range(b.num_spec):
        estimator.predict(args[0], args[1], torch.tensor(step), *args[3:])
    idx_mapping = b.idx_mapping
    num_sampled = torch.randint(0, b.num_spec + 2, (b.num_reqs,), generator=b.g, dtype=torch.int32)
    num_rejected = torch.clamp(b.num_spec + 1 - num_sampled, min=0) * (torch.rand(b.num_reqs, generator=b.g) < 0.8)
    floats = frozenset({"info_ptr", "grad_ptr", "counts_ptr"})
    with comparing(monkeypatch, f"{AE}._accumulate_kernel", floats):
        for _ in range(2):
            estimator.step(idx_mapping, num_sampled, num_rejected.to(torch.int32))


@pytest.mark.parametrize("slope", [0.7, 1e-4], ids=["slope-0.7", "slope-near-0"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_acceptance_estimator_refit(monkeypatch, shape, slope):
    """A refit after two graded steps, and one on cleared statistics (no count: the intercepts stay).  Over these
    shapes and slopes the slope's step is taken in some cases and dropped in others (it would make the slope
    negative: e.g. 32 requests at slope 0.7, a step of -0.82)."""
    b, estimator, args = estimator_batch(shape, per_token_step=False)
    estimator.slope.fill_(slope)
    for step in range(b.num_spec):
        estimator.predict(args[0], args[1], torch.tensor(step), *args[3:])
    num_sampled = torch.randint(0, b.num_spec + 2, (b.num_reqs,), generator=b.g, dtype=torch.int32)
    num_rejected = torch.clamp(b.num_spec + 1 - num_sampled, min=0).to(torch.int32)
    for _ in range(2):
        estimator.step(b.idx_mapping, num_sampled, num_rejected)
    floats = frozenset({"slope_ptr", "intercepts_ptr", "info_ptr", "grad_ptr", "counts_ptr"})
    with comparing(monkeypatch, f"{AE}._refit_kernel", floats) as compare:
        estimator._refit()
        estimator._refit()
    assert compare.launches == 2


def test_a_step_that_verified_no_draft_adds_nothing_to_the_estimator(monkeypatch):
    """Where no draft was verified the torch accumulate returns at once (a paused step's cost); the statistics stay
    bit for bit as Triton's kernel leaves them (it adds zeros)."""
    b, estimator, args = estimator_batch(SHAPES[3], per_token_step=False)
    for step in range(b.num_spec):
        estimator.predict(args[0], args[1], torch.tensor(step), *args[3:])
    estimator.info.fill_(0.25)
    plain = torch.ones(b.num_reqs, dtype=torch.int32)
    with comparing(monkeypatch, f"{AE}._accumulate_kernel"):
        estimator.step(b.idx_mapping, plain, torch.zeros(b.num_reqs, dtype=torch.int32))
    assert bool((estimator.info == 0.25).all()) and not bool(estimator.counts.any())


def test_copies_are_independent():
    """The harness's copies share nothing with the caller's tensors."""
    base = torch.arange(12).view(3, 4)
    view = base[:, 1]
    copied = clone_arg(view)
    assert copied.stride() == view.stride() and torch.equal(copied, view)
    copied.fill_(-1)
    assert torch.equal(base, torch.arange(12).view(3, 4))
    assert copy.copy(5) == clone_arg(5)


# ---------------------------------------------------------------------------------------------
# structured_outputs.py


def test_grammar_bitmask_kernel_still_fails_in_the_interpreter():
    """Why the override below is compared with a reference rather than with Triton: upstream's kernel stops in the
    interpreter. Once it runs there, compare the two as the other kernels are."""
    from vllm.v1.worker.gpu import structured_outputs as up_structured_outputs

    kernel = upstream_kernel("vllm.v1.worker.gpu.structured_outputs._apply_grammar_bitmask_kernel")
    logits = torch.zeros(2, 40)
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        kernel[(1, 1)](logits, logits.stride(0), torch.zeros(1, dtype=torch.int32),
                       torch.tensor([0, 2], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), 2, 40,
                       MASK_STRIDE=2, BLOCK_SIZE=up_structured_outputs.GRAMMAR_BITMASK_BLOCK_SIZE)


@pytest.mark.parametrize("vocab, logits_width", [(100, 100), (64, 70), (4096, 4096)])
def test_grammar_bitmask_forbids_exactly_the_unset_bits(vocab, logits_width):
    """Each mask row bans, in its request's row at its position, the tokens whose bit is 0 (xgrammar's packing:
    bit t % 32 of word t // 32); positions past a request's rows are skipped; other rows are untouched."""
    words = (vocab + 31) // 32
    gen = torch.Generator().manual_seed(vocab)
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)  # three requests: 3, 1 and 3 logits rows
    mask_stride = 3
    # (request, position) as request * 3 + position; request 1 has one row, so its position 2 is skipped
    mapping = torch.tensor([0 * 3 + 0, 0 * 3 + 2, 1 * 3 + 0, 1 * 3 + 2, 2 * 3 + 1], dtype=torch.int32)
    bitmask = torch.randint(-2**31, 2**31 - 1, (mapping.numel(), words), dtype=torch.int32, generator=gen)
    logits = torch.randn(7, logits_width, generator=gen)
    expected = logits.clone()
    for m, entry in enumerate(mapping.tolist()):
        request, position = divmod(entry, mask_stride)
        if position >= int(cu[request + 1] - cu[request]):
            continue
        row = int(cu[request]) + position
        for token in range(vocab):
            if not (int(bitmask[m, token // 32]) >> (token % 32)) & 1:
                expected[row, token] = float("-inf")
    OVERRIDES["vllm.v1.worker.gpu.structured_outputs._apply_grammar_bitmask_kernel"](
        logits, logits.stride(0), mapping, cu, bitmask, bitmask.stride(0), vocab, MASK_STRIDE=mask_stride,
        BLOCK_SIZE=8192)
    assert torch.equal(logits, expected)
    assert torch.isinf(logits[[0, 2, 3, 5]]).any() and not torch.isinf(logits[[1, 4, 6]]).any()  # rows of no mask


# ---------------------------------------------------------------------------------------------
# topk_topp_triton.py (vllm/v1/sample/ops)

_TOPK_TOPP = "vllm.v1.sample.ops.topk_topp_triton._topk_topp_kernel"


def test_topk_topp_kernel_still_fails_in_the_interpreter():
    """Why the override below is compared with a reference rather than with Triton: upstream's kernel stops in the
    interpreter (its loop index is a Python int there). Once it runs there, compare the two as the other kernels are."""
    from vllm.v1.sample.ops import topk_topp_triton as up_topk_topp

    logits = torch.randn(2, 300)
    with dispatcher_off(_TOPK_TOPP, up_topk_topp, "_topk_topp_kernel"), \
            pytest.raises(Exception, match="'int' object has no attribute 'to'"):
        up_topk_topp.apply_top_k_top_p_triton(logits, torch.tensor([5, 300]), torch.tensor([0.9, 1.0]))


@contextmanager
def dispatcher_off(name, module, attr):
    """Upstream's kernel in ``module.attr`` and in the launcher that holds it, for the ``with`` block."""
    kernel = upstream_kernel(name)
    holders = [value for value in vars(module).values() if getattr(value, "kernel", None) is not None]  # launchers
    saved = getattr(module, attr), [(holder, holder.kernel) for holder in holders]
    setattr(module, attr, kernel)
    for holder in holders:
        holder.kernel = kernel
        holder.__dict__.pop("_kernel_arg_names", None)
    try:
        yield
    finally:
        setattr(module, attr, saved[0])
        for holder, value in saved[1]:
            holder.kernel = value
            holder.__dict__.pop("_kernel_arg_names", None)


def _reference_topk_topp(logits, k, p):
    """Row by row: keep the logits at or above the k-th largest (ties kept), then the fewest largest of those whose
    probability sum reaches p (at least one); the others become -inf."""
    out = logits.clone()
    for row in range(logits.shape[0]):
        values = logits[row].clone()
        if k is not None and int(k[row]) < values.numel():
            kth = values.sort(descending=True).values[int(k[row]) - 1]
            values[values < kth] = float("-inf")
        if p is not None:
            ordered, order = values.sort()
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative <= 1 - float(p[row])
            drop[-1] = False
            values[order[drop]] = float("-inf")
        out[row] = values
    return out


@pytest.mark.parametrize("with_k, with_p", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch, vocab", [(1, 300), (5, 1000), (9, 4096)])
def test_topk_topp_masks_as_upstreams_torch_path(batch, vocab, with_k, with_p):
    """Through vLLM's own launcher (``apply_top_k_top_p_triton``, launch options included) with the platform's
    override: rows without top-k (k = vocab) or top-p (p = 1), ties at the k-th value, a strided logits view."""
    from vllm.v1.sample.ops import topk_topp_triton as up_topk_topp

    gen = torch.Generator().manual_seed(batch * vocab)
    wide = torch.randn(batch, vocab + 7, generator=gen) * 3
    wide[:, :vocab] = wide[:, :vocab].round(decimals=1)  # ties
    logits = wide[:, :vocab]
    k = torch.randint(1, 40, (batch,), generator=gen)
    k[0] = vocab
    p = torch.rand(batch, generator=gen) * 0.9 + 0.05
    p[-1] = 1.0
    k, p = (k if with_k else None), (p if with_p else None)
    expected = _reference_topk_topp(logits, k, p)
    override = dispatcher.KernelOverride(upstream_kernel(_TOPK_TOPP), OVERRIDES[_TOPK_TOPP])
    with dispatcher_off(_TOPK_TOPP, up_topk_topp, "_topk_topp_kernel"):
        for holder in [v for v in vars(up_topk_topp).values() if getattr(v, "kernel", None) is not None]:
            holder.kernel = override
            holder.__dict__.pop("_kernel_arg_names", None)
        got = up_topk_topp.apply_top_k_top_p_triton(logits, k, p)
    assert torch.equal(got, expected)
    assert torch.isfinite(got).sum(-1).min() >= 1
