"""The label stage on its own local Ray with a slow scripted fake engine, for the kill test (run as a subprocess).

    python label_stream_job.py RUN_DIR CORPUS SENT_LOG     # prints DONE <sent> <from_ledger>

Every request the fake engine answers is appended to SENT_LOG (its prompt's sha256) before the answer is returned.
"""

import hashlib
import sys
import time

from cqg_ray.llm.engines.fake import FakeBackend

KILL_LABELS = {"n_cluster": 30, "n_neighbor": 20, "n_random": 10, "max_text_chars": 160}  # 60 pairs a question: a run long enough to kill


class LoggingFake(FakeBackend):
    """The fake engine, a little slow, writing each prompt it answers to a log (one line, flushed)."""

    def __init__(self, llm, log_path: str):
        super().__init__(llm, delay_s=0.0)
        self.log_path = log_path

    def complete(self, requests):
        out = super().complete(requests)
        time.sleep(0.02 * len(requests))
        with open(self.log_path, "a") as f:
            for r in requests:
                f.write(hashlib.sha256(repr(r.messages).encode()).hexdigest() + "\n")
        return out


class Engine:
    def __init__(self, llm, log_path):
        self.llm, self.log_path = llm, log_path

    def __call__(self):
        return LoggingFake(self.llm, self.log_path)


def main() -> None:
    from pathlib import Path

    from cqg_ray.config import stage_hash
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.pipeline import init_ray
    from cqg_ray.rundir import RunDir, run_stage
    from tests.conftest import small_config

    run_dir, corpus, sent_log = sys.argv[1:4]
    cfg = small_config(Path(run_dir), Path(corpus), max_clusters=4, extra={"llm": {"flush_every": 50_000}, "label": KILL_LABELS})
    init_ray(cfg.ray)
    run = RunDir(run_dir)
    m = run_stage(run, "labels", stage_hash(cfg, "labels"), lambda ctx: run_labels(cfg, ctx, engine=Engine(cfg.llm, sent_log), progress=False))
    last = Ledger(run, "labels").read_stats()["runs"][-1]
    print("DONE", last["sent"], last["from_ledger"], m["counts"]["pairs_labelled"], flush=True)
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()
