#!/usr/bin/env bash
# Issue G's measurement on a host with two GPUs, in one device call (about 9 minutes on nvidia-h200-x2):
#
#   R=$OUT bash benchmarks/gpu_call.sh bash benchmarks/perf_two_gpus.sh [ARGS...]
#
# (after the kit's calls; the shipped pair models/pair travels with the tree). ARGS go to every
# benchmarks/perf_vs_upstream.py run (e.g. --rounds 4). Three runs:
#   * the trained pair on GPU 0, pinned to the first half of the CPUs, engines started together and measured
#     in interleaved rounds (--parallel-start);
#   * at the same time, the Kimi slice on GPU 1, pinned to the second half: nospec, upstream_k3, fork_k3,
#     check_k3 (PERF_SLICE_ENGINES overrides: add kimi_slice/fork_v1_k3 for the fork's own step times in the
#     projection, else upstream's are used), one engine after another (about 107 GB each);
#   * then the shallow slice of the projection on GPU 0, in the time left.
# Writes $R/pair, $R/slice, $R/shallow (perf_vs_upstream.json and .md each, no PNG) and $R/logs.tgz (engine
# logs), few files, as a device call returns at most 8; gpu_call.sh's own logs go into the archive. Join
# them here with: python3 benchmarks/perf_vs_upstream.py --combine R/pair/... R/slice/... R/shallow/...
# Environment: R (required: the output folder), KIMI_SITE, KIMI_UPSTREAM_SITE and KIMI_BUDGET_S (set by
# gpu_call.sh), KIMI_PYTHON (python3), PERF_SLICE_ENGINES.
set -uo pipefail
: "${R:?set R to the output folder, the device call OUT}"
py=${KIMI_PYTHON:-python3}
bench=$(cd "$(dirname "$0")" && pwd)/perf_vs_upstream.py
budget=${KIMI_BUDGET_S:-540}
cpus=$(nproc)
half=$(( cpus / 2 > 0 ? cpus / 2 : 1 ))
first="0-$(( half - 1 ))"
second="$(( cpus > 1 ? half : 0 ))-$(( cpus - 1 ))"
: "${KIMI_SITE:?and KIMI_UPSTREAM_SITE: run this through benchmarks/gpu_call.sh, which sets them}"
: "${KIMI_UPSTREAM_SITE:?run this through benchmarks/gpu_call.sh, which sets it}"
common=(--upstream-site "$KIMI_UPSTREAM_SITE" --fork-site "$KIMI_SITE" --no-chart "$@")
slice_engines=${PERF_SLICE_ENGINES:-kimi_slice/nospec kimi_slice/upstream_k3 kimi_slice/fork_k3 kimi_slice/check_k3}
scratch=${PERF_SCRATCH:-/tmp/perf_two_gpus}
mkdir -p "$R" "$scratch"
SECONDS=0
echo "perf_two_gpus: $cpus CPUs: pair on GPU 0 / CPUs $first, slice on GPU 1 / CPUs $second; budget ${budget} s"

# shellcheck disable=SC2086
CUDA_VISIBLE_DEVICES=1 taskset -c "$second" "$py" "$bench" "${common[@]}" --ks 3 --models kimi_slice \
  --engines $slice_engines --budget-s "$budget" --scratch "$scratch/slice" --out "$R/slice" \
  > "$scratch/slice.log" 2>&1 &
slice=$!
CUDA_VISIBLE_DEVICES=0 taskset -c "$first" "$py" "$bench" "${common[@]}" --models pair --parallel-start \
  --budget-s "$budget" --scratch "$scratch/pair" --out "$R/pair"
pair_rc=$?
left=$(( budget - SECONDS ))
CUDA_VISIBLE_DEVICES=0 taskset -c "$first" "$py" "$bench" "${common[@]}" --ks 3 --models kimi_slice \
  --engines kimi_slice/nospec_shallow --budget-s "$left" --scratch "$scratch/shallow" --out "$R/shallow"
shallow_rc=$?
wait "$slice"
slice_rc=$?
echo "=== slice (GPU 1)"
grep "perf \[" "$scratch/slice.log" | tail -40
# engine logs only (the scratch folders also hold compile caches), and gpu_call.sh's logs
mapfile -t logs < <(find "$scratch" "$R/logs" -name '*.log' -o -name '*.txt' 2>/dev/null)
tar czf "$R/logs.tgz" "${logs[@]}" 2>/dev/null
rm -rf "$R/logs"
echo "perf_two_gpus: pair rc $pair_rc, slice rc $slice_rc, shallow rc $shallow_rc, ${SECONDS} s"
[ "$pair_rc" -eq 0 ] && [ "$slice_rc" -eq 0 ] && [ "$shallow_rc" -eq 0 ]
