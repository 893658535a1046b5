"""The offline GPU host's install kit, standard library only; ``lab/kimi_lab/gpukit.py`` is its command line.

* :mod:`kimi_lab.kit.base`: sizes, names, the kit's error and exit codes, the manifest;
* :mod:`kimi_lab.kit.plan`: the chunk size the working tree leaves room for, and the device calls to make;
* :mod:`kimi_lab.kit.stream`: the stream written as chunks and a manifest (``pack``, ``rechunk``);
* :mod:`kimi_lab.kit.device`: the host's side, stash and unpack (``python3 -S``);
* :mod:`kimi_lab.kit.wheels`: wheels' requirements, the torch stack, the kit's line and torch;
* :mod:`kimi_lab.kit.requirements`: requirement checks against the host's versions (build) or its site (host).
"""
