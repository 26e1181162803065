import pytest

from spx.daemon.intake.spec import MAX_SPEC_BYTES, SpecError, parse_spec

OK = "name: ok\nscript: train.py\n"


def errors(text: str) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    return e.value.render("job.yaml")


def test_minimal_spec_gets_defaults():
    spec = parse_spec(OK)
    assert spec.launcher == "torchrun" and spec.gpu_count == 0 and spec.worker_count == 1
    assert spec.restart.max_restarts == 10 and spec.stop.grace_seconds == 120


def test_design_example_parses():
    text = """
name: llama-ft
launcher: torchrun
script: train.py
args: ["--batch_size", "32", "--gradient_checkpointing"]
workdir: /home/alice/proj
python: /home/alice/venv/bin/python
gpus: 8
procs: 8
env: {HF_HOME: /data/hf}
nodes: {count: 1}
checkpoints: {dir: /checkpoints/llama-ft, keep: 3}
resume_args: []
restart: {max_restarts: 10, backoff_seconds: [10, 300], hang_timeout_seconds: 900, on_exit_codes: any}
stop: {grace_seconds: 120}
data: {stage: {from: /mnt/volume/data, to: /nvme/data}}
priority: 0
"""
    spec = parse_spec(text)
    assert spec.gpu_count == 8 and str(spec.data.stage.source) == "/mnt/volume/data"


def test_unknown_key_names_field_and_line():
    msg = errors("name: x\nscript: a.py\nrestart:\n  max_restart: 3\n")
    assert "job.yaml:4: restart.max_restart: unknown field" in msg


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 200, "Upper", "-lead"])
def test_bad_names_are_rejected(name):
    assert "name:" in errors(f"name: '{name}'\nscript: a.py\n")


def test_alias_bomb_is_refused_before_expansion():
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    assert "anchors/aliases are not allowed" in errors(bomb)


def test_deep_nesting_is_refused():
    assert "nesting deeper" in errors("name: x\nscript: a\nenv: " + "[" * 40 + "]" * 40 + "\n")


def test_invalid_yaml_names_line():
    assert "job.yaml:3: invalid YAML" in errors("name: x\nscript: [\n")


def test_size_cap():
    assert "larger than" in errors(OK + "#" * (MAX_SPEC_BYTES + 1))


def test_reserved_env_and_relative_paths():
    assert "set by the daemon" in errors(OK + "env: {CUDA_VISIBLE_DEVICES: '0'}\n")
    assert "absolute path" in errors(OK + "workdir: rel/dir\n")
    assert "'..'" in errors(OK + "checkpoints: {dir: /ckpt/../etc}\n")


def test_cross_field_messages_say_the_fix():
    assert "needs `deepspeed_config: FILE`" in errors("name: x\nlauncher: deepspeed\nscript: a.py\n")
    assert "exactly one of `script` or `module`" in errors("name: x\n")
    assert "use torchrun" in errors("name: x\nlauncher: python\nscript: a.py\nprocs: 2\n")
    assert "0 <= first <= cap" in errors(OK + "restart: {backoff_seconds: [5, 1]}\n")
