"""MTEB adapter: the encode contract tested directly; with mteb installed, MTEB's own offline mock tasks and
local tasks built from real slices, whose MTEB scores must equal ours on the same embeddings."""

import numpy as np
import pytest

from cqg_ray.evaluate.data import load_beir, load_clustering, load_sts
from cqg_ray.evaluate.metrics import cosine_pairs, kmeans_v_measure, spearman
from cqg_ray.evaluate.models import budgeted, probabilities
from cqg_ray.evaluate.mteb_adapter import MTEBEncoder, texts_of
from cqg_ray.evaluate.tasks import retrieval_score, sts_scores


class TinyModel:
    """A deterministic interpretable-model stand-in without torch: 8 'questions' on character counts."""

    tau = 0.5
    questions = [f"q{i}" for i in range(8)]

    def encode(self, texts, output="bits", threshold=None):
        feats = np.array([[t.count(c) for c in "aeiostnr"] for t in texts], dtype=np.float32)
        probs = 1 / (1 + np.exp(-(feats - 1.5)))
        return (probs > (threshold or self.tau)).astype(np.uint8) if output == "bits" else probs.astype(np.float32)


class Memo:
    """Wraps an interpretable model and encodes each distinct text once (MTEB and our side ask for the same texts)."""

    def __init__(self, model):
        self.model, self.tau, self.questions, self.cache = model, model.tau, model.questions, {}

    def encode(self, texts, output="bits", threshold=None):
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if todo:
            self.cache.update(zip(todo, self.model.encode(todo, output="probs")))
        probs = np.stack([self.cache[t] for t in texts]).astype(np.float32)
        return (probs > (threshold or self.tau)).astype(np.uint8) if output == "bits" else probs


class DenseOnly:
    def encode(self, texts):
        return np.ones((len(texts), 3), dtype=np.float64)


def test_texts_of_accepts_what_mteb_hands_over():
    assert texts_of("one") == ["one"]
    assert texts_of(["a", "b"]) == ["a", "b"]
    assert texts_of([{"text": ["a", "b"], "title": ["x", "y"]}, {"text": ["c"]}]) == ["a", "b", "c"]
    assert texts_of(iter([["a"], ["b", "c"]])) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="'text' field"):
        texts_of([{"image": [1]}])


def test_encode_contract_shapes_dtype_kwargs():
    enc = MTEBEncoder(TinyModel())
    kwargs = dict(task_metadata=None, hf_split="test", hf_subset="default", prompt_type="query", batch_size=32,
                  show_progress_bar=False, prompt_name=None)
    E = enc.encode([{"text": ["banana", "tree"]}, {"text": ["xyz"]}], **kwargs)
    assert E.shape == (3, 8) and E.dtype == np.float32
    assert set(np.unique(E)) <= {0.0, 1.0}
    np.testing.assert_array_equal(E, TinyModel().encode(["banana", "tree", "xyz"], output="bits"))
    P = MTEBEncoder(TinyModel(), binary=False).encode(["banana", "tree", "xyz"])
    assert P.dtype == np.float32 and ((P > 0) & (P < 1)).all()
    np.testing.assert_array_equal(MTEBEncoder(TinyModel(), tau=0.9).encode(["banana"]), (P[:1] > 0.9).astype(np.float32))
    D = MTEBEncoder(DenseOnly()).encode(["a", "b"], task_metadata=None)
    assert D.shape == (2, 3) and D.dtype == np.float32


