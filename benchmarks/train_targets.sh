#!/usr/bin/env bash
# Candidate reference targets side by side on one CUDA host, then the best kept (issue O).
#
#   bash benchmarks/train_targets.sh ROOT [CANDIDATE...]      (default: 10 25 50 100)
#
# A CANDIDATE is a size N (`--site-mb N`, trained into ROOT/siteN) or NAME=ARGS (ROOT/NAME, trained with the
# extra `kimi models train-target` ARGS, e.g. "ul1=--site-mb 25 --max-seconds 240 --unlikelihood-seconds 180").
# One `kimi models train-target --recipe h200 ...` per candidate, all at once on the same GPU (each stops at its
# time budget, so sharing the GPU costs each of them steps, not time), logs in ROOT/NAME.log; then
# `kimi models pick-target` copies the lowest held-out loss whose greedy code clears the quality bar to
# ROOT/picked (exit 3 if none does). Only the candidates whose training ended well this run are considered.
# Uses the host's python3 (torch with CUDA, transformers, tokenizers); no vLLM needed.
set -uo pipefail
root=${1:?usage: train_targets.sh ROOT [CANDIDATE...]}
shift
[ $# -gt 0 ] || set -- 10 25 50 100
mkdir -p "$root"
names=()
pids=()
for candidate in "$@"; do
  if [[ $candidate == *=* ]]; then
    name=${candidate%%=*}
    read -r -a extra <<<"${candidate#*=}"
  else
    name=site$candidate
    extra=(--site-mb "$candidate")
  fi
  PYTHONUNBUFFERED=1 python3 -m kimi models train-target "$root/$name" --recipe h200 "${extra[@]}" --force \
    >"$root/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
done
failed=0
candidates=()
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    candidates+=("$root/${names[$i]}")
  else
    echo "train_targets: ${names[$i]} failed (see $root/${names[$i]}.log)" >&2
    failed=1
  fi
done
[ ${#candidates[@]} -gt 0 ] || exit 1
python3 -m kimi models pick-target "${candidates[@]}" --into "$root/picked" --force || exit
exit "$failed"
