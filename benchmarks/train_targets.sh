#!/usr/bin/env bash
# Candidate reference targets side by side on one CUDA host, then the best kept (issue O).
#
#   bash benchmarks/train_targets.sh ROOT [SITE_MB...]      (default sizes: 10 25 50 100)
#
# One `kimi models train-target --recipe h200 --site-mb N` per size, all at once on the same GPU (each stops
# at the recipe's time budget, so sharing the GPU costs each of them steps, not time), logs in ROOT/siteN.log;
# then `kimi models pick-target` copies the lowest held-out loss whose greedy code clears the quality bar to
# ROOT/picked (exit 3 if none does). Only the candidates whose training ended well this run are considered.
# Uses the host's python3 (torch with CUDA, transformers, tokenizers); no vLLM needed.
set -uo pipefail
root=${1:?usage: train_targets.sh ROOT [SITE_MB...]}
shift
sizes=("${@:-10 25 50 100}")
read -r -a sizes <<<"${sizes[*]}"
mkdir -p "$root"
pids=()
for mb in "${sizes[@]}"; do
  PYTHONUNBUFFERED=1 python3 -m kimi models train-target "$root/site$mb" --recipe h200 --site-mb "$mb" --force \
    >"$root/site$mb.log" 2>&1 &
  pids+=($!)
done
failed=0
candidates=()
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    candidates+=("$root/site${sizes[$i]}")
  else
    echo "train_targets: site ${sizes[$i]} MB failed (see $root/site${sizes[$i]}.log)" >&2
    failed=1
  fi
done
[ ${#candidates[@]} -gt 0 ] || exit 1
python3 -m kimi models pick-target "${candidates[@]}" --into "$root/picked" --force || exit
exit "$failed"
