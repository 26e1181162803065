"""What the main loop publishes for the daemon's other threads, once per turn.

Why: the control socket's client threads and the metrics server's thread answer while the loop runs.
If they read the loop's own objects (its attempt handles, its job tables) they would iterate dicts the
loop is changing. So after each turn the loop builds one frozen `LoopSnapshot` of what readers need
beyond the store (which they read through their own connections) and swaps it in with one
assignment; a reader takes the current one and never sees a half-made turn.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class LoopSnapshot:
    pids: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    gang_hosts: Mapping[int, tuple[Mapping[str, object], ...]] = field(default_factory=lambda: MappingProxyType({}))
    taken: float = 0.0  # monotonic time of the turn it describes

    @classmethod
    def of(cls, pids: dict[str, list[int]], gang_hosts: dict[int, list[dict]]) -> LoopSnapshot:
        """Deep copies, frozen: nothing in it is shared with the loop."""
        return cls(
            pids=MappingProxyType({name: tuple(p) for name, p in pids.items()}),
            gang_hosts=MappingProxyType({job: tuple(MappingProxyType(dict(line)) for line in lines)
                                         for job, lines in gang_hosts.items()}),
            taken=time.monotonic(),
        )

    def pids_by_name(self) -> dict[str, list[int]]:
        return {name: list(p) for name, p in self.pids.items()}

    def hosts_of(self, job_id: int) -> list[dict] | None:
        lines = self.gang_hosts.get(job_id)
        return None if lines is None else [dict(line) for line in lines]
