"""The job the single-pass kill test runs in a subprocess: 40 single-pass (text, question) pairs through the runner
and the embedded llama.cpp engine, four per batch.  ``python single_pass_job.py RUN_DIR``"""

import sys

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.answers import answer_requests
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS

QUESTIONS = [f"Is the text about topic number {j}?" for j in range(5)]

if __name__ == "__main__":
    # no shard before the end however slow the machine (flush_every and flush_s beyond the job): the kill finds its answers in the journal only
    llm = LLMConfig(flush_every=1000, flush_s=3600, llamacpp=LlamaCppConfig(score_engine="llamacpp", score_batch=4, n_threads=LLM_THREADS))
    reqs = [r for i in range(8) for r in answer_requests(f"Document {i} is a short note about subject {i % 3}.", range(5), QUESTIONS, "single", 20, 200)]
    results = run_requests(reqs, llm, RunDir(sys.argv[1]), "labels", progress=False)
    print("DONE", sum(r.ok for r in results), sum(r.cached for r in results), flush=True)
