"""One job across two hosts (docs/multinode.md, slice 1): two network namespaces joined by a veth pair,
each with its own address and its own real `spx-trainer` (own --root, fake GPUs), one checkpoint
directory both mount. The same 2-node × 2-process job file is dropped in both spools; each daemon
launches its share under torchrun's c10d rendezvous at host 0's address, both jobs succeed, each
daemon saw its own node's progress, and the final model equals a 1-node × 4-process run's, bit for bit.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from netns_hosts import IFNAME, two_hosts

from harness import EXAMPLES, Daemon
from spx.daemon.contract import checkpoint_layout as layout

pytestmark = pytest.mark.slow

PY = sys.executable
HASH = re.compile(r"final_state_sha256=([0-9a-f]{64})")
RDZV_PORT = 29400
STEPS = 16
ARGS = ("--batch_size", "4", "--model-size", "tiny", "--seed", "7", "--steps", str(STEPS), "--checkpoint-every", "8",
        "--dataset-size", "128")


def job_text(name: str, *, procs: int, ckpt: Path | None = None, nodes: str | None = None) -> str:
    argv = ", ".join(f'"{a}"' for a in ARGS)
    return (f"name: {name}\nlauncher: torchrun\nscript: {EXAMPLES / 'train_ddp.py'}\npython: {PY}\n"
            f"args: [{argv}]\ngpus: {procs}\nprocs: {procs}\nenv: {{GLOO_SOCKET_IFNAME: {IFNAME}}}\n"
            f"restart: {{max_restarts: 0}}\nstop: {{grace_seconds: 30}}\n"
            + (f"checkpoints: {{dir: {ckpt}}}\n" if ckpt else "") + (f"nodes: {nodes}\n" if nodes else ""))


def attempt_log(d: Daemon, name: str) -> str:
    return (d.root / "log" / name / "attempt-1.log").read_text(errors="replace")


def test_a_job_across_two_hosts_succeeds_on_both_with_the_model_of_one_host(tmp_path):
    shared = tmp_path / "shared"  # the volume both hosts mount
    shared.mkdir()
    with two_hosts(pytest.skip) as hosts:
        daemons = [Daemon(tmp_path / f"host{i}", gpu_backend="fake", prefix=["ip", "netns", "exec", ns])
                   for i, ns in enumerate(hosts.namespaces)]
        try:
            for d in daemons:
                d.start()
            endpoint = f"{hosts.addresses[0]}:{RDZV_PORT}"
            nodes = f"{{count: 2, rdzv_endpoint: '{endpoint}'}}"
            text = job_text("wide", procs=2, ckpt=shared / "wide", nodes=nodes)
            started = time.monotonic()
            for d in daemons:
                d.drop("wide.yaml", text)
            for d in daemons:
                d.wait_state("wide", {"succeeded", "failed"}, 180)
            took = time.monotonic() - started
            for i, d in enumerate(daemons):
                st = d.status("wide")
                assert st["state"] == "succeeded" and st["attempts"] == 1, (i, st, attempt_log(d, "wide")[-3000:])
                # Each daemon watched its own node's heartbeat (its local rank 0), to the last step.
                assert st["step"] == STEPS, (i, st)
            # Each daemon shows where its node is (from its node's heartbeat) and where the hosts meet.
            shown = [d.status("wide")["node"] for d in daemons]
            assert sorted((n["node_rank"], n["ranks"]) for n in shown) == [(0, [0, 1]), (1, [2, 3])], shown
            assert all((n["nnodes"], n["rdzv_endpoint"], n["rdzv_backend"], n["rdzv_id"]) == (2, endpoint, "c10d", "wide")
                       for n in shown), shown
            rank, (first, last) = shown[1]["node_rank"], shown[1]["ranks"]
            out = daemons[1].spx("status", "wide").stdout
            assert f"node {rank} of 2, ranks {first}–{last}, rendezvous {endpoint} (c10d, wide)" in out, out
            logs = [attempt_log(d, "wide") for d in daemons]
            # The attempt log's first lines hold the argv: each host advertises its own address; the
            # endpoint's host (and only it) serves the rendezvous store.
            for i, log in enumerate(logs):
                assert f"'--local-addr={hosts.addresses[i]}'" in log, log[:2000]
                conf = "is_host=true,join_timeout=600" if i == 0 else "join_timeout=600"
                assert f"'--rdzv-conf={conf}'" in log, log[:2000]
            for ckpt_step in (8, STEPS):
                manifest = layout.read_manifest(shared / "wide" / layout.step_dirname(ckpt_step))
                assert manifest is not None and manifest["world_size"] == 4, ckpt_step
            # Global rank 0 is on one host (torch sorts the hosts by address: host 0); its log has the hash.
            hashes = [HASH.findall(log) for log in logs]
            assert [len(h) for h in hashes] == [1, 0], hashes
            assert "DDP on 4 rank(s)" in logs[0], logs[0][-3000:]
            wide = hashes[0]

            # The reference: the same job, 1 node × 4 processes, on host 0.
            daemons[0].drop("narrow.yaml", job_text("narrow", procs=4))
            st = daemons[0].wait_state("narrow", {"succeeded", "failed"}, 120)
            assert st["state"] == "succeeded", attempt_log(daemons[0], "narrow")[-3000:]
            narrow = HASH.findall(attempt_log(daemons[0], "narrow"))
            print(f"2 nodes x 2 procs: {took:.1f} s from drop to both succeeded; hash {wide[0][:16]}; "
                  f"1 node x 4 procs: hash {narrow[0][:16]}")
            assert wide == narrow, "the same 4 ranks, seeds and shards: the same model, bit for bit"
        finally:
            for d in daemons:
                d.stop()
