#!/usr/bin/env bash
# Rebuilds perf_vs_upstream.{json,md,png} in benchmarks/results/logs/perf-run2 (the table before patch 0013; the
# next one came from benchmarks/runs/perf-run6/combine.sh) from the three result files of the H200 call of
# 2026-11-30 11:05 UTC (nvidia-h200-x2: the pair on GPU 0 with CPUs 0-15, the Kimi slice on GPU 1 with CPUs
# 16-31, then the shallow slice on GPU 0). Run from the repository root. The device command was (carrying
# .kimi/models/trained/{target,drafter,MANIFEST.json}, after the three kit calls):
#   R=$OUT; export R; KIMI_CALL_LIMIT_S=585 bash benchmarks/gpu_call.sh bash -c 'A="--upstream-site
#   $KIMI_UPSTREAM_SITE --fork-site $KIMI_SITE --no-chart --reps 3"; P=benchmarks/perf_vs_upstream.py;
#   (CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 python3 $P $A --ks 3 --v2-ks --models kimi_slice --engines
#   kimi_slice/nospec kimi_slice/upstream_k3 kimi_slice/fork_k3 kimi_slice/check_k3 --scratch /tmp/ps
#   --out $R/slice > /tmp/slice.log 2>&1) & CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 $P $A --v2-ks
#   --no-check --pair .kimi/models/trained --models pair --parallel-start --scratch /tmp/pp --out $R/pair;
#   CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 $P $A --ks 3 --models kimi_slice --engines
#   kimi_slice/nospec_shallow --budget-s $((KIMI_BUDGET_S - SECONDS)) --scratch /tmp/pss --out $R/shallow;
#   wait; ...'
# (before --rounds existed: each engine measured once).
set -euo pipefail
R=benchmarks/results/logs
python3 benchmarks/perf_vs_upstream.py --combine $R/perf-run2/pair.json $R/perf-run2/slice.json \
  $R/perf-run2/shallow.json --out $R/perf-run2 \
  --invalid "kimi_slice/fork_k3=under load_format=dummy the slice's drafter has no lm_head of its own, so vLLM gives it the target's 163840-row head after loading (_maybe_share_lm_head); patch 0009's hook had bound the drafter's first (32000-row) head at load time and computed other logits: its draft ids differed from upstream's on 58368 of 58368 rows (check_k3 below) and its draft step was cheaper for that wrong reason. Fixed since (the hook reads the head at each call; tests/patches/test_eagle3_greedy_draft_vocab.py); not re-measured" \
  --note "Host: nvidia-h200-x2 (2 H200, 32 CPUs). The pair ran on GPU 0 pinned to CPUs 0-15 while the Kimi slice ran on GPU 1 pinned to CPUs 16-31; the pair's engines started together (--parallel-start) and measured one at a time." \
  --note "Noise: this pair is CPU-bound (the target forward is 0.55-0.75 ms of a 1.6-5 ms step), and from engine to engine the same code differs by up to +-40 %. fork/upstream at k = 3, c = 1/4/16/64, in three calls of this day: 1.83/1.70/1.11/0.80 (call 1, fork held on V1; benchmarks/results/logs/perf-run1), 0.80/0.79/0.82/0.91 (call 2, this table), 1.18/0.93/0.97/0.92 (call 3, pair alone, best of 5; logs/perf-run3). The k = 1 engines of this call (fork and upstream differ only in the draft head's last kernels) range 0.61-1.36. So these ratios show no fork effect either way; --rounds (engines measured in interleaved rounds) was added after these calls." \
  --note "The ideal bound sits below the measured rates on the pair: its step times are taken between device synchronizations, which remove the CPU/GPU overlap of vLLM's async scheduling that dominates this small model." \
  --note "vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1; its drafting loop is captured in CUDA graphs): fork on V2 / upstream (V1) at k = 3, c = 1/4/16/64: 2.21/1.55/1.09/1.23 (call 1) and 2.09/1.29/1.21/1.38 (call 3), upstream on V2 likewise in call 1. But tau drops on V2 once requests share a batch (c = 4/16/64: 2.58/2.34/2.34 against V1's 3.02/2.96/2.81, call 3; identical at c = 1), in upstream's V2 as in the fork's, and the Kimi slice's drafter crashed while V2 captured its decode graphs (FlashAttention 3: 'scheduler_metadata must have shape (metadata_size)'; logs/perf-run1/kimi_slice-fork_k3-v2.log.txt). So V2 is not made the default for DeepSeek-V3 targets (a patch that did so was withdrawn)." \
  --note "Patch 0009 check on the pair (KIMI_DRAFT_GREEDY=check, c = 64, k = 3): 0 of 39882 (call 1) and 0 of 57990 (call 3) draft rows differed from upstream's ids."
