"""Per-file test seconds from pytest's ``--durations=0`` report, for the order in which the workers take the files.

    bash scripts/test.sh --durations=0 | tee run.log
    python scripts/test_durations.py run.log [more.log ...] > tests/durations.json

Each file's seconds are the sum of its tests' setup, call and teardown times (a later log wins for a file it lists).
``tests/conftest.py`` hands files to the two workers longest first by these; a file it does not list is estimated
from its markers.
"""

import json
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def file_seconds(lines) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for line in lines:
        m = LINE.match(line)
        if m:
            out[m.group(2)] += float(m.group(1))
    return dict(out)


def main(paths: list[str]) -> int:
    merged: dict[str, float] = {}
    for p in paths:
        with open(p, errors="replace") as f:
            merged.update(file_seconds(f))
    print(json.dumps({k: round(v, 1) for k, v in sorted(merged.items(), key=lambda kv: -kv[1])}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
