"""Sequence-level unlikelihood fine-tuning of the reference target (``kimi.models.unlikelihood``, issue O): which
tokens are pushed down, the loss, that fine-tuning lowers the repeats of a looping model, and the recipe's wiring."""

from __future__ import annotations

import argparse
import math

import pytest

torch = pytest.importorskip("torch")

from kimi.models.unlikelihood import UnlikelihoodOptions, finetune, repeated_ngram_mask, unlikelihood_loss  # noqa: E402


def _mask(tokens: list[int], n: int) -> list[int]:
    return [int(x) for x in repeated_ngram_mask(torch.tensor([tokens]), n)[0]]


def test_only_the_later_copies_of_a_repeated_ngram_are_marked():
    # "7 8 9" is first seen at 0-2, repeated at 4-6; "8 9 5" and "9 5 7" occur once
    assert _mask([7, 8, 9, 5, 7, 8, 9, 1], 3) == [0, 0, 0, 0, 1, 1, 1, 0]
    assert _mask([1, 2, 3, 4, 5, 6], 2) == [0] * 6  # nothing repeats
    assert _mask([1, 2], 4) == [0, 0]  # shorter than one n-gram


def test_an_overlapping_copy_is_not_a_repeat_until_the_first_one_has_ended():
    # 2-grams of "3 3 3 3 3": the copy at 1 overlaps the first (0-1); those at 2 and 3 start after it ends
    assert _mask([3, 3, 3, 3, 3], 2) == [0, 0, 1, 1, 1]
    rows = repeated_ngram_mask(torch.tensor([[1, 2, 1, 2], [1, 2, 3, 4]]), 2)
    assert rows.tolist() == [[False, False, True, True], [False] * 4]  # rows are independent


def test_the_loss_is_minus_log_one_minus_p_of_the_marked_tokens_per_continuation_token():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]])
    sequences = torch.tensor([[0, 2, 0, 2]])
    marked = torch.tensor([[True, False, True]])  # continuation = positions 1..3; tokens 1 and 3 marked
    p = torch.softmax(logits[0], -1)
    expected = -(math.log(1 - p[0, 2]) + math.log(1 - p[2, 2])) / 3
    assert unlikelihood_loss(logits, sequences, marked, start=1).item() == pytest.approx(expected, rel=1e-6)
    assert unlikelihood_loss(logits, sequences, torch.zeros(1, 3, dtype=torch.bool), start=1).item() == 0.0
    # a marked token the model is sure of costs a bounded loss (1 - p clamped), not inf
    sure = torch.tensor([[[0.0, 0.0], [0.0, 80.0]]])
    assert math.isfinite(unlikelihood_loss(sure, torch.tensor([[0, 1]]), torch.tensor([[True]]), 1).item())


def test_a_gradient_step_lowers_the_probability_of_the_marked_tokens_only():
    logits = torch.zeros(1, 4, 5, requires_grad=True)
    sequences = torch.tensor([[0, 1, 2, 3]])
    marked = torch.tensor([[True, False, False]])  # push down token 1 after position 0
    unlikelihood_loss(logits, sequences, marked, start=1).backward()
    with torch.no_grad():
        after = torch.softmax(logits - 1.0 * logits.grad, -1)
    assert after[0, 0, 1] < 0.2 and after[0, 1, 2] == pytest.approx(0.2)


