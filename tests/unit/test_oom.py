from spx.daemon.run.oom import kernel_oom_victims, oom_killed


def test_oom_victims_are_read_from_kernel_log_records(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1234,5678,-;python invoked oom-killer: gfp_mask=0x140cca\n"
        "3,1235,5679,-;Out of memory: Killed process 4242 (python) total-vm:123kB\n"
        "6,1236,5680,-;oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=4343,uid=1000\n"
    )
    assert kernel_oom_victims(str(kmsg)) == {4242, 4343}
    assert oom_killed({1, 4242}, str(kmsg)) and not oom_killed({7}, str(kmsg))


def test_unreadable_kernel_log_means_no_oom(tmp_path):
    assert kernel_oom_victims(str(tmp_path / "missing")) == set()
