"""`spx`: the command line users and operators type. A reader of the flow, never its writer.

    main (the dispatch: ls / status / cancel / adopt / gpus / doctor; a closed pipe ends quietly) ·
    parser (every command and option, the exit statuses in `--help`) · client (one request to the
    daemon's control socket, its error as an exit status, the table of exit statuses; root's
    read-only look at the store when no daemon answers) · render (the text of `spx ls`, `spx
    status`, `spx gpus`) ← colour (states and verdicts painted on a terminal, NO_COLOR) · filters
    (`--me`, `--user`, `--state`, `--since`) · submit (`spx submit FILE`: into the spool, intake's
    answer, the job id for scripts, what it resumes from) ← submit_check (`spx submit --check`) ←
    submit_cmdline (`spx submit -- COMMAND`) ← launch_cmdline (what a torchrun/deepspeed/python line
    says) · verify (`spx verify`: a replay of a job's checkpoints, submitted through submit) · history (`spx history`: what each job used) · incidents (`spx incidents`: a record per
    failed attempt) · job_schema (`spx schema`) · logs (`spx
    logs`: through restarts, an earlier job's by its id) ← log_lines (rank prefix, timestamps, --since,
    reading from the end, the separator) · queue_cmds (hold, release, priority, drain) · timeline (`spx
    status --timeline`) · top + top_command (the live view) · socket_hint (no daemon answers: which
    `--root` does, asking only sockets no one else controls) · parser_tree (both programs'
    parsers as data) → completion (bash completion) and manpage (spx(1), spx-trainer(8)), generated
    at install time · report (`spx report`: a job's
    account, failures and picture) ← job_story (what the status document says: the step line, the
    failures, the recoveries, the account) + report_chart (the picture) ← plot (axes, series,
    markers, spans, stacked bars, a legend) ← svg (the stdlib SVG writer; bench/figures.py draws
    with it too)

Changes go through the spool (submit) or the daemon's control socket (cancel); reads through the
control socket, so `spx` needs no access to the store.
"""
