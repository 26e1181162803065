"""systemd/install.sh: into the booted sandbox (as an operator runs it) and staged under --destdir."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_CONFIG, UNIT

from harness import REPO

pytestmark = pytest.mark.systemd
INSTALL = REPO / "systemd" / "install.sh"


def _mode(p: Path) -> str:
    return f"{stat.S_IMODE(os.lstat(p).st_mode):04o}"


def test_install_sh_in_the_sandbox_sets_up_unit_dirs_and_keeps_the_config(sandbox):
    assert "config: /etc/spx/config.yaml exists, kept as it is" in sandbox.install_log
    assert sandbox.path("/etc/spx/config.yaml").read_text() == TEST_CONFIG
    modes = {d: _mode(sandbox.path(d)) for d in ("/var/spool/spx", "/var/lib/spx", "/var/log/spx")}
    assert modes == {"/var/spool/spx": "1733", "/var/lib/spx": "0700", "/var/log/spx": "0755"}
    assert os.lstat(sandbox.path("/var/spool/spx")).st_uid == 0
    assert os.readlink(sandbox.path("/opt/spx-trainer/venv")) == sys.prefix
    assert sandbox.path("/opt/spx-trainer/src/examples/train_ddp.py").is_file()
    props = sandbox.show(UNIT, "LoadState", "FragmentPath", "UnitFileState")
    assert props == {"LoadState": "loaded", "FragmentPath": f"/etc/systemd/system/{UNIT}",
                     "UnitFileState": props["UnitFileState"]}
    assert props["UnitFileState"] in ("disabled", "enabled"), "install.sh leaves enabling to the operator"


def test_install_sh_destdir_stages_everything_and_keeps_the_config(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --root makes root-owned dirs: needs root")
    dest = tmp_path / "dest"
    dest.mkdir()
    run = [str(INSTALL), "--destdir", str(dest), "--prefix", "/srv/spx", "--venv", sys.prefix]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "staged under" in out
    unit = (dest / "etc/systemd/system" / UNIT).read_text()
    assert "ExecStart=/srv/spx/venv/bin/spx-trainer --config /etc/spx/config.yaml" in unit
    assert "/opt/spx-trainer" not in unit
    assert (dest / "usr/local/lib/tmpfiles.d/spx-trainer.conf").is_file()
    assert _mode(dest / "var/spool/spx") == "1733" and _mode(dest / "var/lib/spx") == "0700"
    assert os.readlink(dest / "srv/spx/venv") == sys.prefix
    assert not list((dest / "srv/spx/src").rglob("__pycache__"))
    config = dest / "etc/spx/config.yaml"
    assert config.read_text() == (REPO / "systemd" / "config.yaml").read_text()
    config.write_text("gpu_backend: none\n")
    again = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "exists, kept" in again and config.read_text() == "gpu_backend: none\n"


def test_install_sh_refuses_destdir_without_an_existing_venv(tmp_path):
    r = subprocess.run([str(INSTALL), "--destdir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--destdir needs --venv" in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written before the refusal"
