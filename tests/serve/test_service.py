"""The serving logic without Ray Serve or HTTP: the request schemas, batching, limits, answers."""

import asyncio

import numpy as np
import pytest

from cqg_ray.config import ServeConfig
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.serve.protocol import ApiError, EmbeddingsRequest, EmbedRequest
from cqg_ray.serve.service import BatchQueue, EmbeddingService


def error_of(fn, *args):
    with pytest.raises(ApiError) as e:
        fn(*args)
    return e.value


def test_openai_request_schema():
    r = EmbeddingsRequest.model_validate({"input": "a", "model": "m", "some_future_field": 1})  # unknown fields ignored
    assert (r.input, r.encoding_format, r.dimensions) == ("a", "float", None)
    r = EmbeddingsRequest.model_validate({"input": "a", "model": "m", "encoding_format": None, "dimensions": None, "user": None})
    assert r.encoding_format is None  # an explicit null, as OpenAI's clients may send it: the float vectors (a 422 before)
    with pytest.raises(ValueError, match="token ids"):
        EmbeddingsRequest.model_validate({"input": [5, 6], "model": "m"})


# ------------------------------------------------------------------ the service itself, in a plain asyncio loop


LOOP = asyncio.new_event_loop()


def run(coro):
    return LOOP.run_until_complete(coro)


def test_batches_cut_requests_into_max_batch_size(model):
    async def go():
        svc = EmbeddingService(model, ServeConfig(max_batch_size=4, batch_wait_timeout_s=0.05))
        texts = [f"text {i} about cooking food" for i in range(10)]
        resp = await svc.embed(EmbedRequest(texts=texts, output="probs"))
        return svc, np.array(resp.embeddings), texts

    svc, probs, texts = run(go())
    assert svc.texts_seen == 10 and svc.batches == 3  # 4 + 4 + 2 texts
    assert np.allclose(probs, model.encode(texts, output="probs", progress=False), atol=1e-4)


def test_concurrent_requests_share_batches(model):
    async def go():
        svc = EmbeddingService(model, ServeConfig(max_batch_size=8, batch_wait_timeout_s=0.05))
        out = await asyncio.gather(*(svc.embed(EmbedRequest(texts=[f"a film review number {i}"])) for i in range(8)))
        return svc, out

    svc, out = run(go())
    assert len(out) == 8 and svc.batches == 1 and svc.texts_seen == 8


# ------------------------------------------------------------------ the batch queue, with a function that records its batches


class Recorder:
    """``fn`` for a BatchQueue: records each batch, sleeps ``seconds`` in the worker thread, answers item * 10."""

    def __init__(self, seconds=0.0, fail_on=None):
        self.batches, self.seconds, self.fail_on = [], seconds, fail_on

    def __call__(self, items):
        import time

        self.batches.append(list(items))
        time.sleep(self.seconds)
        if self.fail_on in items:
            raise ValueError(f"bad item {self.fail_on}")
        return [i * 10 for i in items]


def test_items_that_arrive_while_a_batch_runs_go_together_into_the_next():
    async def go():
        fn = Recorder(seconds=0.2)
        q = BatchQueue(fn, max_batch_size=32, wait_s=0.01)
        first = asyncio.ensure_future(q.submit(0))
        await asyncio.sleep(0.05)  # the first batch is running
        later = []
        for i in range(1, 11):  # 10 items 10 ms apart: each alone would close a batch of its own after wait_s
            later.append(asyncio.ensure_future(q.submit(i)))
            await asyncio.sleep(0.01)
        return fn.batches, await first, await asyncio.gather(*later)

    batches, first, later = run(go())
    assert batches == [[0], list(range(1, 11))]
    assert (first, later) == (0, [i * 10 for i in range(1, 11)])


def test_a_batch_takes_at_most_max_batch_size_items_in_arrival_order():
    async def go():
        fn = Recorder()
        q = BatchQueue(fn, max_batch_size=4, wait_s=0.05)
        out = await asyncio.gather(*(q.submit(i) for i in range(10)))
        return fn.batches, out

    batches, out = run(go())
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and out == [i * 10 for i in range(10)]


def test_a_batch_waits_for_company_until_its_oldest_item_has_waited_wait_s():
    import time

    async def go():
        fn = Recorder()
        q = BatchQueue(fn, max_batch_size=8, wait_s=0.15)
        t0 = time.monotonic()
        a = asyncio.ensure_future(q.submit(1))
        await asyncio.sleep(0.05)
        b = asyncio.ensure_future(q.submit(2))  # joins the open batch
        await asyncio.gather(a, b)
        alone = time.monotonic() - t0
        return fn.batches, alone

    batches, alone = run(go())
    assert batches == [[1, 2]] and 0.15 <= alone < 0.5


def test_an_error_reaches_every_caller_of_its_batch_and_the_queue_goes_on():
    async def go():
        fn = Recorder(fail_on=3)
        q = BatchQueue(fn, max_batch_size=4, wait_s=0.05)
        bad = await asyncio.gather(*(q.submit(i) for i in range(4)), return_exceptions=True)
        good = await asyncio.gather(*(q.submit(i) for i in range(4, 6)))
        return fn.batches, bad, good

    batches, bad, good = run(go())
    assert batches == [[0, 1, 2, 3], [4, 5]]
    assert [str(e) for e in bad] == ["bad item 3"] * 4 and all(isinstance(e, ValueError) for e in bad)
    assert good == [40, 50]


