import pytest

from spx.daemon.core.spec import MAX_SPEC_BYTES, SpecError, parse_spec

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
    assert "only torchrun's workers" in errors("name: x\nlauncher: python\nscript: a.py\n"
                                               "restart: {standby_workers: true}\n")
    assert parse_spec(OK + "restart: {standby_workers: true}\n").restart.standby_workers


# --- every input is a JobSpec or a SpecError (issue 12): the escapes found by a hostile user ------

BASE = "name: x\nscript: a.py\n"


@pytest.mark.parametrize(("line", "expected"), [
    ("args: !!python/object/apply:os.system ['touch /tmp/pwned']", "tag !!python/object/apply:os.system is not allowed"),
    ("args: !!python/name:os.system", "tag !!python/name:os.system is not allowed"),
    ("args: !foo bar", "tag !foo is not allowed"),
    ("args: !!set {a, b}", "tag !!set is not allowed"),
    ("env: !!omap [A: b]", "tag !!omap is not allowed"),
    ("env: !!pairs [A: b]", "tag !!pairs is not allowed"),
    ("args: [!!binary '@@@ not base64']", "tag !!binary is not allowed"),
    ("args: [!!timestamp x]", "tag !!timestamp is not allowed"),
    ("priority: !!int 1.5", "'1.5' is not a valid int"),
    ("priority: !!int [1]", "a list is not a valid int"),
    ("args: [!!bool maybe]", "'maybe' is not a valid bool"),
    ("args: [!!float abc]", "'abc' is not a valid float"),
    ("priority: " + "9" * 5000, "number too large"),
    ("priority: " + "1:" * 40 + "1", "number too large"),  # YAML 1.1 base-60
    ("env: {1: a}", "mapping keys must be text; '1' is not"),
    ("? [a]\n: b", "mapping keys must be text; a list is not"),
    ("yes: 1", "mapping keys must be text; 'yes' is not"),
    ('args: ["a\\0b"]', "must not contain NUL"),
    ('args: ["\\ud800"]', "no lone surrogate"),
])
def test_yaml_escape_is_a_spec_error_at_its_line(line, expected):
    msg = errors(BASE + line + "\n")
    assert msg.startswith("job.yaml:3: ") and expected in msg


def test_duplicate_key_names_the_key_and_both_lines():
    assert "job.yaml:3: name: duplicate key (first given on line 1)" in errors(BASE + "name: y\n")
    assert "job.yaml:5: A: duplicate key (first given on line 4)" in errors(BASE + "env:\n  A: '1'\n  A: '2'\n")


@pytest.mark.parametrize("opener", ["[", "{a: "])
def test_deep_nesting_is_refused_before_the_composer_recurses(opener):
    closer = "]" if opener == "[" else "}"
    assert "job.yaml:3: nesting deeper than 16 levels" in errors(BASE + "args: " + opener * 3000 + closer * 3000 + "\n")


def test_sixteen_levels_are_still_read():
    assert "env: Input should be a valid dictionary" in errors(BASE + "env: " + "[" * 15 + "]" * 15 + "\n")


@pytest.mark.parametrize(("line", "field"), [
    ("restart: {hang_timeout_seconds: .inf}", "restart.hang_timeout_seconds"),
    ("restart: {hang_timeout_seconds: 'inf'}", "restart.hang_timeout_seconds"),
    ("restart: {backoff_seconds: [.nan, .nan]}", "restart.backoff_seconds.0"),
    ("stop: {grace_seconds: .nan}", "stop.grace_seconds"),
    ("priority: 1.0e+400", "priority"),
])
def test_numbers_must_be_finite(line, field):
    assert f"job.yaml:3: {field}: Input should be a finite number" in errors(BASE + line + "\n")


@pytest.mark.parametrize(("line", "field"), [
    ("restart: {hang_timeout_seconds: 2592001}", "restart.hang_timeout_seconds"),  # > 30 days
    ("restart: {backoff_seconds: [1, 86401]}", "restart.backoff_seconds"),  # cap > 1 day
    ("restart: {max_restarts: 99999999999}", "restart.max_restarts"),
    ("restart: {on_exit_codes: [256]}", "restart.on_exit_codes.0"),
    ("priority: 9223372036854775807", "priority"),
    ("procs: 100000", "procs"),
    ("gpus: [64]", "gpus"),
    ("checkpoints: {keep: 100000}", "checkpoints.keep"),
])
def test_numbers_that_would_overflow_timers_or_the_store_are_bounded(line, field):
    assert f"job.yaml:3: {field}: " in errors(BASE + line + "\n")


def test_bounds_themselves_are_accepted():
    spec = parse_spec(BASE + "restart: {hang_timeout_seconds: 2592000, backoff_seconds: [0, 86400], on_exit_codes: [1, 255]}\n")
    assert spec.restart.hang_timeout_seconds == 2592000 and spec.restart.backoff_seconds == (0, 86400)


def test_dates_merges_and_equals_are_plain_text():
    spec = parse_spec(BASE + "args: [2020-01-01, '=', =]\n")
    assert spec.args == ["2020-01-01", "=", "="]
    assert "job.yaml:3: <<: unknown field" in errors(BASE + "<<: {priority: 1}\n")