def _looping_llama():
    """A tiny Llama whose greedy continuations repeat: trained for a few steps on one short pattern."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config)
    pattern = torch.tensor([[5, 6, 7, 8] * 16])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(30):
        model(input_ids=pattern, labels=pattern).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


def _marked_probability(model, sequences: torch.Tensor, marked: torch.Tensor, start: int) -> float:
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=sequences).logits[:, start - 1:-1].float(), -1)
    return float(probs.gather(-1, sequences[:, start:, None])[..., 0][marked].mean())


def test_fine_tuning_pushes_down_the_repeats_of_the_models_own_greedy_continuations():
    import contextlib

    from kimi.models.selection import greedy_completions

    torch.set_num_threads(2)
    prefixes = torch.randint(1, 32, (16, 8), generator=torch.Generator().manual_seed(1))
    lm_batch = torch.randint(1, 32, (2, 16), generator=torch.Generator().manual_seed(2))
    looping = _looping_llama()
    cont = torch.tensor(greedy_completions(looping, prefixes.tolist(), 24, pad_id=0))
    marked = repeated_ngram_mask(cont, 4)
    assert marked.float().mean() > 0.5  # the model loops
    sequences = torch.cat([prefixes, cont], 1)
    assert _marked_probability(looping, sequences, marked, 8) > 0.9

    def windows(count: int, length: int) -> torch.Tensor:  # the same prefixes and next-token batch every time
        return prefixes[:count] if length == 8 else lm_batch

    after = {}
    for weight in (0.0, 100.0):  # the next-token term alone is the control
        model = _looping_llama()
        opts = UnlikelihoodOptions(seconds=600.0, batch=16, prefix=8, tokens=24, weight=weight, lr=1e-2, max_steps=3)
        done = finetune(model, windows, (2, 16), opts, pad_id=0, autocast=contextlib.nullcontext, say=lambda _: None)
        assert done["steps"] == 3
        assert done["repeat_share_first"] == pytest.approx(float(marked.float().mean()), abs=1e-4)
        after[weight] = _marked_probability(model, sequences, marked, 8)
    assert after[100.0] < after[0.0] / 10


def test_no_seconds_no_update():
    import contextlib

    model = _looping_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    done = finetune(model, lambda c, n: torch.ones(c, n, dtype=torch.long), (2, 8), UnlikelihoodOptions(seconds=0.0),
                    pad_id=0, autocast=contextlib.nullcontext, say=lambda _: None)
    assert done["steps"] == 0 and done["repeat_share_first"] is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_recipes_the_command_offers_are_the_recipes_there_are():
    from kimi.cli import build_parser
    from kimi.models.trained import RECIPES, TargetTraining
    from kimi.train.pair import PAIR_RECIPES

    parser = build_parser()
    args = parser.parse_args(["models", "train-target", "--recipe", "h200-unlikelihood"])
    assert args.recipe == "h200-unlikelihood"
    models = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["models"]
    commands = next(a for a in models._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, recipes in (("train-target", RECIPES), ("train-pair", PAIR_RECIPES)):
        assert set(next(a for a in commands[name]._actions if a.dest == "recipe").choices) == set(recipes), name
    assert RECIPES["h200-unlikelihood"].unlikelihood_seconds > 0 and TargetTraining().unlikelihood_seconds == 0
    for bad in ("0", "-5", "inf", "nan"):
        with pytest.raises(SystemExit):
            parser.parse_args(["models", "train-target", "--unlikelihood-seconds", bad])


@pytest.mark.parametrize("argv, overrides", [
    (["--steps", "5", "--site-mb", "3"], {"steps": 5, "site_bytes": 3_000_000}),
    (["--recipe", "h200-unlikelihood", "--max-seconds", "9"], {"max_seconds": 9.0}),
    (["--unlikelihood-seconds", "7", "--unlikelihood-weight", "2"], {"unlikelihood_seconds": 7.0,
                                                                     "unlikelihood_weight": 2.0}),
    ([], {})])
def test_train_target_takes_the_recipe_with_only_the_options_given(argv, overrides, tmp_path):
    from dataclasses import replace
    from unittest import mock

    import kimi.models.trained as trained
    from kimi.cli import build_parser

    args = build_parser().parse_args(["models", "train-target", str(tmp_path / "t"), *argv])
    with mock.patch.object(trained, "train_target") as train_target:
        assert args.func(args, mock.MagicMock()) == 0
    assert train_target.call_args.kwargs["cfg"] == replace(trained.RECIPES[args.recipe], seed=0, **overrides)
