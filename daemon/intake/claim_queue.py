"""Which spool entries the main loop claims this turn: a budget per turn and per owner, owners in turn.

Why: a claim itself is cheap (an open by the spool's dir fd, an fstat, a read of at most 64 KiB), but
every claimed file then costs a parse and a check as its owner off the loop, and any user can drop
10,000 files. So names wait here, one queue per owner (the owner `owner_of` names: the entry's uid,
not following a link); each turn takes at most `turn_budget` entries, at most `owner_turn` of one
owner, owners in round-robin order; and an owner with `owner_in_flight` entries still being checked
gets no more until some come back. A user with 10,000 files delays only their own: another user's
file is claimed in the turn after it is seen. A name already waiting or in flight is not queued twice
(the rescan lists it again every few seconds).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

TURN_BUDGET = 32
OWNER_TURN_BUDGET = 8
OWNER_IN_FLIGHT = 16


class ClaimQueue:
    def __init__(self, owner_of: Callable[[str], int | None], turn_budget: int = TURN_BUDGET,
                 owner_turn: int = OWNER_TURN_BUDGET, owner_in_flight: int = OWNER_IN_FLIGHT):
        self._owner_of = owner_of
        self.turn_budget = turn_budget
        self.owner_turn = owner_turn
        self.owner_in_flight = owner_in_flight
        self._waiting: OrderedDict[int, deque[str]] = OrderedDict()  # owner → names, owners in turn order
        self._known: dict[str, int] = {}                             # name → owner, waiting or in flight
        self._in_flight: dict[int, int] = {}                         # owner → entries being claimed/checked

    def add(self, names: Iterable[str]) -> None:
        """Queue names not seen yet under their owner; a name that is gone already is dropped."""
        for name in names:
            if name in self._known:
                continue
            owner = self._owner_of(name)
            if owner is None:
                continue
            self._known[name] = owner
            self._waiting.setdefault(owner, deque()).append(name)

    def take(self) -> list[str]:
        """This turn's names to claim; each stays known (in flight) until `done`."""
        taken: list[str] = []
        served: dict[int, int] = {}
        progress = True
        while len(taken) < self.turn_budget and progress:
            progress = False
            for owner in list(self._waiting):
                if len(taken) >= self.turn_budget:
                    break
                if served.get(owner, 0) >= self.owner_turn or self._in_flight.get(owner, 0) >= self.owner_in_flight:
                    continue
                names = self._waiting.pop(owner)
                taken.append(names.popleft())
                if names:
                    self._waiting[owner] = names  # back of the order
                served[owner] = served.get(owner, 0) + 1
                self._in_flight[owner] = self._in_flight.get(owner, 0) + 1
                progress = True
        return taken

    def done(self, name: str) -> None:
        """The claim of `name` ended (accepted, rejected, gone, or to be claimed again)."""
        owner = self._known.pop(name, None)
        if owner is None:
            return
        left = self._in_flight.get(owner, 0) - 1
        if left > 0:
            self._in_flight[owner] = left
        else:
            self._in_flight.pop(owner, None)

    def waiting(self) -> dict[int, int]:
        """owner → names waiting to be claimed (not counting those in flight)."""
        return {owner: len(names) for owner, names in self._waiting.items()}
