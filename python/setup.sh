#!/usr/bin/env bash
# Sets up the Python side in python/.venv from requirements.lock (exact
# versions, --no-deps: the lock lists every dependency), then installs the
# kcheck package itself. Prints the time of each step. Re-running reuses the
# environment when the lock has not changed.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
UV_VERSION=0.13.9
VENV=.venv
stamp="$VENV/.lock.sha256"
want=$( (cat requirements.lock; echo "uv==$UV_VERSION") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "python/.venv is up to date with requirements.lock"
else
  t0=$(date +%s)
  # A changed lock updates the environment in place: uv keeps what already
  # matches its pinned version, so adding one package does not download
  # torch again. (A package dropped from the lock stays installed until
  # python/.venv is removed by hand.)
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  t1=$(date +%s); echo "venv: $((t1 - t0)) s"
  # uv installs the lock, not pip: measured here on a fresh 2-core machine
  # (no cache either way) pip took 142 s wall and 146 s CPU for the 6.9 GB,
  # uv 36 s wall and 60 s CPU, with the same packages at the same versions
  # (pip freeze identical). The CPU matters: .ci/run installs beside make
  # test. uv itself is one pinned wheel from PyPI. Like pip --no-compile, uv
  # does not byte-compile: the engines ship thousands of modules and only
  # the few imported ones matter.
  "$VENV/bin/python" -m pip install -q --no-cache-dir "uv==$UV_VERSION"
  UV_NO_CACHE=1 "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --no-deps -r requirements.lock
  t2=$(date +%s); echo "uv pip install -r requirements.lock: $((t2 - t1)) s"
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
