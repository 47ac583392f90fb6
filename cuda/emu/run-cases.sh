#!/usr/bin/env bash
# run-cases.sh LIST OUT.json [BACKEND-OPTIONS]: runs the "ARCH CASE" lines of
# LIST on the cuda-emu backend, one kcheck run an architecture (results in
# OUT.ARCH.json, all of them in OUT.json), and prints the counts of each.
# Exit 0 only when every case passed.
set -uo pipefail
list=$1 out=$2 opts=${3:-}
: > "$out"
code=0
for arch in $(awk '!/^#/ && NF {print $1}' "$list" | sort -u); do
  args=()
  for c in $(awk -v a="$arch" '!/^#/ && $1 == a {print $2}' "$list"); do args+=(--case "$c"); done
  start=$(date +%s)
  part=${out%.json}.$arch.json
  bin/kcheck run --backend "cuda-emu:arch=$arch${opts:+,$opts}" --timeout "${EMU_TIMEOUT:-15m}" --json -q "${args[@]}" > "$part"
  rc=$?
  cat "$part" >> "$out"
  echo "cuda-emu $arch${opts:+ ($opts)}: $(( ${#args[@]} / 2 )) cases in $(( $(date +%s) - start )) s (exit $rc): $(bin/kcheck merge "$part" 2>&1 > /dev/null)"
  [ $rc -eq 0 ] || code=1
done
exit $code
