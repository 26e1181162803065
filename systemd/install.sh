#!/usr/bin/env bash
# Install spx-trainer as a systemd service on this host (what `sudo make install` runs).
#
#   sudo systemd/install.sh                      # venv, unit, tmpfiles, config, spx on PATH, man, completion
#   sudo systemctl enable --now spx-trainer      # then: spx doctor; users submit with spx submit
#
#   --prefix DIR    install under DIR instead of /opt/spx-trainer (src/ and venv/ go there)
#   --bindir DIR    where the spx and spx-trainer links go (default /usr/local/bin; e.g. PREFIX/bin)
#   --datadir DIR   man pages, bash completion, dashboards (default /usr/local/share; e.g. PREFIX/share)
#   --destdir DIR   stage every file under DIR (packaging, tests): nothing is run against the host's
#                   systemd; needs --venv, since a venv built under DIR would point into DIR
#   --venv DIR      use this existing virtualenv (with spx-trainer installed) instead of building
#                   one; PREFIX/venv becomes a link to it
#   --torch SPEC    what `pip install` gets for torch (default: systemd/torch-spec.sh, as `make venv`:
#                   the CUDA build where an NVIDIA driver is loaded); or set SPX_TORCH_SPEC
#   PYTHON=...      the interpreter to build the venv from (default python3, or the system's
#                   /usr/bin/python3 where that one cannot be run by other users)
#
# Re-running it upgrades the code and the unit; /etc/spx/config.yaml is never overwritten, and local
# unit changes belong in `systemctl edit spx-trainer` drop-ins, which it leaves alone.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
destdir=${DESTDIR:-}
prefix=${PREFIX:-/opt/spx-trainer}
bindir=${BINDIR:-/usr/local/bin}
datadir=${DATADIR:-/usr/local/share}
venv_from=
torch_spec=${SPX_TORCH_SPEC:-}
python=${PYTHON:-}

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --bindir) bindir=${2:?--bindir needs a directory}; shift 2 ;;
    --datadir) datadir=${2:?--datadir needs a directory}; shift 2 ;;
    --venv) venv_from=${2:?--venv needs a directory}; shift 2 ;;
    --torch) torch_spec=${2:?--torch needs a pip requirement}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown option $1" >&2; usage ;;
  esac
