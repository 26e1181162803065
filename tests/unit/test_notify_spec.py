"""`notify:` in a job file and in the daemon config: what is accepted, what is refused and why
(the URL and the command come from a user and are acted on by root: core/notify_spec.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spx.daemon.core.config import DaemonConfig
from spx.daemon.core.notify_spec import MAX_COMMAND_ARGS, MAX_URL_CHARS, Notify, webhook_problem
from spx.daemon.core.spec import SpecError, parse_spec

BASE = "name: a\nscript: a.py\n"


def test_a_job_file_names_a_webhook_a_command_and_its_events():
    spec = parse_spec(BASE + "notify:\n  webhook: https://hooks.example.org/T0/x?token=abc\n"
                      "  command: [notify-send, done]\n  events: [failed, restarted]\n  timeout_seconds: 5\n")
    assert spec.notify is not None
    assert spec.notify.webhook == "https://hooks.example.org/T0/x?token=abc"
    assert spec.notify.argv == ["notify-send", "done"]
    assert spec.notify.wants("failed") and spec.notify.wants("restarted")
    assert not spec.notify.wants("succeeded")
    assert spec.notify.timeout_seconds == 5


def test_defaults_are_failed_only_and_ten_seconds_and_a_line_runs_under_sh():
    n = Notify(command="echo $SPX_JOB >> ~/ended")
    assert n.events == ["failed"] and n.timeout_seconds == 10.0
    assert n.argv == ["/bin/sh", "-c", "echo $SPX_JOB >> ~/ended"]


def test_an_empty_notify_tells_no_one():
    spec = parse_spec(BASE + "notify: {}\n")
    assert spec.notify is not None and not spec.notify.wants("failed")
    assert parse_spec(BASE).notify is None


@pytest.mark.parametrize(("url", "why"), [
    ("file:///etc/shadow", "only http"),
    ("gopher://h/x", "only http"),
    ("http+unix://%2Frun%2Fdocker.sock/x", "only http"),
    ("https:///nohost", "names no host"),
    ("https://user:secret@h/x", "credentials"),
    ("https://h/a b", "spaces"),
    ("https://h/\nHost: evil", "spaces or control"),
    ("https://h:99999/x", "not a URL"),
    ("https://h/" + "a" * MAX_URL_CHARS, f"at most {MAX_URL_CHARS}"),
])
def test_webhooks_other_than_plain_http_urls_are_refused(url, why):
    assert why in (webhook_problem(url) or "")
    with pytest.raises(ValidationError):
        Notify(webhook=url)


def test_a_refused_webhook_is_an_intake_error_naming_the_field():
    with pytest.raises(SpecError) as e:
        parse_spec(BASE + "notify:\n  webhook: file:///etc/passwd\n")
    assert "webhook" in str(e.value)


@pytest.mark.parametrize("body", [
    "notify:\n  events: [failed, failed]\n",                  # twice
    "notify:\n  events: [exploded]\n",                        # no such event
    "notify:\n  timeout_seconds: 61\n",                       # past the minute
    "notify:\n  timeout_seconds: 0\n",
    "notify:\n  timeout_seconds: .inf\n",
    "notify:\n  command: []\n",                               # no program
    "notify:\n  command: '  '\n",
    "notify:\n  command: [\"a\\0b\"]\n",                        # NUL
    "notify:\n  retries: 100\n",                              # unknown key
    f"notify:\n  command: [{', '.join(['x'] * (MAX_COMMAND_ARGS + 1))}]\n",
    "notify:\n  command: [" + "y" * 5000 + "]\n",
])
def test_out_of_bounds_values_are_refused(body):
    with pytest.raises(SpecError):
        parse_spec(BASE + body)


def test_the_config_default_takes_the_same_fields_and_is_off_unless_set(tmp_path):
    assert DaemonConfig.rooted(tmp_path).notify is None
    cfg = DaemonConfig.rooted(tmp_path, notify={"webhook": "http://127.0.0.1:9/x", "events": ["failed", "succeeded"]})
    assert cfg.notify is not None and cfg.notify.wants("succeeded")
    with pytest.raises(ValidationError):
        DaemonConfig.rooted(tmp_path, notify={"webhook": "ftp://h/x"})
