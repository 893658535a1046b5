"""What patch 0018's coupling (``kimi.spec.coupled``) assumes of a CUDA ``torch.Generator``.

On CUDA the V1 sampler draws a seeded row with ``random_sample`` (``q[i].exponential_(generator=gen)`` over the
vocabulary, then ``argmax(probs / q)``). The hook moves a generator on by drawing a dummy row, and later puts the
state back with ``set_state`` and draws the real rows. That is right only if a draw takes the same from the
generator whatever the row's values, and if ``get_state`` / ``set_state`` round-trip the Philox seed and offset.
The CPU generator is covered by ``tests/patches/test_seeded_coupled_verification.py``; this needs only torch and a
GPU (no vLLM), so it runs on the GPU host before any kit is installed.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

VOCAB = 163840  # Kimi-K2's vocabulary


def _draw(row, gen) -> int:
    """One seeded draw as vLLM 0.32.0's ``random_sample`` makes it for a one-row batch."""
    import torch

    q = torch.empty_like(row)
    q[0].exponential_(generator=gen)
    return int(row.softmax(-1).div(q).argmax())


def test_a_dummy_draw_moves_a_cuda_generator_as_a_real_one_and_set_state_replays_it() -> None:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(7)
    before = gen.get_state()
    rows = [torch.randn(1, VOCAB, device="cuda") * 3 for _ in range(5)]
    plain = [_draw(r, gen) for r in rows]
    end = gen.get_state()

    gen.set_state(before)
    dummy = torch.full((1, VOCAB), float("-inf"), device="cuda")
    dummy[0, 0] = 0.0
    for _ in range(3):
        _draw(dummy.clone(), gen)
    after_dummies = gen.get_state()
    fourth = _draw(rows[3], gen)  # the bonus draw after three dummy draws, as the hook makes it
    after_fourth = gen.get_state()

    gen.set_state(before)
    replayed = [_draw(r, gen) for r in rows[:3]]
    assert torch.equal(gen.get_state(), after_dummies)  # dummy draws take what real draws take
    assert replayed == plain[:3]
    assert fourth == plain[3]
    gen.set_state(after_fourth)
    assert _draw(rows[4], gen) == plain[4]
    assert torch.equal(gen.get_state(), end)
