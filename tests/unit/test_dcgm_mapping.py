"""dcgm-exporter's job-mapping files (service/dcgm_mapping.py) and the config key that turns them on.

The files are read back the way dcgm-exporter reads them (its `--hpc-job-mapping-dir` mapper: every
entry whose name parses as an integer is a GPU id, each line of it a job id). The writer's thread is
driven by events, never by sleeping: a write that blocks is held on an Event the test releases.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from spx.daemon.core.config import ConfigError, DaemonConfig, MetricsSettings, load_config
from spx.daemon.service.dcgm_mapping import DcgmJobMapping, mapping_files, sync_dir

WAIT = 30.0  # seconds an event may take on a loaded machine; never slept


def read_like_dcgm_exporter(directory: Path) -> dict[str, list[str]]:
    """GPU id → job ids, as dcgm-exporter's HPC mapper sees `directory`: regular files whose name is an
    integer, one job id a line."""
    seen: dict[str, list[str]] = {}
    for entry in os.scandir(directory):
        try:
            int(entry.name)
        except ValueError:
            continue
        if entry.is_file():
            seen[entry.name] = Path(entry.path).read_text().splitlines()
    return seen


def test_one_file_per_held_gpu_named_by_its_index_holding_the_jobs_name(tmp_path):
    mapping_dir = tmp_path / "job-map"
    sync_dir(mapping_dir, {0: ("llama",), 1: ("llama",), 5: ("bert-base",)})
    assert read_like_dcgm_exporter(mapping_dir) == {"0": ["llama"], "1": ["llama"], "5": ["bert-base"]}
    assert (mapping_dir / "5").read_bytes() == b"bert-base\n"
    st = mapping_dir.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o755), "made the daemon's own, readable by all"
    assert stat.S_IMODE((mapping_dir / "0").stat().st_mode) == 0o644, "dcgm-exporter may run as its own user"
    assert sorted(os.listdir(mapping_dir)) == ["0", "1", "5"], "no temp file left"


def test_a_gpu_the_job_left_loses_its_file_and_only_changed_files_are_replaced(tmp_path):
    mapping_dir = tmp_path / "job-map"
    sync_dir(mapping_dir, {0: ("a",), 1: ("a",), 2: ("b",)})
    kept = (mapping_dir / "2").stat().st_ino
    (mapping_dir / "README").write_text("written by the admin\n")
    (mapping_dir / ".3.spx-tmp").write_text("half")  # a temp file a crash left
    sync_dir(mapping_dir, {1: ("c",), 2: ("b",)})
    assert read_like_dcgm_exporter(mapping_dir) == {"1": ["c"], "2": ["b"]}
    assert (mapping_dir / "2").stat().st_ino == kept, "an unchanged file is left as it is"
    assert sorted(os.listdir(mapping_dir)) == ["1", "2", "README"], "other files are not the daemon's to remove"
    sync_dir(mapping_dir, {})
    assert read_like_dcgm_exporter(mapping_dir) == {}


def test_a_directory_someone_else_made_at_the_name_is_moved_aside_not_written_into(tmp_path):
    mapping_dir = tmp_path / "job-map"
    mapping_dir.mkdir()
    (mapping_dir / "0").write_text("planted\n")
    os.chown(mapping_dir, 65534, 65534)
    sync_dir(mapping_dir, {3: ("mine",)})
    assert read_like_dcgm_exporter(mapping_dir) == {"3": ["mine"]}
    assert mapping_dir.stat().st_uid == os.geteuid()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith(".job-map.untrusted-")]
    assert (aside / "0").read_text() == "planted\n"


def test_mapping_files_are_one_job_name_a_line():
    assert mapping_files({4: ("x",), 7: ("y", "z"), 9: ()}) == {"4": b"x\n", "7": b"y\nz\n"}


class BlockingSync:
    """A sync that records each mapping it is given and, while `hold` is set, waits on `release`."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hold = True
        self.called = threading.Condition()
        self.fail_first = 0

    def __call__(self, directory: Path, holders) -> None:
        self.entered.set()
        if self.hold:
            assert self.release.wait(WAIT)
        with self.called:
            self.calls.append(dict(holders))
            self.called.notify_all()
        if self.fail_first:
            self.fail_first -= 1
            raise OSError(28, "No space left on device")

    def wait_calls(self, count: int) -> list[dict]:
        with self.called:
            assert self.called.wait_for(lambda: len(self.calls) >= count, WAIT), self.calls
            return list(self.calls)


