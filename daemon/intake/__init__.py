"""Intake: from a file dropped into the spool to a queued job in the store.

    spool (watch + claim, hostile files) → claim_queue (a budget per turn and per owner)
    → accept (parse and check as the owner off the loop, record durably) ← accepted_copy (the
    root-only copy every job's row names: accepted, adopted, a periodic replay) · access (what the owner
    must be able to do, checked as them; also `spx submit --check`)
    ← dependencies (what an `after:` name means); adopt (queue what a lost host left on a volume)
    ← adopt_scan (find it, through fsafe) ← job_record (what a job keeps in CHECKPOINT_DIR/.spx/)
    · replay_file (a replay of a job's checkpoints as a job file: `spx verify`, `verify:`)

First stage of the one-way flow: spool → intake → state → run → workers. Nothing here launches
anything; it only ever writes new `queued` jobs (and `rejected/` files).
"""
