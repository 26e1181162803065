"""The issue's measurement: a 1 GiB tree of 1,000 files, staged, killed -9 mid-file, resumed.

    .venv/bin/python -m pytest tests/staging/test_staging_1gib.py -m slow -s

Bytes copied are counted three ways: the copier's own result counters, the bytes found in DST after
the kill (finished files + the part), and the kernel's per-process `wchar` counter (every
copy_file_range/sendfile/write byte), minus what the copier wrote to its stdout. All three must add
up to the tree size exactly; then the trees must hash equal, and a third run must copy nothing.
Uses ~2 GiB of disk once under a private temp dir, removed at the end.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from spx.daemon.staging.copier import PART_SUFFIX, StageResult, command, parse_event

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
GIB = 1 << 30
FILES = 1000
BIG = 128 << 20


def make_tree(root: Path) -> int:
    """1,000 files, exactly 1 GiB: four 128 MiB files spread among 996 small ones of random size."""
    rng = random.Random(1234)
    small = [rng.randint(1, 1 << 20) for _ in range(FILES - 4)]
    scale = (GIB - 4 * BIG) / sum(small)
    small = [max(1, int(s * scale)) for s in small]
    small[-1] += GIB - 4 * BIG - sum(small)
    sizes = small[:200] + [BIG] + small[200:450] + [BIG] + small[450:700] + [BIG] + small[700:] + [BIG]
    for i, size in enumerate(sizes):
        path = root / f"d{i // 100:02d}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            left = size
            while left:
                n = min(left, 16 << 20)
                fh.write(os.urandom(n))
                left -= n
    assert sum(sizes) == GIB and len(sizes) == FILES
    return GIB


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0")
            with open(p, "rb") as fh:
                while chunk := fh.read(8 << 20):
                    h.update(chunk)
    return h.hexdigest()


def run_to_end(argv: list[str]) -> tuple[StageResult, int]:
    """Run the copier to completion; (its result, its wchar minus its stdout before the last line)."""
    r = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    lines = r.stdout.splitlines(keepends=True)
    result = parse_event(lines[-1])
    assert isinstance(result, StageResult)
    return result, result.io["wchar"] - sum(len(x.encode()) for x in lines[:-1])


@pytest.mark.slow
def test_1gib_tree_interrupted_and_resumed_copies_each_byte_once(interrupt) -> None:
    base = Path(tempfile.mkdtemp(prefix="spx-stage-1gib-"))
    try:
        src, dst = base / "src", base / "dst"
        total = make_tree(src)

        # Run 1, rate-limited so the kill lands mid-way (after ~40 %), inside a 128 MiB file.
        copied_1, _ = interrupt(command(src, dst, bwlimit=200 << 20), want_copied=int(total * 0.4))
        parts = list(dst.rglob("*" + PART_SUFFIX))
        finished = [p for p in dst.rglob("*.bin") if p.is_file()]
        on_disk = sum(p.stat().st_size for p in parts + finished)
        assert len(parts) == 1
        part_size = parts[0].stat().st_size
        assert 0 < part_size < BIG
        assert copied_1 == on_disk

        # Run 2, unthrottled: finishes the part from its length, skips finished files.
        result, copied_2 = run_to_end(command(src, dst))
        assert (result.files_resumed, result.bytes_resumed) == (1, part_size)
        assert result.files_skipped == len(finished)
        assert result.bytes_copied == copied_2 == total - on_disk
        assert copied_1 + copied_2 == total
        assert tree_hash(src) == tree_hash(dst)

        # Run 3: everything identical, nothing copied.
        again, copied_3 = run_to_end(command(src, dst))
        assert (again.bytes_copied, copied_3, again.files_skipped) == (0, 0, FILES)

        print(
            f"\nstaging 1 GiB / {FILES} files: run 1 copied {copied_1} B then kill -9 "
            f"(1 part of {part_size} B, {len(finished)} files done); "
            f"run 2 copied {copied_2} B ({result.files_copied} files, 1 resumed) in {result.elapsed_s:.2f} s "
            f"= {result.bytes_per_second / (1 << 20):.0f} MiB/s; total {copied_1 + copied_2} B "
            f"== tree {total} B; write_bytes run 2 {result.io.get('write_bytes')}; run 3 copied {copied_3} B"
        )
    finally:
        shutil.rmtree(base)
