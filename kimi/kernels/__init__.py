"""The fork's own CUDA kernels (built from source with nvcc for sm_90a and sm_100a).

``draft_head``: the EAGLE-3 draft head's argmax / top-k over the draft vocabulary mapped
through ``d2t`` to target ids (:func:`kimi.kernels.draft_head.draft_argmax`,
:func:`kimi.kernels.draft_head.draft_topk`), with a torch fallback behind the same interface.
``build``: compile the library, find it, list its cubins. ``sources``: vLLM's CMake external
sources for a from-source build of upstream's kernels. Importing this package imports no torch.
"""
