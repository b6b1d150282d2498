"""The pipeline's evaluation stage (`cqg-ray evaluate-run`, and the last stage of `cqg-ray run`)."""

import pytest

from cqg_ray.config import ConfigError


def test_evaluation_data_that_cannot_be_read_is_a_config_error_and_the_stage_stays_undone(tmp_path, toy_encoder):
    """A missing or unusable evaluate.* file was a DataError traceback (exit 1: 'the pipeline failed in stage evaluation')."""
    from cqg_ray.pipeline import run_one
    from cqg_ray.rundir import RunDir
    from tests.conftest import toy_run

    one = tmp_path / "one.jsonl"
    one.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "x"}\n')
    for evaluate, says in (({"tasks": ["sts"], "sts": [str(tmp_path / "missing.tsv")]}, f"file not found: {tmp_path / 'missing.tsv'}"),
                           ({"tasks": ["clustering"], "clustering": [str(one)]},
                            f"{one}: clustering needs at least two distinct 'label' values; found one")):
        cfg = toy_run(tmp_path / "run", toy_encoder, {"evaluate": {**evaluate, "baselines": []}})
        with pytest.raises(ConfigError) as e:
            run_one(cfg, "evaluation")
        assert str(e.value) == f"the evaluation stage's data (evaluate.*): {says}"
        assert RunDir(str(tmp_path / "run")).manifest("evaluation") is None
