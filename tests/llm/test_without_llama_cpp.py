"""The embedded backend where llama-cpp-python is not installed (what `scripts/setup.sh` leaves on x86 CPUs unless the
tests or `--llama-cpp` ask for it): `auto` resolves both kinds of work to torch, prompts are tokenized by the Hugging
Face tokenizer, a retry at a temperature is sampled by the torch engine with its seed, and what only llama.cpp does
(packed answers under a grammar) fails with the install hint. Run in a subprocess in which `import llama_cpp` fails;
the real bundled SmolLM2-135M answers."""

import json
import subprocess
import sys

import pytest

from cqg_ray.llm.engines.bundled import BundledModelError, resolve_model

SCRIPT = r'''
import json, sys
sys.modules["llama_cpp"] = None  # as if never installed: every import of it fails
from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.base import BackendError, Request, resolve_engine
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend, llamacpp_budget
from cqg_ray.llm.prompts import answer_messages, cqg_messages, single_answer_messages, SINGLE_ANSWER_PREFIX

llm = LLMConfig(llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", n_threads=1, batch_generate=2), constrained=True)
b = LlamaCppBackend(llm)
gen = [Request(cqg_messages(["Whales sing.", "Bats hunt at night."], ["Sharks swim."], 3), max_tokens=12) for _ in range(2)]
greedy = b.complete(gen)
retry = [Request(gen[0].messages, max_tokens=12, temperature=0.7, seed=s) for s in (2, 2, 3)]
sampled = b.complete(retry)
scored = b.complete([Request(single_answer_messages("A cat sat on the mat.", "Is it about an animal?"), max_tokens=1, yes_no=True,
                             answer_prefix=SINGLE_ANSWER_PREFIX)])
try:
    b.complete([Request(answer_messages("A cat sat.", ["Is it an animal?", "Is it red?"]), max_tokens=20, n_answers=2)])
    packed = "answered"
except BackendError as e:
    packed = str(e)
budget = llamacpp_budget(llm)
print(json.dumps({"engines": [resolve_engine("auto", work=w) for w in ("score", "generate")], "tokens": type(b.tokens).__name__,
                  "llama_loaded": b._model is not None, "greedy": [c.text for c in greedy], "greedy_tokens": [c.completion_tokens for c in greedy],
                  "sampled": [c.text for c in sampled], "p_yes": scored[0].p_yes, "packed": packed, "budget": budget.engine,
                  "budget_tokens": budget.count(gen[0]), "prompt_tokens": greedy[0].prompt_tokens}))
'''


def test_the_torch_engines_answer_without_llama_cpp():
    try:
        resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["engines"][0].startswith("torch-") and out["engines"][1] == out["engines"][0]
    assert out["tokens"] == "HFChatTokens" and out["llama_loaded"] is False
    assert out["greedy"][0] == out["greedy"][1] and out["greedy"][0].strip() and out["greedy_tokens"] == [12, 12]
    assert out["sampled"][0] == out["sampled"][1] != out["sampled"][2]  # seeded: the same seed, the same draw
    assert 0.0 <= out["p_yes"][0] <= 1.0
    assert "need llama-cpp-python" in out["packed"] and "answer_mode: single" in out["packed"]
    assert out["budget"] == "Hugging Face tokenizer of bundled:smollm2-135m" and out["budget_tokens"] == out["prompt_tokens"]
