"""Retention removes a finished job's log dir, whose per-rank dir is the owner's: links the owner
left there are removed, never followed (issue 26). A real user, a daemon as root with
`finished_jobs_days: 0.0001` (8.64 s), the root-only bait checked after (probe.py)."""

from __future__ import annotations

from hostile.probe import Bait, answering, drop_as, ended_with_reason, job_yaml, user_script

from harness import Daemon


def test_links_in_the_owners_rank_log_dir_are_removed_not_followed(users, base):
    owner, _victim, _group = users
    bait = Bait.plant(base)
    d = Daemon(base / "root", gpu_backend="none",
               config={"retention": {"finished_jobs_days": 0.0001, "check_every_seconds": 1}}).start()
    try:
        ranks = d.root / "log" / "links" / "attempt-1.ranks"
        script = user_script(owner, "links.py", f"""
            import os
            ranks = {str(ranks)!r}
            os.symlink({str(bait.path.parent)!r}, os.path.join(ranks, "vault"))
            os.symlink({str(bait.path)!r}, os.path.join(ranks, "secret"))
            os.makedirs(os.path.join(ranks, "deep", "er"))
            os.symlink({str(bait.path.parent)!r}, os.path.join(ranks, "deep", "er", "vault"))
            raise SystemExit(3)
        """)
        drop_as(d, owner, "links.yaml", job_yaml("links", script).replace("max_restarts: 3", "max_restarts: 0"))
        ended_with_reason(d, "links", {"failed"})
        assert (ranks / "deep" / "er" / "vault").is_symlink(), "the job did not plant its links"
        d.wait_event("retention_removed", timeout=60, job="links")
        assert not (d.root / "log" / "links").exists()
        bait.untouched()
        answering(d)
    finally:
        d.stop()
