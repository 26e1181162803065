#!/usr/bin/env bash
# PID 1 of a throw-away container in which a real systemd boots, for tests/systemd/.
#
#   unshare --fork --pid --mount --uts --ipc --net --cgroup --propagation private -- \
#       bash sandbox-init.sh ROOT HOST_MNT_NS KEEP_DIR...
#
# (tests/systemd/sandbox.py runs that.) Booting systemd on the host's own filesystem empties /tmp and
# runs whatever the host has enabled (see /work/shared/systemd-sandbox.md), so systemd never sees the
# host's tree here: ROOT becomes a fresh tmpfs holding the host's /usr read-only, an overlay of the
# host's /etc and /usr/local (writes stay in memory), fresh /var, /opt, /home, /tmp, /run, a minimal /dev, a
# read-only /sys and /proc/sys, and each KEEP_DIR (the checkout, the venv, its base python) bound
# read-only at its own path. Then pivot_root, and systemd becomes PID 1 of that tree. Nothing of it
# is visible to the host, and SIGKILL to this process (PID 1 of the namespace) ends all of it.
set -euo pipefail
root=$1 host_mnt_ns=$2
shift 2

# Refuse to touch a single mount unless this really is a private mount namespace.
[ "$(readlink /proc/self/ns/mnt)" != "$host_mnt_ns" ] || { echo "sandbox-init: not in a new mount namespace" >&2; exit 90; }
[ "$$" = 1 ] || { echo "sandbox-init: not PID 1 of a new pid namespace" >&2; exit 90; }
[ "$(findmnt -no PROPAGATION /)" = private ] || { echo "sandbox-init: / is not private here" >&2; exit 90; }

ro_bind() {  # ro_bind SRC DST: per-mount read-only ("remount,bind" never touches the superblock)
  mount --bind "$1" "$2"
  mount -o remount,bind,ro,nosuid,nodev "$2"
}

mount -t tmpfs -o mode=0755 spx-sandbox "$root"
cd "$root"
mkdir -p usr etc opt srv home root mnt tmp var/{lib,log,spool,cache,tmp} run dev proc sys .rw/{etc,usr-local}/{upper,work}
chmod 1777 tmp var/tmp
ln -s /run var/run
ln -s /run/lock var/lock
for d in bin sbin lib lib64 lib32 libx32; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$d"; elif [ -d "/$d" ]; then mkdir "$d"; ro_bind "/$d" "$d"; fi
done
ro_bind /usr usr
overlay() {  # overlay DIR: the host's DIR, with writes kept in this tmpfs
  mount -t overlay "spx-sandbox-$2" -o "lowerdir=/$1,upperdir=$root/.rw/$2/upper,workdir=$root/.rw/$2/work" "$1"
}
overlay etc etc
overlay usr/local usr-local    # install.sh puts the tmpfiles snippet in /usr/local/lib
: > etc/fstab            # no host mounts, swaps or fsck in here

mount -t tmpfs -o mode=0755,nosuid sandbox-dev dev
for n in null zero full random urandom tty; do touch "dev/$n"; mount --bind "/dev/$n" "dev/$n"; done
touch dev/console; mount --bind /dev/null dev/console
mkdir dev/pts dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts dev/pts
ln -s pts/ptmx dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev shm dev/shm
ln -s /proc/self/fd dev/fd; ln -s /proc/self/fd/0 dev/stdin; ln -s /proc/self/fd/1 dev/stdout; ln -s /proc/self/fd/2 dev/stderr

mount -t proc -o nosuid,nodev,noexec proc proc          # this pid namespace's /proc
ro_bind proc/sys proc/sys                                # sysctls are the host kernel's: read-only
if [ -e proc/sysrq-trigger ]; then ro_bind proc/sysrq-trigger proc/sysrq-trigger; fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs sys        # read-only /sys: systemd skips udev & co.
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 sys/fs/cgroup   # rooted at the sandbox's own cgroup
mount -t tmpfs -o mode=0755,nosuid,nodev sandbox-run run

# Runtime masks: units that would act on the host's kernel or hardware, or are useless here.
mkdir -p run/systemd/system run/lock
for u in systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.timer \
         getty.target console-getty.service systemd-logind.service \
         systemd-modules-load.service modprobe@.service kmod-static-nodes.service systemd-sysctl.service \
         systemd-remount-fs.service systemd-udevd.service systemd-udev-trigger.service systemd-hwdb-update.service \
         systemd-random-seed.service systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
         sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount \
         systemd-pstore.service systemd-timesyncd.service systemd-firstboot.service systemd-machine-id-commit.service \
         timers.target; do
  ln -s /dev/null "run/systemd/system/$u"
done

for keep in "$@"; do
  mkdir -p "$root$keep"
  ro_bind "$keep" "$root$keep"
done
# Keep dirs under /root (a pyenv python) must be reachable by the test's unprivileged job user.
chmod 0755 root

mkdir .host
pivot_root . .host
cd /
umount -l /.host
rmdir /.host
exec env -i container=spx-sandbox PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  /lib/systemd/systemd --system --unit=basic.target --log-target=journal --show-status=no
