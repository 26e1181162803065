"""Intake: from a file dropped into the spool to a queued job in the store (design §4).

    spool (watch + claim, hostile files) → spec (parse + validate) → accept (check + record durably)

First stage of the one-way flow: spool → intake → state → run → workers; exporter and CLI only read.
Nothing here launches anything; it only ever writes new `queued` jobs (and `rejected/` files).
"""
