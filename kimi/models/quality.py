"""How plausible a target's completions are, from their token ids: loops and distinct-2.

A small greedy LM that has not learnt much ends in a loop (the same few tokens to the end); a drafter then
guesses it trivially and τ says more about the loop than about drafting. These numbers gate the reference pair
(``benchmarks/acceptance.py``): what τ is measured on.
"""

from __future__ import annotations

#: Shortest tail examined for a loop, in tokens.
MIN_TAIL = 16


def is_loop(tokens: list[int]) -> bool:
    """True when the second half of ``tokens`` (at least :data:`MIN_TAIL` tokens) repeats one n-gram to the end.

    That is: some period ``p <= tail // 2`` with ``tokens[i] == tokens[i - p]`` for every ``i`` of the tail past
    its first ``p`` tokens, so the tail holds at least two whole copies of the repeated n-gram. Completions shorter
    than ``2 * MIN_TAIL`` are never called loops.
    """
    tail = len(tokens) // 2
    if tail < MIN_TAIL:
        return False
    start = len(tokens) - tail
    return any(all(tokens[i] == tokens[i - p] for i in range(start + p, len(tokens)))
               for p in range(1, tail // 2 + 1))


def loop_share(completions: list[list[int]]) -> float:
    """Share of ``completions`` (token id lists) that :func:`is_loop`; nan for none."""
    return sum(map(is_loop, completions)) / len(completions) if completions else float("nan")


def distinct_n(completions: list[list[int]], n: int = 2) -> float:
    """Corpus-level distinct-n: distinct n-grams over all n-grams of all ``completions`` (token ids), as Li et al.
    2016 ("A Diversity-Promoting Objective Function for Neural Conversation Models") define it; nan without
    n-grams."""
    grams = [tuple(c[i:i + n]) for c in completions for i in range(len(c) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")
