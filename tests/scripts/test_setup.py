"""scripts/setup.sh's arguments (what runs before it touches .venv): --help explains, an unknown argument stops it."""

import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


def test_help_says_when_llama_cpp_is_built():
    r = subprocess.run(["bash", str(SETUP), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert "bash scripts/setup.sh --llama-cpp" in r.stdout and "no AVX2" in r.stdout


def test_an_unknown_argument_stops_it_before_any_set_up():
    r = subprocess.run(["bash", str(SETUP), "--llama"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown argument --llama" in r.stderr and r.stdout == ""
