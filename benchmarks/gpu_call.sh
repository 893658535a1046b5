#!/usr/bin/env bash
# The device command for the offline GPU host: the same command for every call of a session.
#
#   bash benchmarks/gpu_call.sh
#
# Each call brings one part of the kit (`bash benchmarks/gpu_kit.sh` builds it in .kimi/gpu-kit/, git-ignored;
# the call's `carry` names the part and SHA256) and stashes it in /tmp/kitparts, which survives between calls
# while the machine stays warm (~30 s: make the calls back to back). The call that completes the kit
#   1. installs it into /tmp/site (upstream vLLM, the release's own files; as ../shared/gpu/install_kit.sh),
#   2. puts the fork on it: python3 -m kimi install-into /tmp/site (vllm.__version__ -> 0.26.0+kimi.1.cuda),
#   3. runs benchmarks/gpu_e2e.py (models, lossless runs with CUDA graphs, counters, vllm serve),
#   4. runs the GPU tests (tests/gpu, on gpu_e2e's results),
# writing everything under $OUT: gpu_e2e.json, gpu_e2e.md, gpu_call.json (steps and times), logs/.
# A later call with the kit already installed (machine still warm) skips step 1.
#
#   bash benchmarks/gpu_call.sh COMMAND [ARGS...]
#
# runs COMMAND instead of steps 3 and 4 (after 1, 2 and the kernel build), with KIMI_BUDGET_S (seconds left in
# the call minus a margin), KIMI_SITE (the fork) and KIMI_UPSTREAM_SITE (a pristine copy of upstream's `vllm`
# package, made right after the kit is installed: benchmarks/perf_vs_upstream.py runs both) exported.
#
# Environment: OUT (default benchmarks/results/gpu), KIMI_CALL_LIMIT_S (the call's time limit, default 600;
# gpu_e2e gets what is left minus a margin), KIMI_GPU_E2E_ARGS (extra arguments for gpu_e2e.py); for a rehearsal
# elsewhere: KIMI_KIT_STASH (/tmp/kitparts), KIMI_SITE (/tmp/site), KIMI_PYTHON (python3), KIMI_GPU_STEPS
# (all, or "install" to stop once the fork is on the installed vLLM).
set -uo pipefail
SECONDS=0
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
kit=$root/.kimi/gpu-kit
out=${OUT:-$root/benchmarks/results/gpu}
stash=${KIMI_KIT_STASH:-/tmp/kitparts}
site=${KIMI_SITE:-/tmp/site}
upstream=${KIMI_UPSTREAM_SITE:-/tmp/upstream}
py=${KIMI_PYTHON:-python3}
limit=${KIMI_CALL_LIMIT_S:-600}
mkdir -p "$out/logs" "$stash"
steps=()
note() { echo "gpu_call [$(date +%H:%M:%S) +${SECONDS}s] $*"; }
step() { steps+=("{\"step\": \"$1\", \"rc\": $2, \"at_s\": $SECONDS}"); }
finish() {
  local rc=$1
  { printf '{\n  "rc": %s,\n  "seconds": %s,\n  "date": "%s",\n  "steps": [\n    ' "$rc" "$SECONDS" "$(date -u +%FT%TZ)"
    local IFS=,; printf '%s' "${steps[*]}"; printf '\n  ]\n}\n'; } > "$out/gpu_call.json"
  note "exit $rc"
  exit "$rc"
}

# -- stash the carried parts ---------------------------------------------------------------------------------
for f in "$kit"/part* "$kit"/SHA256 "$kit"/PARTS.sha256 "$kit"/VERSION; do
  [ -f "$f" ] && cp -f "$f" "$stash/"
done
note "stashed: $(cd "$stash" && ls -1 | tr '\n' ' ')"

installed_sha=$(cat "$site/.kit-sha256" 2>/dev/null || true)
want_sha=$(cat "$stash/SHA256" 2>/dev/null || true)
if [ -n "$installed_sha" ] && { [ -z "$want_sha" ] || [ "$installed_sha" = "$want_sha" ]; }; then
  note "kit already installed in $site (sha256 $installed_sha)"
