"""`notify.command` runs as the job's owner, never as root, the webhook is POSTed by a process of the
owner, and one user's hanging hooks never delay another user's (issue 26). Real users (tests/hostile/users.py), a daemon as root, jobs dropped as
the user; each probe also checks the bait, the loop and the daemon (probe.py)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from hostile.probe import (
    Bait,
    answering,
    drop_as,
    ended_with_reason,
    job_yaml,
    start_daemon,
    user_script,
    wait_file,
)

from harness import wait_for


def _crashing(user, name: str, notify: str) -> str:
    script = user_script(user, f"{name}.py", "raise SystemExit(3)\n")
    return job_yaml(name, script, extra=f"notify: {notify}\n").replace("max_restarts: 3", "max_restarts: 0")


def test_a_hook_command_runs_as_the_owner_with_the_owners_groups_and_cannot_read_roots_files(users, base):
    owner, _victim, group = users
    bait = Bait.plant(base)
    out = Path(owner.pw_dir) / "hook-out"
    hook = (f'{{ id -u; id -g; id -G; echo "$HOME $USER $SPX_JOB $SPX_EVENT"; cat; echo; '
            f'cat {bait.path} 2>&1; }} > {out} 2>&1; true')
    d = start_daemon(base)
    try:
        drop_as(d, owner, "who.yaml", _crashing(owner, "who", json.dumps({"command": hook})))
        ended_with_reason(d, "who", {"failed"})
        wait_file(out)
        d.wait_event("notify_sent", timeout=30, job="who", way="command")
        lines = out.read_text().splitlines()
        assert lines[0] == str(owner.pw_uid) and lines[1] == str(owner.pw_gid), lines
        assert str(group.gr_gid) in lines[2].split(), lines  # the owner's supplementary group too
        assert lines[3] == f"{owner.pw_dir} {owner.pw_name} who failed", lines
        assert json.loads(lines[4])["job"] == "who"  # the event's JSON on stdin
        assert "Permission denied" in lines[5] and bait.content.decode() not in out.read_text()
        assert os.stat(out).st_uid == owner.pw_uid  # made by the owner's process, not root's
        bait.untouched()
        answering(d)
    finally:
        d.stop()


def test_one_users_hanging_hooks_never_delay_another_users_hook(users, base):
    owner, victim, _group = users
    d = start_daemon(base)
    flag = Path(victim.pw_dir) / "told"
    try:
        # More hanging hooks than the owner has lane slots (user_work.slots_per_owner: 4).
        for n in range(6):
            drop_as(d, owner, f"hang{n}.yaml",
                    _crashing(owner, f"hang{n}", json.dumps({"command": "exec sleep 600", "timeout_seconds": 60})))
        wait_for(lambda: all((d.job(f"hang{n}") or {}).get("state") == "failed" for n in range(6)), 60,
                 "the owner's jobs to fail")
        drop_as(d, victim, "told.yaml", _crashing(victim, "told", json.dumps({"command": f"touch {flag}"})))
        ended_with_reason(d, "told", {"failed"})
        wait_file(flag, timeout=20)  # while the owner's hooks hang (60 s each)
        assert not d.events("notify_failed", job="hang0"), json.dumps(d.events("notify_failed", job="hang0"))
        answering(d)
    finally:
        d.stop()


def _socket_uid(port: int) -> int | None:
    """The uid owning the local TCP socket bound to `port` (/proc/net/tcp's uid column)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            return int(fields[7])
    return None


def test_a_webhook_is_posted_by_a_process_of_the_owner(users, base):
    owner, _victim, _group = users
    seen: list[tuple[dict, int | None]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 — http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((body, _socket_uid(self.client_address[1])))  # while the client's socket is open
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    d = start_daemon(base)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/h"
        drop_as(d, owner, "web.yaml", _crashing(owner, "web", json.dumps({"webhook": url})))
        ended_with_reason(d, "web", {"failed"})
        wait_for(lambda: seen, 30, "the webhook")
        body, uid = seen[0]
        assert body["job"] == "web" and body["owner"] == owner.pw_name
        assert uid == owner.pw_uid, f"the POST came from uid {uid}, not the owner's {owner.pw_uid}"
        answering(d)
    finally:
        d.stop()
        server.shutdown()
        server.server_close()
