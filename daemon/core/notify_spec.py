"""The `notify:` part of a job file, and of the daemon's config (the default of every job whose file
has none): who is told when the job fails, succeeds, is restarted or is cancelled (docs/notify.md).

A webhook is a URL the daemon POSTs the event's JSON to; a command is a program run as the job's
owner with the same JSON on stdin. Both come from a user and are acted on by a root daemon, so what
is accepted here is narrow: only `http`/`https` URLs with a host and no credentials in them (no
`file://`, no unix socket, nothing else urllib could open), at most 2048 characters; a command is an
argv (or one line for `/bin/sh -c`) of bounded size; the deadline of one call is at most a minute.
How the daemon sends them (as the owner, no redirect followed, retried with backoff) is
run/notify.py's.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

NotifyEvent = Literal["failed", "succeeded", "restarted", "cancelled"]
NOTIFY_EVENTS: tuple[str, ...] = ("failed", "succeeded", "restarted", "cancelled")
MAX_URL_CHARS = 2048
MAX_COMMAND_ARGS = 64
MAX_COMMAND_ARG_CHARS = 4096
MAX_TIMEOUT_SECONDS = 60.0


class Notify(BaseModel):
    """Where and on which events a job's news goes. `notify: {}` (no webhook, no command) tells no
    one: a job file's way to opt out of the config's default."""

    # As every part of the job file's model: unknown keys and `.inf`/`.nan` are errors.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    webhook: str | None = Field(None, description=(
        "http(s) URL the event's JSON is POSTed to, from a process running as the job's owner; no redirect "
        "is followed; credentials belong in the path or query, not in `user:pass@`."))
    command: str | list[str] | None = Field(None, description=(
        "Program run as the job's owner (argv list, or one line run by /bin/sh -c) in `/` with HOME set, the "
        "event's JSON on stdin and SPX_EVENT, SPX_JOB, SPX_STATE, SPX_REASON, … in its environment."))
    events: list[NotifyEvent] = Field(default_factory=lambda: list[NotifyEvent](["failed"]), description=(
        "Which of failed, succeeded, restarted, cancelled are told (default: failed)."))
    timeout_seconds: float = Field(10.0, gt=0, le=MAX_TIMEOUT_SECONDS, description=(
        "Deadline of one call (at most 60 s); past it the webhook's or the command's process is killed and the "
        "call is retried later (after 5, 30, 120 s), then given up."))

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        if v is None:
            return v
        problem = webhook_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is None:
            return v
        args = [v] if isinstance(v, str) else v
        if not args or not args[0].strip():
            raise ValueError("must name a program")
        if len(args) > MAX_COMMAND_ARGS:
            raise ValueError(f"at most {MAX_COMMAND_ARGS} arguments")
        if any(len(a) > MAX_COMMAND_ARG_CHARS or "\0" in a for a in args):
            raise ValueError(f"each argument at most {MAX_COMMAND_ARG_CHARS} characters, without NUL")
        return v

    @field_validator("events")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("names an event twice")
        return v

    @property
    def argv(self) -> list[str] | None:
        """The command as an argv: a one-line command runs under /bin/sh -c."""
        if self.command is None:
            return None
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)

    def wants(self, event: str) -> bool:
        return event in self.events and (self.webhook is not None or self.command is not None)


def webhook_problem(url: str) -> str | None:
    """Why `url` is no webhook the daemon will POST to, or None: http or https, a host, no
    credentials, no whitespace or control characters, at most MAX_URL_CHARS."""
    if len(url) > MAX_URL_CHARS:
        return f"at most {MAX_URL_CHARS} characters"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 — raises ValueError for a port that is no number in range
    except ValueError as e:
        return f"not a URL: {e}"
    if parts.scheme not in ("http", "https"):
        return "only http:// and https:// URLs are sent to (no file://, unix sockets or other schemes)"
    if not parts.hostname:
        return "names no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@); put a token in the path or query"
    return None
