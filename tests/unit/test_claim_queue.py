"""intake/claim_queue.py: which spool entries a turn claims — a budget per turn and per owner, owners
in turn, no more for an owner whose entries are still being checked, and a name never queued twice.
Owners are given by a dict (no spool, no processes)."""

from __future__ import annotations

from spx.daemon.intake.claim_queue import ClaimQueue


def queue(owners: dict[str, int], **budgets: int) -> ClaimQueue:
    return ClaimQueue(owners.get, **budgets)


def test_one_owners_ten_thousand_files_never_delay_another_owners_file_by_more_than_a_turn():
    owners = {f"a-{i}": 1000 for i in range(10_000)} | {"b-job": 1001}
    q = queue(owners, turn_budget=32, owner_turn=8, owner_in_flight=16)
    q.add(f"a-{i}" for i in range(10_000))
    q.add(["b-job"])
    first = q.take()
    assert "b-job" in first, "another owner's file is claimed in the first turn it is seen"
    assert sum(n.startswith("a-") for n in first) == 8, "at most owner_turn of one owner's a turn"


def test_a_turn_claims_owners_in_turn_up_to_the_turn_budget():
    owners = {f"{o}-{i}": uid for o, uid in (("a", 1), ("b", 2), ("c", 3)) for i in range(10)}
    q = queue(owners, turn_budget=7, owner_turn=8, owner_in_flight=16)
    q.add(sorted(owners))
    assert q.take() == ["a-0", "b-0", "c-0", "a-1", "b-1", "c-1", "a-2"]


def test_an_owner_with_entries_in_flight_gets_no_more_until_some_come_back():
    owners = {f"a-{i}": 1 for i in range(20)}
    q = queue(owners, turn_budget=32, owner_turn=8, owner_in_flight=10)
    q.add(sorted(owners, key=lambda n: int(n[2:])))
    assert len(q.take()) == 8
    assert q.take() == ["a-8", "a-9"], "10 in flight: the cap"
    assert q.take() == []
    q.done("a-0")
    assert q.take() == ["a-10"]
    assert q.waiting() == {1: 9}


def test_a_name_waiting_or_in_flight_is_not_queued_again_and_a_vanished_one_is_dropped():
    q = queue({"x": 5, "y": 5})
    q.add(["x", "x", "gone", "y"])
    q.add(["x"])  # the rescan lists it again while it waits
    assert q.take() == ["x", "y"]
    q.add(["x"])  # and again while it is being checked
    assert q.take() == []
    q.done("x")
    q.add(["x"])  # claimed anew (rewritten while checked)
    assert q.take() == ["x"]
