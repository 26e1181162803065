"""Nothing in the daemon opens, creates, chowns, chmods, renames or deletes a path except through
`spx.daemon.userfs` — or in a module whose paths are the daemon's own (docs/security.md, "What root does
with user paths, and how").

An AST scan of every module under daemon/: a call that touches the file system by path is allowed
only in a module of ALLOWED, each with the reason its paths are not a user's. A new module that
needs one either goes through userfs or earns an entry here, with its reason, in review. And root
never walks a user's tree for the trainer's readers (heartbeat, checkpoint discovery): those are
called only through userfs.
"""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[2] / "daemon"

# Calls that open, create, change or delete something by path (the name of the function or method).
PATH_CALLS = {
    "open", "read_text", "write_text", "read_bytes", "write_bytes", "touch",
    "chown", "lchown", "chmod", "lchmod", "mkdir", "makedirs", "mkfifo", "mknod",
    "rename", "renames", "unlink", "remove", "rmdir", "rmtree", "symlink", "symlink_to", "link", "hardlink_to",
    "copy", "copy2", "copyfile", "copytree", "move", "mkstemp", "mkdtemp", "NamedTemporaryFile",
}
# `replace`, `remove` and `link` count only as `os.…` (`str.replace`, `list.remove`, `dataclasses.replace`
# are not file-system calls).

