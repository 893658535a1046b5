#!/usr/bin/env bash
# The device command for the offline GPU host: the same command for every call of a session.
#
#   bash benchmarks/gpu_call.sh
#
# The kit (`bash benchmarks/gpu_kit.sh` builds it here in .kimi/gpu-kit-VERSION/, git-ignored: one byte stream
# cut into chunk00.. of ~57 MiB, with MANIFEST.json) travels one chunk per call: each call's `carry` names
# MANIFEST.json and one chunk (`python3 lab/kimi_lab/gpukit.py calls --kit .kimi/gpu-kit-VERSION` prints the calls).
# A call that does not complete the kit only stashes (about a second, no torch or vLLM import): it checks the
# carried chunk's size and sha256 against the manifest (a bad chunk is REFUSED, named, and the call exits 2),
# keeps it in /tmp/kitparts/KIT_ID, which survives between calls while the machine stays warm (~30 s: make the
# calls back to back), and prints the chunks still missing and the next one to carry. A machine that went cold
# has an empty /tmp: a call that then brings a chunk after the first says MACHINE RESTARTED and names the chunks
# needed again from the start (it keeps the one it brought). The call that completes the kit
#   1. checks the whole stream's sha256, unpacks it, installs wheels/*.whl with pip --no-deps --target /tmp/site
#      and the release's own vllm/ files (as ../shared/gpu/install_kit.sh), unpacks payloads into
#      /tmp/kitpayload and links each at its path in the repository; puts the carried NCCL
#      (/tmp/site/nvidia/nccl/lib) first on LD_LIBRARY_PATH; checks that `import torch` gives the kit's torch
#      and sees the GPU (prints version, CUDA, NCCL, device); lists vLLM's requirements the host does not meet
#      (logs/check-reqs.log, not fatal);
#   2. puts the fork on it: python3 -m kimi install-into /tmp/site --line LINE (kit.json's "line", the mainline
#      for a kit without one; vllm.__version__ -> VERSION+kimi.N.cuda) and, where the line's series has patch
#      0009 (eagle3-greedy-draft-vocab), builds the fork's draft-head kernel with the host's nvcc,
#   3. runs benchmarks/gpu_e2e.py (models, lossless runs with CUDA graphs, counters, vllm serve),
#   4. runs the GPU tests (tests/gpu, on gpu_e2e's results),
# writing everything under $OUT: gpu_e2e.json, gpu_e2e.md, gpu_call.json (steps and times), kit-stash.json
# (chunks there and missing), logs/. A later call with the kit already installed (machine still warm) skips
# step 1; it needs no chunk (MANIFEST.json alone, or nothing, will do).
#
#   bash benchmarks/gpu_call.sh COMMAND [ARGS...]
#
# runs COMMAND instead of steps 3 and 4 (after 1, 2 and the kernel build), with KIMI_BUDGET_S (seconds left in
# the call minus a margin), KIMI_SITE (the fork) and KIMI_UPSTREAM_SITE (a pristine copy of upstream's `vllm`
# package, made right after the kit is installed: benchmarks/perf_vs_upstream.py runs both) exported. COMMAND
# is stopped 20 s before KIMI_CALL_LIMIT_S (exit 124, "COMMAND STOPPED"), so that a device command's steps after
# gpu_call.sh (copying results into $OUT) run even when COMMAND overruns. While the kit is incomplete such a
# call stashes and exits 3 without running COMMAND.
#
# Exit status: 0 done (or chunk stashed, kit still incomplete), 2 a carried chunk or the whole stream failed its
# sha256, 3 no kit to work with (none carried and none installed, or incomplete with a COMMAND), else the failing
# step's. Environment: OUT (default benchmarks/results/gpu), KIMI_CALL_LIMIT_S (the call's time limit, default
# 600; gpu_e2e gets what is left minus a margin), KIMI_GPU_E2E_ARGS (extra arguments for gpu_e2e.py),
# KIMI_GPU_STEPS (all; "kit" to stop after step 1; "install" to stop once the fork is on the installed vLLM),
# KIMI_KIT_DIR (default: the one .kimi/gpu-kit*/ holding a MANIFEST.json); for a rehearsal elsewhere:
# KIMI_KIT_STASH (/tmp/kitparts), KIMI_SITE (/tmp/site), KIMI_UPSTREAM_SITE (/tmp/upstream), KIMI_PAYLOAD_ROOT
# (/tmp/kitpayload), KIMI_PYTHON (python3: pip, torch, vLLM), KIMI_KIT_PYTHON (python3, run with -S for
# lab/kimi_lab/gpukit.py's stash and unpack), KIMI_KIT_CHECK_TORCH=0 (skip the torch check: a python without torch).
set -uo pipefail
SECONDS=0
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/benchmarks/results/gpu}
stash=${KIMI_KIT_STASH:-/tmp/kitparts}
site=${KIMI_SITE:-/tmp/site}
upstream=${KIMI_UPSTREAM_SITE:-/tmp/upstream}
payload_root=${KIMI_PAYLOAD_ROOT:-/tmp/kitpayload}
py=${KIMI_PYTHON:-python3}
kpy=${KIMI_KIT_PYTHON:-python3}
limit=${KIMI_CALL_LIMIT_S:-600}
mkdir -p "$out/logs"
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
gk() { "$kpy" -S "$root/lab/kimi_lab/gpukit.py" "$@"; }

