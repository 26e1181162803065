"""Data staging: skip-identical, resume of an interrupted part, symlinks, free space, the job's user.

Real files and real `python -m spx.daemon.staging.copier` subprocesses; the only injected thing is statvfs
in the no-space test that cannot mount a small tmpfs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spx.daemon.staging.copier import (
    PART_SUFFIX,
    StageError,
    StageFailure,
    StageProgress,
    StageResult,
    command,
    parse_bytes,
    parse_event,
    spawn,
    stage_tree,
)

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def tree(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """rel → (content, mtime_ns, mode) of the regular files under root (parts excluded)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and not p.name.endswith(PART_SUFFIX):
            st = p.stat()
            out[str(p.relative_to(root))] = (p.read_bytes(), st.st_mtime_ns, st.st_mode & 0o777)
    return out


@pytest.fixture
def src(tmp_path: Path) -> Path:
    s = tmp_path / "src"
    write(s / "a.bin", os.urandom(300_000), 1_600_000_000_123_456_789)
    write(s / "sub" / "b.txt", b"hello\n")
    write(s / "sub" / "deeper" / "c.bin", os.urandom(5_000_001))
    write(s / "empty", b"")
    (s / "sub" / "b.txt").chmod(0o640)
    return s


def test_copies_the_tree_with_contents_modes_and_mtimes(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    result = stage_tree(src, dst)
    assert tree(dst) == tree(src)
    assert result.files_total == result.files_copied == 4
    assert result.bytes_copied == result.bytes_total == 300_000 + 6 + 5_000_001
    assert not list(dst.rglob("*" + PART_SUFFIX))


def test_second_run_skips_identical_files_and_copies_zero_bytes(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    stage_tree(src, dst)
    again = stage_tree(src, dst)
    assert (again.bytes_copied, again.files_copied) == (0, 0)
    assert (again.files_skipped, again.bytes_skipped) == (4, again.bytes_total)


def test_a_changed_source_file_is_copied_again(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    stage_tree(src, dst)
    write(src / "sub" / "b.txt", b"HELLO\n")  # same size, new mtime
    again = stage_tree(src, dst)
    assert (again.files_copied, again.bytes_copied) == (1, 6)
    assert (dst / "sub" / "b.txt").read_bytes() == b"HELLO\n"


def test_symlinks_inside_are_recreated_and_links_out_of_the_tree_are_not_followed(
    src: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    write(secret, b"not part of the data set")
    (src / "sub" / "to_a").symlink_to("../a.bin")
    (src / "absolute_inside").symlink_to(src / "sub" / "deeper")
    (src / "escape").symlink_to(secret)
    (src / "escape_dir").symlink_to(tmp_path)
    (src / "dangling").symlink_to("nowhere")
    dst = tmp_path / "dst"
    result = stage_tree(src, dst)
    assert os.readlink(dst / "sub" / "to_a") == "../a.bin"
    assert os.readlink(dst / "absolute_inside") == "sub/deeper"
    assert (dst / "absolute_inside" / "c.bin").read_bytes() == (src / "sub" / "deeper" / "c.bin").read_bytes()
    for name in ("escape", "escape_dir", "dangling"):
        assert not os.path.lexists(dst / name)
    assert len(result.warnings) == 3
    assert any("escape ->" in w and "points outside" in w for w in result.warnings)
    assert any("dangling" in w for w in result.warnings)
    assert b"not part" not in b"".join(c for c, _, _ in tree(dst).values())


def test_target_inside_the_source_is_refused(src: Path) -> None:
    with pytest.raises(StageError, match="inside the source"):
        stage_tree(src, src / "sub" / "copy")


def statvfs_with_free(free_bytes: int):
    def fake(path: str) -> os.statvfs_result:
        real = os.statvfs(path)
        return os.statvfs_result(
            (real.f_bsize, 4096, real.f_blocks, free_bytes // 4096, free_bytes // 4096,
             real.f_files, real.f_ffree, real.f_favail, real.f_flag, real.f_namemax)
        )

    return fake


def test_no_space_is_refused_up_front_with_need_and_free(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "big", b"x" * (1 << 20))
    dst = tmp_path / "dst"
    with pytest.raises(StageError) as err:
        stage_tree(src, dst, statvfs=statvfs_with_free(200 << 10))
    mount = _mount_point(tmp_path)
    assert str(err.value) == f"no space on {mount}: need 1.0 MiB, 200.0 KiB free"
    assert not dst.exists()


def test_free_space_counts_only_what_is_still_to_copy(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    stage_tree(src, dst)
    assert stage_tree(src, dst, statvfs=statvfs_with_free(0)).bytes_copied == 0


def _mount_point(path: Path) -> str:
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    mnt = Path(tempfile.mkdtemp(prefix="spx-tmpfs-"))
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
        yield mnt
        subprocess.run(["umount", str(mnt)], check=True)
    finally:
        mnt.rmdir()


def test_no_space_on_a_real_small_filesystem(small_tmpfs: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "one", b"1" * (6 << 20))
    write(src / "two", b"2" * (6 << 20))
    r = subprocess.run(command(src, small_tmpfs / "data"), capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 1
    failure = parse_event(r.stdout.splitlines()[-1])
    assert failure == StageFailure(f"no space on {small_tmpfs}: need 12.0 MiB, 8.0 MiB free")
    assert list(small_tmpfs.iterdir()) == []


def test_parse_bytes() -> None:
    assert parse_bytes("200M") == 200 << 20
    assert parse_bytes("1.5G") == 3 << 29
    assert parse_bytes("4096") == 4096
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_subprocess_prints_progress_lines_and_a_final_result(src: Path, tmp_path: Path) -> None:
    write(src / "slow.bin", os.urandom(3 << 20))
    argv = command(src, tmp_path / "dst", bwlimit=2 << 20)
    r = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    events = [parse_event(line) for line in r.stdout.splitlines()]
    progress = [e for e in events if isinstance(e, StageProgress)]
    assert len(progress) >= 2  # ~1.5 s of copying at 2 MiB/s, reports every 0.5 s
    assert all(a.bytes_done <= b.bytes_done for a, b in zip(progress, progress[1:], strict=False))
    assert "staging " in progress[0].summary() and "files" in progress[0].summary()
    result = events[-1]
    assert isinstance(result, StageResult)
    assert result.bytes_copied == result.bytes_total == sum(len(c) for c, _, _ in tree(src).values())
    assert result.io.get("wchar", 0) >= result.bytes_copied or result.io == {}
    assert tree(tmp_path / "dst") == tree(src)


def test_interrupted_copy_resumes_the_part_and_copies_each_byte_once(tmp_path: Path, interrupt) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = os.urandom(24 << 20)
    write(src / "one.bin", data)
    copied_before, _ = interrupt(command(src, dst, bwlimit=8 << 20), want_copied=4 << 20)
    [part] = dst.rglob("*" + PART_SUFFIX)
    assert part.stat().st_size == copied_before
    assert 0 < copied_before < len(data)

    result = stage_tree(src, dst)
    assert (result.files_resumed, result.bytes_resumed) == (1, copied_before)
    assert result.bytes_copied == len(data) - copied_before
    assert (dst / "one.bin").read_bytes() == data
    assert not part.exists()


def test_a_part_left_from_an_older_source_version_is_restarted(tmp_path: Path, interrupt) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src / "one.bin", os.urandom(24 << 20))
    interrupt(command(src, dst, bwlimit=8 << 20), want_copied=4 << 20)
    new = os.urandom(24 << 20)
    write(src / "one.bin", new)  # same size, new content and mtime: the part is stale
    result = stage_tree(src, dst)
    assert (result.files_resumed, result.bytes_copied) == (0, len(new))
    assert (dst / "one.bin").read_bytes() == new


def _python_for(uid: int, base: Path) -> tuple[str, dict[str, str]]:
    """An interpreter that uid can run, with spx.daemon importable (the venv may live under a
    private home; staging is stdlib-only, so the system python with a path to the package will do)."""
    try:
        if subprocess.run([sys.executable, "-c", "import spx.daemon"], user=uid, capture_output=True).returncode == 0:
            return sys.executable, ENV
    except PermissionError:
        pass
    import spx.daemon

    pkg = base / "pkg" / "spx"
    pkg.mkdir(parents=True)
    (pkg / "daemon").symlink_to(Path(spx.daemon.__file__).parent)
    for p in (base / "pkg", pkg):
        p.chmod(0o755)
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None:
        pytest.skip(f"no interpreter that uid {uid} may run")
    return system, {**ENV, "PYTHONPATH": str(base / "pkg")}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the copier as another user")
def test_runs_with_the_job_users_permissions() -> None:
    """As the supervisor does it: the copier runs as the job's uid/gid, so it writes files the user
    owns and cannot read what the user cannot read; the error names that file."""
    base = Path(tempfile.mkdtemp(prefix="spx-stage-user-"))
    try:
        base.chmod(0o755)
        src, dst = base / "src", base / "dst"
        write(src / "mine.bin", b"m" * 1000)
        dst.mkdir()
        os.chown(dst, 65534, 65534)
        src.chmod(0o755)
        python, env = _python_for(65534, base)

        def run() -> tuple[int, str]:
            proc = spawn(src, dst, uid=65534, gid=65534, python=python, env=env)
            out, _ = proc.communicate(timeout=120)
            return proc.returncode, out

        rc, out = run()
        assert rc == 0, out
        assert (dst / "mine.bin").stat().st_uid == 65534
        write(src / "private.bin", b"p" * 10)
        (src / "private.bin").chmod(0o600)
        rc, out = run()
        assert rc == 1
        assert json.loads(out.splitlines()[-1]) == {
            "event": "error", "error": f"cannot read {src}/private.bin: Permission denied"
        }
    finally:
        shutil.rmtree(base)


def test_module_entry_rejects_bad_usage() -> None:
    r = subprocess.run([sys.executable, "-m", "spx.daemon.staging.copier"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2
