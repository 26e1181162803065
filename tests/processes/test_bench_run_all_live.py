"""`make bench` end to end (bench/run_all.py main): it runs a bench script as a process, prints one
table and writes the summary; a bench that fails or writes nothing is an error. Its parts without
processes: tests/unit/test_bench_run_all.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import run_all  # noqa: E402

SAMPLE_BENCH = """
import os, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
from benchlib import Goal, write_result
print("sample bench ran", sys.argv[1:])
if os.environ.get("SAMPLE_FAIL"):
    sys.exit(2)
write_result("sample", [{{"quick": "--quick" in sys.argv}}], [Goal("sample ratio", 1.0, "<=", 1.05)],
             results_dir=Path(os.environ["SAMPLE_RESULTS"]))
"""


def test_main_runs_a_bench_and_prints_one_table(tmp_path, monkeypatch, capsys):
    (tmp_path / "bench_sample.py").write_text(SAMPLE_BENCH.format(bench=str(BENCH)) + '# "--quick"\n')
    results = tmp_path / "results"
    monkeypatch.setenv("SAMPLE_RESULTS", str(results))
    argv = ["--bench-dir", str(tmp_path), "--results", str(results), "--quick"]
    assert run_all.main(argv) == 0
    out = capsys.readouterr().out
    assert "sample ratio" in out and "yes" in out
    assert json.loads((results / "sample.json").read_text())["rows"] == [{"quick": True}]
    assert json.loads((results / "summary.json").read_text())["all_met"] is True
    # Rendering alone reads what is there; a bench that writes nothing is an error and fails the run.
    assert run_all.main(["--bench-dir", str(tmp_path), "--results", str(results), "--no-run", "--markdown"]) == 0
    assert "| sample | sample ratio | 1 | <= 1.05 | yes |" in capsys.readouterr().out
    monkeypatch.setenv("SAMPLE_FAIL", "1")
    assert run_all.main(["--bench-dir", str(tmp_path), "--results", str(results), "--only", "sample"]) == 1
    assert "no result (exit 2)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_all.main(["--bench-dir", str(tmp_path), "--only", "nosuch", "--no-run"])
