#!/usr/bin/env bash
# Build the offline install kit of the pinned upstream vLLM for the GPU test host, inside the project (a
# device call carries project paths only, and ../shared does not travel):
#
#   bash benchmarks/gpu_kit.sh [OUT_DIR] [--line LINE] [--payload DIR]...      default OUT_DIR .kimi/gpu-kit-VERSION
#
# LINE (kimi/lines/LINE; default KIMI_KIT_LINE, else the line whose pin.json names KIMI_KIT_VERSION, else the
# mainline) gives VERSION (its pin's) and the series that `kimi install-into --line LINE` puts on the host
# (kit.json's "line": gpu_call.sh reads it); the CUDA wheel downloaded is checked against the pin's sha256.
# The kit's torch is the one the release's CUDA wheel requires (lab/kimi_lab/gpukit.py kit-torch), never the pin's
# "torch", which is the line's CPU torch (the mainline: 2.13.0 on CPU, while 0.34.0's CUDA wheel wants 2.14.0).
#
# The kit is ONE byte stream (an uncompressed tar: kit.json, vllm.tar.xz, wheels/*.whl, payload/...) cut
# into chunks, OUT_DIR/chunk00.., described by OUT_DIR/MANIFEST.json (chunk names, sizes, sha256s, the total
# size and sha256, the vLLM and torch versions; lab/kimi_lab/gpukit.py writes and reads it). In it:
#   - what the shared build_kit.sh makes for VERSION (KIMI_GPU_SCRIPTS, default ../shared/gpu beside the
#     checkout or /work/shared/gpu): upstream's CUDA wheel (installed files, FA2 left out) and every wheel
#     it needs that the host lacks by name;
#   - where the release pins a torch other than the host's 2.11.0 (vLLM 0.27-0.32: torch 2.13.0; 0.33-0.34:
#     2.14.0): that torch (cp312 manylinux x86_64), the triton and nvidia-nccl-cu13 its wheel pins (the host's
#     NCCL 2.28.9 lacks ncclCommResume) and the torchvision the release pins (the host's 0.26 is built for
#     torch 2.11);
#   - the wheels of host packages whose known host version misses a pin (HOST_VERSIONS in
#     lab/kimi_lab/kit/requirements.py), and of host packages that a carried wheel breaks (HOST_REQUIRES:
#     0.34.0's huggingface-hub 2.x, transformers);
#     pins on host packages of unknown version are listed in OUT_DIR/host-pins.txt and checked on the host
#     when the kit is installed (logs/check-reqs.log);
#   - what kimi/lines/LINE/gpu-kit.txt names (requirements the release needs that the shared resolver skips;
#     the mainline: the CuTe DSL and QuACK, which vLLM 0.34.0 imports at every CUDA engine's start);
#   - each --payload DIR (or KIMI_KIT_PAYLOADS, space-separated), e.g. a model pair folder: unpacked on the
#     host under /tmp/kitpayload and linked at the same path in the repository (.kimi/models/x stays
#     .kimi/models/x; the shipped pair models/pair needs none: it is tracked).
# Chunks are sized so that one chunk + the working tree (git ls-files, measured now) + 4 MiB stay under a
# call's 64 MiB (at most 60 MiB): 57 MiB with today's ~2.7 MiB tree. Downloads are cached in .kimi/cache
# (wheels/, pip/, and gpu-kit/base-VERSION-KEY/ for build_kit.sh's output, KEY from the shared scripts),
# so a rebuild (another payload, another chunk size) needs no network. ~1.3 GB of downloads for 0.32.0.
#
# Environment: KIMI_KIT_LINE, KIMI_KIT_VERSION (default LINE's pin's "version"), KIMI_KIT_TORCH (default
# the torch that the release's wheel requires; it must agree), KIMI_KIT_CHUNK_MIB (default from the tree, as
# above), KIMI_KIT_PAYLOADS, KIMI_KIT_FORCE (comma-separated requirements to carry as well, e.g.
# "pillow>=12.3.0,nvidia-cudnn-cu13==9.20.0.48"), KIMI_KIT_TORCHVISION=0 (leave torchvision out),
# KIMI_GPU_SCRIPTS, KIMI_CACHE_DIR.
#   e.g. KIMI_KIT_VERSION=0.32.0 KIMI_KIT_TORCH=2.13.0 bash benchmarks/gpu_kit.sh
#        bash benchmarks/gpu_kit.sh --line v0.32       (vLLM 0.32.0 + the 0.32.0 series, torch 2.13.0)
#
# It ends by printing the device calls to make (python3 lab/kimi_lab/gpukit.py calls --kit OUT_DIR prints them
# again; --only chunk07,chunk08 for the ones a reply says are missing); see benchmarks/gpu_call.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gk() { python3 "$root/lab/kimi_lab/gpukit.py" "$@"; }
out="" payloads=() line=${KIMI_KIT_LINE:-}
read -r -a payloads <<< "${KIMI_KIT_PAYLOADS:-}"
while [ $# -gt 0 ]; do
  case $1 in
    --payload) payloads+=("$2"); shift 2 ;;
    --payload=*) payloads+=("${1#--payload=}"); shift ;;
    --line) line=$2; shift 2 ;;
    --line=*) line=${1#--line=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) [ -z "$out" ] || { echo "gpu_kit: one OUT_DIR only" >&2; exit 2; }; out=$1; shift ;;
  esac
done
scripts=${KIMI_GPU_SCRIPTS:-}
if [ -z "$scripts" ]; then
  for d in "$root/../shared/gpu" /work/shared/gpu; do
    [ -x "$d/build_kit.sh" ] && { scripts=$d; break; }
  done
fi
[ -n "$scripts" ] && [ -x "$scripts/build_kit.sh" ] || { echo "gpu_kit: no build_kit.sh (set KIMI_GPU_SCRIPTS)" >&2; exit 1; }
{ read -r line; read -r version; read -r pin_sha; } < <(gk line --lines "$root/kimi/lines" --line "$line" \
  --version "${KIMI_KIT_VERSION:-}" || echo)
[ -n "$version" ] || exit 1
out=${out:-$root/.kimi/gpu-kit-$version}
mkdir -p "$out" && out=$(cd "$out" && pwd)
case $out/ in "$root"/*) ;; *) echo "gpu_kit: warning: $out is outside the repository; a device call cannot carry it" >&2 ;; esac
cache=${KIMI_CACHE_DIR:-$root/.kimi/cache}
wheels=$cache/wheels
mkdir -p "$wheels" "$cache/gpu-kit"
export PIP_CACHE_DIR=$cache/pip
unset PIP_NO_CACHE_DIR
host_torch=2.11.0

# pip download one requirement for the host (CPython 3.12, manylinux x86_64) into the cache; print the file
plats=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_18_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 any; do
  plats+=(--platform "$p")
done
fetch() {
  local log
  log=$(python3 -m pip download --no-deps --only-binary=:all: --progress-bar off --python-version 3.12 \
        --implementation cp "${plats[@]}" -d "$wheels" "$1" 2>&1) || { echo "$log" | tail -3 >&2; echo "gpu_kit: cannot download $1" >&2; return 1; }
  echo "$log" | sed -nE 's/.*(Saved|File was already downloaded) (.*\.whl)$/\2/p' | tail -1 | xargs -r -n1 basename \
    | sed "s|^|$wheels/|"
}

echo "gpu_kit: vLLM $version, line $line into $out"
vwhl=$(fetch "vllm==$version")
[ -f "$vwhl" ] || { echo "gpu_kit: no vllm $version wheel" >&2; exit 1; }
if [ -n "$pin_sha" ] && [ "$(sha256sum < "$vwhl" | cut -d' ' -f1)" != "$pin_sha" ]; then
  echo "gpu_kit: $vwhl is not the wheel kimi/lines/$line/pin.json pins (sha256 $pin_sha)" >&2; exit 1
fi
torch=$(gk kit-torch "$vwhl" --torch "${KIMI_KIT_TORCH:-}") || exit 1
echo "gpu_kit: torch $torch (what the CUDA wheel requires)"

# -- 1. build_kit.sh's kit (cached by version and the shared scripts' contents) ---------------------------------
key=$(cat "$scripts/build_kit.sh" "$scripts/resolve_wheels.py" "$scripts/host-packages.txt" | sha256sum | cut -c1-12)
base=$cache/gpu-kit/base-$version-$key
if [ -f "$base/SHA256" ] && [ -f "$base/part00" ] && [ "$(sha256sum < "$base/part00" | cut -d' ' -f1)" = "$(cat "$base/SHA256")" ]; then
  echo "gpu_kit: build_kit.sh's $version kit from the cache ($base)"
else
  echo "gpu_kit: $scripts/build_kit.sh $version (downloads the wheel and its missing dependencies; minutes)"
  rm -rf "$base.new" && mkdir -p "$base.new"
  "$scripts/build_kit.sh" "$version" "$base.new" 1000000 > "$base.new/build.log" 2>&1 \
    || { tail -20 "$base.new/build.log" >&2; exit 1; }
  parts=("$base.new"/part*)
  [ ${#parts[@]} = 1 ] || { echo "gpu_kit: build_kit.sh made ${#parts[@]} parts, not one" >&2; exit 1; }
  rm -rf "$base" && mv "$base.new" "$base"
fi
grep '^FAILED' "$base/build.log" 2>/dev/null | sed 's/^/gpu_kit: build_kit.sh: /' >&2 || true

stage=$(mktemp -d "$cache/gpu-kit/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
tar xf "$base/part00" -C "$stage"
mkdir -p "$stage/wheels"
tar xf "$stage/wheels.tar" -C "$stage/wheels" && rm -f "$stage/wheels.tar"
add_wheel() {
  [ -f "$1" ] || { echo "gpu_kit: no wheel file ($1)" >&2; exit 1; }
  ln -f "$1" "$stage/wheels/" 2>/dev/null || cp "$1" "$stage/wheels/"; echo "gpu_kit: + $(basename "$1") ($(( $(stat -c %s "$1") / 1048576 )) MiB)"
}

# -- 2. the torch stack, where the release pins a torch the host lacks ---------------------------------------------
if [ "$torch" != "$host_torch" ]; then
  twhl=$(fetch "torch==$torch")
  add_wheel "$twhl"
  for req in $(gk torch-stack "$twhl"); do add_wheel "$(fetch "$req")"; done
  tv=$(gk wheel-pin "$vwhl" torchvision)
  if [ -n "$tv" ] && [ "${KIMI_KIT_TORCHVISION:-1}" != 0 ]; then add_wheel "$(fetch "torchvision==$tv")"; fi
fi

# -- 2b. what kimi/lines/LINE/gpu-kit.txt adds (0.34.0: the CuTe DSL and QuACK, which the shared skip leaves out)
for req in $(gk line-requires --lines "$root/kimi/lines" "$line"); do add_wheel "$(fetch "$req")"; done

# -- 3. pins the host's own packages miss -------------------------------------------------------------------------
skip=$(gk skip-names "$scripts/resolve_wheels.py" --carried "$stage/wheels")
gk host-pins "$stage"/wheels/*.whl "$vwhl" --host-packages "$scripts/host-packages.txt" --skip "$skip" > "$out/host-pins.txt"
force=$(gk host-pins "$stage"/wheels/*.whl "$vwhl" --host-packages "$scripts/host-packages.txt" --skip "$skip" --misses)
IFS=, read -r -a extra <<< "${KIMI_KIT_FORCE:-}"
for req in $force "${extra[@]}"; do [ -n "$req" ] && add_wheel "$(fetch "$req")"; done
# host packages that what is carried now breaks (vLLM 0.34.0's huggingface-hub 2.x and the host's transformers)
for req in $(gk host-broken "$vwhl" "$stage"/wheels/*.whl); do
  echo "gpu_kit: the carried wheels break the host's ${req%%[<>=!~]*}: carrying $req"; add_wheel "$(fetch "$req")"
done
grep -v '^unverified' "$out/host-pins.txt" | sed 's/^/gpu_kit: /' || true
unverified=$(grep '^unverified' "$out/host-pins.txt" | cut -d' ' -f8 | tr '\n' ' ' || true)
[ -z "$unverified" ] || echo "gpu_kit: host packages of unknown version with pins (checked on the host at install;" \
  "$out/host-pins.txt): $unverified"

# -- 4. payloads, the chunk size, the stream -----------------------------------------------------------------------
pargs=()
for p in "${payloads[@]}"; do
  [ -d "$p" ] || { echo "gpu_kit: payload $p is not a folder" >&2; exit 1; }
  abs=$(cd "$p" && pwd)
  case $abs/ in "$root"/*) rel=${abs#"$root"/} ;; *) rel=.kimi/payload/$(basename "$abs") ;; esac
  pargs+=(--payload "$rel=$abs")
  echo "gpu_kit: payload $rel ($(du -sm "$abs" | cut -f1) MiB)"
done
chunk_mib=${KIMI_KIT_CHUNK_MIB:-$(gk chunk-mib --root "$root")}
rm -f "$out"/part* "$out/SHA256" "$out/PARTS.sha256" "$out/VERSION"   # the earlier kit format
gk pack --out "$out" --chunk-mib "$chunk_mib" --add "vllm.tar.xz=$stage/vllm.tar.xz" --add "wheels=$stage/wheels" \
  "${pargs[@]}" --meta "version=$version" --meta "line=$line" --meta "torch=$torch" --meta "host_torch=$host_torch" \
  --meta "skip=$skip" --meta "base=base-$version-$key" --meta "chunk_mib=$chunk_mib"
echo
gk calls --kit "$out" --root "$root"
