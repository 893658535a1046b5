"""Quantized targets that vLLM's CPU backend has no kernel for on the host, found while the config is built
(:mod:`kimi.cpu_quantization.check`)."""
