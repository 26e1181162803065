"""service/gpu_rows.py: what `spx gpus` and `spx top` show per GPU, read from the backend — here the
bundled fake 8×H100 fixture, whose GPU 3 has NVLink link 7 down (in process: no NVML thread)."""

from __future__ import annotations

from spx.daemon.gpu.backend import open_backend
from spx.daemon.service.gpu_rows import gpu_rows


def test_a_gpu_with_a_link_down_says_so_and_the_others_are_ok():
    backend = open_backend("fake")
    try:
        health = {r.index: r.health for r in gpu_rows(backend, [])}
    finally:
        backend.close()
    assert health == {**{i: "ok" for i in range(8)}, 3: "NVLink link 7 down"}
