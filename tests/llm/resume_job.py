"""The job the kill-and-resume test runs in a subprocess: N answer requests through the runner and the
OpenAI backend against a local server.  ``python resume_job.py RUN_DIR BASE_URL N``"""

import sys

from cqg_ray.config import LLMConfig, OpenAIConfig
from cqg_ray.llm.base import Request
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.runner import run_requests
from cqg_ray.rundir import RunDir

FLUSH_EVERY = 1000  # no shard before the end: what survives a kill survives through the journal
CONCURRENCY = 2


def llm_config(base_url: str) -> LLMConfig:
    return LLMConfig(backend="openai", flush_every=FLUSH_EVERY,
                     openai=OpenAIConfig(base_url=base_url, model="local", max_concurrency=CONCURRENCY, timeout_s=10, backoff_s=0.01))


def job_requests(n: int) -> list[Request]:
    return [Request(answer_messages(f"document {i} about subject {i % 7}", [f"Is it about subject {j}?" for j in range(5)]), 40, 5, meta={"doc": i})
            for i in range(n)]


if __name__ == "__main__":
    run_dir, base_url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    results = run_requests(job_requests(n), llm_config(base_url), RunDir(run_dir), "labels", progress=False)
    print("DONE", sum(r.ok for r in results), sum(r.cached for r in results), flush=True)
