"""torchrun's arguments for where an attempt's hosts meet: one host, or several (docs/multinode.md).

One host: `--nnodes=1` with a fresh loopback port per attempt (launcher.free_port). Several hosts:
torch's elastic rendezvous at the job's `nodes.rdzv_endpoint`, the same on every host, under the
job's `nodes.rdzv_id` (default its name), so the N daemons that were each given the same file meet
there as one job. Two things torch guesses from the host name are stated instead, where an IP
endpoint lets the daemon know them without a DNS query:

- `--local-addr`: the address this host advertises to the others (the global rank 0 host's becomes
  the workers' MASTER_ADDR). Torch's default, the host's FQDN, is wrong wherever the name resolves to
  an address the peers cannot reach (several networks, containers); the daemon gives the source
  address the kernel routes toward the endpoint, i.e. the one on the network the hosts share.
- `--rdzv-conf=is_host=true` (c10d) on the host that owns the endpoint's address, which then serves
  the rendezvous store. Torch matches the endpoint against the host name's addresses only, so an
  address of a second interface made every host a client of a store nobody served.

With a host name as the endpoint both are left to torch (a DNS query has no place in the daemon's
loop). A loopback endpoint (every "host" on this machine) is torch's own case, left alone too.
"""

from __future__ import annotations

import ipaddress
import socket

from spx.daemon.core.nodes import Nodes, split_endpoint


def torchrun_args(nodes: Nodes, job_name: str, nproc: int, port: int, generation: int | None = None) -> list[str]:
    """The rendezvous part of a torchrun argv (the rest is launcher.plan_launch's). Across hosts
    each generation (run/gang.py) is its own round, `--rdzv-id=ID-gG`: a host relaunched into a new
    one never meets a round the others closed or left."""
    if nodes.count == 1:
        return ["--nnodes=1", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    endpoint = nodes.rdzv_endpoint or ""
    rdzv_id = nodes.rdzv_id or job_name
    if generation is not None:
        rdzv_id = f"{rdzv_id}-g{generation}"
    args = [f"--nnodes={nodes.count}", f"--nproc-per-node={nproc}", f"--rdzv-backend={nodes.rdzv_backend}",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]
    # The agents wait at the rendezvous as long as the daemons wait for a host (run/gang.py).
    conf = [f"join_timeout={int(nodes.host_timeout_seconds)}"]
    host, rdzv_port = split_endpoint(endpoint)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None  # a host name: torch resolves it (see the module doc)
    local = local_address_toward(str(address), rdzv_port) if address is not None and not address.is_loopback else None
    if local is not None:
        args.append(f"--local-addr={local}")
        if nodes.rdzv_backend == "c10d" and ipaddress.ip_address(local) == address:
            conf.insert(0, "is_host=true")
    return [*args, f"--rdzv-conf={','.join(conf)}"]


def local_address_toward(address: str, port: int) -> str | None:
    """This host's address that the kernel would send from to reach `address` (an IP literal), or
    None without a route. A connected UDP socket sends nothing: connect() only picks the route. For
    an address of this host it is the address itself."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((address, port))
            return str(s.getsockname()[0])
    except OSError:
        return None
