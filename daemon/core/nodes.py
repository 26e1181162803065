"""The `nodes` part of a job spec: one job across several hosts (docs/multinode.md).

The engine is torch's own elastic rendezvous: the same job file is dropped on every host, and each
host's daemon launches its share with `torchrun --nnodes=N --rdzv-backend=… --rdzv-endpoint=HOST:PORT
--rdzv-id=…`; the hosts meet at the endpoint and torch numbers them. What this module adds is the
refusals a multi-host job needs at intake, each saying the fix: an endpoint to meet at, torchrun as the
launcher (the only one whose per-host share a daemon can launch and supervise), and a checkpoint dir
named explicitly (the default is on each host's own disk, so the hosts would resume from different
steps). Stdlib + pydantic only: the spec module imports it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_NODES = 1024
# A DNS name (labels of letters, digits, '-'), an IPv4 address, or an IPv6 address in brackets.
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
RDZV_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
RDZV_FIELDS = ("rdzv_endpoint", "rdzv_backend", "rdzv_id", "host_timeout_seconds")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` (`[V6ADDR]:PORT` for IPv6); ValueError saying the form otherwise.
    The port is required: torchrun's default (29400) would silently differ from what a firewall opens."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:29400 or node0.cluster:29400; port 1-65535)")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address in brackets") from None
        return host[1:-1], int(port)
    if len(host) > 253 or not _HOST_RE.match(host):
        raise ValueError(f"{host!r} is not a host name or address (IPv6: [ADDR]:PORT)")
    return host, int(port)


class Nodes(BaseModel):
    """How many hosts the job spans and where they meet; every host gets the same file."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    count: int = Field(1, ge=1, le=MAX_NODES, description=(
        "Hosts the job spans, each running `procs` workers; > 1: drop the same file on every host (docs/multinode.md)."))
    rdzv_endpoint: str | None = Field(None, description=(
        "HOST:PORT where the hosts meet (torchrun's --rdzv-endpoint): one of the job's hosts, reachable from all of "
        "them on that TCP port (c10d: the agent on that host serves the rendezvous store). Required when count > 1."))
    rdzv_backend: Literal["c10d", "etcd-v2"] = Field("c10d", description=(
        "c10d: torch's TCP store in the endpoint host's agent; etcd-v2: an etcd server at the endpoint (it may "
        "outlive any one host; the job's environment needs python-etcd)."))
    rdzv_id: str | None = Field(None, description=(
        "Names this job's rendezvous at the endpoint, the same on every host; default the job's name."))
    host_timeout_seconds: float = Field(600.0, ge=30, le=7 * 24 * 3600, description=(
        "How long the hosts wait for one that does not come, or whose daemon stopped saying where its share is, "
        "before the job fails naming it (torch's rendezvous join timeout too)."))

    @field_validator("rdzv_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None:
            split_endpoint(v)
        return v

    @field_validator("rdzv_id")
    @classmethod
    def _rdzv_id(cls, v: str | None) -> str | None:
        if v is not None and not RDZV_ID_RE.match(v):
            raise ValueError("must match [A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
        return v

    @model_validator(mode="after")
    def _endpoint_when_several(self) -> Nodes:
        if self.count > 1 and self.rdzv_endpoint is None:
            raise ValueError(f"count: {self.count} needs `rdzv_endpoint: HOST:PORT`, where the hosts meet: one of "
                             "them, reachable from all on that TCP port, e.g. {count: 2, rdzv_endpoint: node0:29400}")
        # Set to something other than the default (a stored spec's dump names every field).
        given = sorted(f for f in RDZV_FIELDS if getattr(self, f) != type(self).model_fields[f].default)
        if self.count == 1 and given:
            raise ValueError(f"{', '.join(given)} only apply to a job across hosts (count > 1); drop them or set count")
        return self


def multi_node_problem(launcher: str, checkpoint_dir_given: bool, resume: str) -> str | None:
    """Why a job of these settings cannot span several hosts (with the fix), or None. Called by the
    spec's cross-field check for `nodes.count > 1` only."""
    if launcher == "deepspeed":
        return ("nodes.count > 1 runs under torchrun's rendezvous only: DeepSpeed's multi-host launcher starts "
                "every host's workers over ssh from one host, which no host's daemon could supervise; use "
                "launcher: torchrun (a DeepSpeed script runs under it: put --deepspeed_config FILE in args)")
    if launcher != "torchrun":
        return f"launcher: {launcher} runs one process on one host; nodes.count > 1 needs launcher: torchrun"
    if not checkpoint_dir_given:
        return ("nodes.count > 1 needs `checkpoints.dir` on a path every host mounts (a shared volume): the "
                "default, CHECKPOINTS_ROOT/NAME, is on each host's own disk, so the hosts would resume from "
                "different steps; set e.g. checkpoints: {dir: /shared/checkpoints/NAME}")
    if resume == "never":
        return ("checkpoints.resume: never is not supported with nodes.count > 1 yet: each host's daemon would "
                "set the shared dir's contents aside on its own, at the same time; empty the dir (or name a new "
                "one) before submitting and use resume: auto")
    return None
