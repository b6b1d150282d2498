"""The order the two workers take test files in: longest first by tests/durations.json, from scripts/test_durations.py."""

import json
import subprocess
import sys
from pathlib import Path


from tests.conftest import DURATIONS, heaviest_files_first

ROOT = Path(__file__).resolve().parents[2]


class Item:
    def __init__(self, nodeid: str, marker: str | None = None):
        self.nodeid, self.marker = nodeid, marker

    def get_closest_marker(self, name):
        return name if name == self.marker else None


def test_files_go_longest_first_and_unlisted_files_by_their_tiers():
    items = [Item("a.py::t1"), Item("b.py::t1", "ray"), Item("a.py::t2"), Item("c.py::t1", "slow"), Item("d.py::t1"), Item("b.py::t2", "ray")]
    order = heaviest_files_first(items, {"a.py": 200.0, "d.py": 20.0})
    # a 200 s (listed), c one slow test (150 s guessed), b two ray tests (30 s), d 20 s (listed)
    assert [i.nodeid for i in order] == ["a.py::t1", "a.py::t2", "c.py::t1", "b.py::t1", "b.py::t2", "d.py::t1"]


def test_a_file_that_waits_for_a_set_up_beside_the_tests_comes_after_other_work():
    items = [Item("v.py::t1", "vllm"), Item("a.py::t1"), Item("b.py::t1"), Item("c.py::t1"), Item("d.py::t1")]
    seconds = {"v.py": 600.0, "a.py": 500.0, "b.py": 300.0, "c.py": 200.0, "d.py": 100.0}
    # the vLLM file is the longest, but goes after the first files worth AFTER_SETUP's 900 s: a, b, c (1,000 s)
    assert [i.nodeid.split(".")[0] for i in heaviest_files_first(items, seconds)] == ["a", "b", "c", "v", "d"]
    # fewer seconds of other files than that: it goes last
    assert [i.nodeid.split(".")[0] for i in heaviest_files_first(items[:3], seconds)] == ["a", "b", "v"]


def test_durations_json_is_made_from_a_durations_report(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("\n".join(["============ slowest durations ============",
                              "300.50s call     tests/x.py::test_a",
                              "20.00s setup    tests/x.py::test_b",
                              "0.50s teardown tests/y.py::test_c[param::x]",
                              "(12 durations < 0.005s hidden.)", "2 passed"]))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_durations.py"), str(log)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"tests/x.py": 320.5, "tests/y.py": 0.5}


def test_the_committed_durations_name_test_files_that_exist():
    seconds = json.loads(DURATIONS.read_text())
    assert len(seconds) >= 20 and all(v >= 0 for v in seconds.values())  # a quick file rounds to 0.0 s
    missing = [f for f in seconds if not (ROOT / f).exists()]
    assert not missing, f"tests/durations.json names files that are gone: {missing} (remake it: scripts/test_durations.py)"
