"""The training core without Ray: labels, shards, step layout, the loop, checkpoints, evaluation."""

import json

import numpy as np
import pytest
import torch

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.checkpoint import load_checkpoint, save_checkpoint
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.loop import epoch_layout, make_optimizer, make_shards, steps_per_epoch
from cqg_ray.mbqa.pairs import LabelPairs, split_holdout
from cqg_ray.mbqa.label_plan import holdout_docs
from cqg_ray.mbqa.report import evaluate_heads, predict_pairs
from tests.mbqa.conftest import train_locally


def test_label_pairs_dense_round_trip():
    dense = np.array([[1, -1, 0], [-1, -1, -1], [0, 1, 1]], dtype=np.int8)
    pairs = LabelPairs.from_dense(dense)
    assert pairs.doc.tolist() == [0, 0, 2, 2, 2]
    assert pairs.question.tolist() == [0, 2, 0, 1, 2]
    assert pairs.answer.tolist() == [1, 0, 0, 1, 1]
    assert np.array_equal(pairs.to_dense(3), dense)
    assert pairs.auto_pos_weight() == pytest.approx(2 / 3)  # 2 no / 3 yes
    with pytest.raises(ValueError, match="0 \\(no\\) or 1"):
        LabelPairs(np.array([0]), np.array([0]), np.array([2]), 1)
    with pytest.raises(ValueError, match="question indices"):
        LabelPairs(np.array([0]), np.array([3]), np.array([1]), 2)


def test_shards_partition_texts_and_pairs(problem):
    emb, dense = problem()
    pairs = LabelPairs.from_dense(dense)
    shards = make_shards(pairs, 3, seed=0)
    docs = np.concatenate([s["docs"] for s in shards])
    assert len(docs) == len(np.unique(docs)) == len(np.unique(pairs.doc))
    assert sum(len(s["row"]) for s in shards) == len(pairs)
    got = sorted((int(s["docs"][r]), int(q), int(a)) for s in shards for r, q, a in zip(s["row"], s["question"], s["answer"]))
    assert got == sorted(zip(pairs.doc.tolist(), pairs.question.tolist(), pairs.answer.tolist()))
    assert max(len(s["docs"]) for s in shards) - min(len(s["docs"]) for s in shards) <= 1


def test_epoch_layout_covers_each_pair_once_with_at_most_k_per_head():
    question = np.array([0, 0, 0, 0, 0, 1, 1, 2, 0, 1], dtype=np.int32)
    order, step, slot = epoch_layout(question, 2, seed=0, epoch=0, rank=0)
    assert sorted(order.tolist()) == list(range(10))
    assert np.all(np.diff(step) >= 0)
    cells = list(zip(step.tolist(), question[order].tolist(), slot.tolist()))
    assert len(set(cells)) == 10  # no two pairs in the same (step, head, slot)
    assert steps_per_epoch([{"question": question}], 3, 2) == 3  # question 0 has 6 pairs -> 3 steps of 2
    again = epoch_layout(question, 2, seed=0, epoch=0, rank=0)
    other = epoch_layout(question, 2, seed=0, epoch=1, rank=0)
    assert np.array_equal(order, again[0]) and not np.array_equal(order, other[0])


def test_training_learns_the_synthetic_questions(problem):
    emb, dense = problem()
    pairs = LabelPairs.from_dense(dense)
    held = np.isin(pairs.doc, holdout_docs(pairs.doc, 0.2, seed=0))
    cfg = TrainConfig(epochs=15, lr=1e-2, pairs_per_head=8)
    heads, _, history = train_locally(emb, pairs.select(~held), cfg)
    assert [h["epoch"] for h in history] == list(range(1, 16))
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert all(h["pairs"] == int((~held).sum()) for h in history)
    report = evaluate_heads(heads, emb, pairs.select(held), tau=0.5)
    assert report["accuracy"] > 0.85 and report["macro avg"]["f1-score"] > 0.8  # 0.874 / 0.823 here; all-"no" gives 0.75 / 0.43
    assert report["no"]["support"] + report["yes"]["support"] == int(held.sum())


