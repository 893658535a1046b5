"""Drafter fixtures of the lab, over :mod:`kimi.drafter`: ``assumptions`` lists what vLLM assumes about a drafter,
with lying copies (made by ``lies``); ``corpus`` applies each of them (and the formats the fork writes) to real
drafters; ``other_tools`` writes our drafter as speculators and SpecForge do."""
