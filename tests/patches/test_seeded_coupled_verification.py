"""Patch 0018: a seeded request verified by coupling gives the tokens of plain sampling, whatever the drafts.

With EAGLE-3 on the V1 model runner, vLLM 0.32.0's rejection sampler draws from a seeded request's generator a
number of values that depends on the draft tokens scheduled, and accepts by a ratio test on the drafts themselves: the
same seeded request gave other tokens under another token budget (``benchmarks/robustness.py``: ``mixed_sampling``
seeded 2/4 identical across budgets 64 and 512, ``n_greater_than_1`` 4/5). With the patch the ``t``-th output token
is the plain sampler's ``t``-th draw.

The first test drives ``RejectionSampler.forward`` step by step on CPU tensors against a toy target (logits that
are a function of the prefix), with drafts that are all right, all wrong, partly right, and of another number each
step, beside an unseeded and a greedy request; the reference is vLLM's plain ``Sampler`` on one request with a fresh
generator of the same seed. The engine test runs the shipped pair with EAGLE-3 at two token budgets and without
speculation.
"""

from __future__ import annotations

import random
import textwrap

import pytest

from engine_script import run_engine_script

pytestmark = [pytest.mark.install, pytest.mark.line("v0.32")]

VOCAB = 48
#: (temperature, top_k, top_p, seed) of the batch's requests: two seeded (one with top-k and top-p, the
#: native and CPU samplers both), one unseeded, one greedy.
REQUESTS = [(0.8, 12, 0.9, 11), (1.3, VOCAB, 1.0, 12), (1.0, VOCAB, 1.0, None), (0.0, VOCAB, 1.0, None)]
SEEDED = [0, 1]
OUTPUT_TOKENS = 40


def _torch():
    torch = pytest.importorskip("torch")
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # the CPU sampler's fused_gumbel_argmax
    current_platform.register_triton_kernel_overrides()  # as the worker does: C++ rejection kernels
    return torch


def _toy_logits(torch, prefix: list[int]):
    """[VOCAB] float32 logits of a toy target after ``prefix``: peaked enough that drafts are often right."""
    gen = torch.Generator().manual_seed(hash(tuple(prefix)) % (2**31))
    return torch.randn(VOCAB, generator=gen) * 3.0


