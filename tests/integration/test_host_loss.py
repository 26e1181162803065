"""Host loss (spot reclaim): daemon A runs a real spx.trainer DDP job with its checkpoints on a shared
directory, and is lost with it (kill -9 of the daemon and every process of the job, its root
deleted). Daemons B and C (other roots, same directory) are asked to `spx adopt` it at once: it runs
once, on one of them, resumes from A's last complete checkpoint and ends with the final model hash
of an uninterrupted run. A finished job is never adopted again."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import EXAMPLES, Daemon, job_pids, wait_for
from spx.daemon.contract import checkpoint_layout
from spx.daemon.run import proctree
from spx.daemon.state.store import Store

PY = sys.executable
LEASE_SECONDS = 6
NAME = "reclaimed"


def job_text(name: str, ckpt: Path, steps: int = 40, sleep: float = 0.15, grace: int = 30) -> str:
    argv = ", ".join(f'"{a}"' for a in ("--batch_size", "4", "--model-size", "tiny", "--seed", "11", "--steps", str(steps),
                                        "--checkpoint-every", "10", "--sleep-per-step", str(sleep)))
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\ngpus: 0\nprocs: 2\nrestart: {{max_restarts: 3, backoff_seconds: [1, 10]}}\n"
            f"stop: {{grace_seconds: {grace}}}\ncheckpoints: {{dir: {ckpt}}}\n")


def adopt(d: Daemon, volume: Path) -> list[dict]:
    res = d.spx("adopt", str(volume), "--json", check=False)
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def results_for(results: list[dict], name: str) -> list[str]:
    return [r["result"] for r in results if r.get("name") == name]


def kill_attempts(d: Daemon, name: str) -> None:
    """SIGKILL every process of every attempt of `name` the (dead) daemon `d` started: its monitor,
    launcher and workers, found by their attempt tag, as a host going away would end them."""
    store = Store(d.root / "state" / "spx.sqlite", readonly=True)
    try:
        job = store.jobs.by_name(name)
        assert job is not None
        attempts = store.attempts.for_job(job.id)
    finally:
        store.close()
    for att in attempts:
        proctree.signal_attempt(att.attempt_id, att.pgid, signal.SIGKILL)
    wait_for(lambda: not any(proctree.attempt_pids(att.attempt_id) for att in attempts), 30,
             f"every process of {name} on the lost host to be gone")
    kill_job(name)


def kill_job(name: str) -> None:
    for pid in job_pids(name):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not job_pids(name), 30, f"every process of {name} to be gone")


@pytest.mark.slow
def test_a_job_of_a_lost_host_is_adopted_once_and_finishes_with_the_uninterrupted_hash(tmp_path):
    volume = tmp_path / "volume"  # the persistent checkpoint volume every host mounts
    volume.mkdir()
    config = {"adopt_lease_seconds": LEASE_SECONDS}
    a = Daemon(tmp_path / "A", config=config).start()
    b = c = None
    try:
        a.drop("j.yaml", job_text(NAME, volume / NAME))
        wait_for(lambda: ((a.job(NAME) or {}).get("last_checkpoint_step") or 0) >= 10
                 and (a.job(NAME) or {}).get("step", 0) >= 14, 240, "a checkpoint at step 10 on host A")
        spx_dir = volume / NAME / ".spx"
        assert (spx_dir / "job.yaml").stat().st_mode & 0o077 == 0, "the record is the owner's alone"
        lease = json.loads((spx_dir / "lease").read_text())
        assert lease["host"].endswith(str(tmp_path / "A" / "state"))
        b = Daemon(tmp_path / "B", config=config).start()  # the replacement hosts, already up
        c = Daemon(tmp_path / "C", config=config).start()

        # The host is reclaimed: the daemon and the job die at once, its local disk goes with them.
        a.kill9()
        kill_attempts(a, NAME)
        shutil.rmtree(a.root)
        last = checkpoint_layout.find_latest(volume / NAME)
        assert last is not None and last.step is not None and last.step >= 10

        # A's lease has not expired yet: for all B knows, A is alive behind a partition.
        lease = json.loads((spx_dir / "lease").read_text())
        assert time.time() < lease["expires"], "renewed every third of its length while A lived"
        assert results_for(adopt(b, volume), NAME) == ["held"]
        assert b.job(NAME) is None
        time.sleep(max(0.0, lease["expires"] - time.time()) + 0.5)

        # B and C adopt at the same moment: one of them takes it.
        answers: dict[str, list[dict]] = {}
        threads = [threading.Thread(target=lambda d=d, k=k: answers.__setitem__(k, adopt(d, volume)))
                   for k, d in (("B", b), ("C", c))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        got = {k: results_for(v, NAME) for k, v in answers.items()}
        winners = [k for k, v in got.items() if v == ["queued"]]
        assert len(winners) == 1 and sorted(got.values()) == [["held"], ["queued"]], got
        winner, loser = (b, c) if winners == ["B"] else (c, b)
        # Asked again, on both: nothing more is queued anywhere.
        assert results_for(adopt(winner, volume), NAME) == ["known"]
        assert results_for(adopt(loser, volume), NAME) == ["held"]

        winner.wait_state(NAME, {"succeeded", "failed"}, 400)
        st = winner.status(NAME)
        assert st["state"] == "succeeded", st
        assert len(st["history"]) == 1, "one attempt on the new host"
        assert st["history"][0]["resumed_from_step"] == last.step, "resumed from A's last complete checkpoint"
        assert loser.job(NAME) is None, "the other daemon never ran it"
        adopted_hash = winner.final_hash(NAME, 1)

        # Finished: its end is recorded on the volume, and no host adopts it again.
        wait_for(lambda: (spx_dir / "state").exists(), 30, "the end marker")
        assert json.loads((spx_dir / "state").read_text())["state"] == "succeeded"
        assert results_for(adopt(loser, volume), NAME) == ["ended"]
        assert not (spx_dir / "lease").exists(), "the lease was given up at the end"

        # The same job, uninterrupted, on the daemon that did not run it.
        loser.drop("base.yaml", job_text("baseline", tmp_path / "baseline-ckpt"))
        loser.wait_state("baseline", {"succeeded", "failed"}, 400)
        assert loser.status("baseline")["state"] == "succeeded"
        assert adopted_hash == loser.final_hash("baseline", 1), "the adopted job trained exactly as an uninterrupted one"
    finally:
        for d in (c, b, a):
            if d is not None and d.alive():
                d.stop()
        kill_job(NAME)


def test_adopt_checkpoint_roots_takes_a_lost_hosts_job_over_once_its_lease_expired(tmp_path):
    """No one runs `spx adopt`: daemon B, configured with the volume as an adopt root, queues the job
    once A's lease has expired, and it runs to its end there (its script ran twice: killed with A,
    then once on B)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    runs = tmp_path / "runs"
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\n"
                      f"open({str(runs)!r}, 'a').write(os.environ['SPX_ATTEMPT'] + '\\n')\n"
                      f"sys.exit(0) if len(open({str(runs)!r}).read().split()) > 1 else time.sleep(600)\n")
    a = Daemon(tmp_path / "A", config={"adopt_lease_seconds": 3}).start()
    b = None
    try:
        a.drop("j.yaml", f"name: roots\nlauncher: python\nscript: {script}\npython: {PY}\n"
                         f"checkpoints: {{dir: {volume / 'roots'}}}\n")
        wait_for(lambda: runs.exists() and (volume / "roots" / ".spx" / "lease").exists(), 30, "the job on A")
        a.kill9()
        kill_attempts(a, "roots")
        shutil.rmtree(a.root)
        b = Daemon(tmp_path / "B", config={"adopt_lease_seconds": 3, "adopt_checkpoint_roots": [str(volume)]},
                   log_level="debug").start()  # debug: its scans of the root (adopt_scanned)
        adopted = b.wait_event("job_adopted", timeout=30, job="roots")
        assert adopted["by"] == "adopt_checkpoint_roots"
        b.wait_state("roots", {"succeeded", "failed"}, 60)
        assert b.status("roots")["state"] == "succeeded"
        assert runs.read_text().split() == ["1", "1"], "once on A (killed), once on B"
        wait_for(lambda: (volume / "roots" / ".spx" / "state").exists(), 30, "the end marker")
        # Two more scans: a whole rescan of the root after the job ended. The ended job is not queued again.
        b.wait_more("adopt_scanned", 2, timeout=30, root=str(volume))
        assert len(b.events("job_adopted", job="roots")) == 1
        assert [j["name"] for j in b.ls()] == ["roots"]
    finally:
        for d in (b, a):
            if d is not None and d.alive():
                d.stop()


