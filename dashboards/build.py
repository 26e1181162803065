"""Generate the Grafana dashboards: the Python in spx_dashboards/ is the source of truth, the JSON is
checked in so it can be imported without running anything.

    python dashboards/build.py           # rewrite dashboards/*.json
    python dashboards/build.py --check   # exit 1 if a checked-in file differs from what the code builds

tests/dashboards/test_dashboards_schema.py runs the check, so an edit to the JSON by hand fails CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from spx_dashboards import host_gpus, jobs, nvlink

HERE = Path(__file__).resolve().parent

DASHBOARDS: dict[str, Callable[[], dict]] = {
    "spx-host-gpus.json": host_gpus.build,
    "spx-nvlink.json": nvlink.build,
    "spx-jobs.json": jobs.build,
}


def render(build: Callable[[], dict]) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into (default: dashboards/)")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = args.out / name, render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run: python dashboards/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
