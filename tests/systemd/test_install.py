"""systemd/install.sh: into the booted sandbox (as an operator runs it) and staged under --destdir.
In the sandbox, what an operator and a user do next works from PATH: `spx --version`, `spx doctor`,
`spx submit`, the man pages and completion; and a hung job of the installed daemon gets its Python
stacks (py-spy, a dependency of the package) in its attempt log."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import JOB_USER, TEST_CONFIG, UNIT

from harness import REPO, wait_for

pytestmark = pytest.mark.systemd
INSTALL = REPO / "systemd" / "install.sh"
SHARE = "/usr/local/share"
# A job that beats once, then waits in a function of its own: a hang the daemon sees (its step stops
# moving) and py-spy shows by name.
HUNG_SCRIPT = """\
import os, time
from spx.daemon.contract.worker_env import Heartbeat, write_heartbeat
write_heartbeat(os.environ["SPX_HEARTBEAT_FILE"], Heartbeat(step=1))
print("beat once", flush=True)
def wait_for_a_batch_that_never_comes():
    while True:
        time.sleep(1)
wait_for_a_batch_that_never_comes()
"""


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
    grafana = dest / "etc/grafana/provisioning"  # Grafana on this host: its provisioning gets our files
    (grafana / "datasources").mkdir(parents=True)
    (grafana / "datasources/spx-trainer.yaml").write_text("# the operator's own\n")
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
    assert os.readlink(dest / "usr/local/bin/spx") == "/srv/spx/venv/bin/spx"
    assert (dest / "usr/local/share/man/man1/spx.1").read_text().startswith('.TH "SPX" "1"')
    assert "complete -F _spx spx" in (dest / "usr/local/share/bash-completion/completions/spx").read_text()
    assert (dest / "usr/local/share/spx-trainer/grafana/grafana-datasources.yaml").is_file()
    assert (grafana / "datasources/spx-trainer.yaml").read_text() == "# the operator's own\n"  # kept
    provider = (grafana / "dashboards/spx-trainer.yaml").read_text()
    assert "path: /usr/local/share/spx-trainer/dashboards" in provider and "type: file" in provider
    config = dest / "etc/spx/config.yaml"
    assert config.read_text() == (REPO / "systemd" / "config.yaml").read_text()
    config.write_text("gpu_backend: none\n")
    again = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "exists, kept" in again and config.read_text() == "gpu_backend: none\n"


def test_install_sh_refuses_destdir_without_an_existing_venv(tmp_path):
    r = subprocess.run([str(INSTALL), "--destdir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--destdir needs --venv" in r.stderr
    assert not list(tmp_path.iterdir()), "nothing written before the refusal"


def test_install_sh_puts_spx_on_path_with_man_pages_completion_and_monitoring(sandbox):
    assert f"job environment: {sys.prefix}/bin/python runs as an unprivileged user" in sandbox.install_log
    for cmd in ("spx", "spx-trainer"):
        assert os.readlink(sandbox.path(f"/usr/local/bin/{cmd}")) == f"/opt/spx-trainer/venv/bin/{cmd}"
        out = sandbox.run(cmd, "--version", user=JOB_USER).stdout  # found on PATH, by a user
        assert out.strip() == f"{cmd} {version('spx-trainer')}"
    for section, cmd in (("1", "spx"), ("8", "spx-trainer")):
        found = sandbox.run("man", "-w", section, cmd, user=JOB_USER).stdout.strip()  # /usr/local/man is a link
        assert sandbox.run("readlink", "-f", found).stdout.strip() == f"{SHARE}/man/man{section}/{cmd}.{section}"
    page = sandbox.run("man", "-P", "cat", "spx", user=JOB_USER).stdout
    assert "submit" in page and "--version" in page.replace("\u2010", "-")
    for cmd in ("spx", "spx-trainer"):
        script = f"{SHARE}/bash-completion/completions/{cmd}"
        complete = sandbox.run("bash", "--norc", "-c", f"source {script} && complete -p {cmd}", user=JOB_USER)
        assert f" {cmd}" in complete.stdout and "-F _spx" in complete.stdout
    monitoring = sandbox.path(f"{SHARE}/spx-trainer")
    assert {p.name for p in (monitoring / "dashboards").iterdir()} == {p.name for p in (REPO / "dashboards").glob("spx-*.json")}
    # Prometheus loads the installed config with its rules from where install.sh put them; no honor_labels
    check = sandbox.run("promtool", "check", "config", f"{SHARE}/spx-trainer/prometheus/prometheus.yml", check=False)
    assert check.returncode == 0 and "SUCCESS" in check.stdout + check.stderr, check.stdout + check.stderr
    prometheus = (monitoring / "prometheus/prometheus.yml").read_text()
    assert "file_sd_configs" in prometheus and "honor_labels" not in prometheus.split("scrape_configs:")[1]
    provider = (monitoring / "grafana/grafana-dashboards.yaml").read_text()
    assert f"path: {SHARE}/spx-trainer/dashboards" in provider


def test_install_sh_refuses_a_job_environment_other_users_cannot_run(sandbox):
    """Where the venv's python lives under root's 0700 home (a pyenv), no job of another user could
    start: install.sh tries it as nobody and says so, with the fix."""
    if not sys.base_prefix.startswith("/root/"):
        pytest.skip(f"this interpreter ({sys.base_prefix}) is not under /root, so /root's mode does not hide it")
    sandbox.run("chmod", "0700", "/root")
    try:
        r = sandbox.run("bash", str(INSTALL), "--venv", sys.prefix, check=False)
    finally:
        sandbox.run("chmod", "0755", "/root")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot be used by other users" in r.stderr and "PYTHON=/usr/bin/python3" in r.stderr, r.stderr


def test_install_sh_builds_the_venv_from_a_python_every_user_can_run(sandbox):
    """root's python3 (first on its PATH) lives under /root, 0700: install.sh passes it over for the
    system's. The sandbox has no network, so pip then fails; what is checked is the venv's python."""
    if not sys.base_prefix.startswith("/root/"):
        pytest.skip(f"this interpreter ({sys.base_prefix}) is not under /root, so /root's mode does not hide it")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system python3 at /usr/bin/python3")
    sandbox.run("chmod", "0700", "/root")
    try:
        r = sandbox.run("env", f"PATH={sys.base_prefix}/bin:/usr/bin:/bin", "PIP_NO_INDEX=1", "PIP_FIND_LINKS=",
                        "bash", str(INSTALL), "--prefix", "/srv/fresh", check=False, timeout=300)
    finally:
        sandbox.run("chmod", "0755", "/root")
    out = r.stdout + r.stderr
    assert f"not {sys.base_prefix}/bin/python3" in out and "other users cannot run it" in out, out
    chosen = sandbox.run("readlink", "-f", "/srv/fresh/venv/bin/python").stdout.strip()
    assert chosen == os.path.realpath("/usr/bin/python3"), out
    assert f"install.sh: python: {chosen}" in out or "install.sh: python: /usr/bin/python3" in out, out
    assert r.returncode != 0 and "pip install" in out, "offline, the install stops at pip: " + out


def test_spx_doctor_and_submit_work_from_path_on_the_installed_host(unit):
    unit.systemctl("start", UNIT)
    doctor = unit.run("spx", "doctor", "--json", check=False)
    assert doctor.returncode in (0, 1), doctor.stderr  # 1: some check of this sandbox host fails
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["py-spy"]["status"] == "ok", checks["py-spy"]
    assert checks["worker-access"]["status"] == "ok", checks["worker-access"]
    assert checks["gpus"]["status"] == "ok", checks["gpus"]  # 8 fake GPUs; any count is a normal host
    text = unit.run("spx", "doctor", check=False).stdout
    assert not re.search(r"seed|offer|baremetal|provider", text, re.I), text
    unit.run("sh", "-c", "cat > ~/hello.py", user=JOB_USER, input="print('hello from spx', flush=True)\n")
    unit.run("spx", "submit", "--name", "hello", "--gpus", "0", "--", "/opt/spx-trainer/venv/bin/python", f"/home/{JOB_USER}/hello.py",
             user=JOB_USER)

    def ended():
        s = json.loads(unit.run("spx", "status", "hello", "--json", user=JOB_USER).stdout)
        return s if s["state"] in ("succeeded", "failed") else None

    assert wait_for(ended, 120, "hello ends")["state"] == "succeeded"
    assert "hello from spx" in unit.run("spx", "logs", "hello", user=JOB_USER).stdout


def test_a_hang_on_the_installed_daemon_dumps_python_stacks_into_the_attempt_log(unit):
    unit.systemctl("start", UNIT)
    unit.run("sh", "-c", "cat > ~/hung.py", user=JOB_USER, input=HUNG_SCRIPT)
    spec = (f"name: hung\nlauncher: python\nscript: /home/{JOB_USER}/hung.py\ngpus: 0\n"
            "restart: {max_restarts: 0, hang_timeout_seconds: 3}\nstop: {grace_seconds: 2}\n")
    unit.run("sh", "-c", "cat > ~/hung.yaml", user=JOB_USER, input=spec)
    unit.run("spx", "submit", f"/home/{JOB_USER}/hung.yaml", user=JOB_USER)

    def ended():
        s = json.loads(unit.run("spx", "status", "hung", "--json", user=JOB_USER, check=False).stdout)
        return s if s["state"] in ("succeeded", "failed", "cancelled") else None

    wait_for(ended, 120, "the hung job ends")
    log = unit.run("spx", "logs", "hung", "--attempt", "1", user=JOB_USER).stdout
    assert "beat once" in log
    assert "not installed" not in log, log
    assert re.search(r"hang detected; stack of pid \d+:", log), log
    assert "wait_for_a_batch_that_never_comes" in log, log  # py-spy read the worker's Python frames