# -- the carried kit: stash its chunk(s); install once complete ----------------------------------------------
kit=${KIMI_KIT_DIR:-}
if [ -z "$kit" ]; then
  shopt -s nullglob
  found=("$root"/.kimi/gpu-kit*/MANIFEST.json)
  if [ ${#found[@]} -gt 1 ]; then  # a warm machine keeps ignored paths of earlier calls: take the one with chunks
    with=()
    for m in "${found[@]}"; do c=("$(dirname "$m")"/chunk*); [ ${#c[@]} -gt 0 ] && with+=("$m"); done
    [ ${#with[@]} -gt 0 ] && found=("${with[@]}")
  fi
  shopt -u nullglob
  if [ ${#found[@]} -gt 1 ]; then
    note "several kits carried (${found[*]#"$root"/}): set KIMI_KIT_DIR"; step stash 3; finish 3
  fi
  [ ${#found[@]} -eq 1 ] && kit=$(dirname "${found[0]}")
fi
installed_sha=$(cat "$site/.kit-sha256" 2>/dev/null || true)
just_installed=0
if [ -z "$kit" ]; then
  if [ -n "$installed_sha" ]; then
    note "kit already installed in $site (sha256 ${installed_sha:0:16}; no MANIFEST.json carried)"
  else
    note "no kit carried (.kimi/gpu-kit*/MANIFEST.json) and none installed in $site: the machine is fresh or" \
      "restarted. Carry MANIFEST.json and the chunks from chunk00 (python3 lab/kimi_lab/gpukit.py calls --kit .kimi/gpu-kit-VERSION)"
    step stash 3; finish 3
  fi
else
  gk stash --kit "${kit#"$root"/}" --stash "$stash" --site "$site" --report "$out/kit-stash.json"
  rc=$?
  case $rc in
    4) step stash 0 ;;                       # this kit is installed already
    0) step stash 0 ;;                       # complete: install below
    1) step stash 0
       if [ $# -gt 0 ]; then note "kit incomplete: not running $*"; finish 3; fi
       finish 0 ;;
    *) step stash "$rc"; finish "$rc" ;;     # 2: a chunk refused; 3: no usable manifest
  esac
  if [ $rc -eq 0 ]; then
    # -- 1. install the kit ----------------------------------------------------------------------------------
    note "kit complete: checking the stream and installing it into $site"
    bundle=$site.bundle
    gk unpack --kit "$kit" --stash "$stash" --dest "$bundle" > "$out/logs/kit-unpack.log" 2>&1
    rc=$?; step kit_unpack $rc
    cat "$out/logs/kit-unpack.log"
    if [ $rc -ne 0 ]; then rm -rf "$bundle"; finish $rc; fi
    (
      set -e
      rm -rf "$site" "$site.parts" && mkdir -p "$site" "$site.parts"
      xz -dc -T0 "$bundle/vllm.tar.xz" | tar xf - -C "$site" &
      jobs=($!)
      # each wheel over 50 MB (torch, triton, NCCL) in a pip of its own, the rest in one, side by side; each
      # into a folder of its own, merged with hard links (pip --target would replace a shared bin/)
      small=()
      for w in "$bundle"/wheels/*.whl; do
        if [ "$(stat -c %s "$w")" -gt 52428800 ]; then
          "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site.parts/$(basename "$w")" "$w" &
          jobs+=($!)
        else small+=("$w"); fi
      done
      if [ ${#small[@]} -gt 0 ]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site.parts/small" "${small[@]}" &
        jobs+=($!)
      fi
      for j in "${jobs[@]}"; do wait "$j"; done
      for d in "$site.parts"/*; do cp -alf "$d/." "$site/" 2>/dev/null || cp -af "$d/." "$site/"; done
      rm -rf "$site.parts"
      if [ -d "$bundle/payload" ]; then
        rm -rf "$payload_root" && mkdir -p "$(dirname "$payload_root")" && mv "$bundle/payload" "$payload_root"
      fi
      gk field "$bundle/kit.json" payloads > "$site/.kit-payloads"
      cp "$bundle/kit.json" "$site/.kit.json"
    ) > "$out/logs/kit-install.log" 2>&1
    rc=$?; step kit_install $rc
    if [ $rc -ne 0 ]; then tail -20 "$out/logs/kit-install.log"; finish $rc; fi
    gk field "$kit/MANIFEST.json" total_sha256 > "$site/.kit-sha256"
    kid=$(gk field "$kit/MANIFEST.json" kit_id)
    rm -rf "$bundle" "$stash/${kid:?}"
    just_installed=1
    dists=("$site"/*.dist-info)
    note "kit installed (${#dists[@]} distributions); the stash is freed"
    rm -rf "$upstream" && mkdir -p "$upstream" && cp -a "$site/vllm" "$upstream/vllm"
    rc=$?; step upstream_copy $rc
    note "pristine upstream vllm copied to $upstream"
  fi
fi

# -- environment (as ../shared/gpu/env.sh) -------------------------------------------------------------------
# the site's vllm; kimi from this checkout (install-into copies only its runtime part, the hooks, into the site),
# through a folder that holds nothing else, so that a laid vllm/ at the root (a rehearsal) cannot shadow the site's;
# the lab (kimi_lab) from lab/, which holds nothing else either
mkdir -p /tmp/kimi-path && ln -sfn "$root/kimi" /tmp/kimi-path/kimi
# and what the site's .pth files add: a --target folder on PYTHONPATH is no site directory, so Python reads none
# of them (the CuTe DSL's nvidia_cutlass_dsl_packages.pth puts its dsl_packages/, where `cutlass` is, on the path)
pth=$(cd /tmp && "$py" -S -c 'import site, sys; d = sys.argv[1]; before = list(sys.path); site.addsitedir(d)
print(":".join(p for p in sys.path if p not in before and p != d))' "$site" 2>/dev/null)
export PYTHONPATH=/tmp/kimi-path:$root/lab:$site${pth:+:$pth}${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
# a carried NCCL (torch 2.13 needs 2.29's ncclCommResume; the host's is 2.28.9) goes before the host's
if [ -d "$site/nvidia/nccl/lib" ]; then export LD_LIBRARY_PATH=$site/nvidia/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
# payloads at their paths in the repository
while read -r rel; do
  [ -n "$rel" ] && [ ! -e "$root/$rel" ] && [ ! -L "$root/$rel" ] || continue
  mkdir -p "$(dirname "$root/$rel")" && ln -s "$payload_root/$rel" "$root/$rel" && note "payload $rel -> $payload_root/$rel"
done < <(cat "$site/.kit-payloads" 2>/dev/null)

# -- 1b. the kit's torch: the version it pins, the GPU, NCCL (the first call that installs, and until it passes)
if [ "${KIMI_KIT_CHECK_TORCH:-1}" != 0 ] && { [ $just_installed = 1 ] || [ ! -f "$site/.kit-torch-ok" ]; }; then
  want_torch=$(gk field "$site/.kit.json" torch 2>/dev/null)
  tline=$(cd /tmp && "$py" -c '
import torch
ok = torch.cuda.is_available()
n = torch.cuda.nccl.version() if ok else "-"
print(torch.__version__, "cuda_available=%s" % ok, "cuda=%s" % torch.version.cuda,
      "nccl=%s" % (".".join(map(str, n)) if isinstance(n, tuple) else n),
      "device=%s" % (torch.cuda.get_device_name(0).replace(" ", "_") if ok else "-"), torch.__file__)' \
      2> "$out/logs/torch-check.log")
  rc=$?
  note "torch: ${tline:-import failed} (the kit pins torch ${want_torch:-?})"
  got=${tline%% *}
  if [ $rc -ne 0 ] || [ -z "$want_torch" ] || [ "${got%%+*}" != "$want_torch" ] || [[ "$tline" != *cuda_available=True* ]]; then
    tail -20 "$out/logs/torch-check.log"
    note "torch check FAILED: want torch $want_torch with the GPU (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
    step torch_check 1; finish 1
  fi
  step torch_check 0
  touch "$site/.kit-torch-ok"
fi
if [ $just_installed = 1 ]; then
  "$py" "$root/lab/kimi_lab/gpukit.py" check-reqs --site "$site" --kit-json "$site/.kit.json" > "$out/logs/check-reqs.log" 2>&1
  step check_reqs $?
  head -12 "$out/logs/check-reqs.log"
fi
if [ "${KIMI_GPU_STEPS:-all}" = kit ]; then note "kit installed and checked; stopping (KIMI_GPU_STEPS=kit)"; finish 0; fi
nvidia-smi > "$out/logs/nvidia-smi.txt" 2>&1 || true

# -- 2. the fork onto the installed vLLM: the kit's line (a kit built before kits named theirs: the mainline) ----
line=$(gk field "$site/.kit.json" line 2>/dev/null)
line=${line:-mainline}
if [ -d "$root/kimi/lines" ] && [ ! -f "$root/kimi/lines/$line/pin.json" ]; then  # renamed since (next -> mainline)
  kit_version=$(gk field "$site/.kit.json" version 2>/dev/null)
  line=$(gk line --lines "$root/kimi/lines" --version "$kit_version" | head -1)
  note "the kit's line is no longer in this checkout: the line that pins vLLM $kit_version, $line"
fi
note "putting the $line line on the installed vLLM"
"$py" -m kimi install-into "$site" --line "$line" > "$out/logs/install-into.log" 2>&1
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
if ! compgen -G "$root/kimi/lines/$line/patches/*-eagle3-greedy-draft-vocab.patch" > /dev/null; then
  note "the $line line has no patch eagle3-greedy-draft-vocab: no draft-head kernel to build"; step kernels_build_skipped 0
elif lib=$(KIMI_KERNELS_BUILD_DIR=/tmp/kimi-kernels-host "$py" -m kimi kernels build --arch '9.0a;10.0a' --jobs 2 --json \
      2> "$out/logs/kernels-build.log" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["library"])')
   [ -f "$lib" ]; then
  step kernels_build 0
  export KIMI_DRAFT_HEAD_LIB=$lib
  note "draft-head kernel built: $lib (greedy drafts use it with KIMI_DRAFT_GREEDY=auto)"
else
  step kernels_build 1
  note "draft-head kernel not built (logs/kernels-build.log): greedy drafts use torch"
fi

# -- a command of the caller instead of 3 and 4 --------------------------------------------------------------
if [ $# -gt 0 ]; then
  export KIMI_BUDGET_S=$(( limit - SECONDS - 45 )) KIMI_SITE=$site KIMI_UPSTREAM_SITE=$upstream
  # stopped (with its child processes: timeout signals its process group) $copy_s before the call's limit, so
  # that what the caller's device command does after gpu_call.sh (copy or tar results into $OUT) still runs
  copy_s=20
  stop=$(( limit - SECONDS - copy_s ))
  if [ $stop -lt 1 ]; then  # timeout 0 would mean no limit at all
    note "COMMAND STOPPED before it started: KIMI_CALL_LIMIT_S=${limit} leaves no time for it"; step command 124; finish 124
  fi
  note "running $* (budget ${KIMI_BUDGET_S} s; stopped after ${stop} s)"
  began=$SECONDS
  timeout -k 5 "$stop" "$@"
  rc=$?; step command $rc
  # 124 / 137 from timeout, or the command's own exit status (it ended before the stop)
  if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ $(( SECONDS - began )) -ge "$stop" ]; then
    note "COMMAND STOPPED after ${stop} s, ${copy_s} s before KIMI_CALL_LIMIT_S=${limit}: what it wrote so far is" \
         "left for the rest of the call to copy; give it a smaller job or a larger KIMI_CALL_LIMIT_S"
  fi
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