ALLOWED: dict[str, str] = {
    # the safe module and what runs as the user
    "userfs/fsafe.py": "the safe module itself: dir-fd walks, O_NOFOLLOW|O_NONBLOCK, O_EXCL, fchown/fchmod",
    "userfs/user_actions.py": "runs as the job's owner (identity.become before any path): the kernel checks the user",
    "userfs/spx_dir.py": "runs only inside user_actions, as the job's owner: the .spx/ record, lease and end marker",
    "userfs/cas.py": "runs only inside user_actions, as the job's owner: the compare-and-swap of .spx/lease and "
                     ".spx-gang/generation, by the dir fd, O_NOFOLLOW|O_NONBLOCK, the owner's regular files only",
    "staging/copier.py": "runs as the job's owner (--become before any path is touched)",
    "staging/copy_engine.py": "runs inside the copier, as the job's owner",
    "contract/checkpoint_formats.py": "completeness rules, run as the job's owner (userfs.user_actions), "
                                      "O_NOFOLLOW|O_NONBLOCK, regular files only",
    "contract/checkpoint_layout.py": "readers only (its writer side is spx.trainer.layout_writer, in workers, as "
                                     "the user); the daemon runs them only in user_actions, as the owner",
    "contract/fencing.py": "the fence check, in workers as the job's user (the daemon only shares its names and "
                           "lock rule): by dir fd, O_NOFOLLOW|O_NONBLOCK, read-only, the user's own files only",
    "contract/worker_env.py": "trainer side: the worker writes its heartbeat as the user; the daemon reads via userfs",
    # root's own places, and every user place reached only by dir fd from a verified root-owned dir
    "run/attempt_files.py": "fsafe for every user path; its own renames/mkdir/unlink are by fd in root-owned dirs",
    "intake/spool.py": "claims by the spool's dir fd (O_NOFOLLOW|O_NONBLOCK, fstat); rejected/ through fsafe",
    "intake/accept.py": "state_dir/jobs: root-only (state_dir is 0700)",
    "intake/adopt.py": "state_dir/jobs: root-only (state_dir is 0700); the volume is walked by adopt_scan via fsafe",
    "intake/accepted_copy.py": "state_dir/jobs: root-only (state_dir is 0700): the copy each job row names",
    "run/retention_files.py": "removes a finished job's root-owned dirs by the fd of log_dir (renamed by dir fd "
                              "under attempt_files.LOG_DIRS, only when its .job-id marker names the job), "
                              "state_dir/jobs (root-only) and spool/rejected/ (root's, checked by fstat)",
    "userfs/webhook.py": "no path: urllib's opener.open of an http(s) URL, inside user_actions as the job's owner",
    "run/log_relay.py": "writes attempt-N.log by the fd of root-owned log/NAME (attempt_files.open_log_dir), "
                        "O_NOFOLLOW, regular files only, fchown on the fd",
    "run/attempt_monitor.py": "writes the exit record by the fd of root-owned log/NAME (O_NOFOLLOW, temp + rename "
                              "by dir fd); stdlib-only under -I -S, so it cannot import userfs",
    "run/launcher.py": "reads the monitor's exit record in root-owned log/NAME: O_NOFOLLOW|O_NONBLOCK, 4 KiB cap",
    "run/standby_agent.py": "opens /dev/null only, and runs as the job's user (never root): the job's own launcher",
    "run/standby_worker.py": "runs as the job's user (never root), a worker of the job: opens /dev/null, its own "
                             "/proc/self/maps and the rank's log files torchrun named, as the cold worker would",
    "run/attempt_runtime.py": "mkdir of the attempt's cgroup in the daemon's own cgroupfs subtree",
    "run/enter_attempt.py": "the exec shim: cgroup.procs in the daemon's cgroupfs, as root, before the uid switch",
    "run/cgroups.py": "cgroupfs: the daemon's own delegated subtree",
    "run/device_filter.py": "opens an attempt's cgroup directory (O_RDONLY|O_DIRECTORY) in the daemon's own "
                            "cgroupfs subtree, as bpf(2)'s attach target",
    "run/proctree.py": "/proc",
    "run/worker_watch.py": "/proc (children, environ and stat of an attempt's processes)",
    "run/rank_cpu.py": "/proc (a rank's environ and schedstat)",
    "state/standby_memory.py": "/proc (smaps_rollup and children of the standbys, the daemon's own children)",
    "run/oom.py": "/dev/kmsg",
    "gpu/kernel_log.py": "/dev/kmsg (a test's own file in tests)",
    "gpu/fake_sim.py": "the fake fixture's simulated kernel log: a file the fixture (a test) names",
    "state/store.py": "state_dir (root-only)",
    "state/backup.py": "state_dir/backup (root-only)",
    "state/integrity.py": "state_dir (root-only)",
    "core/config.py": "the config file the admin names",
    "service/daemon.py": "creates the configured top-level dirs (state, log, run, checkpoints root, spool) at start",
    "service/wedge_hook.py": "the test hook's marker in run_dir (root's own dir; only with SPX_TEST_HOOKS=1)",
    "service/handover.py": "the reload and stop markers in run_dir (verified the daemon's own by "
                           "fsafe.open_root_dir, written/read/unlinked by its fd, O_NOFOLLOW); /proc/self",
    "service/control.py": "the control socket: bound and chmod-ed in run_dir, verified the daemon's own and "
                          "writable by no one else (fsafe.open_root_dir), unlink/chmod by that dir's fd",
    "service/dcgm_mapping.py": "dcgm-exporter's job-mapping dir, verified root-owned and writable by no one else "
                                "(fsafe.open_root_dir; the config checked the dirs above it): temp + rename, unlink by "
                                "its fd",
    "doctor/hostprobe.py": "/proc, /sys and /etc, read on the admin's request",
    "doctor/report.py": "/proc/1/comm",
    "doctor/cgroup_checks.py": "/proc/self/mountinfo and /proc/1/comm, read on the admin's request",
    "doctor/gpu_checks.py": "/proc/driver/nvidia/version (the kernel module's), read on the admin's request",
    "doctor/stackdump_checks.py": "/proc/sys/kernel/yama/ptrace_scope, read on the admin's request",
    "doctor/device_checks.py": "the daemon's device-filter record in run_dir, read on the admin's request "
                               "(O_NOFOLLOW|O_NONBLOCK, 4 KiB)",
    "doctor/storage_checks.py": "a probe file in a directory the admin configured (checkpoints root, staging)",
    "gpu/fake.py": "the fake-GPU fixture file the admin names",
    "gpu/fake_procs.py": "/proc",
    "cli/submit.py": "`spx submit` reads the caller's job file and drops it into the spool as the invoking "
                     "user, with that user's own rights (never root's daemon)",
    "cli/logs.py": "`spx logs` reads attempt logs as the invoking user, with that user's own rights "
                   "(never root's daemon)",
    "cli/submit_cmdline.py": "`spx submit -- COMMAND` reads the #! line of the caller's own torchrun/deepspeed, "
                             "as the invoking user (never root's daemon)",
    "cli/job_schema.py": "`spx schema --output FILE` writes where the invoking user asked, with that user's own "
                         "rights (never root's daemon)",
    "cli/report.py": "`spx report NAME -o FILE.svg` writes the picture where the invoking user asked, with that "
                     "user's own rights (the CLI is never the root daemon)",
    "cli/main.py": "/dev/null, put under stdout when the reader of `spx … | head` left",
}

