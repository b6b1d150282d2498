"""`cqg-ray demo` prints each summary block once, with the copy rate against the run's own corpus (no Ray: the
pipeline is stood in for by the evaluation stage alone, on a toy run whose earlier stages are done)."""

import cqg_ray.pipeline
from cqg_ray.config import dump_config

STS_PAIRS = [("A man is playing a guitar.", "A man plays the guitar.", 4.8), ("A dog runs in the park.", "A dog is running in a park.", 4.6),
             ("The bank raised interest rates.", "Interest rates were raised by the bank.", 4.4),
             ("A woman is cooking dinner.", "A woman is preparing a meal.", 3.9), ("A child reads a book.", "A kid is reading.", 3.2),
             ("The phone has a big screen.", "The laptop is heavy.", 1.4), ("A cat sleeps on the sofa.", "Stocks fell sharply on Monday.", 0.2),
             ("A man walks down the street.", "The orchestra played a symphony.", 0.0)]


def test_the_demo_prints_the_summary_once_with_a_copy_rate(tmp_path, monkeypatch, capsys, toy_encoder):
    """The first demo runs the evaluation stage (which prints the tables), the second finds it done (the demo prints
    them): each time the STS table and the question-quality block appear once, the copy rate measured against the
    run's prepared corpus (the model folder has no run_config.yaml)."""
    from cqg_ray.demo import run_demo
    from cqg_ray.evaluate.report import TASK_TITLES
    from tests.conftest import toy_run

    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in STS_PAIRS))
    cfg = toy_run(tmp_path / "run", toy_encoder, {"evaluate": {"tasks": ["sts"], "sts": [str(sts)], "baselines": ["dense"],
                                                                "tau_sweep": [0.5], "m_sweep": [2], "active_k": [2]}})
    (tmp_path / "demo.yaml").write_text(dump_config(cfg))
    ran = []

    def pipeline(cfg, **kwargs):  # the stages before the evaluation are done; Ray is not started
        ran.append(cfg.run_dir)
        return {"evaluation": cqg_ray.pipeline.run_one(cfg, "evaluation")}

    monkeypatch.setattr(cqg_ray.pipeline, "run_pipeline", pipeline)
    manifests = []
    for attempt in ("evaluated", "resumed"):
        assert run_demo(str(tmp_path / "demo.yaml")) == 0
        out = capsys.readouterr().out
        assert out.count(TASK_TITLES["sts"]) == 1, (attempt, out)
        assert out.count("Question quality of ") == 1 and out.count("copy_rate: ") == 1, (attempt, out)
        assert "copy_rate: 0.2500   (share sharing a run of 6 words with a corpus text)" in out, (attempt, out)
        assert out.count("(full report with the load frontier") == 1 and "Two explanations (STS-B test pairs):" in out
        manifests.append((tmp_path / "run" / "evaluation" / "_manifest.json").read_text())
    assert ran == [str(tmp_path / "run")] * 2 and manifests[0] == manifests[1]  # the second demo skipped the stage