else
  if [ -z "$want_sha" ]; then
    note "no SHA256 yet: carry .kimi/gpu-kit/SHA256 with the parts"; step stash 0; finish 0
  fi
  if [ -f "$stash/PARTS.sha256" ]; then
    missing=() bad=()
    while read -r sum name; do
      if [ ! -f "$stash/$name" ]; then missing+=("$name")
      elif [ "$(sha256sum "$stash/$name" | cut -d' ' -f1)" != "$sum" ]; then bad+=("$name"); rm -f "$stash/$name"
      fi
    done < "$stash/PARTS.sha256"
    if [ ${#bad[@]} -gt 0 ]; then note "corrupt parts removed: ${bad[*]}; carry them again"; fi
    if [ ${#missing[@]} -gt 0 ] || [ ${#bad[@]} -gt 0 ]; then
      note "kit not complete yet: still needed ${missing[*]} ${bad[*]}"
      note "(if they were carried before, the machine went cold between calls: make the calls back to back)"
      step stash 0; finish 0
    fi
  fi
  got=$(cat "$stash"/part* 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ "$got" != "$want_sha" ]; then
    note "kit not complete yet (parts: $(cd "$stash" && ls part* 2>/dev/null | tr '\n' ' ')); carry the next part."
    note "If every part was carried, the machine went cold between calls: make the calls back to back."
    step stash 0; finish 0
  fi
  # -- 1. install the kit ------------------------------------------------------------------------------------
  note "installing the kit into $site"
  (
    set -e
    bundle=$site.bundle
    rm -rf "$bundle" "$site" && mkdir -p "$bundle/w" "$site"
    cat "$stash"/part* | tar xf - -C "$bundle"
    tar xf "$bundle/wheels.tar" -C "$bundle/w"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$bundle"/w/*.whl
    tar xJf "$bundle/vllm.tar.xz" -C "$site"
    rm -rf "$bundle"
  ) > "$out/logs/kit-install.log" 2>&1
  rc=$?; step kit_install $rc
  if [ $rc -ne 0 ]; then tail -20 "$out/logs/kit-install.log"; finish $rc; fi
  echo "$want_sha" > "$site/.kit-sha256"
  rm -rf "$upstream" && mkdir -p "$upstream" && cp -a "$site/vllm" "$upstream/vllm"
  rc=$?; step upstream_copy $rc
  note "kit installed; pristine upstream vllm copied to $upstream"
fi

# -- environment (as ../shared/gpu/env.sh) -------------------------------------------------------------------
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
nvidia-smi > "$out/logs/nvidia-smi.txt" 2>&1 || true

# -- 2. the fork onto the installed vLLM ---------------------------------------------------------------------
"$py" -m kimi install-into "$site" > "$out/logs/install-into.log" 2>&1
rc=$?; step install_into $rc
cat "$out/logs/install-into.log"
if [ $rc -ne 0 ]; then finish $rc; fi
if [ "${KIMI_GPU_STEPS:-all}" = install ]; then
  version=$("$py" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["__version__"])' "$site/vllm/_version.py")
  note "vllm/_version.py says $version; stopping (KIMI_GPU_STEPS=install)"; step version 0; finish 0
fi
version=$(cd /tmp && "$py" -c 'import vllm; print(vllm.__version__)' 2> "$out/logs/import-vllm.log")
rc=$?; step import_vllm $rc
note "vllm.__version__ = $version"
if [ $rc -ne 0 ] || [[ "$version" != *+kimi.* ]]; then tail -20 "$out/logs/import-vllm.log"; finish 1; fi

# -- 2b. the fork's draft-head kernel with the host's nvcc (patch 0009 with KIMI_DRAFT_GREEDY=auto) --------
PATH="$PATH:/usr/local/cuda/bin"
lib=$(KIMI_KERNELS_BUILD_DIR=/tmp/kimi-kernels-host "$py" -m kimi kernels build --arch '9.0a;10.0a' --jobs 2 --json \
      2> "$out/logs/kernels-build.log" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["library"])')
rc=$?; step kernels_build $rc
if [ $rc -eq 0 ] && [ -f "$lib" ]; then
  export KIMI_DRAFT_HEAD_LIB=$lib
  note "draft-head kernel built: $lib (greedy drafts use it with KIMI_DRAFT_GREEDY=auto)"
else
  note "draft-head kernel not built (logs/kernels-build.log): greedy drafts use torch"
fi

# -- a command of the caller instead of 3 and 4 --------------------------------------------------------------
if [ $# -gt 0 ]; then
  export KIMI_BUDGET_S=$(( limit - SECONDS - 45 )) KIMI_SITE=$site KIMI_UPSTREAM_SITE=$upstream
  note "running $* (budget ${KIMI_BUDGET_S} s)"
  "$@"
  rc=$?; step command $rc
  finish $rc
fi

# -- 3. end to end -------------------------------------------------------------------------------------------
budget=$(( limit - SECONDS - 120 ))
note "gpu_e2e.py with a budget of ${budget} s"
# shellcheck disable=SC2086
"$py" benchmarks/gpu_e2e.py --out "$out" --scratch /tmp/gpu_e2e --budget-s "$budget" ${KIMI_GPU_E2E_ARGS:-}
e2e=$?; step gpu_e2e $e2e
note "drafter loads with the fork's draft-head kernel: $(cat "$out"/logs/lane-*.log 2>/dev/null | grep -c 'fork CUDA kernel'),"\
" with torch: $(cat "$out"/logs/lane-*.log 2>/dev/null | grep -c 'EAGLE-3 greedy drafts: .*(torch)')"

# -- 4. GPU tests on its results -----------------------------------------------------------------------------
left=$(( limit - SECONDS - 15 ))
if [ -f "$out/gpu_e2e.json" ] && [ $left -gt 20 ]; then
  KIMI_GPU_E2E_RESULTS=$out/gpu_e2e.json timeout "$left" "$py" -m pytest -q -p no:cacheprovider tests/gpu \
    -o addopts="-ra" > "$out/logs/pytest-gpu.log" 2>&1
  rc=$?; step pytest_gpu $rc
  tail -15 "$out/logs/pytest-gpu.log"
else
  step pytest_gpu_skipped 0
fi
finish $e2e
