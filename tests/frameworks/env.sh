#!/usr/bin/env bash
# Build (once per machine) the training frameworks' test environment and print its python.
# It lives outside the clone, in $CKPT_TEST_ENVS (default ~/.cache/ckpt/test-envs), named
# by a digest of requirements.txt and the Python version, so a new pin builds a new one and
# an unchanged one is reused by every clone and every CI run. It is built under a temporary
# name and renamed when complete, so an interrupted build is never taken for a finished
# one. (Only `bin/python` is used: the scripts in bin/ keep the temporary name.)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${CKPT_TEST_ENVS:-$HOME/.cache/ckpt/test-envs}"
python="${PYTHON:-python3.11}"
key="$( (cat "$here/requirements.txt"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)"
env="$root/frameworks-$key"
if [ ! -x "$env/bin/python" ]; then
  mkdir -p "$root"
  partial="$env.partial-$$"
  trap 'rm -rf "$partial"' EXIT
  echo "building the frameworks' test environment $env (once per machine)" >&2
  "$python" -m venv "$partial"
  "$partial/bin/python" -m pip install --quiet --upgrade pip >&2
  "$partial/bin/python" -m pip install --quiet -r "$here/requirements.txt" >&2
  mv -T "$partial" "$env" 2>/dev/null || true  # another build finished first: keep it
  trap - EXIT
  rm -rf "$partial"
fi
echo "$env/bin/python"