def test_weight_decay_is_an_l2_penalty_that_keeps_few_label_heads_small(problem):
    """train.weight_decay is each head's own L2 (its mean loss + wd / 2 |w|^2): Adam's coupled decay wd / m, since a
    step's loss averages over all m heads' pairs. On questions with a dozen labels each it gives heads with smaller
    first-layer weights than the paper's unpenalised training, which fits its few texts."""
    emb, dense = problem(per_question=12)
    pairs = LabelPairs.from_dense(dense)
    plain, _, _ = train_locally(emb, pairs, TrainConfig(epochs=60, lr=1e-2))
    decayed, opt, history = train_locally(emb, pairs, TrainConfig(epochs=60, lr=1e-2, weight_decay=0.05))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05 / pairs.n_questions] and TrainConfig().weight_decay == 0.0
    assert decayed.w1.norm() < 0.5 * plain.w1.norm()
    assert np.isfinite(history[-1]["loss"])


def test_checkpoint_resume_is_exact(problem, tmp_path):
    emb, dense = problem(m=4, per_question=80)
    pairs = LabelPairs.from_dense(dense)
    full, _, hist_full = train_locally(emb, pairs, TrainConfig(epochs=4, lr=1e-2))
    half, opt, _ = train_locally(emb, pairs, TrainConfig(epochs=2, lr=1e-2))
    save_checkpoint(str(tmp_path), half, opt, 2)
    torch.manual_seed(123)  # a different initialisation: everything must come from the checkpoint
    fresh = StackedHeads(emb.shape[1], 4, 8)
    fresh_opt = make_optimizer(fresh, TrainConfig(lr=1e-2))
    _, epoch = load_checkpoint(str(tmp_path), fresh, fresh_opt)
    assert epoch == 2
    resumed, _, hist_resumed = train_locally(emb, pairs, TrainConfig(epochs=4, lr=1e-2), fresh, fresh_opt, start_epoch=2)
    assert [h["epoch"] for h in hist_resumed] == [3, 4]
    assert hist_resumed[-1]["loss"] == pytest.approx(hist_full[-1]["loss"], rel=1e-6)
    for k, v in full.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v)


def test_predict_pairs_matches_dense_forward(problem):
    emb, dense = problem(m=5)
    pairs = LabelPairs.from_dense(dense)
    torch.manual_seed(0)
    heads = StackedHeads(emb.shape[1], 5, 8)
    probs = predict_pairs(heads, emb, pairs.doc, pairs.question, chunk=37)
    with torch.no_grad():
        dense_probs = torch.sigmoid(heads(torch.from_numpy(emb))).numpy()
    np.testing.assert_allclose(probs, dense_probs[pairs.doc, pairs.question], rtol=1e-5, atol=1e-6)


def test_split_holdout_is_by_document_and_disjoint():
    rng = np.random.default_rng(3)
    pairs = LabelPairs(rng.integers(0, 200, 3000), rng.integers(0, 40, 3000), rng.integers(0, 2, 3000), 40)
    pairs = pairs.select(np.unique(pairs.doc * 40 + pairs.question, return_index=True)[1])  # one answer per pair
    train, test = split_holdout(pairs, 0.1, seed=5)
    train_docs, test_docs = set(train.doc.tolist()), set(test.doc.tolist())
    assert not train_docs & test_docs  # no held-out text is ever trained on
    assert train_docs | test_docs == set(pairs.doc.tolist())
    assert len(test_docs) == round(0.1 * len(set(pairs.doc.tolist())))
    assert len(train) + len(test) == len(pairs)
    assert set(test.doc.tolist()) == set(holdout_docs(pairs.doc, 0.1, 5).tolist())
    # every pair keeps its answer on its side of the split
    key = dict(zip((pairs.doc * 40 + pairs.question).tolist(), pairs.answer.tolist()))
    for side in (train, test):
        assert all(key[k] == a for k, a in zip((side.doc * 40 + side.question).tolist(), side.answer.tolist()))


