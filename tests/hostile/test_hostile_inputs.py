"""Hostile probes against what a user sends the root daemon: job file text (YAML tags, numbers that
overflow timers, nesting that recurses the parser), the control socket (a slow client, an oversized or
malformed request, many connections at once) and /metrics (another user's job names). Real users, a
real daemon as root, the real `spx` (see probe.py for what every probe asserts)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from hostile.probe import (
    PYTHON,
    Bait,
    answering,
    drop_as,
    ended_with_reason,
    job_yaml,
    metrics_as,
    real_spx_as,
    remove_world,
    user_script,
    world,
)
from hostile.users import run_as

from harness import Daemon, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs the daemon as root and creates users")

BASE = "name: {name}\nlauncher: python\nscript: /bin/true\n"
# (id, the line after BASE (line 4), what the rejection must say). `{pwned}` is a file root must not create.
ESCAPES = [
    ("python-object", "args: !!python/object/apply:os.system ['touch {pwned}']", "tag !!python/object/apply:os.system"),
    ("python-name", "args: !!python/name:os.system", "tag !!python/name:os.system"),
    ("unknown-tag", "args: !foo bar", "tag !foo is not allowed"),
    ("int-1.5", "priority: !!int 1.5", "'1.5' is not a valid int"),
    ("bool-maybe", "args: [!!bool maybe]", "'maybe' is not a valid bool"),
    ("float-abc", "args: [!!float abc]", "'abc' is not a valid float"),
    ("timestamp", "args: [!!timestamp x]", "tag !!timestamp"),
    ("binary", "args: [!!binary '@@@']", "tag !!binary"),
    ("set", "args: !!set {{a, b}}", "tag !!set"),
    ("omap", "env: !!omap [A: b]", "tag !!omap"),
    ("nested-3000", "args: " + "[" * 3000 + "]" * 3000, "nesting deeper than 16 levels"),
    ("huge-int", "priority: " + "9" * 5000, "number too large"),
    ("key-not-text", "env: {{1: a}}", "mapping keys must be text"),
    ("duplicate-key", "name: other", "name: duplicate key (first given on line 1)"),
    ("hang-inf", "restart: {{hang_timeout_seconds: .inf}}", "restart.hang_timeout_seconds: Input should be a finite number"),
    ("backoff-nan", "restart: {{backoff_seconds: [.nan, .nan]}}", "restart.backoff_seconds.0: Input should be a finite number"),
    ("grace-nan", "stop: {{grace_seconds: .nan}}", "stop.grace_seconds: Input should be a finite number"),
    ("hang-60-days", "restart: {{hang_timeout_seconds: 5184000}}", "restart.hang_timeout_seconds: Input should be less"),
    ("priority-huge", "priority: 9223372036854775807", "priority: Input should be less than or equal to 1000"),
    ("procs-huge", "procs: 1.0e+30", "procs:"),
    ("nul-in-args", 'args: ["a\\0b"]', "must not contain NUL"),
]


@pytest.fixture(scope="module")
def shared(users):
    """One daemon for the many text probes: each must leave it alive for the next."""
    base = world()
    bait = Bait.plant(base)
    d = Daemon(base / "root", gpu_backend="none").start()
    try:
        yield base, bait, d
    finally:
        d.stop()
        remove_world(base)


def _text(name: str, line: str, pwned: Path) -> str:
    return BASE.format(name=name) + line.format(pwned=pwned) + "\n"


def _no_tracebacks(d: Daemon) -> None:
    assert not [e for e in d.lines if "Traceback" in json.dumps(e) and e.get("event") != "control_answer_failed"]


@pytest.mark.parametrize(("case", "line", "expected"), ESCAPES, ids=[c[0] for c in ESCAPES])
def test_yaml_escape_dropped_in_the_spool_is_rejected_with_the_reason(users, shared, case, line, expected):
    owner, victim, _group = users
    base, bait, d = shared
    pwned = base / f"pwned-{case}"
    drop_as(d, owner, f"{case}.yaml", _text(case.replace(".", "-"), line, pwned))
    err = d.spool / "rejected" / f"{case}.yaml.error"
    wait_for(err.exists, 15, f"{err}")
    reason = run_as(owner, ["cat", str(err)]).stdout  # (c): the submitter reads why
    assert f"{case}.yaml:4: " in reason and expected in reason, reason
    assert "Traceback" not in reason and len(reason) < 2000
    assert run_as(victim, ["cat", str(err)]).returncode != 0, "another user read the rejection"
    assert not pwned.exists(), "the YAML ran a command as root"
    bait.untouched()  # (a)
    assert all(j["name"] != case for j in answering(d))  # (b), and nothing was accepted
    assert not [e for ev in ("claim_failed", "reject_failed", "loop_stage_failed") for e in d.events(ev)]
    _no_tracebacks(d)


@pytest.mark.parametrize(("case", "line", "expected"), ESCAPES, ids=[c[0] for c in ESCAPES])
def test_spx_submit_of_a_yaml_escape_prints_a_clear_error(users, shared, case, line, expected):
    owner, _victim, _group = users
    base, bait, d = shared
    pwned = base / f"pwned-submit-{case}"
    job = user_script(owner, f"submit-{case}.yaml", _text(case.replace(".", "-"), line, pwned))
    before = set(os.listdir(d.spool))
    res = real_spx_as(owner, d, "submit", str(job))
    assert res.returncode in (1, 2), (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    assert res.stderr.startswith(f"spx: {job}:4: ") and expected in res.stderr, res.stderr
    assert set(os.listdir(d.spool)) == before, "a file the client refused reached the spool"
    assert not pwned.exists()
    bait.untouched()
    answering(d)


def test_spx_submit_of_binary_garbage_or_an_endless_file_prints_a_clear_error(users, shared):
    owner, _victim, _group = users
    _base, _bait, d = shared
    job = Path(owner.pw_dir) / "garbage.yaml"
    job.write_bytes(b"name: x\n\xff\xfe\x00\x9c garbage")
    os.chown(job, owner.pw_uid, owner.pw_gid)
    res = real_spx_as(owner, d, "submit", str(job))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith(f"spx: {job}: not UTF-8 text"), res.stderr
    endless = real_spx_as(owner, d, "submit", "/dev/zero")  # read up to the cap, never whole
    assert endless.returncode == 2 and endless.stderr == "spx: /dev/zero: file is larger than 64 KiB\n"
    answering(d)


# --- the control socket ---------------------------------------------------------------------------

# Runs as the attacking user: `mode` slow (a byte every `every` s, then the reply), big (70 KiB line),
# deep (64 KiB of '['), or hold (N idle connections, then one more request whose reply is printed).
CLIENT = textwrap.dedent("""
    import json, socket, sys, time
    path, mode, arg = sys.argv[1], sys.argv[2], float(sys.argv[3])
    def conn():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(path)
        return s
    def reply(s):
        data = b""
        while not data.endswith(b"\\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode()
    if mode == "hold":
        held = [conn() for _ in range(int(arg))]
        time.sleep(0.5)
        s = conn()
        try:
            s.sendall(b'{"op": "ls"}\\n')
        except (BrokenPipeError, ConnectionResetError):  # "busy" may be sent and the socket closed before we write
            pass
        print(reply(s), flush=True)
        sys.exit(0)
    s = conn()
    start = time.monotonic()
    try:
        if mode == "slow":
            print("started", flush=True)
            for i, b in enumerate(b'{"op": "ls", "name": null}\\n'):
                s.send(bytes([b]))
                if i == 1:
                    print("two bytes in", flush=True)
                time.sleep(arg)
        elif mode == "big":
            s.sendall(b'{"op": "ls", "name": "' + b"x" * 70000 + b'"}\\n')
        elif mode == "deep":
            s.sendall(b"[" * 65000 + b"\\n")
    except OSError as e:  # cut off while sending
        pass
    print(json.dumps({"reply": reply(s), "seconds": time.monotonic() - start}), flush=True)
""")


def _client(user: pwd.struct_passwd, base: Path, d: Daemon, mode: str, arg: float = 0) -> subprocess.Popen:
    script = base / "client.py"
    script.write_text(CLIENT)
    script.chmod(0o644)
    groups = os.getgrouplist(user.pw_name, user.pw_gid)
    return subprocess.Popen([PYTHON, str(script), str(d.root / "run" / "spx.sock"), mode, str(arg)],
                            user=user.pw_uid, group=user.pw_gid, extra_groups=groups, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 30) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out.strip().splitlines()[-1]


def test_a_slow_loris_client_does_not_block_spx(users, base):
    owner, victim, _group = users
    bait = Bait.plant(base)
    d = Daemon(base / "root", gpu_backend="none").start()
    try:
        loris = _client(owner, base, d, "slow", 2.0)  # one byte every 2 s
        try:
            assert loris.stdout is not None and loris.stdout.readline().strip() == "started"
            # Two bytes in: the old server sat in recv() for this client.
            assert loris.stdout.readline().strip() == "two bytes in"
            for who in (None, victim):
                t0 = time.monotonic()
                res = d.spx("ls", "--json") if who is None else real_spx_as(who, d, "ls", "--json")
                assert res.returncode == 0 and time.monotonic() - t0 < 4.0, "spx ls waited for the slow client"
            cut = json.loads(_finish(loris))
        finally:
            if loris.poll() is None:
                loris.kill()
                loris.wait()
        reply = json.loads(cut["reply"])
        assert reply["ok"] is False and "not received within 5 s" in reply["error"]
        assert cut["seconds"] < 8, "the deadline is for the whole request, not for each byte"
        bait.untouched()
        answering(d)
        _no_tracebacks(d)
    finally:
        d.stop()


@pytest.mark.parametrize(("mode", "expected"), [("big", "request larger than 64 KiB"), ("deep", "malformed request")])
def test_an_oversized_or_malformed_request_gets_an_error_reply(users, base, mode, expected):
    owner, _victim, _group = users
    d = Daemon(base / "root", gpu_backend="none").start()
    try:
        reply = json.loads(json.loads(_finish(_client(owner, base, d, mode)))["reply"])
        assert reply["ok"] is False and expected in reply["error"] and reply["code"] == 2
        answering(d)
        _no_tracebacks(d)
    finally:
        d.stop()


def test_one_user_holding_many_connections_gets_busy_and_others_are_served(users, base):
    owner, victim, _group = users
    d = Daemon(base / "root", gpu_backend="none").start()
    try:
        holder = _client(owner, base, d, "hold", 8)  # the per-uid cap: the ninth gets "busy"
        reply = json.loads(_finish(holder))
        assert reply == {"ok": False, "error": "daemon busy: too many open requests; try again", "code": 1}
        t0 = time.monotonic()
        assert real_spx_as(victim, d, "ls", "--json").returncode == 0 and time.monotonic() - t0 < 4.0  # under the 5 s deadline that would free a held slot
        answering(d)
    finally:
        d.stop()


# --- /metrics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("job_labels", [True, False], ids=["default", "metrics_job_labels-false"])
def test_another_users_job_name_in_metrics_only_where_the_operator_wants_it(users, base, job_labels):
    owner, victim, _group = users
    secret = "owner-secret-project"
    config = None if job_labels else {"metrics_job_labels": False}
    d = Daemon(base / "root", gpu_backend="none", config=config).start()
    try:
        script = user_script(owner, "sleepy.py", "import time\ntime.sleep(120)\n")
        drop_as(d, owner, "secret.yaml", job_yaml(secret, script))
        d.wait_state(secret, "running", 60)
        text = metrics_as(victim, d)
        assert (secret in text) is job_labels
        assert ('spx_job="' in text) is job_labels
        assert ('owner="' in text) is job_labels
        assert "spx_build_info" in text
        answering(d)
        d.spx("cancel", secret)
        ended_with_reason(d, secret, {"cancelled"})
    finally:
        d.stop()