def test_a_caller_that_went_away_is_left_out_of_its_batch():
    async def go():
        fn = Recorder(seconds=0.1)
        q = BatchQueue(fn, max_batch_size=8, wait_s=0.0)
        first = asyncio.ensure_future(q.submit(0))
        await asyncio.sleep(0.03)  # the first batch runs; the next two wait
        gone, kept = asyncio.ensure_future(q.submit(1)), asyncio.ensure_future(q.submit(2))
        await asyncio.sleep(0)
        gone.cancel()
        return fn.batches, await first, await kept, gone.cancelled()

    assert run(go()) == ([[0], [2]], 0, 20, True)


def test_a_new_event_loop_gets_a_worker_of_its_own():
    fn = Recorder()
    q = BatchQueue(fn, max_batch_size=4, wait_s=0.0)
    answers = []
    for i in range(2):  # as a TestClient does: a loop that ends, then another
        loop = asyncio.new_event_loop()
        answers.append(loop.run_until_complete(q.submit(i)))
        loop.close()
    assert answers == [0, 10] and fn.batches == [[0], [1]]


def test_explanation_matches_model_explain(model):
    a, b = "The film was a wonderful movie with great actors.", "I watched a terrible movie at the cinema."
    svc = EmbeddingService(model, ServeConfig())
    p = model.encode([a, b], output="probs", progress=False)
    got = svc.explanation(p[0], p[1])  # the model's budget
    want = model.explain(a, b)
    assert got.cosine == want.cosine and got.cognitive_load == want.cognitive_load
    assert [q.index for q in got.shared_yes] == [q.index for q in want.shared_yes]
    assert [q.index for q in got.only_a] == [q.index for q in want.only_a]
    assert [q.index for q in got.only_b] == [q.index for q in want.only_b]
    assert [q.p_a for q in got.shared_yes] == [q.p_a for q in want.shared_yes]


def test_yes_rates_from_the_model_or_from_served_texts(tmp_path, model):
    svc = EmbeddingService(model, ServeConfig())
    q = svc.questions()
    assert q.yes_rate_source == "served" and q.texts_seen == 0 and all(x.yes_rate is None for x in q.questions)
    run(svc.embed(EmbedRequest(texts=["a movie", "a doctor", "a film about doctors"])))
    bits = model.encode(["a movie", "a doctor", "a film about doctors"], progress=False)
    rates = [x.yes_rate for x in svc.questions().questions]
    assert rates == (bits.sum(axis=0) / 3).tolist()
    assert svc.questions().texts_seen == 3

    records = [{**r, "yes_rate": i / 100} for i, r in enumerate(model.question_records)]
    with_rates = InterpretableEmbedder(model.encoder_name, records, model.heads, model.tau, device="cpu", encoder=model.encoder)
    q = EmbeddingService(with_rates, ServeConfig()).questions()
    assert q.yes_rate_source == "model" and [x.yes_rate for x in q.questions] == [i / 100 for i in range(32)]


def test_limits_checked_before_the_model(model):
    svc = EmbeddingService(model, ServeConfig(max_texts_per_request=2, max_chars_per_text=5))
    assert error_of(svc.check_texts, ["a", "b", "c"], "texts").code == "too_many_texts"
    assert error_of(svc.check_texts, ["abcdef"], "texts").message == "texts[0] has 6 characters; at most 5"
    assert error_of(svc.check_texts, [" "], "input").message == "input is empty, or only whitespace and characters no encoder reads"
    assert error_of(svc.check_texts, ["\u200b\ufeff"], "input").code == "empty_text"
    assert error_of(svc.check_texts, [], "input").status == 422
    assert svc.texts_seen == 0


def test_counting_tokens_does_not_disturb_a_batch_in_the_worker_thread(model):
    """/v1/embeddings counts tokens on the event loop while another batch tokenises in the worker thread: the two
    must not share one fast tokenizer (its padding setting flips per call; shared, a batch lost its padding)."""
    import threading

    svc = EmbeddingService(model, ServeConfig())
    texts = ["a cat sat on the mat", "Stock markets fell sharply on Tuesday after the central bank raised rates."] * 4
    want = svc.count_tokens(texts)
    enc, errors, counts = model.encoder, [], []

    def batches():
        for _ in range(1500):
            try:
                enc.tokenize(texts)  # what Encoder.encode runs in the worker thread
            except Exception as e:
                errors.append(repr(e))

    def usage():
        for _ in range(1500):
            counts.append(svc.count_tokens(texts))

    threads = [threading.Thread(target=batches), threading.Thread(target=usage)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == [] and set(counts) == {want}


def test_encoder_batch_size_follows_the_backend_unless_set(model):
    from cqg_ray.encoder_export import EXPORTED
    from cqg_ray.hardware import cpu_flags

    on_cpu = EmbeddingService(model, ServeConfig()).encoder_batch_size
    assert on_cpu == (32 if model.encoder.backend in EXPORTED and "avx512f" in cpu_flags() else 8)
    assert EmbeddingService(model, ServeConfig(encoder_batch_size=5)).encoder_batch_size == 5


def test_the_encoder_batch_size_follows_the_device_the_backend_and_the_cpu():
    from types import SimpleNamespace

    from cqg_ray.serve.service import default_encoder_batch_size

    def model(device, backend):
        return SimpleNamespace(device=device, encoder=SimpleNamespace(backend=backend))

    zen4, avx2 = {"avx2", "avx512f", "avx512_bf16"}, {"avx2", "fma"}
    assert default_encoder_batch_size(model("cuda", "torch-float32"), avx2) == 64
    assert default_encoder_batch_size(model("cpu", "openvino"), zen4) == 32
    assert default_encoder_batch_size(model("cpu", "onnx"), zen4) == 32
    assert default_encoder_batch_size(model("cpu", "openvino"), avx2) == 8  # padding a batch of 32 costs more there
    assert default_encoder_batch_size(model("cpu", "torch-float32"), zen4) == 8
