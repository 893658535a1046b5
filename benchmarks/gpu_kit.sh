#!/usr/bin/env bash
# Build the offline install kit of the pinned upstream vLLM for the GPU test host, inside the
# project (the device call carries project paths only, and ../shared does not travel):
#   bash benchmarks/gpu_kit.sh [OUT_DIR]        default .kimi/gpu-kit (git-ignored)
# Runs the shared build_kit.sh (KIMI_GPU_SCRIPTS, default ../shared/gpu beside the checkout or
# /work/shared/gpu) with the pin's version; parts are 58 MiB so that one part plus the working tree
# stays under a call's 64 MiB. Needs the package index (downloads ~350 MB, ~1.2 GB of scratch space).
# Then see benchmarks/gpu_call.sh for the device calls.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.kimi/gpu-kit}
part_mib=${KIMI_KIT_PART_MIB:-58}
scripts=${KIMI_GPU_SCRIPTS:-}
if [ -z "$scripts" ]; then
  for d in "$root/../shared/gpu" /work/shared/gpu; do
    [ -x "$d/build_kit.sh" ] && { scripts=$d; break; }
  done
fi
[ -n "$scripts" ] && [ -x "$scripts/build_kit.sh" ] || { echo "gpu_kit: no build_kit.sh (set KIMI_GPU_SCRIPTS)" >&2; exit 1; }
version=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$root/kimi/lines/mainline/pin.json")
echo "gpu_kit: vLLM $version kit with $scripts/build_kit.sh into $out (parts of $part_mib MiB)"
mkdir -p "$out"
PIP_NO_CACHE_DIR=1 "$scripts/build_kit.sh" "$version" "$out" "$part_mib"
echo "$version" > "$out/VERSION"
(cd "$out" && sha256sum part* > PARTS.sha256)
tree_kb=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
echo "gpu_kit: working tree ${tree_kb} KiB; the device command is \`bash benchmarks/gpu_call.sh\`, one call per part:"
for p in "$out"/part*; do
  echo "  carry [\".kimi/gpu-kit/$(basename "$p")\", \".kimi/gpu-kit/SHA256\", \".kimi/gpu-kit/PARTS.sha256\"]" \
       " ($(( $(stat -c %s "$p") / 1048576 )) MiB)"
done
