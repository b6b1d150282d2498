"""`cqg-ray status`'s table: each stage's headline counts first, every count with --all, floats kept short."""

from cqg_ray.rundir import RunDir, run_stage
from cqg_ray.status import format_status, shown_counts

QUESTIONS = {"clusters": 20, "generation_prompts": 20, "generation_failed": 0, "generated": 190, "parsed": 183, "dropped_empty": 0,
             "probed": 182, "deduped": 31, "questions": 30, "mean_quality_selected": 0.123456789}


def line_of(table: str, stage: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(stage))


def test_a_stage_shows_its_headline_counts_first_then_the_rest_in_order():
    # the questions kept were the 19th count: the line showed the first six, none of them what the stage made
    assert shown_counts("questions", QUESTIONS) == [("questions", 30), ("clusters", 20), ("generated", 190), ("probed", 182),
                                                    ("generation_prompts", 20), ("generation_failed", 0)]
    assert shown_counts("questions", QUESTIONS, every=True)[6:] == [("parsed", 183), ("dropped_empty", 0), ("deduped", 31),
                                                                    ("mean_quality_selected", 0.123456789)]
    assert shown_counts("cluster", {"documents": 3, "clusters": 2}) == [("documents", 3), ("clusters", 2)]  # no headline: as written
    assert shown_counts("model", {"epochs": 200, "heldout_accuracy": 0.7}) == [("heldout_accuracy", 0.7), ("epochs", 200)]


def test_the_table_shows_six_counts_or_all_of_them(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    run_stage(run, "questions", "h", lambda ctx: ctx.counts.update(QUESTIONS), deps=[])
    assert line_of(format_status(run), "questions").split(None, 3)[3] == (
        "questions=30, clusters=20, generated=190, probed=182, generation_prompts=20, generation_failed=0")
    assert line_of(format_status(run, every=True), "questions").split(None, 3)[3] == (
        "questions=30, clusters=20, generated=190, probed=182, generation_prompts=20, generation_failed=0, parsed=183, "
        "dropped_empty=0, deduped=31, mean_quality_selected=0.1235")
