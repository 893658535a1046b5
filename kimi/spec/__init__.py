"""Speculative decoding logic of the fork that runs inside vLLM's model runner (reached through hooks)."""
