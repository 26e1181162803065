#!/usr/bin/env bash
# The Debian packages the test suite runs for real: Prometheus + promtool (exporter, dashboard and
# alert tests), systemd + util-linux (the unit is tested under a real systemd booted in a private
# namespace). Installs what is missing when run as root on Debian/Ubuntu; otherwise says what to
# install and leaves it to the tests to fail with the same words.
set -euo pipefail
need=()
command -v promtool >/dev/null || need+=(prometheus)
[ -x /lib/systemd/systemd ] || need+=(systemd)
command -v unshare >/dev/null || need+=(util-linux)
[ "${#need[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "tests need: ${need[*]} (Debian packages); install them as root, e.g. sudo apt-get install ${need[*]}" >&2
  exit 0
fi
echo "installing ${need[*]} (Debian packages the tests use)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The package starts its own Prometheus on :9090; the tests start theirs on free ports.
if [[ " ${need[*]} " == *" prometheus "* ]]; then
  pkill -x prometheus 2>/dev/null || true
fi
