"""The fork's hooks: the only part of ``kimi`` that the mainline's patches import.

A patch adds a call and nothing else (the rule brave-core keeps for its Chromium overrides); the fork's
logic sits behind the call, in the module named after the patch: patch ``NNNN-some-slug`` calls
``kimi.hooks.some_slug``.  The rules, checked by ``tests/test_hooks.py``:

* every ``+`` line of a mainline patch that names ``kimi`` names ``kimi.hooks.<its own module>``;
* a patch imports its hook lazily (inside the function that needs it), so importing an upstream module
  never imports ``kimi`` - except ``setup.py``, which runs the build hook at its top;
* every module here is called by a patch of some line (``kimi/lines/*/patches``).

``kimi install-into`` copies the runtime part of ``kimi`` into a site-packages: these modules except the
build-time ones (:data:`BUILD_TIME`) and the ``kimi`` modules they import, found by reading their imports
(:func:`kimi.fork.runtime.runtime_modules`).
"""

#: Hook modules that run only while the fork is built or installed (``setup.py``), never inside vLLM.
BUILD_TIME = frozenset({"precompiled_fork_build"})
