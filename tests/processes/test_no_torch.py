"""The daemon never imports torch (fast start, small RSS, survives a broken CUDA install)."""

import pkgutil
import subprocess
import sys

import spx.daemon


def _all_daemon_modules() -> list[str]:
    return ["spx.daemon"] + [m.name for m in pkgutil.walk_packages(spx.daemon.__path__, prefix="spx.daemon.")]


def test_every_daemon_module_imports_without_torch():
    modules = _all_daemon_modules()
    assert "spx.daemon.service.main" in modules and "spx.daemon.run.supervisor" in modules
    code = (
        "import importlib, sys\n"
        f"mods = {modules!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        "bad = sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.') or k == 'deepspeed')\n"
        "print(len(mods), bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, f"torch got imported by the daemon: {res.stdout}{res.stderr}"
