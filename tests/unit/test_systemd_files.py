"""The files in systemd/ agree with the daemon: paths, names, the config template."""

from __future__ import annotations

import configparser
from pathlib import Path

from spx.daemon.core.config import DaemonConfig, load_config
from spx.daemon.doctor.report import DoctorContext

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def _service() -> configparser.ConfigParser:
    # strict=False: systemd allows repeated keys (DeviceAllow=, Wants=), configparser would not.
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]
    p.read(SYSTEMD / "spx-trainer.service")
    return p


def test_config_template_loads_and_is_the_defaults():
    assert load_config(SYSTEMD / "config.yaml") == DaemonConfig()


def test_unit_directories_are_the_configs_defaults():
    svc = _service()["Service"]
    defaults = DaemonConfig()
    assert Path("/var/lib") / svc["StateDirectory"] == defaults.state_dir
    assert Path("/var/log") / svc["LogsDirectory"] == defaults.log_dir
    assert Path("/run") / svc["RuntimeDirectory"] == defaults.run_dir
    assert svc["ExecStart"].split()[1:] == ["--config", "/etc/spx/config.yaml"]


def test_tmpfiles_make_the_spool_and_dirs_with_the_modes_the_daemon_and_doctor_want():
    lines = [ln.split() for ln in (SYSTEMD / "tmpfiles.d" / "spx-trainer.conf").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    entries = {path: (kind, mode, user) for kind, path, mode, user, *_ in lines}
    defaults = DaemonConfig()
    assert entries[str(defaults.spool_dir)] == ("d", "1733", "root")
    assert entries[str(defaults.state_dir)] == ("d", "0700", "root")
    assert entries[str(defaults.log_dir)] == ("d", "0755", "root")


def test_doctor_checks_the_unit_that_is_installed():
    assert (SYSTEMD / f"{DoctorContext().unit}.service").is_file()
