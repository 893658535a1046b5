#!/usr/bin/env bash
# On the offline GPU host (H200, torch 2.11.0+cu130, nvcc 13.0): build the EAGLE-3 draft-head
# kernels with the host's nvcc for sm_90a + sm_100a, list the cubins, run tests/test_kernels.py
# (GPU tests included) and benchmarks/kernels.py. Everything lands in $OUT (default
# benchmarks/results). Under 3 minutes; no network.
#
#   OUT=/some/dir bash benchmarks/kernels_gpu.sh
#
# A library built elsewhere (.kimi/build/kernels, e.g. carried from the dev machine) is used when
# the host's build fails, and its build.json is reported as the "local" build. A cuobjdump of
# CUDA >= 13 is looked up next to nvcc, on PATH, in .kimi/tools/bin (carried), then in wheels.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
  [ -x "$d/nvcc" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH
[ -f .kimi/tools/bin/cuobjdump ] && chmod +x .kimi/tools/bin/cuobjdump
LOCAL_BUILD=$(ls -t .kimi/build/kernels/draft_head-*/build.json 2>/dev/null | head -1)
HOST_ROOT=${KIMI_HOST_BUILD_DIR:-/tmp/kimi-kernels-host}
rc=0

echo "== nvcc: $(command -v nvcc || echo none); $(nvcc --version 2>/dev/null | grep release)"
$PY -c 'import torch; print("== torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'

echo "== build on this host (sm_90a, sm_100a)"
if KIMI_KERNELS_BUILD_DIR=$HOST_ROOT $PY -m kimi kernels build --arch '9.0a;10.0a' --jobs 2 --force --json \
     > "$OUT/host_build.json" 2> "$OUT/host_build.err"; then
  export KIMI_KERNELS_BUILD_DIR=$HOST_ROOT
  cat "$OUT/host_build.json"
else
  echo "host build FAILED (see $OUT/host_build.err); using the carried library: ${LOCAL_BUILD:-none}"
  cat "$OUT/host_build.err"
  rm -f "$OUT/host_build.json"
  rc=1
fi

echo "== cubins"
$PY -m kimi kernels check --json > "$OUT/cubins.json" 2> "$OUT/cubins.err" || rc=1
cat "$OUT/cubins.json" "$OUT/cubins.err"

echo "== tests/test_kernels.py"
$PY -m pytest -q -p no:cacheprovider tests/test_kernels.py --junitxml "$OUT/test_kernels.xml" 2>&1 \
  | tee "$OUT/test_kernels.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

echo "== benchmarks/kernels.py"
$PY benchmarks/kernels.py --out "$OUT" ${LOCAL_BUILD:+--local-build "$LOCAL_BUILD"} \
  $( [ -s "$OUT/host_build.json" ] && echo --host-build "$OUT/host_build.json" ) 2>&1 | tee "$OUT/kernels_bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
echo "== done, status $rc"
exit $rc
