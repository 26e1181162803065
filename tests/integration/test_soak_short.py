"""The short form of bench/bench_soak.py: one real daemon (fake 8-GPU host) for 3 minutes of jobs of
every kind — ok, crash, hang, cancel, one adopted across a SIGKILL and a restart, one across a
reload after a config change (both in the first 15 % of the run, so the last daemon life is long
enough to fit) — one job in flight at a time (two while one is disrupted), sampled every 5 s. About
3.1 minutes of wall time, most of it waiting on the jobs.

Held to the soak's bounds, scaled to 3 minutes where they are rates: nothing left running once the
jobs have ended, every job ended as its kind says with a reason, descriptors and threads flat (the
same max − min as the hour), and the rates held to what 3 minutes can tell, never to a machine's
milliseconds: RSS growth within 60 MiB/hour after a 60 s warm-up (the hour's bound is 5; a young
daemon's first minutes cannot resolve less, and a leak of a job's worth of state per job would show
well past it), the loop's p99 and the scrape's time not doubling within the run (Theil–Sen slope
over the run within 2× their median: a shared CI machine's noise is most of a 3-minute window).

With `metrics_ended_jobs: 8`: /metrics shows the newest 8 of the jobs that ended (256 by default),
so the cap on the scrape's per-job series binds within the first minute here as it does within the
hour's first minutes at 34 jobs a minute; before that cap every job that ended in the last 24 hours
was viewed on every scrape, and the scrape's time and the daemon's RSS grew with the jobs done."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from bench_soak import FD_FLAT, THREADS_FLAT, soak  # noqa: E402

MINUTES = 3
RSS_MIB_PER_HOUR = 60.0
TREND_FACTOR = 2.0


@pytest.mark.slow(seconds=185)
def test_three_minutes_of_every_kind_of_job_leave_the_daemon_flat(tmp_path):
    run, verdict = soak(tmp_path, minutes=MINUTES, sample_seconds=5, warmup=60, concurrency=1, disruptions=2,
                        torchrun_every=0, config={"metrics_ended_jobs": 8}, disrupt_within=0.15)
    f = verdict["figures"]
    assert verdict["unexpected"] == [], verdict
    assert set(verdict["jobs"]) == {"ok", "crash", "hang", "cancel", "adopt", "reload"}, verdict["jobs"]
    assert [e["what"] for e in run.events] == ["adopt", "reload"], run.events
    assert f["leftover_processes"] == 0, run.leftover
    assert run.samples[-1]["zombies"] == 0, run.samples[-1]
    assert f["samples_after_warmup"] >= 15, f
    assert f["fds_range"] <= FD_FLAT and f["threads_range"] <= THREADS_FLAT, f
    assert f["rss_mib_per_hour"] <= RSS_MIB_PER_HOUR, f
    assert f["loop_p99_trend_over_median"] <= TREND_FACTOR, f
    assert f["scrape_trend_over_median"] <= TREND_FACTOR, f