def test_soft_labels_are_the_training_target(problem):
    """train.soft_labels: the heads are fitted to P(yes); the hard answers still define pos_weight and fidelity."""
    emb, dense = problem()
    hard = LabelPairs.from_dense(dense)
    p = np.where(hard.answer == 1, 0.95, 0.05).astype(np.float32)  # a confident LLM
    soft = LabelPairs(hard.doc, hard.question, hard.answer, hard.n_questions, p)
    assert soft.training_target.tolist() == p.tolist() and hard.training_target.tolist() == hard.answer.astype(np.float32).tolist()
    assert soft.select(np.arange(3)).target.tolist() == p[:3].tolist()
    shards = make_shards(soft, 2, seed=0)
    got = sorted((int(s["docs"][r]), int(q), float(t)) for s in shards for r, q, t in zip(s["row"], s["question"], s["answer"]))
    assert got == sorted(zip(soft.doc.tolist(), soft.question.tolist(), p.astype(float).tolist()))
    with pytest.raises(ValueError, match="soft targets"):
        LabelPairs(hard.doc, hard.question, hard.answer, hard.n_questions, p[:-1])
    with pytest.raises(ValueError, match="soft targets"):
        LabelPairs(hard.doc, hard.question, hard.answer, hard.n_questions, p + 1.0)
    cfg = TrainConfig(epochs=60, lr=1e-2)
    heads, _, history = train_locally(emb, soft, cfg)
    assert history[-1]["loss"] < history[0]["loss"]
    assert evaluate_heads(heads, emb, hard)["accuracy"] > 0.99  # 0.998 here; hard labels 1.0


def test_the_task_trainers_checkpoints_are_whole_and_the_newest_two_are_kept(tmp_path):
    from cqg_ray.mbqa.checkpoint import latest_checkpoint, write_checkpoint

    folder = str(tmp_path / "run")
    with latest_checkpoint(folder) as found:
        assert found is None  # no folder yet
    heads = StackedHeads(4, 3, 2)
    opt = make_optimizer(heads, TrainConfig())
    paths = [write_checkpoint(folder, heads, opt, epoch, {"loss": 0.5}) for epoch in (5, 10, 15)]
    assert paths == [f"{folder}/checkpoint_{e:06d}" for e in (5, 10, 15)]
    (tmp_path / "run" / ".checkpoint_000020.partial").mkdir()  # a write killed before its move: not a checkpoint
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".checkpoint_000020.partial", "checkpoint_000010", "checkpoint_000015"]
    with latest_checkpoint(folder) as found:
        assert found == paths[-1]
        loaded, epoch = load_checkpoint(found)
    assert epoch == 15
    for k, v in heads.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)
    write_checkpoint(folder, heads, opt, 20)  # the leftover partial folder is replaced
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint_000015", "checkpoint_000020"]


def test_the_task_trainers_checkpoints_on_a_remote_filesystem(tmp_path, monkeypatch):
    """Through a filesystem that is not the local one (a URI's: written beside and copied up, read by copying down)."""
    from pyarrow import fs as pafs

    from cqg_ray.mbqa import checkpoint

    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    monkeypatch.setattr(checkpoint, "resolve", lambda folder: (remote, "bucket/run"))
    heads = StackedHeads(4, 3, 2)
    opt = make_optimizer(heads, TrainConfig())
    for epoch in (1, 2, 3):
        checkpoint.write_checkpoint("s3://bucket/run", heads, opt, epoch)
    assert sorted(p.name for p in (tmp_path / "bucket" / "run").iterdir()) == ["checkpoint_000002", "checkpoint_000003"]
    with checkpoint.latest_checkpoint("s3://bucket/run") as found:
        assert not found.startswith(str(tmp_path))  # a local copy
        assert load_checkpoint(found)[1] == 3


