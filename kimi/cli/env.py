"""``kimi setup``, ``kimi demo``, ``kimi test``: a working environment from a fresh clone, and its use."""

from __future__ import annotations

import argparse

from kimi.cli.options import add_env, add_from, positive_int
from kimi.fork.layout import Layout


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``setup``, ``demo`` and ``test`` to the ``kimi`` subparsers."""
    p = sub.add_parser("setup", help="sync, install the fork into a venv (precompiled kernels), smoke-run vllm",
                       description="The README's first command: kimi sync, a virtual environment with the "
                                   "pinned torch, `pip install -e .` with kernels borrowed from the pinned "
                                   "wheel, then `vllm --version` and `vllm serve --help`.")
    add_env(p)
    add_from(p)
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("demo", help="set up, serve the shipped reference pair with EAGLE-3, ask, show acceptance",
                       description="The README's main command, on a machine without a GPU too: kimi setup; the "
                                   "shipped reference pair (models/pair, checked against its MANIFEST.json, never "
                                   "trained here); `vllm serve` of its DeepSeek-V3-architecture target with its "
                                   "EAGLE-3 drafter; completion requests with held-out real code; the mean acceptance "
                                   "length and per-position acceptance from /metrics; then the server is stopped. "
                                   "--models reference serves the random-weight reference models instead.")
    add_env(p)
    add_from(p)
    p.add_argument("--models", choices=("trained", "reference"), default="trained",
                   help="the trained pair (default) or the random-weight reference models (kimi models make)")
    p.add_argument("--drafter", choices=("mla", "llama"), default=None,
                   help="EAGLE-3 drafter style of the reference models (default: mla; the trained pair's is llama)")
    p.add_argument("-k", "--num-speculative-tokens", dest="k", type=positive_int, default=3,
                   help="draft tokens per step (default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=64,
                   help="completion length per prompt (default: %(default)s)")
    p.add_argument("--prompts", type=positive_int, default=3, help="code prompts to send (default: %(default)s)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("test", help="run the test suite (sets up first if needed)",
                       description="Ensure the environment (as `kimi setup`), then run pytest on tests/ in it. "
                                   "Arguments after -- go to pytest. No tests collected is a failure.")
    add_env(p)
    p.add_argument("--fast", action="store_true",
                   help="only the tests that need no install, GPU or build, with this python3 and no setup step "
                        "(seconds; --line, --venv and --kernels do not apply)")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments for pytest (after --)")
    p.set_defaults(func=cmd_test)


def cmd_setup(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi setup``: sync, install into the venv, smoke-run vllm."""
    from kimi.devenv import setup

    setup(layout, args.line, venv=args.venv, kernels=args.kernels, from_dir=args.from_dir)
    return 0


def cmd_demo(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi demo``: serve a target with its EAGLE-3 drafter and show the acceptance."""
    from kimi.demo import demo

    demo(layout, args.line, venv=args.venv, kernels=args.kernels, from_dir=args.from_dir, drafter=args.drafter,
         k=args.k, max_tokens=args.max_tokens, models=args.models, prompts=args.prompts)
    return 0


def cmd_test(args: argparse.Namespace, layout: Layout) -> int:
    """``kimi test [--fast] [-- PYTEST_ARGS]``: pytest's exit status (no tests collected is 1)."""
    from kimi.devenv import run_fast_tests, run_tests

    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.fast:
        return run_fast_tests(layout, pytest_args=pytest_args)
    return run_tests(layout, args.line, venv=args.venv, kernels=args.kernels, pytest_args=pytest_args)
