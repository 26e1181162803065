"""The `.spx/` lease and end marker (userfs/spx_dir.py), in one process: a free or expired lease is
taken under a new generation, a valid one of another host is kept, its holder renews it under the
same generation and learns when another host took it, the end marker is written only by the holder
(or when nobody holds it). Many daemons racing for one lease: tests/integration/test_lease_race.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from spx.daemon.userfs import spx_dir

UID = "0123456789abcdef0123456789abcdef"


def _ckpt(tmp_path: Path, uid: str = UID) -> Path:
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, exist_ok=True, mode=0o700)
    (ckpt / ".spx" / "job.yaml").write_text(f'# record\nuid: "{uid}"\nformat: 1\n')
    return ckpt


def _lease(host: str, expires_in: float = 60.0) -> dict:
    now = time.time()
    return {"host": host, "job": UID, "expires": now + expires_in, "written": now}


def _claim(ckpt: Path, host: str, expires_in: float = 60.0) -> dict:
    return spx_dir.claim({"dir": str(ckpt), "lease": _lease(host, expires_in), "now": time.time()})


def _on_disk(ckpt: Path) -> dict:
    return json.loads((ckpt / ".spx" / "lease").read_text())


def test_a_valid_lease_of_another_host_is_kept_and_its_holder_renews_it(tmp_path):
    ckpt = _ckpt(tmp_path)
    first = _claim(ckpt, "a")
    assert first == {"held": True, "gen": 1}
    other = _claim(ckpt, "b")
    assert other["held"] is False and other["holder"]["host"] == "a"
    renewed = _lease("a", expires_in=600)
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": renewed}], "now": time.time()})
    assert answer == {"result": "held", "gen": 1}, "renewed under the same generation"
    assert _on_disk(ckpt)["expires"] == renewed["expires"]


def test_every_take_is_a_new_generation_and_an_expired_lease_goes_to_the_next_taker(tmp_path):
    ckpt = _ckpt(tmp_path)
    assert _claim(ckpt, "a", expires_in=-1)["gen"] == 1
    assert _claim(ckpt, "a")["gen"] == 2, "this host's next attempt: a token of its own"
    (ckpt / ".spx" / "lease").write_text(json.dumps({**_lease("a", expires_in=-1), "gen": 2}))
    assert _claim(ckpt, "b") == {"held": True, "gen": 3}
    assert _on_disk(ckpt)["host"] == "b"


def test_garbage_at_the_lease_is_nobodys(tmp_path):
    ckpt = _ckpt(tmp_path)
    (ckpt / ".spx" / "lease").write_bytes(b"\x00not json")
    assert _claim(ckpt, "a") == {"held": True, "gen": 1}
    (ckpt / ".spx" / "lease").write_text('{"host": "x", "job": "j", "expires": Infinity, "gen": 9}')
    assert _claim(ckpt, "b")["held"] is True, "a lease that never expires is not a lease"


def test_a_holder_whose_lease_another_host_took_learns_it_and_writes_nothing(tmp_path):
    ckpt = _ckpt(tmp_path)
    _claim(ckpt, "a", expires_in=-1)  # a's lease lapsed (a partition, a hung volume)
    assert _claim(ckpt, "b")["gen"] == 2
    before = (ckpt / ".spx" / "lease").read_bytes()
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": _lease("a")}], "now": time.time()})
    assert answer["result"] == "other" and answer["holder"]["host"] == "b"
    assert (ckpt / ".spx" / "lease").read_bytes() == before, "a renewal never takes a lease back"


def test_renewal_and_claim_skip_a_directory_whose_record_names_another_job(tmp_path):
    ckpt = _ckpt(tmp_path, uid="f" * 32)
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": _lease("a")}], "now": time.time()})
    assert answer == {"result": "absent"}
    assert _claim(ckpt, "a")["held"] is False
    assert not (ckpt / ".spx" / "lease").exists()
    (none,) = spx_dir.renew({"jobs": [{"dir": str(tmp_path), "lease": _lease("a")}], "now": time.time()})
    assert none == {"result": "absent"}, "no .spx: a job not prepared yet"


def test_the_end_marker_is_written_by_the_holder_only_and_gives_the_lease_up(tmp_path):
    ckpt = _ckpt(tmp_path)
    _claim(ckpt, "b")
    ended = {"job": UID, "state": "succeeded", "reason": "exit code 0", "host": "a", "time": time.time()}
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "a", "state": ended}], "now": time.time()}) == ["other"]
    assert not (ckpt / ".spx" / "state").exists()
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "b", "state": ended}], "now": time.time()}) == ["written"]
    assert json.loads((ckpt / ".spx" / "state").read_text())["state"] == "succeeded"
    assert not (ckpt / ".spx" / "lease").exists()
    assert _claim(ckpt, "c")["held"] is False, "an ended job is never taken again"
    other = "e" * 32  # the next job in this dir
    (ckpt / ".spx" / "job.yaml").write_text(f'uid: "{other}"\n')
    taken = spx_dir.claim({"dir": str(ckpt), "lease": {**_lease("c"), "job": other}, "now": time.time()})
    assert taken == {"held": True, "gen": 2}, "given up, the generation is still counted"


def test_a_job_handed_to_another_host_is_never_ended_for_good_by_the_host_that_lost_it(tmp_path):
    ckpt = _ckpt(tmp_path)
    _claim(ckpt, "b", expires_in=-1)  # b took it over, and its lease lapsed too (b is gone)
    lost = {"job": UID, "state": "cancelled", "reason": "handed over", "host": "a", "time": time.time()}
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "a", "state": lost}], "now": time.time()}) == ["other"]
    assert not (ckpt / ".spx" / "state").exists(), "the job stays adoptable"


def test_a_job_that_ended_on_the_host_it_was_handed_to_is_never_taken_again_by_the_one_that_lost_it(tmp_path):
    ckpt = _ckpt(tmp_path)
    _claim(ckpt, "b")
    done = {"job": UID, "state": "succeeded", "reason": "exit code 0", "host": "b", "label": "node-b", "time": 1.0}
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "b", "state": done}], "now": time.time()}) == ["written"]
    lost = {**done, "state": "cancelled", "host": "a"}
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "a", "state": lost}], "now": time.time()}) == ["other"]
    assert json.loads((ckpt / ".spx" / "state").read_text())["state"] == "succeeded", "b's end stands"
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": _lease("a")}], "now": time.time()})
    assert answer["result"] == "other" and answer["holder"]["label"] == "node-b", "a's attempt is stopped"
    again = _claim(ckpt, "a")
    assert again["held"] is False and again["holder"]["ended"] == "succeeded", "a's relaunch does not run it again"
    assert not (ckpt / ".spx" / "lease").exists()


def test_publish_refuses_while_another_host_holds_the_dir(tmp_path):
    ckpt = _ckpt(tmp_path)
    _claim(ckpt, "b")
    before = (ckpt / ".spx" / "job.yaml").read_text()
    reply = spx_dir.publish({"dir": str(ckpt), "record": 'uid: "' + "e" * 32 + '"\n', "lease": _lease("a"),
                             "now": time.time()})
    assert reply["held"] is False and reply["holder"]["host"] == "b"
    assert (ckpt / ".spx" / "job.yaml").read_text() == before, "nothing written"
