"""run/gang_link.py: a beat's and an agreement's answers become the machine's observations — the
generation now, a host gone past the host timeout, every host's line kept for `spx status` — and a
failed call an ActionFailed. The shared-dir calls (run/gang.py, as the user: real processes, tested
in tests/unit/test_gang_dir.py and tests/integration/test_multinode*.py) are replaced here by
scripted answers; the lanes are real threads."""

from __future__ import annotations

import threading

import pytest

from spx.daemon.core.config import load_config
from spx.daemon.core.lanes import Lanes
from spx.daemon.core.spec import parse_spec
from spx.daemon.lifecycle.actions import AgreeGeneration, BeatGang
from spx.daemon.lifecycle.observations import ActionFailed, GangSeen, GenerationAgreed
from spx.daemon.lifecycle.record import GangTurn
from spx.daemon.run import gang
from spx.daemon.run.gang_link import GangLink
from spx.daemon.run.user_work import UserWork
from spx.daemon.state.store import Store

WAIT = 10.0


@pytest.fixture
def link(tmp_path, monkeypatch):
    cfg = load_config(None, tmp_path / "root")
    store = Store(tmp_path / "spx.sqlite")
    spec = parse_spec(f"name: wide\nscript: /bin/true\ncheckpoints: {{dir: {tmp_path}/shared/wide}}\n"
                      "nodes: {count: 2, host_timeout_seconds: 60, rdzv_endpoint: '127.0.0.1:29400'}\n")
    job = store.jobs.get(store.jobs.add(spec, 1000, "u", "/spool/wide", 1.0))
    woken = threading.Event()
    lanes = Lanes(4, 2, wake=woken.set)
    monkeypatch.setattr(gang, "me", lambda cfg: gang.Me("host-a", "k", "node0"))
    yield GangLink(cfg, UserWork(lanes), wall=lambda: 1000.0), job, woken
    lanes.close(wait=WAIT)
    store.close()


def answer(link: GangLink, woken: threading.Event) -> list:
    assert woken.wait(WAIT), "the call never came back"
    woken.clear()
    return link.work.results()


def test_a_beat_brings_the_generation_now_and_names_a_host_gone_past_the_timeout(link, monkeypatch):
    gl, job, woken = link
    lines = [{"host": "node0", "time": 999.0}, {"host": "node1", "time": 900.0}]
    monkeypatch.setattr(gang, "beat", lambda cfg, job, d, gen, step: (GangTurn(4, "node1"), lines))
    gl.beat(job, BeatGang(1, 3, 17, since_wall=800.0))
    [(job_id, seen)] = answer(gl, woken)
    assert job_id == job.id and isinstance(seen, GangSeen) and seen.turn == GangTurn(4, "node1")
    assert seen.missing is not None and seen.missing.startswith("host node1 gone: no word from its daemon for 100 s")
    assert gl.hosts[job.id] == lines


def test_a_beat_without_a_generation_and_a_failed_one(link, monkeypatch):
    gl, job, woken = link
    monkeypatch.setattr(gang, "beat", lambda *a: (None, []))
    gl.beat(job, BeatGang(1, 3, None, 990.0))
    assert answer(gl, woken) == [(job.id, GangSeen(None))]

    def refused(*a):
        raise TimeoutError("the shared dir did not answer")

    monkeypatch.setattr(gang, "beat", refused)
    beat = BeatGang(1, 3, None, 990.0)
    gl.beat(job, beat)
    assert answer(gl, woken) == [(job.id, ActionFailed(beat, "the shared dir did not answer"))]


def test_an_agreement_answers_who_began_the_next_generation(link, monkeypatch):
    gl, job, woken = link
    asked = []
    theirs = GangTurn(5, "node1", "exit code 1", True)
    monkeypatch.setattr(gang, "advance", lambda cfg, job, d, gen, bump, step: asked.append((gen, bump, step))
                        or (False, theirs))
    mine = GangTurn(5, reason="exit code 1", counted=True)
    gl.agree(job, AgreeGeneration(2, 4, mine, 30))
    assert answer(gl, woken) == [(job.id, GenerationAgreed(2, False, theirs))]
    assert asked == [(4, mine, 30)]
