#!/usr/bin/env bash
# Sets up the Python side in python/.venv from requirements.lock (exact
# versions, --no-deps: the lock lists every dependency), then installs the
# kcheck package itself. Prints the time of each step. Re-running reuses the
# environment when the lock has not changed.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
stamp="$VENV/.lock.sha256"
want=$(sha256sum requirements.lock | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python/.venv is up to date with requirements.lock"
else
  t0=$(date +%s)
  # A changed lock updates the environment in place: pip keeps what already
  # matches its pinned version, so adding one package does not download
  # torch again. (A package dropped from the lock stays installed until
  # python/.venv is removed by hand.)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  t1=$(date +%s); echo "venv: $((t1 - t0)) s"
  # --no-compile: the engines ship thousands of modules; byte-compiling all
  # of them costs minutes on two cores and only the few imported ones matter.
  "$VENV/bin/python" -m pip install -q --no-deps --no-compile --no-cache-dir -r requirements.lock
  t2=$(date +%s); echo "pip install -r requirements.lock: $((t2 - t1)) s"
  echo "$want" > "$stamp"
fi
t3=$(date +%s)
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
echo "pip install -e python: $(( $(date +%s) - t3 )) s"
# The capture hook's .pth line, for programs that are not vLLM or SGLang
# (those load it through their plugin entry points): it does nothing unless
# KCHECK_CAPTURE is set.
"$VENV/bin/python" -m kcheck.capture install-pth >/dev/null
du -sh "$VENV" | awk '{print "python/.venv: " $1}'
