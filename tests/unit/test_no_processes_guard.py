"""tests/unit starts no process and never sleeps: what needs a real process, user, cgroup or mount is
in tests/processes (or the folder of its subject), and a unit test's time is a fake clock, a scripted
input or a synchronisation (an event, a barrier, the state of the thing waited for).

An AST scan of every file in tests/unit: no import of a module that starts processes (subprocess,
multiprocessing, pty; of tests/harness.py only `wait_for`, a wait on a condition with a deadline, not
its daemons, `spx` runs, mounts or forked users), no call that forks, spawns or execs (os.fork, Popen,
os.spawn*, os.exec*, os.system, launcher.spawn and the relay's start), and no sleep.
"""

from __future__ import annotations

import ast
from pathlib import Path

UNIT = Path(__file__).resolve().parent

# Modules whose import means processes (or a real user, cgroup or mount) in the test.
PROCESS_MODULES = {
    "subprocess", "multiprocessing", "pty", "concurrent.futures.process", "asyncio.subprocess",
    "scratch_cgroup",  # a real cgroup of this machine
    "hostile",         # real users (useradd/userdel)
    "netns_hosts",     # network namespaces
}
HARNESS_ALLOWED = {"wait_for"}  # the rest of tests/harness.py runs daemons, `spx`, mounts and forked users
# Calls that start a process, by name; `os.`-qualified ones count only on `os`.
PROCESS_CALLS = {"Popen", "fork", "forkpty", "spawn", "start_relay", "start_staging", "ProcessPoolExecutor",
                 "create_subprocess_exec", "create_subprocess_shell"}
OS_PROCESS_CALLS = {"system", "popen", "posix_spawn", "posix_spawnp"}
OS_PROCESS_PREFIXES = ("spawn", "exec")


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules (and `module.name`s) an import statement brings in that start processes."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return [n for n in names if n == "harness" or n in PROCESS_MODULES or n.split(".")[0] in PROCESS_MODULES]
    module = node.module or ""
    if module == "harness":
        return [f"harness.{a.name}" for a in node.names if a.name not in HARNESS_ALLOWED]
    return [module] if module in PROCESS_MODULES or module.split(".")[0] in PROCESS_MODULES else []


def problems(tree: ast.AST) -> list[str]:
    """What in `tree` starts a process or sleeps, as "what:line"."""
    found = []
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    time_modules = {a.asname or a.name for n in imports if isinstance(n, ast.Import) for a in n.names if a.name == "time"}
    sleeps = {a.asname or a.name for n in imports if isinstance(n, ast.ImportFrom) and n.module == "time"
              for a in n.names if a.name == "sleep"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found += [f"import {module}:{node.lineno}" for module in _imported(node)]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        if name is None:
            continue
        if (name == "sleep" and owner in time_modules) or (isinstance(f, ast.Name) and name in sleeps):
            found.append(f"sleep:{node.lineno}")
        elif name in PROCESS_CALLS:
            found.append(f"{name}:{node.lineno}")
        elif owner == "os" and (name in OS_PROCESS_CALLS or name.startswith(OS_PROCESS_PREFIXES)):
            found.append(f"os.{name}:{node.lineno}")
    return sorted(found, key=lambda hit: int(hit.rsplit(":", 1)[1]))


def test_no_unit_test_starts_a_process_or_sleeps():
    offenders = {}
    for path in sorted(UNIT.glob("*.py")):
        hits = problems(ast.parse(path.read_text(), str(path)))
        if hits:
            offenders[path.name] = hits
    assert not offenders, (
        "tests/unit starts no process and does not sleep: move a test that needs a real process, user, "
        "cgroup or mount to tests/processes (or its subject's folder), and give one that waits a fake "
        f"clock or a synchronisation (event, barrier, the thing's own state): {offenders}"
    )


def test_the_scan_sees_what_it_is_meant_to_see():
    sample = ast.parse(
        "import subprocess\nimport multiprocessing.pool\nfrom harness import Daemon, wait_for\nfrom time import sleep as nap\n"
        "import os, time as clock, json\nimport harness\nfrom scratch_cgroup import scratch_cgroup\n"
        "subprocess.Popen(['x'])\nos.fork()\nos.execv('/bin/x', [])\nos.spawnl(0, 'x')\nos.system('x')\n"
        "launcher.spawn(plan)\nclock.sleep(1)\nnap(2)\n"
        "json.loads('1')\nos.getpid()\nclock.monotonic()\nstandby.module_of(plan)\nevent.wait(1)\nasyncio.sleep(1)\n"
    )
    assert [p.split(":")[0] for p in problems(sample)] == [
        "import subprocess", "import multiprocessing.pool", "import harness.Daemon", "import harness",
        "import scratch_cgroup", "Popen", "fork", "os.execv", "os.spawnl", "os.system", "spawn", "sleep", "sleep"]
