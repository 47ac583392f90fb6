#!/usr/bin/env bash
# gpu-check.sh OUTDIR: run kcheck's CUDA checks on a GPU machine that has the
# NVIDIA driver (and perhaps nvcc) but no Go, from the bundle that
# `make gpu-bundle` builds (build/gpu/: this script, cuda.test,
# kcheck-gpu.test, kcheck-gpu, kcheck, ptxasreport, ptx/, src/). It writes
# OUTDIR/summary.json and OUTDIR/summary.md, plus each step's log and results,
# and is meant to finish in under 5 minutes (each step has a time limit).
#
#   1. environment: GPU, driver, nvcc, glibc (the binaries need >= 2.34)
#   2. with nvcc: hostcheck (the kernels' conversion helpers against this
#      CUDA's host conversions), and a rebuild of each kernel file on its
#      own for this GPU: PTX, a cubin for its arch (the 'a' target first:
#      sm_90a, sm_100a, sm_120a, sm_121a...), and the ptxas table of the
#      real architecture (ptxasreport, as in CI)
#   3. the case catalog on the shipped compute_80 PTX (driver JIT), judged by
#      the three-way check (-test.short: no 8K-128K contexts)
#   4. a second catalog pass on the locally built cubins (without a local
#      nvcc: on the bundle's cubins for this architecture)
#   5. deliberately broken kernels: crash, trap and hang are recorded and the
#      next kernel runs on a fresh worker
#   6. benchmarks: MLA decode and NVFP4 dequantize against a device copy,
#      W4A4 GEMM TFLOP/s
#
# Environment: KCHECK_GPU_MATCH (regexp of catalog cases), KCHECK_SKIP_BENCH=1,
# KCHECK_SKIP_REBUILD=1, KCHECK_CATALOG_TIMEOUT (seconds, default 150).
set -u

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu-check.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export CUDA_CACHE_PATH="$out/.nv-cache"
started=$(date +%s)

steps=()   # "name|status|seconds|detail" rows for the summary
step() {   # step NAME TIMEOUT LOG CMD...: run CMD with a time limit, record how it ended
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 )) status=ok detail=${log#"$out"/}
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status="timeout(${limit}s)"
  elif [ $rc -ne 0 ]; then status="exit $rc"; fi
  if [ $rc -ne 0 ]; then detail="$detail: $(grep -v '^\s*$' "$log" | tail -n 1 | tr '|' '/' | cut -c1-160)"; fi
  steps+=("$name|$status|$dt|$detail")
  echo "[gpu-check] $name: $status (${dt}s)"
  return $rc
}

# json_escape: stdin as the inside of a JSON string (newlines as \n, none trailing).
json_escape() { sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/ /g' | tr -d '\r' | awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'; }

# 1. Environment.
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not available"
  command -v nvcc >/dev/null && nvcc --version | tail -n 2 | head -n 1 || echo "nvcc: not found"
  ldd --version 2>&1 | head -n 1
} > "$out/environment.txt"
cat "$out/environment.txt"
glibc=$(ldd --version 2>&1 | head -n 1 | grep -oE '[0-9]+\.[0-9]+$' || echo 0)
glibc_ok=$(echo "$glibc" | awk -F. '{ print ($1 > 2 || ($1 == 2 && $2 >= 34)) ? "yes" : "no" }')
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
arch=${cc:+sm_$cc}

if [ "$glibc_ok" != yes ]; then
  steps+=("binaries|skipped|0|glibc $glibc < 2.34: the bundled Go binaries cannot run here")
fi