# The trainer-side readers root must not run on a user's tree itself (userfs runs them as the owner).
USER_TREE_READERS = {"find_latest", "latest_complete", "discover", "read_manifest", "complete_checkpoints"}
USER_TREE_READER_MODULES = {"userfs/user_actions.py", "contract/checkpoint_layout.py", "contract/checkpoint_formats.py",
                            "contract/checkpoint_discovery.py", "contract/checkpoint_tiers.py"}
# The writer side of the checkpoint layout (spx.trainer.layout_writer) deletes and renames in the
# user's tree: workers only, never the daemon.
USER_TREE_WRITERS = {"publish", "apply_retention", "remove_stale_tmp", "fsync_tree", "build_manifest"}


def _call_name(node: ast.Call) -> tuple[str | None, str | None]:
    """(function or method name, the name it is qualified by if a plain module name, e.g. `os`)."""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id, None
    if isinstance(f, ast.Attribute):
        owner = f.value.id if isinstance(f.value, ast.Name) else None
        return f.attr, owner
    return None, None


def _path_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name, owner = _call_name(node)
        if name not in PATH_CALLS and name != "replace":
            continue
        if name in ("replace", "remove", "link") and owner != "os":
            continue
        found.append(f"{name}:{node.lineno}")
    return found


def _modules() -> dict[str, ast.AST]:
    return {str(p.relative_to(DAEMON)): ast.parse(p.read_text(), str(p)) for p in sorted(DAEMON.rglob("*.py"))}


def test_only_modules_with_daemon_owned_paths_touch_the_file_system_by_path():
    offenders = {}
    for rel, tree in _modules().items():
        calls = _path_calls(tree)
        if calls and rel not in ALLOWED:
            offenders[rel] = calls
    assert not offenders, (
        "these modules touch paths directly; go through spx.daemon.userfs (fsafe / as_user / attempt_files), "
        f"or, if every path they touch is the daemon's own, add them to ALLOWED with the reason: {offenders}"
    )


def test_the_scan_sees_what_it_is_meant_to_see():
    sample = ast.parse(
        "open(p)\np.open('a')\nos.open(p, 0)\np.read_text()\nos.chown(p, 1, 1)\np.chmod(0)\n"
        "p.mkdir()\nos.replace(a, b)\nshutil.rmtree(p)\ns.replace('a', 'b')\nreplace(obj, x=1)\n"
    )
    assert [c.split(":")[0] for c in _path_calls(sample)] == [
        "open", "open", "open", "read_text", "chown", "chmod", "mkdir", "replace", "rmtree"]


def test_root_never_walks_a_users_checkpoint_tree_itself():
    callers = {}
    for rel, tree in _modules().items():
        if rel in USER_TREE_READER_MODULES:
            continue
        hits = [f"{n}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                for n in [_call_name(node)[0]] if n in USER_TREE_READERS and _call_name(node)[1] != "as_user"]
        if hits:
            callers[rel] = hits
    assert not callers, f"checkpoint discovery must run as the owner (userfs.as_user.find_latest): {callers}"


def test_root_never_writes_or_deletes_in_a_users_checkpoint_tree():
    """The checkpoint layout's writers (spx.trainer.layout_writer) rmtree and rename by path: right for the trainer, which runs as
    the user, and never to be run by the root daemon, not even as the owner."""
    callers = {}
    for rel, tree in _modules().items():
        hits = [f"{n}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                for n in [_call_name(node)[0]] if n in USER_TREE_WRITERS]
        if hits:
            callers[rel] = hits
    assert not callers, f"the daemon must not write checkpoints (that is the trainer's, as the user): {callers}"


def test_the_daemon_reads_heartbeats_only_through_userfs():
    callers = [rel for rel, tree in _modules().items() if rel != "contract/worker_env.py"
               for node in ast.walk(tree) if isinstance(node, ast.Call)
               and _call_name(node) == ("read_heartbeat", "worker_env")]
    assert not callers, f"worker_env.read_heartbeat follows links and blocks on FIFOs; use userfs.heartbeat: {callers}"


def test_every_allowed_module_exists():
    missing = [rel for rel in ALLOWED if not (DAEMON / rel).exists()]
    assert not missing, f"stale ALLOWED entries (remove them): {missing}"
