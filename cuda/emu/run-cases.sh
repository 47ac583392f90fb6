#!/usr/bin/env bash
# run-cases.sh LIST OUT.json [BACKEND-OPTIONS]: runs the "ARCH CASE" lines of
# LIST on the cuda-emu backend, one kcheck run an architecture, appends the
# JSON results to OUT.json and prints the counts. Exit 0 only when every
# case passed.
set -uo pipefail
list=$1 out=$2 opts=${3:-}
: > "$out"
code=0
for arch in $(awk '!/^#/ && NF {print $1}' "$list" | sort -u); do
  args=()
  for c in $(awk -v a="$arch" '!/^#/ && $1 == a {print $2}' "$list"); do args+=(--case "$c"); done
  start=$(date +%s)
  bin/kcheck run --backend "cuda-emu:arch=$arch${opts:+,$opts}" --timeout "${EMU_TIMEOUT:-15m}" --json -q "${args[@]}" >> "$out"
  rc=$?
  echo "cuda-emu $arch${opts:+ ($opts)}: $(( ${#args[@]} / 2 )) cases in $(( $(date +%s) - start )) s (exit $rc)"
  [ $rc -eq 0 ] || code=1
done
bin/kcheck merge "$out" > /dev/null
exit $code