@pytest.mark.parametrize(("text", "expected"), [
    ("\udcff", "not valid UTF-8"),
    (BASE + "\x01", "job.yaml:3: invalid YAML: control character U+0001"),
    (BASE + "---\n" + BASE, "invalid YAML"),
    ("# only a comment\n", "file is empty"),
])
def test_odd_texts_are_spec_errors(text, expected):
    assert expected in errors(text)


def test_too_many_nodes_are_refused_while_scanning():
    """64 KiB of tiny values would hold the main loop for seconds in the pure-Python passes."""
    assert "job.yaml:1: more than 4000 YAML values" in errors("[" + "a," * 30000 + "]\n")
    assert parse_spec(BASE + "env: {" + ", ".join(f"K{i}: v" for i in range(1990)) + "}\n").env["K1989"] == "v"


def test_a_flood_of_unknown_keys_lists_twenty_problems_and_a_count():
    e = pytest.raises(SpecError, parse_spec, BASE + "".join(f"k{i}: 1\n" for i in range(1500))).value
    assert len(e.problems) == 21 and e.problems[-1] == (None, "", "... and 1480 more problems")


# --- spx submit: relative paths against the job file's directory -----------------------------------


def test_submit_resolves_a_relative_workdir_and_python_against_the_job_files_directory(tmp_path):
    from spx.daemon.core.spec import submitted_text

    jobs = tmp_path / "proj" / "jobs"
    text = "# mine\nname: rel\nworkdir: ..\npython: ../.venv/bin/python\nscript: train.py\nargs: ['--x', '1']\n"
    spec = parse_spec(text, jobs)
    assert (spec.workdir, spec.python, spec.script) == (tmp_path / "proj", tmp_path / "proj/.venv/bin/python", "train.py")
    dropped = submitted_text(text, jobs, "jobs/rel.yaml")
    assert dropped.startswith("# spx submit jobs/rel.yaml: relative workdir/python resolved against ")
    assert parse_spec(dropped) == spec  # the daemon reads the dropped copy as the same job, absolute paths only
    absolute = "name: abs\nworkdir: /srv/x\nscript: t.py\n"
    assert submitted_text(absolute, jobs, "a.yaml") is absolute  # nothing relative: the file as written


def test_a_relative_workdir_is_refused_where_there_is_no_job_file_directory():
    with pytest.raises(SpecError) as e:
        parse_spec("name: rel\nworkdir: ..\nscript: t.py\n")
    assert e.value.problems[0][:2] == (2, "workdir")


def test_errors_of_a_submitted_file_keep_its_own_lines(tmp_path):
    with pytest.raises(SpecError) as e:
        parse_spec("name: rel\nworkdir: proj\nscript: t.py\ngpus: -1\n", tmp_path)
    assert [(line, field) for line, field, _ in e.value.problems] == [(4, "gpus")]


def test_checkpoints_resume_is_auto_never_or_require_and_fresh_sets_never(tmp_path):
    from spx.daemon.core.spec import submitted_text

    assert parse_spec(OK).checkpoints.resume == "auto"
    assert parse_spec("name: ok\nscript: t.py\ncheckpoints: {resume: require}\n").checkpoints.resume == "require"
    assert "checkpoints.resume: Input should be 'auto', 'never' or 'require'" in errors(
        "name: ok\nscript: t.py\ncheckpoints: {resume: sometimes}\n")
    fresh = submitted_text("name: ok\nscript: t.py\ncheckpoints: {keep: 2}\n", tmp_path, "ok.yaml", fresh=True)
    spec = parse_spec(fresh)
    assert (spec.checkpoints.resume, spec.checkpoints.keep) == ("never", 2) and "--fresh" in fresh.splitlines()[0]


def test_restart_on_failure_merges_rules_over_the_defaults():
    spec = parse_spec("name: a\nscript: x.py\nrestart:\n  on_failure: {oom: never, hang: {max: 2}, user-code: counted}\n")
    rules = spec.restart.on_failure
    assert rules["oom"] == "never" and rules["hang"].max == 2 and rules["hang"].within_first_seconds is None
    assert rules["user-code"] == "counted" and rules["preempted"] == "always" and rules["gpu-fault"] == "always"
    default = parse_spec("name: a\nscript: x.py\n").restart.on_failure["user-code"]
    assert (default.max, default.within_first_seconds) == (1, 120.0)


@pytest.mark.parametrize(("rules", "message"), [
    ("{user-error: always}", "restart.on_failure: unknown failure class 'user-error'; the classes are: user-code,"),
    ("{oom: sometimes}", "restart.on_failure: oom: unknown rule 'sometimes'; a rule is always, never, counted or"),
    ("{oom: 3}", "restart.on_failure: oom: a rule is always, never, counted or {max: N"),
    ("{oom: {max: -1}}", "restart.on_failure.oom.max: Input should be greater than or equal to 0"),
    ("{oom: {maxx: 1}}", "restart.on_failure.oom.maxx: unknown field"),
    ("{oom: {max: 1, within_first_seconds: .inf}}", "restart.on_failure.oom.within_first_seconds: Input should be a finite"),
    ("[oom]", "restart.on_failure: must be a mapping of failure class to a rule"),
    ("{lost: always}", "unknown failure class 'lost'"),
])
def test_restart_on_failure_is_strict(rules, message):
    with pytest.raises(SpecError) as e:
        parse_spec(f"name: a\nscript: x.py\nrestart:\n  on_failure: {rules}\n")
    assert message in str(e.value) and ":4:" in str(e.value), str(e.value)