def test_a_ray_train_run_whose_snapshot_a_kill_cut_resumes_from_its_newest_whole_checkpoint(tmp_path, caplog):
    """Ray Train rewrites its snapshot in place: a kill then leaves it empty or cut, and Train's next fit() would fail
    on it. `checkpoint_without_snapshot` deletes it and names the newest checkpoint that loads (a half-copied one is
    passed over); a readable snapshot is Train's to use."""
    from cqg_ray.mbqa.train import SNAPSHOT, checkpoint_without_snapshot

    run = tmp_path / "run"
    assert checkpoint_without_snapshot(str(run)) is None  # nothing yet
    heads = StackedHeads(4, 3, 2)
    opt = make_optimizer(heads, TrainConfig())
    for name, epoch in (("checkpoint_2026-12-06_10-00-01.000001", 2), ("checkpoint_2026-12-06_10-00-02.000002", 3)):
        save_checkpoint(str(run / name), heads, opt, epoch)
    cut = run / "checkpoint_2026-12-06_10-00-03.000003"  # Train's copy into storage, killed midway
    save_checkpoint(str(cut), heads, opt, 4)
    data = (cut / "heads.safetensors").read_bytes()
    (cut / "heads.safetensors").write_bytes(data[: len(data) // 2])

    (run / SNAPSHOT).write_text('{"latest_checkpoint_result": {"checkpoint_dir_name": "checkpoint_2026-12-06_10-00-02.000002"}}')
    assert checkpoint_without_snapshot(str(run)) is None and (run / SNAPSHOT).exists()
    for unreadable in (b"", b'{"checkpoint_results": [{"metrics"', b"\xff\xfe"):
        (run / SNAPSHOT).write_bytes(unreadable)
        with caplog.at_level("WARNING", logger="cqg_ray"):
            found = checkpoint_without_snapshot(str(run))
        assert found == f"{run}/checkpoint_2026-12-06_10-00-02.000002"
        assert not (run / SNAPSHOT).exists()
        assert "does not load" in caplog.text and "resuming from" in caplog.text
    assert checkpoint_without_snapshot(str(run)) == found  # no snapshot at all (killed before a restarted run wrote one)
    for name in ("checkpoint_2026-12-06_10-00-01.000001", "checkpoint_2026-12-06_10-00-02.000002"):
        (run / name / "optimizer.pt").unlink()
    assert checkpoint_without_snapshot(str(run)) is None  # none loads: Train starts from scratch


def test_the_checkpoints_train_forgot_are_deleted_once_the_resumed_run_has_finished(tmp_path, caplog):
    """Those that were there when the run started and the new snapshot does not name go; those it names, and any the
    run wrote itself, stay. Where the snapshot does not read, nothing is deleted."""
    from cqg_ray.mbqa.train import SNAPSHOT, drop_checkpoints_train_forgot

    run = tmp_path / "run"
    old = ["checkpoint_2026-12-06_10-00-01.000001", "checkpoint_2026-12-06_10-00-02.000002"]
    new = ["checkpoint_2026-12-06_11-00-01.000001", "checkpoint_2026-12-06_11-00-02.000002"]
    for name in old + new:
        (run / name).mkdir(parents=True)
        (run / name / "state.json").write_text("{}")
    (run / SNAPSHOT).write_text("")
    with caplog.at_level("WARNING", logger="cqg_ray"):
        drop_checkpoints_train_forgot(str(run), old)
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == old + new and "does not read after the run" in caplog.text
    (run / SNAPSHOT).write_text(json.dumps({"checkpoint_results": [{"checkpoint_dir_name": new[1]}, {"checkpoint_dir_name": old[1]}]}))
    drop_checkpoints_train_forgot(str(run), old)
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [old[1], *new]


def test_a_cut_snapshot_on_a_remote_filesystem(tmp_path, monkeypatch):
    """The same rule through a filesystem that is not the local one (a URI's): the snapshot read and deleted there,
    the checkpoints loaded from copies, the one named by its URI."""
    from pyarrow import fs as pafs

    from cqg_ray import rundir
    from cqg_ray.mbqa import checkpoint, train

    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    for module in (checkpoint, rundir):
        monkeypatch.setattr(module, "resolve", lambda folder: (remote, "bucket/run"))
    heads = StackedHeads(4, 3, 2)
    opt = make_optimizer(heads, TrainConfig())
    for name, epoch in (("checkpoint_2026-12-06_10-00-01.000001", 2), ("checkpoint_2026-12-06_10-00-02.000002", 3)):
        save_checkpoint(str(tmp_path / "bucket" / "run" / name), heads, opt, epoch)
    (tmp_path / "bucket" / "run" / "checkpoint_2026-12-06_10-00-02.000002" / "state.json").write_text('{"epo')
    (tmp_path / "bucket" / "run" / train.SNAPSHOT).write_text("")
    assert train.checkpoint_without_snapshot("s3://bucket/run/") == "s3://bucket/run/checkpoint_2026-12-06_10-00-01.000001"
    assert not (tmp_path / "bucket" / "run" / train.SNAPSHOT).exists()


def test_auto_trains_one_worker_in_a_task_and_more_with_ray_train():
    from cqg_ray.mbqa.train import trainer_kind

    assert trainer_kind(TrainConfig()) == "task"
    assert trainer_kind(TrainConfig(num_workers=2)) == "ray"
    assert trainer_kind(TrainConfig(trainer="ray")) == "ray"
    with pytest.raises(ValueError, match="train.trainer=task runs one worker, not train.num_workers=2"):
        trainer_kind(TrainConfig(num_workers=2, trainer="task"))
    from cqg_ray.config import ConfigError, PipelineConfig

    with pytest.raises((ConfigError, ValueError), match="train.trainer=task runs one worker"):
        PipelineConfig.model_validate({"train": {"trainer": "task", "num_workers": 2}})
