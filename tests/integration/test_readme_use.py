"""The README's "Use" section, as a new user meets it: each command as written, from the checkout."""

from __future__ import annotations

from harness import Daemon


def test_fake_backend_says_once_that_its_faults_are_the_fixtures(tmp_path):
    d = Daemon(tmp_path / "spx-root", gpu_backend="fake").start()
    try:
        d.wait_event("gpu_xid", timeout=10)
    finally:
        d.stop()
    [said] = d.events("gpu_fake_fixture_faults")
    assert said["faults"] == ["GPU 3: NVLink link 7 down", "GPU 3: XID 79 at 0 s, then every 300 s"]
    assert all(e["level"] == "info" and e["simulated"] for e in d.events("gpu_xid"))
    assert not [e for e in d.lines if e.get("level") in ("warning", "error") and "gpu" in e.get("event", "")]
