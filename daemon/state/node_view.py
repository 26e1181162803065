"""A job's share on this host when it spans several (docs/multinode.md): which node this is, its global
ranks and where the hosts meet, for `spx status` and the job metrics.

Every host's daemon supervises only its own node, so this is that node's view: the node rank and rank
range come from the heartbeat its local rank 0 writes (torch numbers the nodes at the rendezvous, so
only the workers know them, and only for the attempt that beat); how many nodes and the rendezvous
come from the job's spec. None for a one-host job, whose status stays as it was. Stdlib-only, like
state/views.py, which holds a `NodeView`.
"""

from __future__ import annotations

from dataclasses import dataclass

from spx.daemon.contract.worker_env import Heartbeat


@dataclass(frozen=True)
class NodeView:
    """`node_rank` and `ranks` ([first, last] global rank) are None until this attempt's first beat
    says them; `nnodes` and the rendezvous are the spec's (`rdzv_id` with its default, the job name)."""

    node_rank: int | None
    nnodes: int
    ranks: list[int] | None
    rdzv_endpoint: str
    rdzv_backend: str
    rdzv_id: str
    # The generation the current / last attempt joined (its rendezvous round is RDZV_ID-gG), and
    # every host's line in the shared `.spx-gang/hosts/` as this daemon last read it (run/gang.py):
    # {"host", "generation", "state", "time", "step"}; empty until this host's share has run.
    generation: int | None = None
    hosts: list[dict] | None = None


def node_view(nodes: object, job_name: str, beat: Heartbeat | None, generation: int | None = None,
              hosts: list[dict] | None = None) -> NodeView | None:
    """This host's node of a job across `nodes.count` > 1 hosts, from `beat` (the current attempt's, or
    None when it is missing or an earlier attempt's: its numbering may not hold any more). `nodes` is
    the spec's `intake.nodes.Nodes`, read by attribute because a stored spec this version refuses is
    not validated (its `nodes` may be a plain dict: then no view)."""
    count = getattr(nodes, "count", None)
    if not isinstance(count, int) or count <= 1:
        return None
    return NodeView(
        node_rank=beat.node_rank if beat else None,
        nnodes=count,
        ranks=list(beat.ranks) if beat and beat.ranks else None,
        rdzv_endpoint=str(getattr(nodes, "rdzv_endpoint", None) or ""),
        rdzv_backend=str(getattr(nodes, "rdzv_backend", "c10d")),
        rdzv_id=str(getattr(nodes, "rdzv_id", None) or job_name),
        generation=generation,
        hosts=list(hosts) if hosts else None,
    )


def describe(node: dict, now: float) -> list[str]:
    """`spx status`'s lines for a `NodeView` as JSON: "node 1 of 2, ranks 2–3, rendezvous
    10.0.0.1:29400 (c10d, wide)" ("?" for what no beat has said yet), then the generation and, per
    host, where its share is: "host node0: running in generation 2, step 31, 1 s ago"."""
    rank = "?" if node.get("node_rank") is None else str(node["node_rank"])
    ranks = node.get("ranks")
    span = f"{ranks[0]}–{ranks[1]}" if ranks else "?"
    lines = [f"node {rank} of {node['nnodes']}, ranks {span}, "
             f"rendezvous {node['rdzv_endpoint']} ({node['rdzv_backend']}, {node['rdzv_id']})"]
    if node.get("generation") is not None:
        lines.append(f"generation {node['generation']} (rendezvous round {node['rdzv_id']}-g{node['generation']})")
    for h in node.get("hosts") or []:
        ago = f", {max(0.0, now - h['time']):.0f} s ago" if h.get("time") is not None else ""
        step = f", step {h['step']}" if h.get("step") is not None else ""
        lines.append(f"host {h['host']}: {h.get('state') or '?'} in generation {h.get('generation')}{step}{ago}")
    return lines
