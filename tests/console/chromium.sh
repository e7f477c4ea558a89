#!/usr/bin/env bash
# The console's tests drive Debian's Chromium (Playwright never downloads a browser here):
# install it, once per machine, when it is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "installing Debian's chromium for the console's tests (once per machine)" >&2
sudo=""
if [ "$(id -u)" != "0" ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >&2
$sudo apt-get install -y -q chromium >&2
