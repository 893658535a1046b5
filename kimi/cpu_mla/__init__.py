"""MLA attention on vLLM's CPU platform: the fork's ``CPU_MLA`` backend (patch 0006).

``ops`` holds the torch arithmetic (latent-cache writes, paged absorbed attention), ``backend`` the
vLLM classes, ``selection`` which backend an MLA layer gets.  The patched ``CpuPlatform`` reaches them through
``kimi.hooks.cpu_mla_backend``.
"""
