"""A job across several hosts: what intake refuses (each refusal says the fix) and the torchrun argv
each host's daemon launches (pure apart from a routing lookup, no processes)."""

from dataclasses import replace
from pathlib import Path

import pytest

from spx.daemon.core.spec import SpecError, parse_spec
from spx.daemon.run.launcher import LaunchContext, plan_launch
from spx.daemon.run.rendezvous import local_address_toward

BASE = "name: big\nscript: train.py\ngpus: 2\n"
SHARED = "checkpoints: {dir: /shared/ckpt/big}\n"


def errors(text: str) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    return e.value.render("job.yaml")


def ctx() -> LaunchContext:
    return LaunchContext(attempt=1, attempt_id="a", gpus=[0, 1], port=29555, checkpoint_dir=Path("/shared/ckpt/big"),
                         resume_from=None, heartbeat_file=Path("/run/hb.json"), rank_log_dir=Path("/log/big/r"),
                         home="/home/alice", user="alice")


def test_two_nodes_with_endpoint_and_shared_dir_parse_with_defaults():
    spec = parse_spec(BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: '10.0.0.1:29400'}\n")
    assert (spec.nodes.count, spec.nodes.rdzv_backend, spec.nodes.rdzv_id) == (2, "c10d", None)


def test_several_nodes_need_an_endpoint_and_the_error_shows_one():
    msg = errors(BASE + SHARED + "nodes: {count: 2}\n")
    assert "job.yaml:5: nodes: count: 2 needs `rdzv_endpoint: HOST:PORT`" in msg and "node0:29400" in msg


@pytest.mark.parametrize("endpoint, expected", [
    ("node0", "is not HOST:PORT"), ("node0:0", "port 1-65535"), ("node0:99999", "is not HOST:PORT"),
    ("-x:1", "is not a host name"), ("a b:1", "is not a host name"), ("[::1]:29400", None),
    ("[zz]:1", "not an IPv6 address"), ("node0.cluster.local:29400", None), ("10.0.0.1:29400", None),
])
def test_endpoint_forms(endpoint, expected):
    text = BASE + SHARED + f"nodes: {{count: 2, rdzv_endpoint: '{endpoint}'}}\n"
    if expected is None:
        assert parse_spec(text).nodes.rdzv_endpoint == endpoint
    else:
        assert "nodes.rdzv_endpoint" in errors(text) and expected in errors(text)


def test_the_default_checkpoint_dir_is_host_local_and_refused_with_the_fix():
    msg = errors(BASE + "nodes: {count: 2, rdzv_endpoint: 'n0:29400'}\n")
    assert "needs `checkpoints.dir` on a path every host mounts" in msg and "checkpoints: {dir: /shared" in msg


@pytest.mark.parametrize("launcher, expected", [
    ("launcher: deepspeed\ndeepspeed_config: ds.json\n", "DeepSpeed's multi-host launcher starts every host's workers over ssh"),
    ("launcher: python\ngpus: 1\n", "launcher: python runs one process on one host; nodes.count > 1 needs launcher: torchrun"),
])
def test_only_torchrun_spans_hosts(launcher, expected):
    text = "name: big\nscript: train.py\n" + launcher + SHARED + "nodes: {count: 2, rdzv_endpoint: 'n0:29400'}\n"
    assert expected in errors(text)


def test_resume_never_is_refused_across_hosts():
    text = BASE + "checkpoints: {dir: /shared/c, resume: never}\nnodes: {count: 2, rdzv_endpoint: 'n0:1'}\n"
    assert "resume: never is not supported with nodes.count > 1" in errors(text)


def test_rendezvous_fields_without_several_nodes_are_an_error_not_ignored():
    assert "rdzv_backend, rdzv_endpoint only apply to a job across hosts" in errors(
        BASE + "nodes: {rdzv_endpoint: 'n0:1', rdzv_backend: etcd-v2}\n")


def test_a_stored_spec_round_trips_with_every_nodes_field_named():
    for text in (BASE, BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: 'n0:29400', rdzv_id: r1}\n"):
        spec = parse_spec(text)
        assert type(spec).model_validate_json(spec.model_dump_json(by_alias=True)) == spec
    assert "nodes.rdzv_id" in errors(BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: 'n0:1', rdzv_id: '../x'}\n")


def test_one_node_keeps_the_loopback_master_and_a_port_per_attempt():
    argv = plan_launch(parse_spec(BASE), ctx(), default_python="/p").argv
    assert argv[3:7] == ["--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1", "--master-port=29555"]
    assert not [a for a in argv if a.startswith("--rdzv")]


def test_several_nodes_meet_at_the_endpoint_under_the_job_name():
    spec = parse_spec(BASE + SHARED + "procs: 2\nnodes: {count: 3, rdzv_endpoint: 'node0.cluster:29400'}\n")
    argv = plan_launch(spec, ctx(), default_python="/p").argv
    assert argv[:3] == ["/p", "-m", "torch.distributed.run"]  # what the standby launcher relies on
    assert argv[3:8] == ["--nnodes=3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                         "--rdzv-endpoint=node0.cluster:29400", "--rdzv-id=big"]
    assert "--max-restarts=0" in argv and "--tee=3" in argv and "--log-dir=/log/big/r" in argv
    assert not [a for a in argv if a.startswith(("--master", "--local-addr"))], "a host name: torch's"
    assert "--rdzv-conf=join_timeout=600" in argv, "the agents wait for a host as long as the daemons do"


def test_each_generation_is_a_round_of_its_own_and_the_host_timeout_is_torchs_join_timeout():
    spec = parse_spec(BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: 'node0:29400', host_timeout_seconds: 90}\n")
    argv = plan_launch(spec, replace(ctx(), generation=4)).argv
    assert "--rdzv-id=big-g4" in argv and "--rdzv-conf=join_timeout=90" in argv


def test_an_etcd_rendezvous_and_an_own_id_pass_through():
    spec = parse_spec(BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: '127.0.0.1:2379', rdzv_backend: etcd-v2, "
                                      "rdzv_id: run-7}\n")
    argv = plan_launch(spec, ctx()).argv
    assert "--rdzv-backend=etcd-v2" in argv and "--rdzv-id=run-7" in argv
    assert not [a for a in argv if a.startswith("--local-addr")], "loopback: torch's own case"


def test_an_endpoint_address_of_this_host_serves_the_store_and_is_advertised():
    here = local_address_toward("192.0.2.1", 9)  # TEST-NET-1: connect() only picks the route
    if here is None or here.startswith("127."):
        pytest.skip("no route off this host: no non-loopback address of its own to name")
    spec = parse_spec(BASE + SHARED + f"nodes: {{count: 2, rdzv_endpoint: '{here}:29400'}}\n")
    argv = plan_launch(spec, ctx()).argv
    assert f"--local-addr={here}" in argv and "--rdzv-conf=is_host=true,join_timeout=600" in argv


def test_another_hosts_endpoint_gets_the_address_toward_it_but_no_store():
    here = local_address_toward("192.0.2.1", 9)
    if here is None:
        pytest.skip("no route to 192.0.2.1 from this host")
    spec = parse_spec(BASE + SHARED + "nodes: {count: 2, rdzv_endpoint: '192.0.2.1:29400'}\n")
    argv = plan_launch(spec, ctx()).argv
    assert f"--local-addr={here}" in argv and "--rdzv-conf=join_timeout=600" in argv
