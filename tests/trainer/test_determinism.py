"""Deterministic algorithms without importing TorchInductor at start-up (trainer/determinism.py).

Each check runs in a fresh interpreter: the flag is process-global, and whether inductor is imported
is only meaningful in a process that did not import it yet.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys, torch
from spx.trainer import determinism
{before}
determinism.enable(warn_only=True)
state = {{"on": torch.are_deterministic_algorithms_enabled(),
          "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
          "inductor_loaded": "torch._inductor" in sys.modules}}
import torch._inductor.config as inductor
state["inductor_deterministic"] = inductor.deterministic
print(json.dumps(state))
"""


def probe(before: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_flag_is_on_and_inductor_is_not_imported_for_it():
    assert probe() == {"on": True, "warn_only": True, "inductor_loaded": False, "inductor_deterministic": True}


def test_an_inductor_imported_before_gets_the_setting_too():
    got = probe("import torch._inductor.config")
    assert got == {"on": True, "warn_only": True, "inductor_loaded": True, "inductor_deterministic": True}
