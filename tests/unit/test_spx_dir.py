"""The `.spx/` lease and end marker (userfs/spx_dir.py): renewal by its holder only, garbage at the
lease is nobody's, the end marker written only by the holder (or when nobody holds it). Daemons
racing for it, as real processes: tests/processes/test_spx_dir_race.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

from spx.daemon.userfs import spx_dir

UID = "0123456789abcdef0123456789abcdef"


def _ckpt(tmp_path: Path, uid: str = UID) -> Path:
    ckpt = tmp_path / "ckpt"
    (ckpt / ".spx").mkdir(parents=True, exist_ok=True)
    (ckpt / ".spx" / "job.yaml").write_text(f'# record\nuid: "{uid}"\nformat: 1\n')
    return ckpt


def _lease(host: str, expires_in: float = 60.0) -> dict:
    now = time.time()
    return {"host": host, "job": UID, "expires": now + expires_in, "written": now}


def test_a_valid_lease_of_another_host_is_kept_and_its_holder_renews_it(tmp_path):
    ckpt = _ckpt(tmp_path)
    first = spx_dir.claim({"dir": str(ckpt), "lease": _lease("a"), "now": time.time()})
    assert first == {"held": True}
    other = spx_dir.claim({"dir": str(ckpt), "lease": _lease("b"), "now": time.time()})
    assert other["held"] is False and other["holder"]["host"] == "a"
    renewed = _lease("a", expires_in=600)
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": renewed}], "now": time.time()})
    assert answer == {"result": "held"}
    assert json.loads((ckpt / ".spx" / "lease").read_text())["expires"] == renewed["expires"]


def test_garbage_at_the_lease_is_nobodys(tmp_path):
    ckpt = _ckpt(tmp_path)
    (ckpt / ".spx" / "lease").write_bytes(b"\x00not json")
    assert spx_dir.claim({"dir": str(ckpt), "lease": _lease("a"), "now": time.time()}) == {"held": True}


def test_renewal_and_claim_skip_a_directory_whose_record_names_another_job(tmp_path):
    ckpt = _ckpt(tmp_path, uid="f" * 32)
    (answer,) = spx_dir.renew({"jobs": [{"dir": str(ckpt), "lease": _lease("a")}], "now": time.time()})
    assert answer == {"result": "absent"}
    assert spx_dir.claim({"dir": str(ckpt), "lease": _lease("a"), "now": time.time()})["held"] is False
    assert not (ckpt / ".spx" / "lease").exists()
    (none,) = spx_dir.renew({"jobs": [{"dir": str(tmp_path), "lease": _lease("a")}], "now": time.time()})
    assert none == {"result": "absent"}, "no .spx: a job not prepared yet"


def test_the_end_marker_is_written_by_the_holder_only_and_gives_the_lease_up(tmp_path):
    ckpt = _ckpt(tmp_path)
    spx_dir.claim({"dir": str(ckpt), "lease": _lease("b"), "now": time.time()})
    ended = {"job": UID, "state": "succeeded", "reason": "exit code 0", "host": "a", "time": time.time()}
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "a", "state": ended}], "now": time.time()}) == ["other"]
    assert not (ckpt / ".spx" / "state").exists()
    assert spx_dir.mark_ended({"jobs": [{"dir": str(ckpt), "host": "b", "state": ended}], "now": time.time()}) == ["written"]
    assert json.loads((ckpt / ".spx" / "state").read_text())["state"] == "succeeded"
    assert not (ckpt / ".spx" / "lease").exists()


def test_publish_refuses_while_another_host_holds_the_dir(tmp_path):
    ckpt = _ckpt(tmp_path)
    spx_dir.claim({"dir": str(ckpt), "lease": _lease("b"), "now": time.time()})
    before = (ckpt / ".spx" / "job.yaml").read_text()
    reply = spx_dir.publish({"dir": str(ckpt), "record": 'uid: "' + "e" * 32 + '"\n', "lease": _lease("a"),
                             "now": time.time()})
    assert reply["held"] is False and reply["holder"]["host"] == "b"
    assert (ckpt / ".spx" / "job.yaml").read_text() == before, "nothing written"
