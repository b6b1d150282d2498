"""The job the generation kill test runs in a subprocess: 6 CQG prompts through the runner and the embedded torch
generation engine (SmolLM2-135M: the path, not the model, is under test), two per batch.  ``python generate_job.py RUN_DIR``"""

import sys

from cqg_ray.config import LLMConfig, LlamaCppConfig
from cqg_ray.llm.base import Request
from cqg_ray.llm.prompts import cqg_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir
from tests.conftest import LLM_THREADS

TEXTS = [f"Document {i} is a short note about subject {i % 3}." for i in range(4)]

if __name__ == "__main__":
    # no shard before the end however slow the machine (flush_every and flush_s beyond the job): the kill finds its answers in the journal only
    llm = LLMConfig(flush_every=1000, flush_s=3600,
                    llamacpp=LlamaCppConfig(model="bundled:smollm2-135m", generate_engine="torch-float32", batch_generate=2, n_threads=LLM_THREADS))
    reqs = [Request(cqg_messages([t], [u], n_questions=3), max_tokens=30) for t in TEXTS for u in TEXTS[:2] if u != t]
    assert len(reqs) == 6
    results = run_requests(reqs, llm, RunDir(sys.argv[1]), "questions", progress=False)
    print("DONE", sum(r.ok for r in results), sum(r.cached for r in results), flush=True)