done
for dir in "$prefix" "$bindir" "$datadir"; do
  case $dir in /*) ;; *) echo "install.sh: --prefix, --bindir and --datadir must be absolute" >&2; exit 2 ;; esac
done
if [ -n "$destdir" ]; then
  destdir=$(cd "$destdir" && pwd)
  [ -n "$venv_from" ] || { echo "install.sh: --destdir needs --venv (a venv cannot be moved after it is built)" >&2; exit 2; }
fi
D=$destdir
say() { echo "install.sh: $*"; }
die() { echo "install.sh: $*" >&2; exit 1; }

# Jobs run as their owners with the venv's python (the default `python:`), and users run spx from
# it: an interpreter that only root can reach (one under root's 0700 home, e.g. pyenv) fails every
# job with "Permission denied". So each interpreter is tried as an unprivileged user before use.
as_unprivileged() {  # as_unprivileged CMD...: run CMD as nobody (as is, when not root: already one)
  if [ "$(id -u)" != 0 ]; then (cd / && "$@"); return; fi
  id nobody >/dev/null 2>&1 || { echo "no user nobody to try it as" >&2; return 1; }
  # Through sh: setpriv's own exec of a path under a 0700 directory can succeed where a process
  # of that user cannot exec it (measured here with /root 0700), and a job's launcher is the latter.
  (cd / && env -i HOME=/ PATH=/usr/bin:/bin LANG=C.UTF-8 \
     setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups -- sh -c 'exec "$@"' sh "$@")
}
# python_for_venv: the interpreter to build the venv from: $PYTHON if set (it must work), else the
# first of python3 on PATH, /usr/bin/python3, /usr/local/bin/python3 that is 3.10+, has venv, and
# can be run by other users.
python_for_venv() {
  local candidates py why
  if [ -n "$python" ]; then candidates=$python; else candidates="python3 /usr/bin/python3 /usr/local/bin/python3"; fi
  for py in $candidates; do
    py=$(command -v "$py" 2>/dev/null) || continue
    py=$("$py" -c 'import sys; print(sys.executable)' 2>/dev/null) || continue  # past a pyenv shim
    if ! "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      say "not $py: needs python 3.10+ with venv and ensurepip" >&2; continue
    fi
    if ! why=$(as_unprivileged "$py" -c 'import sys' 2>&1); then
      say "not $py: other users cannot run it (${why:-exit status $?}); a job's owner could not" >&2; continue
    fi
    echo "$py"; return 0
  done
  die "no python 3.10+ with venv that every user can run (tried: $candidates); install the system's python3 and python3-venv, or set PYTHON="
}

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
  "$venv_from/bin/spx-trainer" --version >/dev/null || { echo "install.sh: $venv_from has no working spx-trainer" >&2; exit 1; }
  if [ -e "$D$prefix/venv" ] && [ ! -L "$D$prefix/venv" ]; then
    echo "install.sh: $D$prefix/venv exists and is not a link; remove it to use --venv" >&2; exit 1
  fi
  ln -sfn "$venv_from" "$D$prefix/venv"
  say "venv: $D$prefix/venv -> $venv_from"
else
  venv=$prefix/venv
  if [ ! -x "$venv/bin/python" ] || ! as_unprivileged "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
    python=$(python_for_venv)
    say "python: $python"
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/pip" install -q --upgrade pip
  # torch first and alone, chosen as `make venv` does: pip must not pick a multi-GB CUDA build on a
  # host without GPUs, nor the CPU build on one with them. DeepSpeed then builds no ops at install time.
  [ -n "$torch_spec" ] || torch_spec=$(sh "$src/systemd/torch-spec.sh")
  say "pip install $torch_spec"
  # shellcheck disable=SC2086  # the spec may carry pip options
  "$venv/bin/pip" install -q $torch_spec
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q --no-build-isolation 'deepspeed>=0.14'
  # [train]: what jobs import; the daemon's own needs (py-spy among them) are the package's dependencies.
  "$venv/bin/pip" install -q "$prefix/src[train]"
  say "venv: $venv"
fi
venv_real=${venv_from:-$prefix/venv}
py=$venv_real/bin/python
[ -x "$venv_real/bin/py-spy" ] || say "warning: no py-spy in $venv_real/bin: a hung job's attempt log gets no stack dump ($py -m pip install py-spy)"
# The job environment as a job's owner meets it: the interpreter, spx-trainer's package and torch.
# Not for a staged tree: it runs elsewhere (there, `spx doctor` tries it: worker-access).
if [ -n "$D" ]; then
  say "job environment: not tried (staged under $D; spx doctor on the host tries it)"
elif ! why=$(as_unprivileged "$py" -c 'import spx.daemon, torch' 2>&1); then
  die "$py cannot be used by other users: ${why##*$'\n'}
  Jobs run as their owners with this python, and users run spx from it. Build the venv from a python
  every user can run: rm -rf $prefix/venv; PYTHON=/usr/bin/python3 $0 (or point --venv at such a venv)."
else
  say "job environment: $py runs as an unprivileged user and imports torch"
fi

# 3. The commands on PATH, their man pages and bash completion, generated from the installed parsers.
mkdir -p "$D$bindir"
for cmd in spx spx-trainer; do ln -sfn "$prefix/venv/bin/$cmd" "$D$bindir/$cmd"; done
say "commands: $D$bindir/spx, $D$bindir/spx-trainer"
generate() {  # generate MODULE PROGRAM FILE
  mkdir -p "$(dirname "$3")"
  "$py" -m "spx.daemon.cli.$1" "$2" > "$3.tmp"
  chmod 0644 "$3.tmp"
  mv "$3.tmp" "$3"
}
generate manpage spx "$D$datadir/man/man1/spx.1"
generate manpage spx-trainer "$D$datadir/man/man8/spx-trainer.8"
generate completion spx "$D$datadir/bash-completion/completions/spx"
generate completion spx-trainer "$D$datadir/bash-completion/completions/spx-trainer"
say "man pages: $D$datadir/man/man1/spx.1, man8/spx-trainer.8; bash completion: $D$datadir/bash-completion/completions/"

# 4. Dashboards, alert and recording rules, and the Grafana and Prometheus files that load them.
share=$datadir/spx-trainer
mkdir -p "$D$share"/{dashboards,rules,grafana,prometheus}
install -m 0644 "$src"/dashboards/spx-*.json "$D$share/dashboards/"
install -m 0644 "$src/dashboards/rules/spx_alerts.yml" "$src/dashboards/rules/spx_recording.yml" "$D$share/rules/"
shipped=/usr/local/share/spx-trainer  # the paths the shipped files name, rewritten to $share
for f in grafana-datasources.yaml grafana-dashboards.yaml; do
  sed "s|$shipped|$share|g" "$src/dashboards/provisioning/$f" > "$D$share/grafana/$f"
done
sed "s|$shipped|$share|g" "$src/dashboards/provisioning/prometheus-scrape.yml" > "$D$share/prometheus/prometheus.yml"
install -m 0644 "$src/dashboards/provisioning/spx-targets.example.yml" "$D$share/prometheus/"
chmod 0644 "$D$share"/grafana/* "$D$share/prometheus/prometheus.yml"
say "dashboards and rules: $D$share (Prometheus: $share/prometheus/prometheus.yml)"
# Grafana on this host: provision the data source and the dashboards, never overwriting a file.
grafana=$D/etc/grafana/provisioning
if [ -d "$grafana" ]; then
  for kind in datasources dashboards; do
    target=$grafana/$kind/spx-trainer.yaml
    if [ -e "$target" ]; then say "grafana: $target exists, kept as it is"
    else install -D -m 0644 "$D$share/grafana/grafana-$kind.yaml" "$target"; say "grafana: $target"; fi
  done
fi

# 5. The unit, the directories, the config.

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
  say "done. Start it with: systemctl enable --now spx-trainer; then check the host: spx doctor"
else
  say "done (systemd is not running here, so not reloaded)"
fi
