"""Replay verification without processes: which chain of checkpoint records a replay trains
(replay_chain.replay_chain), how it compares, and the contract's `replay` verdict in the heartbeat
(bounded: an odd verdict costs only that field, never the beat) and SPX_REPLAY."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spx.daemon.contract import replay_verdict, worker_env
from spx.daemon.contract.checkpoint_layout import MANIFEST, step_dirname
from spx.daemon.contract.worker_env import (
    ENV_NAMES,
    ENV_REPLAY,
    Heartbeat,
    ReplayVerdict,
    load_heartbeat,
    parse_replay,
)
from spx.trainer.replay import skipped_by_records
from spx.trainer.replay_chain import RECORD, first_difference, read_record, replay_chain


def checkpoint(root: Path, step: int, from_step: int | None = -1, steps: list | None = None) -> Path:
    """A complete checkpoint of `step` whose record's interval begins at `from_step` (-1: no record)."""
    d = root / step_dirname(step)
    d.mkdir(parents=True)
    (d / MANIFEST).write_text(json.dumps({"version": 1, "step": step, "epoch": 0, "world_size": 2, "format": "spx-ddp",
                                          "files": []}))
    if from_step != -1:
        if steps is None:
            steps = [[s, 1.0 / s, 0.5, [0.25, 0.75]] for s in range((from_step or 0) + 1, step + 1)]
        (d / RECORD).write_text(json.dumps({"version": 1, "from_step": from_step, "step": step, "world_size": 2,
                                            "steps": steps, "state_sha256": f"hash-{step}"}))
    return d


def spans(chain) -> list[tuple[int | None, int]]:
    return [(link.record.from_step, link.record.step) for link in chain.links]


def test_the_oldest_chain_follows_from_step_back_to_scratch(tmp_path):
    for step, start in ((10, None), (20, 10), (30, 20), (40, 30)):
        checkpoint(tmp_path, step, start)
    chain = replay_chain(tmp_path, None)
    assert chain.start is None and chain.start_step is None and chain.reason is None
    assert spans(chain) == [(None, 10), (10, 20), (20, 30), (30, 40)] and chain.end_step == 40


def test_a_step_in_the_middle_stops_at_the_first_interval_that_reaches_back_to_it(tmp_path):
    for step, start in ((10, None), (20, 10), (30, 20), (40, 30)):
        checkpoint(tmp_path, step, start)
    chain = replay_chain(tmp_path, 25)
    assert chain.start == tmp_path / step_dirname(20) and chain.start_step == 20
    assert spans(chain) == [(20, 30), (30, 40)]
    assert spans(replay_chain(tmp_path, 30)) == [(30, 40)]


def test_a_missing_link_starts_the_chain_after_it_and_a_checkpoint_without_a_record_is_a_start(tmp_path):
    checkpoint(tmp_path, 30, 20)  # 20 is gone (retention): interval 20-30 cannot be replayed
    checkpoint(tmp_path, 40, 30)
    chain = replay_chain(tmp_path, None)
    assert chain.start == tmp_path / step_dirname(30) and spans(chain) == [(30, 40)]
    checkpoint(tmp_path, 20)  # an older trainer's checkpoint: no record, but one can resume from it
    chain = replay_chain(tmp_path, None)
    assert chain.start == tmp_path / step_dirname(20) and spans(chain) == [(20, 30), (30, 40)]


def test_nothing_to_replay_says_why(tmp_path):
    assert "has a replay record" in replay_chain(tmp_path, None).reason
    checkpoint(tmp_path, 10)
    assert not replay_chain(tmp_path, None).links
    checkpoint(tmp_path, 40, 30)  # its start, 30, is gone
    chain = replay_chain(tmp_path, None)
    assert not chain.links and "checkpoint 30" in chain.reason and "no longer on disk" in chain.reason


def test_the_newest_checkpoint_with_a_record_ends_the_chain_and_odd_records_do_not_count(tmp_path):
    checkpoint(tmp_path, 10, None)
    checkpoint(tmp_path, 20)  # a JIT checkpoint: no record
    assert replay_chain(tmp_path, None).end_step == 10
    bad = checkpoint(tmp_path, 30, 10)
    (bad / RECORD).write_text('{"version": 1, "from_step": 10, "step": 31, "world_size": 2, "steps": [], '
                              '"state_sha256": "x"}')  # not this checkpoint's step
    assert read_record(bad) is None and replay_chain(tmp_path, None).end_step == 10
    outside = checkpoint(tmp_path, 50, 40, steps=[[39, 1.0, 1.0, None]])
    assert read_record(outside) is None


