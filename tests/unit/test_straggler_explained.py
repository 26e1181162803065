"""Slow ranks explained (gpu/straggler.py, gpu/evidence.py, service/stragglers.py): the slow rank
found from the heartbeat's per-rank times, mapped to its GPU, joined with the fake GPU's evidence
(a throttle reason injected into the fixture), and said in one line. The fake GPUs compute while a
process of a job can see them: here a scripted /proc holds one environment per "worker"."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from spx.daemon.contract.worker_env import MAX_RANKS_REPORTED, Heartbeat, load_heartbeat
from spx.daemon.gpu.backend import fake_backend
from spx.daemon.gpu.evidence import EvidenceBoard, GpuReading
from spx.daemon.gpu.fake import DEFAULT_FIXTURE, FakeNvml
from spx.daemon.gpu.fake_procs import ProcessScanner
from spx.daemon.gpu.straggler import SlowRank, cause, explain, rank_gpu, slow_rank, throttled_gpus
from spx.daemon.service.stragglers import StragglerWatch
from spx.daemon.state.views import JobView

BASE = json.loads(DEFAULT_FIXTURE.read_text())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def view(times: list[float] | None, gpus: list[int], state: str = "running") -> JobView:
    return JobView(name="llama", state=state, reason=None, owner_uid=1000, owner="alice", attempts=1, step=80,
                   epoch=0, samples_per_second=10.0, last_checkpoint_step=None, last_checkpoint_time=None,
                   gpus=gpus, submitted=0.0, rank_step_seconds=times)


@pytest.fixture
def thermal_host(tmp_path: Path):
    """A fake 8×H100 whose GPU 2 is thermally throttled (1410 of 1980 MHz at 89 °C) while busy, and
    a job with workers on GPUs 0-3 (one per local rank), in a scripted /proc."""
    fixture = copy.deepcopy(BASE)
    for dev in fixture["devices"]:
        dev["xid_schedule"] = []
    fixture["devices"][2].update(clock_event_reasons_busy=["HwThermalSlowdown"], sm_clock_busy_mhz=1410,
                                 temperature_busy_c=87)  # the fake adds index % 4: 89 °C
    for pid, rank in ((4001, 0), (4002, 1), (4003, 2), (4004, 3)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(
            f"SPX_JOB=llama\0CUDA_VISIBLE_DEVICES=0,1,2,3\0LOCAL_RANK={rank}\0".encode())
    nvml = FakeNvml(fixture)
    nvml._procs = ProcessScanner([d["uuid"] for d in fixture["devices"]], proc=tmp_path)
    backend = fake_backend(nvml)
    yield backend
    backend.close()


def test_the_slowest_rank_at_the_threshold_above_the_median_is_the_straggler():
    slow = slow_rank([0.100, 0.101, 0.114, 0.099], 10.0)
    assert slow == SlowRank(2, 0.114, 0.1005)
    assert round(slow.slower, 3) == 0.134
    assert slow_rank([0.100, 0.101, 0.109, 0.099], 10.0) is None  # 8.5 %: under the threshold
    assert slow_rank([0.1], 10.0) is None and slow_rank(None) is None and slow_rank([0.0, 0.0]) is None


def test_a_rank_runs_on_the_gpu_at_its_local_rank_in_the_jobs_gpu_order():
    assert rank_gpu(2, [4, 5, 6, 7]) == 6
    assert rank_gpu(6, [0, 3], node_ranks=[4, 7]) == 0       # node 2 of a job across hosts: local rank 2
    assert rank_gpu(1, [0, 3], node_ranks=[4, 7]) is None    # a rank of another node
    assert rank_gpu(3, []) is None                           # a CPU job


def test_the_sentence_names_rank_gpu_clock_and_thermal_cause():
    reading = GpuReading(gpu=2, time=0.0, sm_mhz=1410, sm_max_mhz=1980, reasons=frozenset({"hw_thermal_slowdown"}),
                         temperature_c=89, power_w=600, power_limit_w=700)
    found = explain(SlowRank(2, 0.114, 0.1), 2, reading, None)
    assert found.text == "rank 2 is 14 % slower than the median: GPU 2 at 1410 of 1980 MHz, thermal slowdown (89 °C)"
    assert (found.rank, found.gpu, found.cause, found.slower) == (2, 2, "thermal", 0.14)


def test_each_cause_from_the_gpus_evidence():
    def reading(**kw):
        return GpuReading(gpu=0, time=0.0, sm_mhz=1980, sm_max_mhz=1980, power_w=700, power_limit_w=700, **kw)

    assert cause(reading(reasons=frozenset({"hw_power_brake"})), None) == (
        "power_brake", "at 1980 of 1980 MHz, power brake (700 of 700 W)")
    assert cause(reading(reasons=frozenset({"sync_boost"})), None)[0] == "sync_boost"
    assert cause(reading(link_errors=7.0), reading(link_errors=3.0)) == (
        "link_errors", "at 1980 of 1980 MHz, NVLink errors +4")
    assert cause(GpuReading(gpu=0, time=0.0, sm_mhz=1200, sm_max_mhz=1980), None)[0] == "low_clock"
    assert cause(reading(), None)[0] == "unknown"
    assert cause(GpuReading(gpu=0, time=0.0, sm_mhz=345, sm_max_mhz=1980, reasons=frozenset({"gpu_idle"})), None) == (
        "unknown", "idle when read")
    unknown = explain(SlowRank(1, 0.2, 0.1), 0, reading(), None)
    assert unknown.text == "rank 1 is 100 % slower than the median: GPU 0 at 1980 of 1980 MHz, no throttling seen"
    assert explain(SlowRank(1, 0.2, 0.1), None, None, None).text == "rank 1 is 100 % slower than the median"


def test_a_thermally_throttled_fake_gpu_explains_rank_2_of_a_4_rank_job(thermal_host):
    watch = StragglerWatch(EvidenceBoard(thermal_host), threshold_percent=10.0)
    [found] = watch.view(view([0.051, 0.050, 0.071, 0.052], [0, 1, 2, 3])).stragglers
    assert found == {"rank": 2, "gpu": 2, "slower": 0.3786, "cause": "thermal",
                     "text": "rank 2 is 38 % slower than the median: GPU 2 at 1410 of 1980 MHz, thermal slowdown (89 °C)"}


def test_an_undisturbed_job_has_no_straggler(thermal_host):
    watch = StragglerWatch(EvidenceBoard(thermal_host), threshold_percent=10.0)
    assert watch.view(view([0.051, 0.050, 0.053, 0.052], [0, 1, 2, 3])).stragglers == []
    assert watch.view(view([0.05, 0.05, 0.09, 0.05], [0, 1, 2, 3], state="restarting")).stragglers == []


def test_a_script_without_rank_times_gets_its_throttled_gpus(thermal_host):
    watch = StragglerWatch(EvidenceBoard(thermal_host), threshold_percent=10.0)
    found = watch.view(view(None, [1, 2])).stragglers
    assert found == [{"rank": None, "gpu": 2, "slower": None, "cause": "thermal",
                      "text": "GPU 2 throttled: at 1410 of 1980 MHz, thermal slowdown (89 °C)"}]
    assert throttled_gpus([0, 1], {}) == []
    # spx.trainer before its first window of rank times (an empty list): wait for them, so the first
    # finding names the slow rank rather than its GPU alone.
    assert watch.view(view([], [1, 2])).stragglers == []


def test_the_board_reads_a_gpu_only_when_no_scrape_left_a_fresh_reading(thermal_host):
    clock = Clock()
    board = EvidenceBoard(thermal_host, max_age=30.0, clock=clock)
    nvml = thermal_host.nvml
    board.record(GpuReading(gpu=2, time=clock(), sm_mhz=1410, sm_max_mhz=1980,
                            reasons=frozenset({"hw_thermal_slowdown"}), temperature_c=89))
    before = sum(nvml.calls.values())
    now, _ = board.latest(2)
    assert now is not None and now.sm_mhz == 1410 and sum(nvml.calls.values()) == before  # the scrape's reading
    clock.now += 31  # no scrape since: the board reads the GPU itself, once
    now, previous = board.latest(2)
    assert now is not None and now.time == clock.now and previous is not None and previous.time == 100.0
    assert now.reasons == {"hw_thermal_slowdown"} and now.temperature_c == 89
    reads = sum(nvml.calls.values())
    board.latest(2)
    assert sum(nvml.calls.values()) == reads
    # A reading of an idle GPU (its workers not started yet) is read again after 2 s, not 30.
    board.record(GpuReading(gpu=5, time=clock(), sm_mhz=345, sm_max_mhz=1980, reasons=frozenset({"gpu_idle"})))
    assert board.latest(5)[0].time == clock.now
    clock.now += 3
    assert board.latest(5)[0].time == clock.now


def test_rank_times_in_a_heartbeat_are_bounded_and_an_odd_list_costs_only_itself():
    beat = Heartbeat(step=80, rank_step_seconds=[0.05, 0.07])
    assert load_heartbeat(beat.to_json()).rank_step_seconds == [0.05, 0.07]
    assert load_heartbeat(Heartbeat(step=80, rank_step_seconds=[]).to_json()).rank_step_seconds == []
    for odd in ([0.05, -1], [0.05, "0.07"], [1e300], [0.01] * (MAX_RANKS_REPORTED + 1), {"0": 0.05}):
        doc = json.loads(Heartbeat(step=80).to_json()) | {"rank_step_seconds": odd}
        got = load_heartbeat(json.dumps(doc))
        assert got.step == 80 and got.rank_step_seconds is None, odd


def test_spx_status_and_spx_top_say_the_straggler_in_one_line(thermal_host, capsys):
    from spx.daemon.cli.render import print_status
    from spx.daemon.cli.top import render
    from spx.daemon.cli.top_command import job_from_json

    watch = StragglerWatch(EvidenceBoard(thermal_host), threshold_percent=10.0)
    found = watch.view(view([0.050, 0.050, 0.057, 0.050], [0, 1, 2, 3]))
    doc = found.to_json(with_history=True)
    print_status(doc)
    line = "rank 2 is 14 % slower than the median: GPU 2 at 1410 of 1980 MHz, thermal slowdown (89 °C)"
    assert f"  straggler: {line}\n" in capsys.readouterr().out
    frame = render([job_from_json(found.to_json())], [], now=0.0, width=120)
    assert f"  ! {line}\n" in frame
    assert "!" not in render([job_from_json(view([0.05, 0.05], [0, 1]).to_json())], [], now=0.0, width=120)


def test_a_rank_whose_process_waits_for_a_cpu_is_cpu_contention_when_its_gpu_shows_nothing(tmp_path: Path):
    from spx.daemon.run.rank_cpu import RunQueueWait

    for pid, rank, schedstat in ((501, None, "9 1 1"), (502, 0, "900 100 5"), (503, 1, "600 400 5")):
        (tmp_path / str(pid)).mkdir()
        env = b"SPX_JOB=llama\0" + (f"RANK={rank}\0".encode() if rank is not None else b"")
        (tmp_path / str(pid) / "environ").write_bytes(env)
        (tmp_path / str(pid) / "schedstat").write_text(schedstat + "\n")
    cpu = RunQueueWait(tmp_path)
    assert cpu.rank_pid([501, 502, 503], 1) == 503 and cpu.rank_pid([501, 502], 1) is None
    assert cpu.waiting_share(503) == 0.4  # since it started
    (tmp_path / "503" / "schedstat").write_text("700 700 9\n")
    assert cpu.waiting_share(503) == 0.75  # since the last read: 100 ns ran, 300 waited
    assert cpu.waiting_share(504) is None
    fine = GpuReading(gpu=1, time=0.0, sm_mhz=1980, sm_max_mhz=1980)
    found = explain(SlowRank(1, 0.12, 0.1), 1, fine, None, cpu_wait=0.4)
    assert (found.cause, found.text) == ("cpu_contention", "rank 1 is 20 % slower than the median: GPU 1 at 1980 of "
                                         "1980 MHz, CPU contention (its process waited for a CPU 40 % of the time)")
    assert explain(SlowRank(1, 0.12, 0.1), 1, fine, None, cpu_wait=0.1).cause == "unknown"
    throttled = GpuReading(gpu=1, time=0.0, sm_mhz=1410, sm_max_mhz=1980, reasons=frozenset({"sw_thermal_slowdown"}))
    assert explain(SlowRank(1, 0.12, 0.1), 1, throttled, None, cpu_wait=0.4).cause == "thermal"
    assert explain(SlowRank(1, 0.12, 0.1), None, None, None, cpu_wait=0.5).text == (
        "rank 1 is 20 % slower than the median: CPU contention (its process waited for a CPU 50 % of the time)")
    cpu.forget({502})
    assert cpu.rank_pid([503], 1) == 503  # found again from its environment
