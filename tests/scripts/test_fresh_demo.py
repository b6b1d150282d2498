"""scripts/fresh_demo.sh's arguments (what runs before it clones): --help explains, a folder it would empty is refused."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fresh_demo.sh"


def test_help_says_what_is_fresh():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    assert "empty" in r.stdout and "bash scripts/fresh_demo.sh [DIR] [-- demo arguments]" in r.stdout and "--avx2-env" in r.stdout


def test_the_checkout_its_folders_and_root_are_refused_untouched(tmp_path):
    for folder in (ROOT, ROOT / "tests", Path("/")):
        r = subprocess.run(["bash", str(SCRIPT), str(folder), "--", "--minutes", "1"], capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"scripts/fresh_demo.sh: refusing DIR={folder}\n")
    assert (ROOT / "tests" / "scripts" / "test_fresh_demo.py").exists()