def test_similarity_is_cosine_and_zero_safe():
    torch = pytest.importorskip("torch")
    enc = MTEBEncoder(TinyModel())
    a = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float32)
    b = np.array([[1, 0, 0], [0, 1, 0]], dtype=np.float32)
    S = enc.similarity(a, b)
    np.testing.assert_allclose(S, [[1, 0], [2**-0.5, 2**-0.5], [0, 0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(enc.similarity(torch.tensor(a), [b[0], b[1]]), S, rtol=1e-6)
    np.testing.assert_allclose(enc.similarity(a[0], b), S[:1], rtol=1e-6)
    np.testing.assert_allclose(enc.similarity_pairwise(a[:2], b), [1, 2**-0.5], rtol=1e-6)
    assert not np.isnan(enc.similarity_pairwise(a[2:], a[2:])).any()


# ----------------------------------------------------------------------------------------- with MTEB installed


def _meta(name, task_type, main_score):
    from mteb.abstasks.task_metadata import TaskMetadata

    return TaskMetadata(
        type=task_type, name=name, main_score=main_score, description="a local slice of real data for cqg-ray tests",
        reference="https://github.com/embeddings-benchmark/mteb", dataset={"path": "local", "revision": "local"},
        category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], date=("2010-01-01", "2020-12-31"), dialect=[],
        domains=[], task_subtypes=[], license="cc-by-sa-4.0", annotations_creators="human-annotated",
        modalities=["text"], sample_creation="found", bibtex_citation="",
    )


@pytest.fixture(scope="module")
def mteb():
    return pytest.importorskip("mteb")


def _retrieval_split(queries: list[dict], corpus: list[dict], qrels: dict) -> dict:
    """An MTEB retrieval split from query and corpus rows ({"id", "text"[, "title"]}) and qrels."""
    from datasets import Dataset

    return {"queries": Dataset.from_list(queries), "corpus": Dataset.from_list(corpus), "relevant_docs": qrels,
            "top_ranked": None}


def _split_of(data) -> dict:
    """The MTEB retrieval split of a loaded RetrievalData: our document texts (title and text joined) as its corpus."""
    return _retrieval_split([{"id": q, "text": t} for q, t in zip(data.query_ids, data.queries)],
                            [{"id": d, "text": t} for d, t in zip(data.doc_ids, data.docs)], data.qrels)


def _main_score(results, name):
    tr = next(t for t in results.task_results if t.task_name == name)
    return float(tr.scores["test"][0]["main_score"])


def test_adapter_runs_mteb_offline_mock_tasks(mteb):
    from mteb.mocks import MockClusteringTask, MockRetrievalTask, MockSTSTask

    model = MTEBEncoder(TinyModel())
    assert isinstance(model, mteb.EncoderProtocol)
    assert model.mteb_model_meta.embed_dim == 8 and model.mteb_model_meta.similarity_fn_name == "cosine"
    res = mteb.evaluate(model, [MockSTSTask(), MockRetrievalTask(), MockClusteringTask()], cache=None,
                        show_progress_bar=False)
    assert sorted(t.task_name for t in res.task_results) == ["MockClusteringTask", "MockRetrievalTask", "MockSTSTask"]
    assert not res.exceptions


def test_mteb_scores_equal_ours_on_real_slices(mteb, make_rp_model, data_path):
    """Same embeddings, two implementations: MTEB's cosine_spearman, ndcg_at_10 and v_measure vs ours (x100)."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS

    sts = load_sts(data_path("sts/STSBenchmark.test.tsv"), max_pairs=120, seed=1)
    ret = load_beir(data_path("retrieval/scifact"), max_queries=20, max_docs=120, seed=1)
    clu = load_clustering(data_path("clustering/twentynewsgroups.jsonl.gz"), field="subject", max_docs=200, seed=1)

    class LocalSTS(AbsTaskSTS):
        metadata = _meta("LocalSTSB", "STS", "cosine_spearman")
        min_score, max_score = 0, 5

        def load_data(self, **kwargs):
            cols = {"sentence1": sts.sentence1, "sentence2": sts.sentence2, "score": list(sts.scores)}
            self.dataset, self.data_loaded = DatasetDict({"test": Dataset.from_dict(cols)}), True

    class LocalRetrieval(AbsTaskRetrieval):
        metadata = _meta("LocalSciFact", "Retrieval", "ndcg_at_10")

        def load_data(self, **kwargs):
            self.dataset, self.data_loaded = {"default": {"test": _split_of(ret)}}, True

    class LocalClustering(AbsTaskClusteringLegacy):
        metadata = _meta("LocalTNG", "Clustering", "v_measure")

        def load_data(self, **kwargs):
            cols = {"sentences": [clu.texts], "labels": [clu.labels]}
            self.dataset, self.data_loaded = DatasetDict({"test": Dataset.from_dict(cols)}), True

    model = Memo(make_rp_model(m=48))
    # probabilities (binary=False): no ties, so the two implementations must agree to rounding
    res_p = mteb.evaluate(MTEBEncoder(model, binary=False), [LocalSTS(), LocalRetrieval()], cache=None,
                          show_progress_bar=False)
    # binary at tau, the paper's setting
    res_b = mteb.evaluate(MTEBEncoder(model), [LocalSTS(), LocalClustering()], cache=None, show_progress_bar=False)

    texts, i1, i2 = sts.unique_texts()
    P = probabilities(model, texts)
    assert 100 * _main_score(res_p, "LocalSTSB") == pytest.approx(sts_scores(P, sts, i1, i2, False)["spearman"], abs=1e-4)
    ours_ret = retrieval_score(probabilities(model, ret.queries), probabilities(model, ret.docs), ret)
    assert 100 * _main_score(res_p, "LocalSciFact") == pytest.approx(ours_ret, abs=1e-3)  # MTEB rounds to 5 decimals

    ours_clu = kmeans_v_measure(budgeted(model, probabilities(model, clu.texts)), clu.labels)
    assert 100 * _main_score(res_b, "LocalTNG") == pytest.approx(ours_clu, abs=1e-9)  # same k-means, same seed
    # Binary STS: MTEB scores 1 - sklearn's paired_cosine_distances in float32, which splits some mathematically tied
    # cosines of 0/1 vectors by rounding errors (~1e-7); ours keeps them tied (see
    # test_cosine_of_binary_vectors_keeps_mathematical_ties_exact). Both facts are checked exactly:
    from sklearn.metrics.pairwise import paired_cosine_distances

    bits = budgeted(model, P).astype(np.float32)
    cos_mteb = 1 - paired_cosine_distances(bits[i1], bits[i2])
    assert 100 * _main_score(res_b, "LocalSTSB") == pytest.approx(100 * spearman(cos_mteb, sts.scores), abs=1e-9)
    cos_ours = cosine_pairs(bits[i1], bits[i2])
    assert np.abs(cos_mteb - cos_ours).max() < 1e-6 and len(set(cos_mteb.tolist())) > len(set(cos_ours.tolist()))
    exact = np.unique(cos_ours)  # snap each float32 cosine to the nearest exact value: the ties come back
    snapped = exact[np.abs(cos_mteb[:, None] - exact[None, :]).argmin(axis=1)]
    ours_bin = sts_scores(bits, sts, i1, i2, True)["spearman"]
    assert ours_bin == pytest.approx(100 * spearman(snapped, sts.scores), abs=1e-9)


def test_mteb_identical_ids_equal_ours(mteb, identical_ids_beir):
    """MTEB's ignore_identical_ids (on for ArguAna and Quora) and our default drop give the same nDCG@10 on the tiny
    set whose corpus holds two of its queries under their own ids; off, MTEB equals our keep option."""
    import math

    from mteb.abstasks.retrieval import AbsTaskRetrieval

    folder, lookup = identical_ids_beir
    drop, keep = load_beir(folder), load_beir(folder, drop_identical_ids=False)

    class Local(AbsTaskRetrieval):
        def load_data(self, **kwargs):
            self.dataset, self.data_loaded = {"default": {"test": _split_of(drop)}}, True

    class LocalDrop(Local):
        metadata = _meta("LocalIdenticalIdsDrop", "Retrieval", "ndcg_at_10")
        ignore_identical_ids = True

    class LocalKeep(Local):
        metadata = _meta("LocalIdenticalIdsKeep", "Retrieval", "ndcg_at_10")
        ignore_identical_ids = False

    res = mteb.evaluate(MTEBEncoder(lookup), [LocalDrop(), LocalKeep()], cache=None, show_progress_bar=False)
    ours_drop = retrieval_score(lookup.encode(drop.queries), lookup.encode(drop.docs), drop)
    ours_keep = retrieval_score(lookup.encode(keep.queries), lookup.encode(keep.docs), keep)
    r3 = 1 / math.log2(3)
    assert ours_drop == pytest.approx(100 * (2 + r3) / 3, abs=1e-9) and ours_keep == pytest.approx(100 * r3, abs=1e-9)
    assert 100 * _main_score(res, "LocalIdenticalIdsDrop") == pytest.approx(ours_drop, abs=1e-3)  # MTEB: 5 decimals
    assert 100 * _main_score(res, "LocalIdenticalIdsKeep") == pytest.approx(ours_keep, abs=1e-3)


def test_mteb_long_documents_equal_ours(mteb, long_docs_beir):
    """Long documents (issue 15): MTEB, fed the raw BEIR rows (id, title, text) as its own BEIR tasks hold them,
    and our loader hand the encoder the very same strings, title and text joined, whole (no truncation) and
    stripped alike; the same vectors then give the same nDCG@10, which is also computed here by hand."""
    import math

    from mteb.abstasks.retrieval import AbsTaskRetrieval

    folder, raw, lookup = long_docs_beir
    data = load_beir(folder)
    expected = [raw["expected"][r["_id"]] for r in raw["corpus"]]
    assert data.doc_ids == [r["_id"] for r in raw["corpus"]] and data.docs == expected
    assert data.queries == [q["text"] for q in raw["queries"]]  # unstripped: "sourdough starter hydration "
    assert all(len(t) > 4000 and len(t.split()) > 600 for t in data.docs)  # each word is >= 1 WordPiece token
    try:
        from cqg_ray.evaluate.baselines import BagOfTokens

        assert min(len(ids) for ids in BagOfTokens().token_ids(data.docs)) > 700  # the bundled BERT tokenizer
    except ImportError:
        pass

    class LocalLong(AbsTaskRetrieval):
        metadata = _meta("LocalLongDocs", "Retrieval", "ndcg_at_10")

        def load_data(self, **kwargs):
            corpus = [{"id": r["_id"], "title": r["title"], "text": r["text"]} for r in raw["corpus"]]  # MTEB's columns
            split = _retrieval_split([{"id": q["_id"], "text": q["text"]} for q in raw["queries"]], corpus, raw["qrels"])
            self.dataset, self.data_loaded = {"default": {"test": split}}, True

    res = mteb.evaluate(MTEBEncoder(lookup), [LocalLong()], cache=None, show_progress_bar=False)
    mteb_seen, lookup.seen = lookup.seen, []
    ours = retrieval_score(lookup.encode(data.queries), lookup.encode(data.docs), data)
    # every text both sides encoded is a key of the table (StrictLookup fails on anything else); each side asked
    # for every document and query, exactly once
    assert sorted(mteb_seen) == sorted(lookup.seen) == sorted(lookup.table)

    r3 = 1 / math.log2(3)
    idcg = 2 + r3  # relevance 2 at rank 1, relevance 1 at rank 2
    qa = (1 + 2 * r3) / idcg  # orchard (1) first, glacier (2) second
    qb = 1.0  # bakery (1) first
    qc = (2 * r3 + 1 / 2) / idcg  # lighthouse (0), chess (2), glacier (1)
    assert ours == pytest.approx(100 * (qa + qb + qc) / 3, abs=1e-9)
    assert 100 * _main_score(res, "LocalLongDocs") == pytest.approx(ours, abs=1e-3)  # MTEB rounds to 5 decimals


def test_doc_text_joins_as_mteb_and_beir(mteb):
    """Our document text equals MTEB's corpus join (mteb._create_dataloaders._corpus_to_dict) and BEIR's
    SentenceBERT.encode_corpus join on the edge cases: empty or blank title, whitespace at either end of either
    field, an empty text, no title field."""
    from cqg_ray.evaluate.data import doc_text

    try:
        from mteb._create_dataloaders import _corpus_to_dict as corpus_to_dict  # private: where MTEB joins the two
    except ImportError:
        pytest.skip("this mteb version has no _create_dataloaders._corpus_to_dict")

    def beir(doc):  # beir/retrieval/models/sentence_bert.py, sep " "
        return (doc["title"] + " " + doc["text"]).strip() if "title" in doc else doc["text"].strip()

    rows = [
        {"title": "", "text": "\n  body text  \n"},
        {"title": "   ", "text": "body"},
        {"title": "Title", "text": "\n body  \n\n"},
        {"title": " Title ", "text": "body\twith  inner   spacing"},
        {"title": "Title", "text": ""},
        {"text": "  no title field "},
    ]
    for row in rows:
        ours = doc_text(row)
        assert ours == corpus_to_dict({"id": "x", **row})["text"] == beir(row), row