def _metadata(torch, rows: list[int], generators: dict, max_num_logprobs=None):
    """SamplingMetadata of the batch ``rows`` (indices into :data:`REQUESTS`) with ``generators``."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    params = [REQUESTS[i] for i in rows]
    temperature = torch.tensor([p[0] for p in params], dtype=torch.float32)
    return SamplingMetadata(
        temperature=temperature, all_greedy=bool((temperature == 0).all()), all_random=bool((temperature > 0).all()),
        top_p=torch.tensor([p[2] for p in params], dtype=torch.float32),
        top_k=torch.tensor([p[1] for p in params], dtype=torch.int32), generators=generators,
        max_num_logprobs=max_num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(len(rows)), presence_penalties=torch.zeros(len(rows)),
        repetition_penalties=torch.ones(len(rows)), output_token_ids=[[] for _ in rows],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def _sampler(torch, native: bool):
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    if native:  # random_sample's exponential row per draw: the CUDA path's draw
        sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native
    return sampler


def _plain(torch, native: bool, request: int, count: int):
    """The request's first ``count`` tokens sampled one by one by the plain Sampler, and its generator's state."""
    sampler = _sampler(torch, native)
    gen = torch.Generator().manual_seed(REQUESTS[request][3])
    tokens: list[int] = []
    for _ in range(count):
        logits = _toy_logits(torch, tokens).unsqueeze(0)
        tokens.append(int(sampler(logits, _metadata(torch, [request], {0: gen})).sampled_token_ids[0, 0]))
    return tokens, gen.get_state()


def _drafts(policy: str, n: int, truth: list[int], rng: random.Random) -> list[int]:
    """``n`` draft tokens: ``right`` (the plain tokens to come), ``wrong`` (never those), ``partial`` (right, then
    wrong from a random position)."""
    cut = {"right": n, "wrong": 0, "partial": rng.randrange(n + 1)}[policy]
    out = truth[:cut] + [(t + 1 + rng.randrange(VOCAB - 1)) % VOCAB for t in truth[cut:n]]
    return out + [rng.randrange(VOCAB) for _ in range(n - len(out))]


def _step(torch, outputs: list[list[int]], drafts: list[list[int]]):
    """One step's ``SpecDecodeMetadata`` and target logits [num drafts + batch, VOCAB] for requests that have
    emitted ``outputs`` and propose ``drafts`` (the toy target's rows: each draft position, then the bonus)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    metadata = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    ends = metadata.cu_num_sampled_tokens.tolist()
    metadata.bonus_logits_indices = torch.tensor([e - 1 for e in ends], dtype=torch.int32)
    metadata.target_logits_indices = torch.tensor(
        [s + j for s, d in zip([0, *ends[:-1]], drafts, strict=True) for j in range(len(d))], dtype=torch.int32)
    rows = [_toy_logits(torch, tokens + d[:j]) for tokens, d in zip(outputs, drafts, strict=True)
            for j in range(len(d) + 1)]
    return metadata, torch.stack(rows)


def _speculate(torch, native: bool, policy: str, seed: int):
    """Run the batch of :data:`REQUESTS` through ``RejectionSampler.forward`` until every request has
    :data:`OUTPUT_TOKENS` tokens; 0-3 drafts per request and step (some steps none at all). Returns the tokens, the
    seeded generators and the number of the seeded requests' drafts accepted."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    rng = random.Random(seed)
    truth = {i: _plain(torch, native, i, OUTPUT_TOKENS + 4)[0] for i in SEEDED}
    gens = {i: torch.Generator().manual_seed(REQUESTS[i][3]) for i in SEEDED}
    sampler = RejectionSampler(_sampler(torch, native))
    out: list[list[int]] = [[] for _ in REQUESTS]
    seeded_accepted = 0
    while min(len(o) for o in out) < OUTPUT_TOKENS:
        none_this_step = rng.random() < 0.15
        drafts = []
        for i, tokens in enumerate(out):
            n = 0 if none_this_step else rng.randrange(4)
            future = truth[i][len(tokens):] if i in SEEDED else [rng.randrange(VOCAB) for _ in range(n)]
            drafts.append(_drafts(policy, n, future, rng))
        metadata, logits = _step(torch, out, drafts)
        ends = metadata.cu_num_sampled_tokens.tolist()
        result = sampler(metadata, None, logits.clone(), _metadata(torch, list(range(len(REQUESTS))), gens, 0))
        width = result.sampled_token_ids.shape[1]
        logprobs = result.logprobs_tensors.logprobs[:, 0].view(len(REQUESTS), width)
        for i, row in enumerate(result.sampled_token_ids.tolist()):
            emitted = [t for t in row if t != -1]
            accepted = len(emitted) - 1
            assert emitted[:accepted] == drafts[i][:accepted]  # a prefix of the drafts, then one token
            # the logprob of each emitted token (raw logprobs, vLLM's default) is its own row's
            first = ends[i] - len(drafts[i]) - 1
            want = [logits[first + j].log_softmax(-1)[t] for j, t in enumerate(emitted)]
            assert torch.allclose(logprobs[i, :len(emitted)], torch.stack(want), atol=1e-5)
            if REQUESTS[i][0] == 0.0:  # greedy: the toy target's argmax chain
                assert emitted == [int(logits[first + j].argmax()) for j in range(len(emitted))]
            out[i] += emitted
            seeded_accepted += accepted * (i in SEEDED)
    return out, gens, seeded_accepted


@pytest.mark.parametrize("native", [False, True], ids=["cpu-sampler", "native-sampler"])
@pytest.mark.parametrize("policy", ["right", "wrong", "partial"])
def test_seeded_tokens_are_the_plain_samplers_whatever_the_drafts(policy: str, native: bool) -> None:
    torch = _torch()
    for seed in range(3):
        out, gens, accepted = _speculate(torch, native, policy, seed)
        assert (accepted > 0) == (policy != "wrong"), accepted
        for i in SEEDED:
            plain, state = _plain(torch, native, i, len(out[i]))
            assert out[i] == plain, (policy, seed, i)
            assert torch.equal(gens[i].get_state(), state), "the generator is not where plain sampling leaves it"
        assert all(len(o) >= OUTPUT_TOKENS for o in out)


def test_upstream_mode_keeps_the_ratio_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KIMI_SEEDED_VERIFICATION=upstream``: vLLM's own verification, whose seeded tokens follow the drafts (the
    symptom; this is how the test above fails without the patch)."""
    torch = _torch()
    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", "upstream")
    out, _, _ = _speculate(torch, False, "partial", 0)
    assert any(out[i] != _plain(torch, False, i, len(out[i]))[0] for i in SEEDED)


def test_a_draw_takes_the_same_from_a_generator_whatever_the_row() -> None:
    """What :meth:`CoupledVerification.start` relies on to move a generator on before the bonus draw."""
    torch = _torch()
    for native in (False, True):
        sample = _sampler(torch, native).topk_topp_sampler
        states = []
        for row in (torch.zeros(1, 4096), torch.randn(1, 4096) * 5, torch.full((1, 4096), float("-inf"))):
            gen = torch.Generator().manual_seed(3)
            row[0, 7] = 1.0
            sample(row, {0: gen}, None, None)
            states.append(gen.get_state())
        assert all(torch.equal(s, states[0]) for s in states)


def test_a_bad_mode_fails_when_the_rejection_sampler_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the model runner's construction, before any weight loads, not at the first seeded step with drafts
    (which killed the engine while it served)."""
    torch = _torch()
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", "off")
    with pytest.raises(ValueError, match="KIMI_SEEDED_VERIFICATION='off': expected one of coupled, upstream"):
        RejectionSampler(_sampler(torch, False))


def _unseeded_beside_a_coupled_request(torch, monkeypatch: pytest.MonkeyPatch, mode: str):
    """One step of a seeded request with three drafts beside an unseeded one with two, from global seed 5 (the
    engine's ``seed``): the unseeded request's tokens and the global generator's state after it."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    monkeypatch.setenv("KIMI_SEEDED_VERIFICATION", mode)
    metadata, logits = _step(torch, [[], []], [[1, 2, 3], [4, 5]])
    gens = {0: torch.Generator().manual_seed(REQUESTS[0][3])}
    torch.manual_seed(5)
    result = RejectionSampler(_sampler(torch, False))(metadata, None, logits, _metadata(torch, [0, 2], gens))
    return result.sampled_token_ids[1].tolist(), torch.get_rng_state()


def test_coupling_leaves_unseeded_requests_their_own_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU sampler takes one value of the global generator per row it samples: the hook's own draws must
    not, or an unseeded request batched with a seeded one gets other tokens than vLLM gives it."""
    torch = _torch()
    coupled_tokens, coupled_state = _unseeded_beside_a_coupled_request(torch, monkeypatch, "coupled")
    upstream_tokens, upstream_state = _unseeded_beside_a_coupled_request(torch, monkeypatch, "upstream")
    assert coupled_tokens == upstream_tokens
    assert torch.equal(coupled_state, upstream_state)


_SCRIPT = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    from kimi.e2e.engine import spec_metrics, tokenize
    from kimi.e2e.presets import CPU_EAGER
    from kimi.models.prompts import code_prompts
    from kimi.models import SHIPPED_PAIR

    target, drafter = str(SHIPPED_PAIR / "target"), str(SHIPPED_PAIR / "drafter")
    prompts = [{"prompt_token_ids": ids[:56 + 8 * i]} for i, ids in enumerate(tokenize(target, code_prompts(6)))]
    # the seeded requests of benchmarks/robustness.py's mixed_sampling, and an n = 3 one, in one batch
    params = [SamplingParams(temperature=0.8, seed=11, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=1.0, top_p=0.9, seed=12, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=20, seed=13, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.95, top_k=50, seed=14, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=15, max_tokens=48, ignore_eos=True),
              SamplingParams(temperature=1.0, top_p=0.9, n=3, seed=6, max_tokens=32, ignore_eos=True)]
    speculative = {"method": "eagle3", "model": drafter, "num_speculative_tokens": 3}
    out, counters = {}, {}
    for name, spec, budget in (("spec_64", speculative, 64), ("spec_512", speculative, 512),
                               ("nospec", None, 64)):
        llm = LLM(model=target, enable_prefix_caching=False, max_num_batched_tokens=budget,
                  speculative_config=spec, disable_log_stats=False, **CPU_EAGER)
        try:
            done = llm.generate(prompts, params, use_tqdm=False)
            out[name] = [list(c.token_ids) for o in done for c in o.outputs]
            counters[name] = spec_metrics(llm.get_metrics())
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    print("RESULT " + json.dumps({"out": out, "counters": counters}))
""")


def test_seeded_batch_is_identical_across_budgets_and_to_no_speculation() -> None:
    """The shipped pair, EAGLE-3 k = 3, a batch of seeded requests (the torture run's mixed_sampling settings and an
    n = 3 request) at token budgets 64 and 512, and without speculation: every sequence identical (without the
    patch, ``KIMI_SEEDED_VERIFICATION=upstream``, some differ)."""
    result = run_engine_script(_SCRIPT, timeout=1200)
    out = result["out"]
    assert len(out["spec_64"]) == 8 and all(out["spec_64"])
    assert result["counters"]["spec_64"]["num_accepted_tokens"] > 0  # drafts were accepted
    assert out["spec_64"] == out["spec_512"]
    assert out["spec_64"] == out["nospec"]

