#!/usr/bin/env bash
# Install spx-trainer as a systemd service on this host (what `sudo make install` runs).
#
#   sudo systemd/install.sh                      # venv in /opt/spx-trainer/venv, unit, tmpfiles, config
#   sudo systemctl enable --now spx-trainer      # then: users drop job files into /var/spool/spx
#
#   --prefix DIR    install under DIR instead of /opt/spx-trainer (src/ and venv/ go there)
#   --destdir DIR   stage every file under DIR (packaging, tests): nothing is run against the host's
#                   systemd; needs --venv, since a venv built under DIR would point into DIR
#   --venv DIR      use this existing virtualenv (with spx-trainer installed) instead of building
#                   one; PREFIX/venv becomes a link to it
#   --torch SPEC    what `pip install` gets for torch (default: the CUDA build where an NVIDIA
#                   driver is loaded, else the CPU build); or set SPX_TORCH_SPEC
#
# Re-running it upgrades the code and the unit; /etc/spx/config.yaml is never overwritten, and local
# unit changes belong in `systemctl edit spx-trainer` drop-ins, which it leaves alone.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
destdir=${DESTDIR:-}
prefix=${PREFIX:-/opt/spx-trainer}
venv_from=
torch_spec=${SPX_TORCH_SPEC:-}
python=${PYTHON:-python3}

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --venv) venv_from=${2:?--venv needs a directory}; shift 2 ;;
    --torch) torch_spec=${2:?--torch needs a pip requirement}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown option $1" >&2; usage ;;
  esac
done
case $prefix in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 2 ;; esac
if [ -n "$destdir" ]; then
  destdir=$(cd "$destdir" && pwd)
  [ -n "$venv_from" ] || { echo "install.sh: --destdir needs --venv (a venv cannot be moved after it is built)" >&2; exit 2; }
fi
D=$destdir
say() { echo "install.sh: $*"; }

# 1. The code: the package, the examples the job files in examples/jobs point at, and the docs.
say "copying $src to $D$prefix/src"
rm -rf "$D$prefix/src.new"
mkdir -p "$D$prefix/src.new"
tar -C "$src" --exclude=__pycache__ -cf - pyproject.toml README.md daemon trainer examples systemd docs \
  | tar -C "$D$prefix/src.new" -xf -
rm -rf "$D$prefix/src"
mv "$D$prefix/src.new" "$D$prefix/src"

# 2. The environment the daemon (and, by default, the jobs) run in.
if [ -n "$venv_from" ]; then
  "$venv_from/bin/spx-trainer" --help >/dev/null || { echo "install.sh: $venv_from has no working spx-trainer" >&2; exit 1; }
  if [ -e "$D$prefix/venv" ] && [ ! -L "$D$prefix/venv" ]; then
    echo "install.sh: $D$prefix/venv exists and is not a link; remove it to use --venv" >&2; exit 1
  fi
  ln -sfn "$venv_from" "$D$prefix/venv"
  say "venv: $D$prefix/venv -> $venv_from"
else
  venv=$prefix/venv
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # torch first and alone, as in the Makefile: pip must not pick a multi-GB CUDA build on a host
  # without GPUs, nor the CPU build on one with them. DeepSpeed then builds no ops at install time.
  if [ -z "$torch_spec" ]; then
    if [ -e /proc/driver/nvidia/version ]; then torch_spec='torch>=2.3'
    else torch_spec='torch --index-url https://download.pytorch.org/whl/cpu'; fi
  fi
  say "pip install $torch_spec"
  # shellcheck disable=SC2086  # the spec may carry pip options
  "$venv/bin/pip" install -q $torch_spec
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation 'deepspeed>=0.14'
  "$venv/bin/pip" install -q "$prefix/src[train]"
  say "venv: $venv"
fi

# 3. The unit, the directories, the config.
unit=$D/etc/systemd/system/spx-trainer.service
mkdir -p "$(dirname "$unit")"
sed "s|/opt/spx-trainer|$prefix|g" "$src/systemd/spx-trainer.service" > "$unit.tmp"
chmod 0644 "$unit.tmp"
mv "$unit.tmp" "$unit"
say "unit: $unit"
# /usr/local/lib, so that a copy in /etc/tmpfiles.d/ overrides it and survives re-installs.
tmpfiles=$D/usr/local/lib/tmpfiles.d/spx-trainer.conf
install -D -m 0644 "$src/systemd/tmpfiles.d/spx-trainer.conf" "$tmpfiles"
say "tmpfiles: $tmpfiles"
if [ -n "$D" ]; then
  systemd-tmpfiles --root="$D" --create spx-trainer.conf
else
  systemd-tmpfiles --create "$tmpfiles"
fi
config=$D/etc/spx/config.yaml
if [ -e "$config" ]; then
  say "config: $config exists, kept as it is"
else
  install -D -m 0644 "$src/systemd/config.yaml" "$config"
  say "config: $config (defaults; edit, then restart the unit)"
fi

if [ -n "$D" ]; then
  say "done: staged under $D (systemd not reloaded)"
elif [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  say "done. Start it with: systemctl enable --now spx-trainer; check it with: spx doctor"
else
  say "done (systemd is not running here, so not reloaded)"
fi