def test_steps_a_record_lacks_are_skipped_again(tmp_path):
    checkpoint(tmp_path, 30, None)
    checkpoint(tmp_path, 40, 30, steps=[[s, 1.0, 1.0, None] for s in (31, 32, 38, 39, 40)])  # a rollback skipped 33-37
    assert skipped_by_records(replay_chain(tmp_path, None)) == ((33, 37),)


def test_the_first_difference_is_found_step_by_step_rank_before_the_global_norm(tmp_path):
    record = read_record(checkpoint(tmp_path, 20, 10))
    same = [list(s) for s in record.steps]
    assert first_difference(record, same, "hash-20") is None
    assert first_difference(record, same, "other").metric == "state_sha256"
    wrong = [list(s) for s in record.steps]
    wrong[4] = [15, wrong[4][1], 0.51, [0.25, 0.7500001]]
    diff = first_difference(record, wrong, "hash-20")
    assert (diff.step, diff.metric, diff.rank, diff.expected, diff.got) == (15, "rank_grad_norm", 1, 0.75, 0.7500001)
    wrong[2][1] = math.nan  # an earlier step's loss
    diff = first_difference(record, wrong, "hash-20")
    assert (diff.step, diff.metric, diff.got) == (13, "loss", "NaN")
    diff = first_difference(record, same[:-1], "hash-20")
    assert diff.metric == "steps" and diff.step == 20


def test_the_verdicts_bounds_are_the_heartbeats():
    assert replay_verdict.MAX_RANKS == worker_env.MAX_RANKS_REPORTED
    assert replay_verdict.MAX_REPLAY_INTERVALS == worker_env.MAX_CHECKPOINT_KEEP


def test_spx_replay_is_a_step_or_oldest():
    assert ENV_REPLAY in ENV_NAMES
    assert parse_replay("") is None and parse_replay(" oldest ") is None and parse_replay("25") == 25
    for bad in ("-1", "x", "1e3", "9" * 30):
        with pytest.raises(ValueError, match="SPX_REPLAY"):
            parse_replay(bad)


def test_the_verdict_round_trips_through_the_heartbeat():
    verdict = ReplayVerdict(None, 40, False, ((0, 10), (10, 20)), 25, "rank_grad_norm", 1, 0.621913731098175, math.inf)
    back = load_heartbeat(Heartbeat(step=30, status="replayed", replay=verdict).to_json())
    assert back.status == "replayed" and back.replay == verdict
    assert back.replay.describe() == ("differs at step 25: rank 1's gradient norm Infinity, recorded 0.621913731098175; "
                                      "checkpoints 10–20 verified before it")
    hashes = ReplayVerdict(20, 40, False, ((20, 30),), 40, "state_sha256", None, "a" * 64, "b" * 64)
    assert load_heartbeat(Heartbeat(step=40, replay=hashes).to_json()).replay == hashes
    nothing = ReplayVerdict(None, None, None, reason="no complete checkpoint has a replay record")
    assert load_heartbeat(Heartbeat(step=0, replay=nothing).to_json()).replay == nothing


@pytest.mark.parametrize("odd", [
    '"verified"',
    '{"verified": "yes"}',
    '{"verified": true, "intervals": [[10, 5]]}',
    '{"verified": true, "intervals": [[1, 2, 3]]}',
    '{"verified": true, "intervals": ' + json.dumps([[i, i + 1] for i in range(1001)]) + '}',
    '{"verified": false, "metric": "temperature"}',
    '{"verified": false, "rank": -1}',
    '{"verified": false, "step": 1e400}',
    '{"verified": null, "reason": "' + "x" * 401 + '"}',
])
def test_an_odd_verdict_costs_only_the_field_never_the_beat(odd):
    beat = load_heartbeat('{"step": 12, "status": "replayed", "replay": ' + odd + '}')
    assert beat.step == 12 and beat.status == "replayed" and beat.replay is None


def test_an_odd_compared_value_is_dropped_to_none_not_the_verdict():
    beat = load_heartbeat('{"step": 12, "replay": {"verified": false, "expected": [1], "got": 1e300}}')
    assert beat.replay is not None and beat.replay.expected is None and beat.replay.got is None
