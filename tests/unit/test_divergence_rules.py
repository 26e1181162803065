"""The divergence rules of spx.trainer (trainer/divergence.py) on scripted loss series, and the
contract's part of a rollback: SPX_SKIP_STEPS and the heartbeat's loss, grad_norm and `diverged`."""

from __future__ import annotations

import math

import pytest

from spx.daemon.contract.worker_env import (
    NON_FINITE,
    Divergence,
    Heartbeat,
    format_skip_steps,
    load_heartbeat,
    parse_skip_steps,
)
from spx.trainer.config import TrainerConfig
from spx.trainer.divergence import DivergenceCheck, SpikeRule, skipped


def first_hit(check: DivergenceCheck, losses: list[float], grad_norms: list[float | None] | None = None):
    for step, loss in enumerate(losses, start=1):
        norm = grad_norms[step - 1] if grad_norms else None
        hit = check.check(step, {"loss": loss, "grad_norm": norm})
        if hit is not None:
            return hit
    return None


def decaying(n: int, start: float = 4.0) -> list[float]:
    """A healthy loss curve: decays, with a small deterministic wobble."""
    return [start * 0.98**i + 0.02 * ((i * 7) % 5 - 2) for i in range(n)]


def test_nan_and_inf_are_caught_by_default_and_spikes_are_not():
    check = DivergenceCheck()
    assert TrainerConfig().check_non_finite and TrainerConfig().spike_rule is None
    series = decaying(36) + [400.0] + decaying(10)  # a spike: not judged without a spike rule
    assert first_hit(check, series) is None
    hit = first_hit(DivergenceCheck(), [*decaying(36), math.nan])
    assert hit == Divergence(37, "loss", hit.value, NON_FINITE) and math.isnan(hit.value)
    assert hit.describe() == "loss NaN"
    inf = first_hit(DivergenceCheck(), decaying(5), [1.0, 1.1, math.inf, 1.0, 1.0])
    assert (inf.step, inf.metric, inf.value, inf.describe()) == (3, "grad_norm", math.inf, "grad_norm Infinity")


def test_the_non_finite_rule_can_be_turned_off():
    assert not DivergenceCheck(non_finite=False).enabled
    assert first_hit(DivergenceCheck(non_finite=False), [1.0, math.nan, -math.inf]) is None


def test_a_spike_over_median_plus_k_mad_of_the_window_is_caught_at_its_step():
    rule = SpikeRule(k=10.0, window=20, min_history=10)
    series = decaying(40) + [9.0] + decaying(5)
    hit = first_hit(DivergenceCheck(spike=rule), series)
    assert hit is not None and (hit.step, hit.metric, hit.value) == (41, "loss", 9.0)
    assert hit.rule.startswith("spike: above median ") and "10 x MAD" in hit.rule and "last 20 steps" in hit.rule
    assert hit.describe().startswith("loss 9 (spike: ")


def test_no_spike_before_min_history_and_none_on_a_healthy_noisy_curve():
    rule = SpikeRule(k=10.0, window=20, min_history=10)
    assert first_hit(DivergenceCheck(spike=rule), [1.0] * 5 + [50.0]) is None  # 5 seen < min_history
    assert first_hit(DivergenceCheck(spike=rule), decaying(300)) is None


def test_a_flat_loss_does_not_make_every_wobble_a_spike():
    """MAD of a loss flat to the last digit is 0; the floor (min_spread × |median|) keeps a 5 % wobble quiet."""
    rule = SpikeRule(k=10.0, window=20, min_history=10, min_spread=0.01)
    assert first_hit(DivergenceCheck(spike=rule), [2.0] * 30 + [2.1]) is None
    assert first_hit(DivergenceCheck(spike=rule), [2.0] * 30 + [2.3]).step == 31  # 2.3 > 2.0 + 10 × 0.02


def test_a_spike_does_not_join_the_window_it_is_judged_against():
    """A check that keeps running after a hit (the caller decides) still judges by the healthy values."""
    check = DivergenceCheck(spike=SpikeRule(k=5.0, window=10, min_history=5))
    for step in range(1, 11):
        assert check.check(step, {"loss": 1.0 + 0.01 * (step % 3)}) is None
    assert check.check(11, {"loss": 30.0}) is not None
    assert check.check(12, {"loss": 30.0}) is not None


@pytest.mark.parametrize("bad", [SpikeRule(k=0), SpikeRule(window=1, min_history=1), SpikeRule(window=10, min_history=11),
                                 SpikeRule(min_spread=-1)])
def test_a_spike_rule_that_cannot_work_is_refused(bad):
    with pytest.raises(ValueError):
        DivergenceCheck(spike=bad)


def test_skip_steps_are_ranges_of_steps_merged_and_bounded():
    assert parse_skip_steps("") == ()
    assert parse_skip_steps("31-37") == ((31, 37),)
    assert parse_skip_steps("45, 31-37,38-40, 44") == ((31, 40), (44, 45))
    assert format_skip_steps(parse_skip_steps("31-37,52")) == "31-37,52-52"
    for bad in ("0-3", "5-3", "a-b", "1-" + "9" * 30, ",".join(["1"] * 65), "-5"):
        with pytest.raises(ValueError, match="SPX_SKIP_STEPS"):
            parse_skip_steps(bad)
    ranges = parse_skip_steps("31-37")
    assert [s for s in range(29, 40) if skipped(ranges, s)] == list(range(31, 38))


def test_the_heartbeat_carries_non_finite_losses_as_json_can():
    beat = Heartbeat(step=37, status="diverged", loss=math.nan, grad_norm=math.inf,
                     diverged=Divergence(37, "loss", math.nan, NON_FINITE))
    text = beat.to_json()
    assert "NaN" not in text.replace('"NaN"', "") and '"Infinity"' in text  # no bare NaN: standard JSON
    back = load_heartbeat(text)
    assert math.isnan(back.loss) and back.grad_norm == math.inf and back.status == "diverged"
    assert back.diverged.step == 37 and back.diverged.describe() == "loss NaN"


@pytest.mark.parametrize(("raw", "loss"), [
    ('{"step": 3, "loss": 2.5}', 2.5),
    ('{"step": 3, "loss": NaN}', "nan"),          # Python's json.dumps of a float NaN
    ('{"step": 3, "loss": 1e400}', math.inf),     # overflowed: infinite
    ('{"step": 3, "loss": -Infinity}', -math.inf),
    ('{"step": 3, "loss": "lots"}', None),        # an odd metric is dropped, never the beat
    ('{"step": 3, "loss": [1]}', None),
    ('{"step": 3, "loss": 1e300}', None),         # finite but beyond what the daemon computes with
])
def test_a_reported_loss_is_a_bounded_number_nan_inf_or_dropped(raw, loss):
    got = load_heartbeat(raw).loss
    assert (math.isnan(got) if loss == "nan" else got == loss), got


def test_an_odd_divergence_record_is_dropped_not_the_beat():
    beat = load_heartbeat('{"step": 9, "status": "diverged", "diverged": {"metric": "' + "x" * 40 + '", "rule": "r"}}')
    assert beat.step == 9 and beat.diverged is None
