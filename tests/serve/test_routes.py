"""Every route of a real Serve app on 127.0.0.1 through a real HTTP client (httpx) and the `openai` client."""

import base64
import json

import numpy as np
import pytest

TEXTS = [
    "The fossil has been named Selam, which means peace in Ethiopia's official Amharic language.",
    "another similarity with fight club is that both films are not action flicks .",
    "Large footprint; grabs the paper loudly; shakes the desk while printing (!)",
    "The new vaccine lowered the infection rate in the clinical trial.",
]
A = "The film was a wonderful movie with great actors and a moving story."
B = "I watched a terrible movie at the cinema; the acting was poor."


def local(model, texts):
    return model.encode(texts, output="probs", progress=False)


def assert_bits_match(bits, p_local, tau):
    """Server bits equal the local model's, except where a probability sits within 1e-3 of tau (batch padding
    changes the encoder's output in the 6th decimal)."""
    bits = np.asarray(bits)
    clear = np.abs(p_local - tau) > 1e-3
    assert (bits == (p_local > tau))[clear].all()


def test_healthz(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert {k: body[k] for k in ("status", "model", "m", "tau")} == {"status": "ok", "model": "cqg-mbqa", "m": 32, "tau": 0.5}
    assert body["batches"] <= body["texts_seen"]


def test_embed_bits_probs_packed_and_tau(client, model):
    p = local(model, TEXTS)
    r = client.post("/embed", json={"texts": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["model"], body["m"], body["tau"], body["output"], body["packed"]) == ("cqg-mbqa", 32, 0.5, "bits", False)
    bits = np.array(body["embeddings"])
    assert bits.shape == (4, 32) and set(np.unique(bits)) <= {0, 1}
    assert_bits_match(bits, p, 0.5)

    got = client.post("/embed", json={"texts": TEXTS, "output": "probs"}).json()
    probs = np.array(got["embeddings"])
    assert got["budget"] == "none: every probability"
    assert probs.shape == (4, 32)
    assert np.allclose(probs, p, atol=1e-4)

    packed = client.post("/embed", json={"texts": TEXTS, "packed": True}).json()
    assert packed["packed"] is True
    raw = [np.frombuffer(base64.b64decode(s), np.uint8) for s in packed["embeddings"]]
    assert all(len(x) == 4 for x in raw)  # ceil(32 / 8) bytes a text
    assert np.array_equal(np.unpackbits(np.stack(raw), axis=1, count=32), bits)

    low = client.post("/embed", json={"texts": TEXTS, "tau": 0.2}).json()
    assert (low["tau"], low["budget"]) == (0.5, "tau=0.2")
    assert_bits_match(low["embeddings"], p, 0.2)
    assert np.array(low["embeddings"]).sum() >= bits.sum()


def test_embed_sparse_and_k(client, model):
    p = local(model, TEXTS)
    body = client.post("/embed", json={"texts": TEXTS, "output": "sparse", "k": 3}).json()
    assert (body["output"], body["budget"], body["embeddings"]) == ("sparse", "top3>0.5", None)
    clear = (np.abs(p - 0.5) > 1e-3).all(axis=1)  # texts with no probability at the floor's float noise
    for row, (idx, vals) in enumerate(zip(body["indices"], body["values"])):
        assert len(idx) == len(vals) <= 3 and vals == [1.0] * len(idx)  # a version-1 model's values are 0/1
        assert [p[row, i] for i in idx] == sorted((p[row, i] for i in idx), reverse=True)  # most confident first
        if clear[row]:
            want = [i for i in np.argsort(-p[row], kind="stable")[:3] if p[row, i] > 0.5]
            assert idx == want
    bits = np.array(client.post("/embed", json={"texts": TEXTS, "k": 3}).json()["embeddings"])
    assert (bits.sum(axis=1) <= 3).all()
    assert [sorted(i) for i in body["indices"]] == [np.flatnonzero(b).tolist() for b in bits]


def test_explain_matches_the_model(client, model):
    r = client.post("/explain", json={"text_a": A, "text_b": B})
    assert r.status_code == 200, r.text
    got = r.json()
    want = model.explain(A, B)
    assert [q["index"] for q in got["shared_yes"]] == [q.index for q in want.shared_yes]  # ranked alike
    assert [q["index"] for q in got["only_a"]] == [q.index for q in want.only_a]
    assert [q["index"] for q in got["only_b"]] == [q.index for q in want.only_b]
    assert got["cognitive_load"] == want.cognitive_load == len(want.shared_yes) > 0
    assert got["cosine"] == pytest.approx(want.cosine, abs=1e-12)
    assert got["m"] == 32 and got["budget"] == "tau=0.5"
    assert got["yes_a"] == len(want.shared_yes) + len(want.only_a)
    q = got["shared_yes"][0]
    assert q["text"] == model.questions[q["index"]] and q["id"] == f"q{q['index']:03d}"
    assert q["a"] and q["b"] and q["p_a"] > 0.5 and q["p_b"] > 0.5
    for d in got["only_a"]:
        assert d["a"] and not d["b"] and d["p_b"] <= 0.5
    # each shown question with its measured precision and the labels behind it, as the model stores them
    shown = got["shared_yes"] + got["only_a"] + got["only_b"]
    assert [(d["precision"], d["n_heldout"]) for d in shown] == [(q.precision, q.n_heldout) for q in want.shared_yes + want.only_a + want.only_b]
    for d in shown:
        rec = model.question_records[d["index"]]
        assert (d["precision"], d["n_heldout"]) == (rec.get("precision"), rec.get("n_heldout"))
    assert {d["index"] % 3 for d in shown} == {0, 1, 2}  # all three kinds are among them

    strict = client.post("/explain", json={"text_a": A, "text_b": B, "tau": 0.9}).json()
    assert strict["budget"] == "tau=0.9" and strict["cognitive_load"] <= got["cognitive_load"]
    short = client.post("/explain", json={"text_a": A, "text_b": B, "k": 2}).json()
    assert short["budget"] == "top2>0.5" and short["cognitive_load"] <= 2 and short["yes_a"] <= 2


def test_questions_with_served_yes_rates(client, model):
    client.post("/embed", json={"texts": TEXTS})
    r = client.get("/questions")
    assert r.status_code == 200
    body = r.json()
    assert body["m"] == 32 and len(body["questions"]) == 32
    assert body["yes_rate_source"] == "served" and body["texts_seen"] >= 4
    assert [q["text"] for q in body["questions"]] == model.questions
    assert [q["id"] for q in body["questions"]] == [f"q{i:03d}" for i in range(32)]
    assert all(0.0 <= q["yes_rate"] <= 1.0 for q in body["questions"])
    assert [(q["precision"], q["recall"], q["n_heldout"]) for q in body["questions"]] == [
        (r.get("precision"), r.get("recall"), r.get("n_heldout")) for r in model.question_records]


def test_openai_route_raw(client, model):
    p = local(model, [A, B])
    r = client.post("/v1/embeddings", json={"model": "cqg-mbqa", "input": [A, B]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "cqg-mbqa"
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    vecs = np.array([d["embedding"] for d in body["data"]])
    assert vecs.shape == (2, 32)
    assert_bits_match(vecs, p, 0.5)
    from transformers import AutoTokenizer

    from cqg_ray.encoder import resolve_encoder_path

    tokens = sum(len(x) for x in AutoTokenizer.from_pretrained(resolve_encoder_path(model.encoder.name))([A, B])["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    explicit = client.post("/v1/embeddings", json={"model": "cqg-mbqa", "input": A, "encoding_format": None, "dimensions": None}).json()
    assert explicit["data"][0]["embedding"] == body["data"][0]["embedding"]  # every field sent, nulls included: the floats
    b64 = client.post("/v1/embeddings", json={"model": "cqg-mbqa", "input": A, "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, vecs[0])
    assert client.get("/v1/models").json()["data"][0]["id"] == "cqg-mbqa"


def test_openai_client(server, client):
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    one = oa.embeddings.create(model="cqg-mbqa", input=A)  # the client asks for base64 and decodes it
    assert len(one.data) == 1 and len(one.data[0].embedding) == 32
    both = oa.embeddings.create(model="cqg-mbqa", input=[A, B], encoding_format="float")
    x, y = (np.array(d.embedding) for d in both.data)
    assert one.data[0].embedding == both.data[0].embedding
    assert both.usage.prompt_tokens > 0
    # cosine of the returned vectors is the model's similarity, as /explain reports it
    explained = client.post("/explain", json={"text_a": A, "text_b": B}).json()
    assert float(x @ y / np.sqrt(x.sum() * y.sum())) == pytest.approx(explained["cosine"], abs=1e-9)
    assert [m.id for m in oa.models.list()] == ["cqg-mbqa"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.embeddings.create(model="text-embedding-3-small", input=A)
    with pytest.raises(openai.UnprocessableEntityError, match="empty"):
        oa.embeddings.create(model="cqg-mbqa", input=[])
    with pytest.raises(openai.UnprocessableEntityError, match="token ids"):
        oa.embeddings.create(model="cqg-mbqa", input=[[1, 2, 3]])


def test_page_and_docs(client):
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "Compare two texts" in r.text and "default-src 'none'" in r.headers["content-security-policy"]
    spec = client.get("/openapi.json").json()
    assert {"/embed", "/explain", "/questions", "/v1/embeddings", "/healthz"} <= set(spec["paths"])


def test_bearer_token_app(server):
    import httpx

    with httpx.Client(base_url=server.secure_url, timeout=60) as c:
        assert c.get("/healthz").status_code == 200  # liveness needs no token
        assert c.get("/ui").status_code == 200       # the page itself holds no data; it sends the token it is given
        r = c.post("/embed", json={"texts": [A]})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "missing Authorization" in r.json()["error"]["message"]
        assert c.get("/questions").status_code == 401
        auth = {"Authorization": f"Bearer {server.token}"}
        assert c.post("/embed", json={"texts": [A]}, headers=auth).status_code == 200
        assert c.get("/questions", headers=auth).json()["m"] == 32
        lost = c.get("/nowhere", headers=auth).json()["error"]["message"]  # the routes named under the app's prefix
        assert lost == ("no route /secure/nowhere: see GET /secure/ui, GET /secure/questions, POST /secure/embed, POST /secure/explain, "
                        "POST /secure/v1/embeddings")
    openai = pytest.importorskip("openai")
    oa = openai.OpenAI(base_url=server.secure_url + "/v1", api_key=server.token, max_retries=0)
    assert len(oa.embeddings.create(model="cqg-mbqa", input=A).data[0].embedding) == 32
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.secure_url + "/v1", api_key="wrong", max_retries=0).embeddings.create(model="cqg-mbqa", input=A)


def test_batching_shares_encoder_calls(server):
    """Concurrent single-text requests are answered from shared batches (fewer encoder calls than requests)."""
    import asyncio

    import httpx

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            before = (await c.get("/healthz")).json()
            rs = await asyncio.gather(*(c.post("/embed", json={"texts": [f"text number {i} about a movie"]}) for i in range(48)))
            after = (await c.get("/healthz")).json()
            return [r.status_code for r in rs], after["texts_seen"] - before["texts_seen"], after["batches"] - before["batches"]

    codes, seen, batches = asyncio.run(go())
    assert codes == [200] * 48 and seen == 48
    assert batches < 48  # at least some requests shared an encoder call


def test_json_error_shape(client):
    r = client.post("/embed", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert set(json.loads(r.text)["error"]) == {"message", "type", "code", "param"}
