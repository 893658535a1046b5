"""Patch 0022: EAGLE-3 with pipeline parallelism on DeepSeek-V3 targets (V1 runner, vLLM's CPU backend).

The decisions of ``kimi.spec.pipeline`` (behind ``kimi.hooks.eagle3_pipeline_parallel``) are checked here, most
without vLLM: which stage makes which aux hidden state and under which key it travels (a 6-layer target split 3 + 3,
ids inside each stage and at the boundary), the layouts the stages agree on, the accepted drafts an earlier stage
recovers, the drafts the engine core holds while their batch is queued. The engines (PP 2 and TP 2 x PP 2 against one
stage) are in ``tests/test_parallel.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kimi.spec import pipeline as pp

IDS = (2, 3, 5)  # 6 layers, stages [0, 3) and [3, 6): 2 inside the first, 3 at the boundary, 5 inside the second


def tensors(**named) -> SimpleNamespace:
    """An ``IntermediateTensors`` as the hook reads it."""
    return SimpleNamespace(tensors=dict(named))


def stage(start: int, end: int, first: bool, ids: tuple[int, ...] = IDS) -> list[int]:
    """The aux ids a stage of layers [start, end) makes: before a layer inside it, and its output."""
    made = [layer for layer in range(start, end) if pp.makes_aux_here(ids, layer, start, first)]
    return made + ([end] if end in ids else [])


def test_each_aux_state_is_made_once_by_the_stage_that_computes_it() -> None:
    assert stage(0, 3, True) == [2, 3]  # the boundary state is the first stage's output
    assert stage(3, 6, False) == [5]  # ... so the second stage does not make it again
    assert stage(0, 6, True) == [2, 3, 5]  # one stage makes them all
    assert stage(0, 3, True, (0, 4)) == [0] and stage(3, 6, False, (0, 4)) == [4]  # id 0: the embedding output


def test_a_stage_receives_the_keys_of_every_earlier_stage() -> None:
    assert pp.upstream_aux_keys(IDS, 3, is_first_rank=False) == ["aux_hidden_states_0", "aux_hidden_states_1"]
    assert pp.upstream_aux_keys(IDS, 0, is_first_rank=True) == []
    assert pp.upstream_aux_keys((1, 5, 9), 4, is_first_rank=False) == ["aux_hidden_states_0"]  # middle stage of 3
    assert pp.aux_slot((5, 2, 3), 5) == 2  # slots follow the sorted ids


def test_states_travel_through_a_middle_stage_and_arrive_in_aux_id_order() -> None:
    ids = (1, 5, 9)  # 12 layers in three stages [0, 4) [4, 8) [8, 12)
    first = pp.pack_aux(ids, {1: "s1"}, None)
    assert first == {"aux_hidden_states_0": "s1"}
    middle = pp.pack_aux(ids, {5: "s5"}, tensors(hidden_states="h", residual="r", **first))
    assert middle == {"aux_hidden_states_0": "s1", "aux_hidden_states_1": "s5"}  # relays what it received
    last = pp.gather_aux(ids, 8, {9: "s9"}, tensors(hidden_states="h", **middle), is_first_rank=False)
    assert last == ["s1", "s5", "s9"]


def test_a_missing_earlier_state_is_named() -> None:
    with pytest.raises(RuntimeError, match=r"\['aux_hidden_states_1'\].*missing.*\['aux_hidden_states_0', 'h'\]"):
        pp.gather_aux(IDS, 3, {5: "s5"}, tensors(h=1, aux_hidden_states_0="s2"), is_first_rank=False)


def test_the_stages_agree_on_the_layouts_all_of_them_support() -> None:
    """Upstream asserted identical lists; the first stage (no drafter) supports every layout, the last (the drafter's
    CPU attention) one of them."""
    every = ["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"]
    assert pp.agreed_kv_cache_layouts([every, ["LBHNC"]]) == ["LBHNC"]
    assert pp.agreed_kv_cache_layouts([every, every]) == every
    assert pp.agreed_kv_cache_layouts([["A", "B"], ["B", "A"], ["B"]]) == ["B"]
    with pytest.raises(ValueError, match="No KV cache layout is supported by every worker"):
        pp.agreed_kv_cache_layouts([["A"], ["B"]])


def test_an_earlier_stage_recovers_the_drafts_the_last_stage_accepted() -> None:
    """The scheduler sends the next input only (the bonus token 9): 2 of the drafts [4, 5, 6] were accepted."""
    assert pp.stage_new_tokens([9], 3, [4, 5, 6]) == [4, 5, 9]
    assert pp.stage_new_tokens([9], 1, [4, 5, 6]) == [9]  # none accepted
    assert pp.stage_new_tokens([7, 8, 9], 2, []) == [8, 9]  # no speculation: upstream's slice
    assert pp.stage_new_tokens([9], 0, []) == []
    # a request the stage dropped from its batch (not scheduled last step): the scheduler sent its tokens
    assert pp.stage_new_tokens([9], 3, [], all_token_ids=[0, 1, 2, 4, 5, 9], known=3) == [4, 5, 9]
    with pytest.raises(RuntimeError, match="missing 2 accepted tokens.*verified only 1 drafts"):
        pp.stage_new_tokens([9], 3, [4])


@pytest.mark.install
def test_drafts_of_a_queued_batch_wait_until_its_output_is_processed() -> None:
    from vllm.v1.outputs import DraftTokenIds

    pending = pp.PendingDrafts()
    assert pending.release(DraftTokenIds(["a", "b"], [[1, 2], [3, 4]]), in_flight={"a", "b"}) is None
    released = pending.release(None, in_flight={"b"})  # a's batch was processed
    assert (released.req_ids, released.draft_token_ids) == (["a"], [[1, 2]])
    released = pending.release(DraftTokenIds(["b"], [[5, 6]]), in_flight=set())  # b's later drafts replace
    assert (released.req_ids, released.draft_token_ids) == (["b"], [[5, 6]])
    assert pending.release(None, in_flight=set()) is None
    queue = [(None, SimpleNamespace(num_scheduled_tokens={"a": 1, "c": 4}), None)]
    assert pp.in_flight(queue) == {"a", "c"}


@pytest.mark.install
def test_the_last_stage_shares_the_targets_embedding_only_where_it_has_one() -> None:
    from torch import nn
    from vllm.model_executor.models.utils import PPMissingLayer

    assert pp.holds_target_embedding(SimpleNamespace(model=SimpleNamespace(embed_tokens=nn.Embedding(4, 2))))
    assert not pp.holds_target_embedding(SimpleNamespace(model=SimpleNamespace(embed_tokens=PPMissingLayer())))
    assert not pp.holds_target_embedding(SimpleNamespace())
