"""Data staging (`data.stage`): copy a job's working set to local disk before its first attempt.

    copier (`python -m spx.daemon.staging.copier SRC DST`, runs as the job's user) uses copy_engine
    (the byte-moving, resumable file copy); runner (the daemon's side) starts the copier and reads
    its progress without blocking the main loop.

Part of the run stage: the supervisor starts a runner instead of a launch while a job's data is not
yet staged.
"""
