"""scripts/cpu_map.py: a command's CPU time by kind of process."""

import json
import subprocess
import sys
from pathlib import Path
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
cpu_map = load_script("scripts/cpu_map.py", "cpu_map")


def test_kinds_name_ray_titles_test_workers_and_programs():
    assert cpu_map.kind("ray::MapWorker(MapBatches(EncodeUnits))") == "ray::MapWorker"
    assert cpu_map.kind("ray::IDLE") == "ray::IDLE"
    assert cpu_map.kind("/x/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))") == "pytest worker"
    assert cpu_map.kind("/x/python -u /x/ray/_private/log_monitor.py --session-dir=/tmp/ray/s") == "log_monitor"
    assert cpu_map.kind("/x/python -m llama_cpp.server --model m.gguf") == "llama_cpp.server"
    assert cpu_map.kind("/usr/bin/kworker") == "kworker"
    # a test's subprocess is its own kind, though its arguments name pytest's temporary folders
    assert cpu_map.kind("python -m pytest tests/x.py") == "pytest worker"
    assert cpu_map.kind("python -m cqg_ray.cli run --config /tmp/pytest-of-root/pytest-1/full.yaml") == "cqg_ray.cli"


def test_a_process_alive_before_counts_only_what_it_used_during_the_command():
    rows = [{"pid": 1, "start": 0.0, "began": 10.0, "last": 20.0, "cpu0": 100.0, "cpu": 103.0, "cmd": "ray::IDLE"},
            {"pid": 2, "start": 12.0, "began": 10.0, "last": 20.0, "cpu0": 1.0, "cpu": 5.0, "cmd": "ray::IDLE"},
            {"pid": 3, "start": 11.0, "began": 10.0, "last": 19.0, "cpu0": 0.5, "cpu": 2.0, "cmd": "/usr/bin/raylet --x"}]
    out = cpu_map.table(rows).splitlines()
    assert out[0] == "10 CPU-seconds sampled in 3 processes"
    assert out[2].split() == ["8", "80.0%", "2", "ray::IDLE"]  # 3 of the old one's 103, all 5 of the new one's
    assert out[3].split() == ["2", "20.0%", "1", "raylet"]


def test_a_command_is_run_sampled_and_its_status_returned(tmp_path):
    busy = "import time\nwhile time.process_time() < 2.0: pass\nraise SystemExit(3)"  # two CPU-seconds, however busy the machine
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_map.py"), "--every", "0.2", "--out", str(tmp_path / "s.jsonl"), "--",
                        sys.executable, "-c", busy], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["cmd"].startswith(f"{sys.executable} -c import time")]  # the command (not cpu_map's own line)
    assert len(mine) == 1 and 1.0 <= mine[0]["cpu"] <= 2.5  # what it used after the last sample is missed
    assert "CPU-seconds sampled" in r.stderr