def test_the_loop_never_waits_on_a_write_and_the_newest_mapping_wins(tmp_path):
    sync = BlockingSync()
    writer = DcgmJobMapping(tmp_path, sync=sync)
    try:
        writer.show({0: "a"})
        assert sync.entered.wait(WAIT), "the writer took the first mapping"
        # The writer is blocked in its write: the loop goes on showing changes, none of them waits.
        writer.show({0: "a", 1: "b"})
        writer.show({1: "b"})
        writer.show({1: "b"})  # unchanged: not handed over again
        sync.release.set()
        assert sync.wait_calls(2) == [{0: ("a",)}, {1: ("b",)}], "the middle mapping was never written"
    finally:
        writer.close()
    assert sync.calls == [{0: ("a",)}, {1: ("b",)}]


def test_a_failed_write_is_logged_once_and_retried_until_it_succeeds(tmp_path):
    sync = BlockingSync()
    sync.hold, sync.fail_first = False, 2
    with capture_logs() as lines:
        writer = DcgmJobMapping(tmp_path, sync=sync, retry_seconds=0.01)
        try:
            writer.show({2: "j"})
            assert sync.wait_calls(3) == [{2: ("j",)}] * 3
        finally:
            writer.close()
    events = [line["event"] for line in lines]
    assert events.count("dcgm_job_mapping_failed") == 1, lines
    assert "dcgm_job_mapping_written_again" in events
    failed = next(line for line in lines if line["event"] == "dcgm_job_mapping_failed")
    assert failed["error"] == "OSError: [Errno 28] No space left on device" and failed["dir"] == str(tmp_path)


def test_close_writes_the_last_mapping_shown(tmp_path):
    mapping_dir = tmp_path / "job-map"
    writer = DcgmJobMapping(mapping_dir)
    writer.show({0: "a", 1: "a"})
    writer.show({})  # the stop: its jobs left their GPUs
    writer.close()
    assert read_like_dcgm_exporter(mapping_dir) == {}
    assert mapping_dir.is_dir(), "the writer made the directory"


# --- the config key ---------------------------------------------------------------------------------


def test_the_config_names_the_directory_under_metrics(tmp_path):
    (tmp_path / "config.yaml").write_text(f"metrics: {{dcgm_job_mapping_dir: {tmp_path / 'job-map'}}}\n")
    cfg = load_config(tmp_path / "config.yaml", tmp_path / "root")
    assert cfg.metrics.dcgm_job_mapping_dir == tmp_path / "job-map"
    assert DaemonConfig().metrics.dcgm_job_mapping_dir is None, "off by default"
    (tmp_path / "typo.yaml").write_text(f"metrics: {{dcgm_job_map_dir: {tmp_path}}}\n")
    with pytest.raises(ConfigError, match="dcgm_job_map_dir"):
        load_config(tmp_path / "typo.yaml")


@pytest.mark.parametrize(("mode", "owner", "accepted"), [
    (0o755, 0, True),
    (0o1777, 0, True),      # sticky, like /tmp: no one renames root's entry in it
    (0o777, 0, False),      # anyone could rename the directory and put their own in its place
    (0o775, 0, False),
    (0o755, 65534, False),  # its owner could
])
def test_only_root_may_be_able_to_write_above_the_directory(tmp_path, mode, owner, accepted):
    """Checked by the daemon (check_host, at its start and in --check), not when `spx` loads the config."""
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(mode)
    os.chown(parent, owner, 0)
    cfg = DaemonConfig.rooted(tmp_path / "root", metrics=MetricsSettings(dcgm_job_mapping_dir=parent / "job-map"))
    if accepted:
        cfg.check_host()
    else:
        with pytest.raises(ConfigError, match=f"{parent} is owned by uid {owner} with mode {mode:o}"):
            cfg.check_host()


def test_a_relative_path_or_a_missing_parent_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not an absolute path"):
        MetricsSettings(dcgm_job_mapping_dir=Path("job-map"))
    missing = DaemonConfig.rooted(tmp_path / "root", metrics={"dcgm_job_mapping_dir": tmp_path / "absent" / "job-map"})
    with pytest.raises(ConfigError, match="No such file or directory"):
        missing.check_host()
    DaemonConfig.rooted(tmp_path / "root").check_host()  # nothing to check without the key


def test_the_mapping_and_private_job_names_are_not_both_asked_for(tmp_path):
    (tmp_path / "config.yaml").write_text(
        f"metrics_job_labels: false\nmetrics: {{dcgm_job_mapping_dir: {tmp_path / 'job-map'}}}\n")
    with pytest.raises(ConfigError, match="metrics_job_labels: false keeps private"):
        load_config(tmp_path / "config.yaml")
