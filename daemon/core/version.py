"""The installed package's version: what `--version`, the man pages and the daemon's first log line
say. Here, at the bottom, so `spx --help` does not import the daemon's loop to print it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def daemon_version() -> str:
    try:
        return version("spx-trainer")
    except PackageNotFoundError:
        return "0+unknown"
