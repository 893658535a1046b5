"""EAGLE-3 drafter training for DeepSeek-V3-architecture targets: ``kimi train`` stages.

regenerate -> capture -> vocab -> train -> export -> report, each in :mod:`kimi.train` (one module a
stage), all working in one folder (:mod:`kimi.train.store` lists its files). The aux layer ids are chosen
once, at capture, in vLLM's convention, and written into the exported drafter's config.
"""
