"""benchlib's result files and `make bench`'s table and summary (bench/run_all.py), from sample
results: the shape, goals marked met or not, failed benchmarks shown as errors. No timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import run_all  # noqa: E402
from benchlib import Goal, machine, write_result  # noqa: E402


@pytest.mark.parametrize(("op", "value", "target", "met"), [
    ("<=", 1.02, 1.05, True), ("<=", 1.2, 1.05, False), (">=", 0.97, 0.95, True), (">=", 0.9, 0.95, False),
    ("==", 0, 0, True), ("==", 1, 0, False), (">", 0.5, 0, True), (">", 0, 0, False),
])
def test_goal_met(op, value, target, met):
    assert Goal("g", value, op, target).met is met


def test_write_result_shape(tmp_path):
    path = write_result("sample", [{"case": "a", "s": 1.5}], [Goal("ratio", 0.5, "<=", 1.0, "x")], results_dir=tmp_path)
    assert path == tmp_path / "sample.json"
    assert [p.name for p in tmp_path.iterdir()] == ["sample.json"]  # no temp file left behind
    doc = json.loads(path.read_text())
    assert set(doc) == {"bench", "machine", "when", "rows", "goals"}
    assert doc["bench"] == "sample" and doc["rows"] == [{"case": "a", "s": 1.5}]
    assert doc["goals"] == [{"name": "ratio", "value": 0.5, "op": "<=", "target": 1.0, "unit": "x", "met": True}]
    assert doc["machine"] == machine() and doc["machine"]["cpus"] >= 1


def _samples(results: Path) -> list[dict]:
    write_result("alpha", [{"x": 1}], [Goal("alpha ratio", 0.97, ">=", 0.95), Goal("alpha misses", 2, "==", 0)],
                 results_dir=results)
    write_result("beta", [{"x": 2}], [Goal("beta p95", 12.5, "<=", 100, "ms")], results_dir=results)
    return [run_all.load("alpha", results), run_all.load("beta", results),
            {"bench": "gamma", "exit": 3, "seconds": 1.0}, run_all.load("delta", results)]


def test_table_marks_each_goal(tmp_path):
    entries = _samples(tmp_path)
    rows = run_all.table_rows(entries)
    assert rows == [
        ("alpha", "alpha ratio", "0.97", ">= 0.95", "yes"),
        ("alpha", "alpha misses", "2", "== 0", "NO"),
        ("beta", "beta p95", "12.5 ms", "<= 100", "yes"),
        ("gamma", "no result (exit 3)", "–", "–", "error"),
        ("delta", "not run", "–", "–", "–"),
    ]
    text = run_all.render(entries, markdown=False)
    lines = text.splitlines()
    assert lines[0].split() == ["bench", "goal", "value", "target", "met"]
    assert any(line.startswith("machine: ") and f"{machine()['cpus']} CPUs" in line for line in lines)
    assert len([line for line in lines if line.startswith(("alpha", "beta", "gamma", "delta"))]) == 5


def test_markdown_table(tmp_path):
    md = run_all.render(_samples(tmp_path), markdown=True).splitlines()
    assert md[0] == "| bench | goal | value | target | met |"
    assert md[1] == "|---|---|---|---|---|"
    assert "| alpha | alpha misses | 2 | == 0 | NO |" in md
    assert md[-1].startswith("Machine: ")


def test_summary_file(tmp_path):
    entries = _samples(tmp_path)
    doc = json.loads(run_all.write_summary(entries, tmp_path).read_text())
    assert [b["bench"] for b in doc["benches"]] == ["alpha", "beta", "gamma", "delta"]
    assert doc["benches"][2] == {"bench": "gamma", "exit": 3, "seconds": 1.0, "when": None, "goals": None}
    assert doc["benches"][1]["goals"][0]["met"] is True
    assert doc["all_met"] is False
    only_met = [run_all.load("beta", tmp_path)]
    assert run_all.summary(only_met)["all_met"] is True


def test_discovers_every_bench_script(tmp_path):
    (tmp_path / "bench_one.py").write_text('p.add_argument("--quick")\n')
    (tmp_path / "bench_two.py").write_text("")
    (tmp_path / "benchlib.py").write_text("")
    found = run_all.discover(tmp_path)
    assert list(found) == ["one", "two"]
    assert run_all.quick_args("one", found["one"]) == ["--quick"]
    assert run_all.quick_args("intake", found["two"]) == run_all.QUICK_ARGS["intake"]
    assert set(run_all.discover()) >= {"checkpoint_stall", "daemon_restart", "goodput", "intake", "scrape",
                                       "trainer_loop"}


def test_readme_table_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{run_all.README_BEGIN}\nold table\n{run_all.README_END}\n\n## Next\n")
    table = run_all.render(_samples(tmp_path)[:2], markdown=True)
    run_all.update_readme(readme, table)
    run_all.update_readme(readme, table)  # idempotent
    assert readme.read_text() == f"# x\n\n{run_all.README_BEGIN}\n{table}\n{run_all.README_END}\n\n## Next\n"
    (tmp_path / "plain.md").write_text("# no markers\n")
    with pytest.raises(SystemExit):
        run_all.update_readme(tmp_path / "plain.md", table)


def test_goodput_steps_misses_and_goals():
    import bench_goodput as g

    log = g.StepLog([(1.0, 10, "running"), (2.0, 20, "running"), (5.0, 11, "running"), (6.0, 30, "finished")])
    assert log.computed() == 30 + (20 - 11 + 1)  # resumed from step 10: steps 11..20 done twice
    assert g.StepLog([(1.0, 5, "running"), (2.0, 9, "finished")]).computed() == 9
    d = g.Disturber(g.Disturbance("kill", every=10), "GOODPUT_RUN=none", seed=1, start=0.0, stall_timeout=60)
    d.kills = [{"t": 1.0, "hit": True}, {"t": 3.0, "hit": True}, {"t": 4.0, "hit": False}]
    assert d.misses(log) == 0  # training came back (t=5) after the second kill, and after the first
    assert d.misses(g.StepLog([(2.0, 3, "running")])) == 1  # after the kill at t=3: nothing
    rows = [{"launcher": launcher, "disturbance": dist, "seed": seed, "goodput": gp, "misses": 0, "unfinished_runs": u,
             "steps_recomputed_per_kill": rec}
            for launcher, dist, seed, gp, u, rec in [
                ("spx", "undisturbed", None, 1.0, 0, None), ("spx", "kill -9 every 60 s", 1, 0.96, 0, 0.0),
                ("torchrun", "kill -9 every 60 s", 1, 0.9, 1, 0.0),
                ("spx", "kill -9 every 20 s", 1, 0.91, 0, 0.0), ("spx", "kill -9 every 20 s", 2, 0.87, 0, 2.5),
                ("spx", "kill -9 every 20 s", 3, 0.93, 0, 0.0),
                ("spx", "SIGTERM (spot reclaim) at 36 s", None, 0.9, 0, None)]]
    goals = {x.name: (x.value, x.met) for x in g.goodput_goals(rows)}
    assert goals == {"spx goodput, kill -9 every 60 s": (0.96, True),
                     "(baseline) torchrun goodput, kill -9 every 60 s": (0.9, False),
                     # several seeds: the median, the spread in the name; its own target (0.9)
                     "spx goodput, kill -9 every 20 s (median of 3 seeds, 0.870–0.930)": (0.91, True),
                     "(reported) spx goodput, SIGTERM (spot reclaim)": (0.9, False),
                     "spx steps recomputed per kill, kill -9 every 20 s (worst seed; JIT checkpoints)": (2.5, False),
                     "spx misses + unfinished runs, kill -9 runs": (0, True),
                     "(baseline) torchrun misses + unfinished runs, kill -9 runs": (1, False)}


def test_goodput_bench_measures_kept_training_and_checks_the_ledger_against_it():
    import bench_goodput as g

    # Attempt a trains steps 1..25 (10 → 13 s); b resumed from step 12 (its first beat is step 13), so a
    # kept 10 → when it reached step 12 (11 + 3/8 s); b, the last, kept all of its 20 → 22 s.
    log = g.StepLog(beats=[(10.0, 1, 1.0), (11.0, 9, 1.0), (12.0, 17, 1.0), (13.0, 25, 1.0),
                           (20.0, 13, 2.0), (21.0, 21, 2.0), (22.0, 40, 2.0)])
    assert log.kept_training_seconds() == pytest.approx(1.375 + 2.0)
    assert g.reached([(5.0, 3), (6.0, 5)], 1) == 5.0 and g.reached([(5.0, 3), (6.0, 5)], 9) == 6.0
    assert "--no-jit-checkpoint" in g.train_args(10, jit=False) and "--no-jit-checkpoint" not in g.train_args(10)
    assert g.Disturbance("kill", every=20, jit=False).label == "kill -9 every 20 s, JIT off"

    def job(productive, recomputed, queued, unsettled, submitted, end):
        seconds = dict.fromkeys(("productive", "recomputed", "queued", "restart_detect"), 0.0)
        seconds.update(productive=productive, recomputed=recomputed, queued=queued)
        seconds["restart_detect"] = end - submitted - productive - recomputed - queued - unsettled
        return {"submitted": submitted, "history": [{"end": end}],
                "ledger": {"seconds": seconds, "unsettled_seconds": unsettled}}

    o = g.Outcome(wall_s=10.0, finished=True, steps=log, jobs=[job(2.7, 1.0, 1.0, 0.0, 0.0, 11.0)])
    numbers = g.ledger_numbers(o)
    assert (numbers["ledger_goodput"], numbers["external_goodput"]) == (0.27, 0.3375)
    assert (numbers["recomputed_s"], numbers["ledger_sum_error"]) == (1.0, 0.0)
    rows = [{"launcher": "spx", "disturbance": label, "seed": seed, "ledger_goodput": 0.8, "external_goodput": ext,
             "ledger_sum_error": 0.002, "recomputed_s": rec}
            for label, seed, ext, rec in [("kill -9 every 20 s", 1, 0.805, 0.0), ("kill -9 every 20 s, JIT off", 1, 0.82, 4.2),
                                          ("kill -9 every 20 s", 2, 0.1, 9.0),  # another seed: not the ledger's pair
                                          ("kill -9 every 60 s", 1, 0.5, 0.0)]]
    goals = {x.name: x.met for x in g.ledger_goals(rows)}
    assert goals == {
        "spx ledger goodput - bench's, kill -9 every 20 s": True,
        "spx ledger sum - wall (fraction), kill -9 every 20 s": True,
        "spx ledger recomputed s, kill -9 every 20 s": True,
        "spx ledger goodput - bench's, kill -9 every 20 s, JIT off": False,   # 0.02 apart
        "spx ledger sum - wall (fraction), kill -9 every 20 s, JIT off": True,
        "spx ledger recomputed s, kill -9 every 20 s, JIT off": True,
    }


def test_goodput_bench_keeps_why_a_relaunch_resumed_from_a_periodic_checkpoint(tmp_path):
    import bench_goodput as g

    logs = tmp_path / "job-1"
    logs.mkdir()
    (logs / "attempt-1.log").write_text("[default1]: INFO step 120\n"
                                        "[default1]: WARNING a collective failed at step 101 (closed): writing the JIT "
                                        "checkpoint of step 100\n"
                                        "[default1]: WARNING JIT checkpoint /ck/step-000000100 published in 0.01 s\n")
    (logs / "attempt-2.log").write_text("[default0]: WARNING JIT checkpoint of step 251 impossible: ranks [1] left "
                                        "no state of that step\nE torchrun: failed (exitcode: -9) local_rank: 1\n"
                                        "[default0]: INFO step 250\n")
    job = {"name": "job-1", "history": [{"number": 3, "resumed_from_step": 200}, {"number": 1, "resumed_from_step": None},
                                        {"number": 2, "resumed_from_step": 100}]}
    assert g.relaunches(tmp_path, [job]) == [
        {"job": "job-1", "attempt": 2, "resumed_from_step": 100},  # the JIT checkpoint its survivor published
        {"job": "job-1", "attempt": 3, "resumed_from_step": 200, "attempt_before_said": [
            "[default0]: WARNING JIT checkpoint of step 251 impossible: ranks [1] left no state of that step",
            "E torchrun: failed (exitcode: -9) local_rank: 1"]}]
