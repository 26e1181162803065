"""Lifecycle: the pure state machine of one tracked job, from "GPUs allocated" to its next resting state.

    machine (advance: the dispatch table (phase, observation) → handler; where a job begins: placed,
    adopted) over record (TrackedJob: the job, its phase and clock, ledger, attempt, hang calibration,
    multi-host share, pending writes), observations (what the executor saw) and actions (what it must
    do); handlers by what they hold: starting (backoff, Go, staging, checkpoint, launch), running
    (heartbeats, activity, hangs), stopping (cancel, faults, signals, exit, leftovers), ending (the
    diagnosis, the decision, the record of the end), across_hosts (the generation a job across hosts
    runs in), failures (an action that failed, a store that refuses, a fault of the daemon's), moves
    (what they share); policy (after an exit: restart, back off, give up), resume_fallback (the
    crash-loop fallback checkpoint) and rollback (after a divergence: the checkpoint before it, the
    data skipped since).

Between state and run in the package graph: it imports core, contract and state's job states only,
and does no I/O — no process, file, clock or store; `run` performs its actions (run/executor.py) and
feeds back what it saw. Every edge has a test that scripts its observations (tests/unit/test_lifecycle_*.py).
"""
