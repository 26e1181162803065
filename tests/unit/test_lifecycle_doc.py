"""docs/architecture.md names the job state machine's phases, observations and actions; the lists
there are the code's, in the code's order (a renamed or new one fails here until the doc says so)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from spx.daemon.lifecycle.actions import ACTIONS, Action
from spx.daemon.lifecycle.machine import HANDLERS
from spx.daemon.lifecycle.observations import OBSERVATIONS, Observation
from spx.daemon.lifecycle.record import Phase

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BLOCK = re.compile(r"<!-- lifecycle-names:.*?-->\n(.*?)\n\n", re.S)


def listed(kind: str) -> list[str]:
    match = BLOCK.search(ARCHITECTURE.read_text())
    assert match, "docs/architecture.md has no lifecycle-names block"
    item = re.search(rf"^- {kind}: (.*?)(?=^- |\Z)", match.group(1), re.S | re.M)
    assert item, f"the lifecycle-names block lists no {kind}"
    return re.findall(r"`(\w+)`", item.group(1))


def test_the_documented_phases_are_the_codes():
    assert listed("Phases") == [p.name for p in Phase]


def test_the_documented_observations_are_the_codes():
    assert set(OBSERVATIONS) == set(get_args(Observation))
    assert listed("Observations") == [o.__name__ for o in OBSERVATIONS]


def test_the_documented_actions_are_the_codes():
    assert set(ACTIONS) == set(get_args(Action))
    assert listed("Actions") == [a.__name__ for a in ACTIONS]


def test_every_phase_has_a_tick_handler_and_every_observation_a_handler_somewhere():
    """The dispatch table is the machine: no phase without its Tick handler, no observation no phase handles."""
    assert {p for p, o in HANDLERS if o.__name__ == "Tick"} == set(Phase)
    assert {o for _, o in HANDLERS} == set(OBSERVATIONS)
