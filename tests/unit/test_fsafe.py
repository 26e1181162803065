"""fsafe: root's reads and writes under user-writable directories never follow a link, never block
on a FIFO, never read past a cap, and never trust a directory root did not make."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import pytest

from spx.daemon.userfs import fsafe
from spx.daemon.userfs.fsafe import UserPathError

NOBODY = 65534


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "d").mkdir()
    return tmp_path


def test_read_file_reads_a_regular_file(base):
    (base / "d" / "f").write_bytes(b"hello")
    assert fsafe.read_file(base / "d" / "f", base) == b"hello"


def test_read_file_refuses_a_symlink_at_the_end(base):
    secret = base / "secret"
    secret.write_text("root only")
    os.symlink(secret, base / "d" / "f")
    with pytest.raises(UserPathError) as e:
        fsafe.read_file(base / "d" / "f", base)
    assert e.value.errno == errno.ELOOP


def test_read_file_refuses_a_symlinked_directory_on_the_way(base):
    (base / "real").mkdir()
    (base / "real" / "f").write_text("x")
    os.symlink(base / "real", base / "d" / "via")
    with pytest.raises(UserPathError):
        fsafe.read_file(base / "d" / "via" / "f", base)


def test_read_file_on_a_fifo_returns_at_once_with_an_error(base):
    os.mkfifo(base / "d" / "f")
    t0 = time.monotonic()
    with pytest.raises(UserPathError, match="not a regular file"):
        fsafe.read_file(base / "d" / "f", base)
    assert time.monotonic() - t0 < 1.0


def test_read_file_refuses_more_than_the_cap(base):
    (base / "d" / "f").write_bytes(b"x" * 1001)
    with pytest.raises(UserPathError) as e:
        fsafe.read_file(base / "d" / "f", base, cap=1000)
    assert e.value.errno == errno.EFBIG
    assert fsafe.read_file(base / "d" / "f", base, cap=1001) == b"x" * 1001


def test_read_file_refuses_a_path_outside_its_base(base):
    with pytest.raises(UserPathError):
        fsafe.read_file(Path("/etc/passwd"), base)
    with pytest.raises(UserPathError):
        fsafe.read_file(base / "d" / ".." / ".." / "etc" / "passwd", base)


def test_read_tail_gives_the_last_bytes(base):
    (base / "d" / "log").write_bytes(b"a" * 100 + b"tail")
    assert fsafe.read_tail(base / "d" / "log", base, 4) == b"tail"
    assert fsafe.read_tail(base / "d" / "log", base, 1000) == b"a" * 100 + b"tail"


def test_create_excl_never_writes_through_a_dangling_symlink(base):
    target = base / "elsewhere"
    os.symlink(target, base / "d" / "x.error")
    fd = fsafe.open_trusted_dir(base / "d")
    try:
        with pytest.raises(FileExistsError):
            fsafe.create_excl(fd, "x.error", 0o600)
    finally:
        os.close(fd)
    assert not target.exists() and not target.is_symlink()


def test_create_excl_sets_mode_and_owner_on_the_fd(base):
    fd = fsafe.open_trusted_dir(base / "d")
    try:
        wfd = fsafe.create_excl(fd, "new", 0o640, NOBODY, NOBODY)
        os.close(wfd)
    finally:
        os.close(fd)
    st = os.stat(base / "d" / "new")
    assert stat.S_IMODE(st.st_mode) == 0o640 and (st.st_uid == NOBODY or os.geteuid() != 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another user")
def test_open_append_refuses_links_and_other_users_files(base):
    secret = base / "secret"
    secret.write_text("keep")
    os.symlink(secret, base / "d" / "sym")
    os.link(secret, base / "d" / "hard")
    (base / "d" / "theirs").write_text("x")
    os.chown(base / "d" / "theirs", 1, 1)
    fd = fsafe.open_trusted_dir(base / "d")
    try:
        for name in ("sym", "hard", "theirs"):
            with pytest.raises(UserPathError):
                fsafe.open_append(fd, name, 0o640, NOBODY, NOBODY)
        os.close(fsafe.open_append(fd, "fresh", 0o640, NOBODY, NOBODY))
        wfd = fsafe.open_append(fd, "fresh", 0o640, NOBODY, NOBODY)
        fsafe.write_all(wfd, b"line\n")
        os.close(wfd)
    finally:
        os.close(fd)
    assert secret.read_text() == "keep" and os.stat(secret).st_uid == 0
    assert (base / "d" / "fresh").read_bytes() == b"line\n"


def _aside(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.untrusted-")]


def test_ensure_root_dir_creates_it_with_the_mode(base):
    fsafe.ensure_root_dir(base / "d" / "rejected", 0o711)
    st = os.lstat(base / "d" / "rejected")
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o711 and st.st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another user")
def test_ensure_root_dir_moves_aside_a_directory_a_user_made_first(base):
    planted = base / "d" / "rejected"
    planted.mkdir()
    (planted / "trap").write_text("mine")
    os.chown(planted, NOBODY, NOBODY)
    fsafe.ensure_root_dir(planted, 0o711)
    assert os.lstat(planted).st_uid == 0 and list(planted.iterdir()) == []
    (aside,) = _aside(base / "d", "rejected")
    assert (base / "d" / aside / "trap").read_text() == "mine"


@pytest.mark.parametrize("kind", ["symlink", "file", "world-writable"])
def test_ensure_root_dir_moves_aside_links_files_and_open_directories(base, kind):
    target = base / "d" / "x"
    if kind == "symlink":
        (base / "elsewhere").mkdir()
        os.symlink(base / "elsewhere", target)
    elif kind == "file":
        target.write_text("f")
    else:
        target.mkdir()
        target.chmod(0o777)
    fsafe.ensure_root_dir(target, 0o755)
    st = os.lstat(target)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755
    assert len(_aside(base / "d", "x")) == 1
    if kind == "symlink":
        assert list((base / "elsewhere").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_ensure_owned_dir_is_handed_over_on_its_fd(base):
    fd = fsafe.open_trusted_dir(base / "d")
    try:
        os.close(fsafe.ensure_owned_dir_at(fd, "mine", 0o750, NOBODY, NOBODY))
        os.symlink("/etc", base / "d" / "link")
        os.close(fsafe.ensure_owned_dir_at(fd, "link", 0o750, NOBODY, NOBODY))
    finally:
        os.close(fd)
    assert os.lstat(base / "d" / "mine").st_uid == NOBODY
    assert os.lstat(base / "d" / "link").st_uid == NOBODY and stat.S_ISDIR(os.lstat(base / "d" / "link").st_mode)
    assert os.stat("/etc").st_uid == 0


def test_chmod_socket_at_changes_the_socket_and_never_follows_a_link(tmp_path):
    import socket as socketlib

    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    sock.bind(str(tmp_path / "s.sock"))
    target = tmp_path / "target"
    target.write_text("x")
    target.chmod(0o600)
    (tmp_path / "link").symlink_to(target)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsafe.chmod_socket_at(fd, "s.sock", 0o666)
        assert stat.S_IMODE(os.stat(tmp_path / "s.sock").st_mode) == 0o666
        with pytest.raises(OSError):
            fsafe.chmod_socket_at(fd, "link", 0o666)
        with pytest.raises(fsafe.UserPathError):
            fsafe.chmod_socket_at(fd, "target", 0o666)
    finally:
        os.close(fd)
        sock.close()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