# 2. Rebuild with the local nvcc (optional). Each .cu file is built on its
# own (in parallel), so one that fails, most likely in the sm_120a asm that
# no GPU has run yet, leaves the others' PTX and cubins for step 4. On an
# sm_90 or newer GPU the arch-specific target (sm_90a, sm_100a, sm_120a,
# sm_121a...) is tried first; where this nvcc does not know it, or it fails,
# the plain sm_XY cubin is built instead and the failure is recorded.
rebuild_one() {  # rebuild_one NAME: ptx-local/NAME.ptx and a cubin for $arch
  local n=$1 log="$out/ptx-local/$1.log" ok=1
  cd "$here/src" || return 1
  : > "$log"
  echo "## $n.cu compute_80 (PTX)" >> "$log"
  nvcc -O3 -std=c++17 -ptx -arch=compute_80 -o "$out/ptx-local/$n.ptx" "$n.cu" >> "$log" 2>&1 || { echo "FAILED: $n.ptx" >> "$log"; ok=0; }
  if [ -n "$arch" ]; then
    local cc=${arch#sm_} built=""
    if [ "$cc" -ge 90 ]; then
      echo "## $n.cu ${arch}a" >> "$log"
      if nvcc -O3 -std=c++17 -cubin -gencode "arch=compute_${cc}a,code=${arch}a" -Xptxas -v \
           -o "$out/ptx-local/$n.${arch}a.cubin" "$n.cu" >> "$log" 2>&1; then
        built=${arch}a
      else
        echo "FAILED: $n.${arch}a.cubin" >> "$log"; ok=0
      fi
    fi
    if [ -z "$built" ]; then
      echo "## $n.cu $arch" >> "$log"
      nvcc -O3 -std=c++17 -cubin -arch="$arch" -Xptxas -v -o "$out/ptx-local/$n.$arch.cubin" "$n.cu" >> "$log" 2>&1 ||
        { echo "FAILED: $n.$arch.cubin" >> "$log"; ok=0; }
    fi
  fi
  [ $ok -eq 1 ]
}
rebuild_all() {
  local pids=() names=() failed=() i
  for f in "$here"/src/*.cu; do
    names+=("$(basename "$f" .cu)")
    rebuild_one "${names[-1]}" & pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${names[$i]}"); done
  for n in "${names[@]}"; do cat "$out/ptx-local/$n.log"; done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "rebuild: failed in ${failed[*]} (FAILED lines above); the other files' PTX and cubins are kept"
    return 1
  fi
}
export -f rebuild_one rebuild_all
export here out arch

local_ptx=""
if command -v nvcc >/dev/null && [ "${KCHECK_SKIP_REBUILD:-0}" != 1 ]; then
  mkdir -p "$out/hostcheck" "$out/ptx-local"
  step hostcheck 60 "$out/hostcheck/hostcheck.log" bash -c "
    nvcc -O2 -std=c++17 -arch=sm_80 -o '$out/hostcheck/hostcheck' '$here/src/hostcheck/hostcheck.cu' &&
    '$out/hostcheck/hostcheck' '$here/src/testdata'"
  step rebuild 180 "$out/ptx-local/build.log" bash -c rebuild_all
  # Whatever was built is used, even when some file failed.
  if ls "$out/ptx-local"/*.cubin >/dev/null 2>&1; then local_ptx="$out/ptx-local"; fi
  # The ptxas table of this GPU's architecture, by the same tool as CI's
  # (the PTX that failed to build locally is read from the bundle).
  if [ -f "$out/ptx-local/build.log" ]; then
    mkdir -p "$out/ptx-facts"
    cp "$here"/ptx/*.ptx "$out/ptx-facts/" 2>/dev/null
    cp "$out"/ptx-local/*.ptx "$out/ptx-facts/" 2>/dev/null
    "$here/ptxasreport" -log "$out/ptx-local/build.log" -ptx "$out/ptx-facts" -src "$here/src" \
      > "$out/ptx-local/ptxas-table.md" 2>&1
    echo "[gpu-check] ptxas table: $(tail -n 1 "$out/ptx-local/ptxas-table.md")"
  fi
fi
# Without a local rebuild, the cubins shipped in the bundle (CI's nvcc) for
# this architecture get the second pass.
if [ -z "$local_ptx" ] && [ -n "$arch" ] && ls "$here"/ptx/*."$arch"*.cubin >/dev/null 2>&1; then
  local_ptx="$here/ptx"
fi

if [ "$glibc_ok" = yes ]; then
  # Worker and device info.
  step info 60 "$out/info.json" "$here/kcheck-gpu" info --ptx-dir "$here/ptx"


  # 3. The catalog on the shipped PTX (src/ as working directory: the
  #    precision test reads the .cu files there).
  mkdir -p "$out/catalog-ptx"
  step catalog-ptx "${KCHECK_CATALOG_TIMEOUT:-150}" "$out/catalog-ptx/test.log" \
    env KCHECK_PTX_DIR="$here/ptx" KCHECK_PTX_ONLY=1 KCHECK_GPU_RESULTS="$out/catalog-ptx" \
    bash -c 'cd "$0" && exec "$@"' "$here/src" \
    "$here/cuda.test" -test.short -test.v -test.run 'TestCatalog|TestPrecision|TestKernels' -test.timeout 10m

  # 4. The catalog on the local cubins: a subset (the kernels whose code
  #    differs per architecture, and the split, MTP and sparse decode).
  if [ -n "$local_ptx" ] && ls "$local_ptx"/*.cubin >/dev/null 2>&1; then
    mkdir -p "$out/catalog-cubin"
    step catalog-cubin 60 "$out/catalog-cubin/test.log" \
      env KCHECK_PTX_DIR="$local_ptx" KCHECK_GPU_RESULTS="$out/catalog-cubin" \
      KCHECK_GPU_MATCH="${KCHECK_GPU_MATCH:-nvfp4|kv_cache|splitk|mla_decode/(split|mtp)|mla_decode_sparse}" \
      bash -c 'cd "$0" && exec "$@"' "$here/src" \
      "$here/cuda.test" -test.short -test.v -test.run 'TestCatalog' -test.timeout 5m
  fi

  # 5. Faults.
  mkdir -p "$out/faults"
  step faults 60 "$out/faults/test.log" env KCHECK_PTX_DIR="$here/ptx" \
    "$here/kcheck-gpu.test" -test.v -test.run 'TestFaultsAreRecorded|TestWorkerCapture'

  # 6. Benchmarks.
  if [ "${KCHECK_SKIP_BENCH:-0}" != 1 ]; then
    mkdir -p "$out/bench"
    step bench 90 "$out/bench/bench.log" \
      env KCHECK_PTX_DIR="$here/ptx" KCHECK_GPU_RESULTS="$out/bench" \
      bash -c 'cd "$0" && exec "$@"' "$here/src" \
      "$here/cuda.test" -test.run '^$' -test.bench . -test.benchtime 1x
  fi
fi

# Summary.
total=$(( $(date +%s) - started ))
{
  echo "# kcheck gpu-check"
  echo
  echo '```'
  cat "$out/environment.txt"
  echo '```'
  echo
  echo "Total: ${total}s"
  echo
  echo "| step | status | seconds | log |"
  echo "|---|---|---|---|"
  for r in "${steps[@]}"; do IFS='|' read -r n s d l <<<"$r"; echo "| $n | $s | $d | $l |"; done
  for f in catalog-ptx catalog-cubin bench; do
    if [ -f "$out/$f/results.md" ]; then echo; echo "## $f"; echo; sed 's/^#/##/' "$out/$f/results.md"; fi
  done
  if [ -f "$out/faults/test.log" ]; then echo; echo "## faults"; echo; echo '```'; grep -E '^(=== RUN|--- |    main_test|PASS|FAIL|ok)' "$out/faults/test.log" | head -40; echo '```'; fi
  if [ -f "$out/ptx-local/ptxas-table.md" ]; then
    echo; echo "## ptxas on this GPU's architecture (registers, spills, shared memory)"; echo
    grep -v '^$' "$out/ptx-local/ptxas-table.md"
  fi
} > "$out/summary.md"

{
  echo "{"
  echo "  \"environment\": \"$(json_escape < "$out/environment.txt")\","
  echo "  \"total_s\": $total,"
  echo "  \"steps\": ["
  n=${#steps[@]}; i=0
  for r in "${steps[@]}"; do
    i=$((i+1)); IFS='|' read -r nm s d l <<<"$r"
    sep=","; [ $i -eq $n ] && sep=""
    printf '    {"step": "%s", "status": "%s", "seconds": "%s", "detail": "%s"}%s\n' \
      "$nm" "$(printf %s "$s" | json_escape)" "$d" "$(printf %s "$l" | json_escape)" "$sep"
  done
  echo "  ],"
  for f in catalog-ptx catalog-cubin bench; do
    if [ -f "$out/$f/results.json" ]; then echo "  \"$f\": $(cat "$out/$f/results.json"),"; fi
  done
  echo "  \"summary_md\": \"summary.md\""
  echo "}"
} > "$out/summary.json"

echo "[gpu-check] done in ${total}s: $out/summary.md, $out/summary.json"