def tokens_by_step(ckpt: Path) -> dict[int, str]:
    """The writer's token (spx.trainer's per-attempt id, in the manifest) of every complete checkpoint."""
    return {ref.step or 0: json.loads((ref.path / checkpoint_layout.MANIFEST).read_text())["extra"]["token"]
            for ref in checkpoint_layout.complete_checkpoints(ckpt)}


@pytest.mark.slow
def test_a_fenced_host_publishes_no_checkpoint_after_another_host_took_its_lease(tmp_path):
    """Host A is cut off (its daemon stopped: it cannot renew) while its job's workers train on. Host
    B adopts the job once A's lease expired and runs it from the latest complete checkpoint. A's
    workers, still saving every 10 steps, publish nothing from then on (the fence: they exit 77);
    when A's daemon comes back it finds its lease taken, and the job ends there cancelled, handed
    over to B, without touching B's end marker. B's job succeeds."""
    volume = tmp_path / "volume"
    volume.mkdir()
    ckpt = volume / "fenced"
    config = {"adopt_lease_seconds": LEASE_SECONDS}
    text = job_text("fenced", ckpt, steps=200, sleep=0.1, grace=5)
    a = Daemon(tmp_path / "A", config=config).start()
    b = Daemon(tmp_path / "B", config=config).start()
    stopped = False
    try:
        a.drop("j.yaml", text)
        wait_for(lambda: ((a.job("fenced") or {}).get("last_checkpoint_step") or 0) >= 10, 240, "a checkpoint on A")
        a_token = tokens_by_step(ckpt)[10]
        os.kill(a.proc.pid, signal.SIGSTOP)  # a partition: A's daemon renews nothing, its workers train on
        stopped = True
        lease = json.loads((ckpt / ".spx" / "lease").read_text())
        time.sleep(max(0.0, lease["expires"] - time.time()) + 0.5)
        assert results_for(adopt(b, volume), "fenced") == ["queued"]
        taken_at_step = checkpoint_layout.latest_complete(ckpt).step
        new_lease = json.loads((ckpt / ".spx" / "lease").read_text())
        assert new_lease["gen"] > lease["gen"] and new_lease["host"] != lease["host"]

        # A's workers reach their next save, find the lease taken, publish nothing and exit 77.
        log_a = a.root / "log" / "fenced" / "attempt-1.log"
        wait_for(lambda: "fenced:" in log_a.read_text(errors="replace"), 60, "A's worker to find itself fenced")
        assert "launched with lease generation" in log_a.read_text(errors="replace")
        b.wait_state("fenced", {"succeeded", "failed"}, 400)
        assert b.status("fenced")["state"] == "succeeded"
        late = {step for step, token in tokens_by_step(ckpt).items() if token == a_token and step > taken_at_step}
        assert not late, f"A published steps {late} after B took the lease at step {taken_at_step}"
        wait_for(lambda: (ckpt / ".spx" / "state").exists(), 30, "B's end marker")

        os.kill(a.proc.pid, signal.SIGCONT)  # A comes back
        stopped = False
        ended = a.wait_state("fenced", {"cancelled", "failed", "succeeded"}, 120)
        assert ended["state"] == "cancelled" and "handed over to host" in ended["reason"], ended
        assert a.wait_event("job_lease_lost", job="fenced", timeout=30)["holder"].endswith(str(tmp_path / "B" / "state"))
        a.wait_event("job_end_left_to_holder", job="fenced", timeout=30)  # A's end marker: B's to write
        assert json.loads((ckpt / ".spx" / "state").read_text())["state"] == "succeeded"
        assert results_for(adopt(a, volume), "fenced") in (["known"], ["ended"])
    finally:
        if stopped:
            os.kill(a.proc.pid, signal.SIGCONT)
        for d in (b, a):
            if d.alive():
                d.stop()
        kill_job("fenced")
