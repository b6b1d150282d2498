"""Bad requests of many kinds, sent to a real Serve app: each answered 4xx with a clear message in OpenAI's error
shape (never 5xx), and the server keeps serving. test_app.py sends the same requests to the app without Ray."""

import gzip
import json

import pytest

from tests.serve.conftest import TEST_CFG

J = {"content-type": "application/json"}
MAX_TEXTS, MAX_CHARS, MAX_BYTES = TEST_CFG["max_texts_per_request"], TEST_CFG["max_chars_per_text"], TEST_CFG["max_request_bytes"]


def raw(obj) -> bytes:
    return json.dumps(obj).encode()


# (name, method, path, body bytes or None, headers, expected status, a piece of the message)
BAD = [
    ("malformed JSON", "POST", "/embed", b'{"texts": [', J, 400, "not valid JSON"),
    ("not JSON at all", "POST", "/embed", b"hello there", J, 400, "not valid JSON"),
    ("empty body", "POST", "/embed", b"", J, 400, "empty request body"),
    ("whitespace body", "POST", "/embed", b"  \n ", J, 400, "empty request body"),
    ("top-level array", "POST", "/embed", raw(["a text"]), J, 422, "JSON object, got a JSON array"),
    ("top-level string", "POST", "/embed", raw("a text"), J, 422, "got a JSON string"),
    ("top-level null", "POST", "/embed", b"null", J, 422, "got a JSON null"),
    ("missing texts", "POST", "/embed", raw({}), J, 422, "texts: Field required"),
    ("texts is a string", "POST", "/embed", raw({"texts": "one text"}), J, 422, "texts: Input should be a valid list"),
    ("texts is an object", "POST", "/embed", raw({"texts": {"a": 1}}), J, 422, "texts: Input should be a valid list"),
    ("empty texts list", "POST", "/embed", raw({"texts": []}), J, 422, "at least 1 item"),
    ("a number among texts", "POST", "/embed", raw({"texts": ["ok", 3]}), J, 422, "texts.1: Input should be a valid string"),
    ("null among texts", "POST", "/embed", raw({"texts": [None]}), J, 422, "texts.0: Input should be a valid string"),
    ("nested list of texts", "POST", "/embed", raw({"texts": [["a"]]}), J, 422, "texts.0: Input should be a valid string"),
    ("empty text", "POST", "/embed", raw({"texts": ["ok", ""]}), J, 422, "texts[1] is empty"),
    ("whitespace-only text", "POST", "/embed", raw({"texts": ["  \t\n"]}), J, 422, "texts[0] is empty"),
    ("too many texts", "POST", "/embed", raw({"texts": ["t"] * (MAX_TEXTS + 1)}), J, 413, f"at most {MAX_TEXTS} per request"),
    ("text too long", "POST", "/embed", raw({"texts": ["x" * (MAX_CHARS + 1)]}), J, 413, f"at most {MAX_CHARS}"),
    ("body too large", "POST", "/embed", raw({"texts": ["y" * (MAX_BYTES + 10)]}), J, 413, f"at most {MAX_BYTES}"),
    ("tau zero", "POST", "/embed", raw({"texts": ["a"], "tau": 0}), J, 422, "tau: Input should be greater than 0"),
    ("tau above one", "POST", "/embed", raw({"texts": ["a"], "tau": 1.5}), J, 422, "tau: Input should be less than 1"),
    ("tau as a string", "POST", "/embed", raw({"texts": ["a"], "tau": "0.5"}), J, 422, "tau: Input should be a valid number"),
    ("tau NaN", "POST", "/embed", b'{"texts": ["a"], "tau": NaN}', J, 422, "tau: Input should be a finite number"),
    ("explain tau Infinity", "POST", "/explain", b'{"text_a": "a", "text_b": "b", "tau": -Infinity}', J, 422, "tau: Input should be a finite number"),
    ("unknown output", "POST", "/embed", raw({"texts": ["a"], "output": "floats"}), J, 422, "output: Input should be 'bits', 'probs' or 'sparse'"),
    ("k zero", "POST", "/embed", raw({"texts": ["a"], "k": 0}), J, 422, "k: Input should be greater than or equal to 1"),
    ("k negative", "POST", "/embed", raw({"texts": ["a"], "k": -3}), J, 422, "k: Input should be greater than or equal to 1"),
    ("k as a string", "POST", "/embed", raw({"texts": ["a"], "k": "8"}), J, 422, "k: Input should be a valid integer"),
    ("k a fraction", "POST", "/embed", raw({"texts": ["a"], "k": 2.5}), J, 422, "k: Input should be a valid integer"),
    ("k over m", "POST", "/embed", raw({"texts": ["a"], "k": 33}), J, 422, "k must be from 1 to m=32, got 33"),
    ("k and tau", "POST", "/embed", raw({"texts": ["a"], "k": 3, "tau": 0.5}), J, 422, "give tau (the paper's rule) or k (top-k), not both"),
    ("explain k over m", "POST", "/explain", raw({"text_a": "a", "text_b": "b", "k": 99}), J, 422, "k must be from 1 to m=32, got 99"),
    ("k with probabilities", "POST", "/embed", raw({"texts": ["a"], "output": "probs", "k": 3}), J, 422,
     "output 'probs' is every probability, unbudgeted: tau and k choose the active questions of bits and sparse"),
    ("tau with probabilities", "POST", "/embed", raw({"texts": ["a"], "output": "probs", "tau": 0.5}), J, 422, "output 'probs' is every probability"),
    ("packed probabilities", "POST", "/embed", raw({"texts": ["a"], "output": "probs", "packed": True}), J, 422, "packed applies to output 'bits' only"),
    ("packed as a string", "POST", "/embed", raw({"texts": ["a"], "packed": "yes"}), J, 422, "packed: Input should be a valid boolean"),
    ("unknown field", "POST", "/embed", raw({"texts": ["a"], "text": "b"}), J, 422, "text: Extra inputs are not permitted"),
    ("wrong content type", "POST", "/embed", raw({"texts": ["a"]}), {"content-type": "text/plain"}, 415, "Content-Type must be application/json"),
    ("form content type", "POST", "/embed", b"texts=a", {"content-type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ("gzip body", "POST", "/embed", gzip.compress(raw({"texts": ["a"]})), {**J, "content-encoding": "gzip"}, 415,
     "Content-Encoding 'gzip' is not supported: send the body uncompressed"),
    ("unpaired surrogate", "POST", "/embed", b'{"texts": ["bad \\ud800 text"]}', J, 422, "unpaired surrogate"),
    ("invalid UTF-8 bytes", "POST", "/embed", b'{"texts": ["\xff\xfe"]}', J, 400, "not UTF-8"),
    ("deeply nested JSON", "POST", "/embed", b"[" * 9_000 + b"]" * 9_000, J, 400, "nested too deeply"),
    ("explain without text_b", "POST", "/explain", raw({"text_a": "a"}), J, 422, "text_b: Field required"),
    ("explain with a number", "POST", "/explain", raw({"text_a": 5, "text_b": "b"}), J, 422, "text_a: Input should be a valid string"),
    ("explain with an empty text", "POST", "/explain", raw({"text_a": "", "text_b": "b"}), J, 422, "text_a is empty"),
    ("explain with a long text", "POST", "/explain", raw({"text_a": "a", "text_b": "z" * (MAX_CHARS + 1)}), J, 413, "text_b has"),
    ("explain with a list", "POST", "/explain", raw({"text_a": ["a"], "text_b": "b"}), J, 422, "text_a: Input should be a valid string"),
    ("openai without input", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa"}), J, 422, "input: Field required"),
    ("openai without model", "POST", "/v1/embeddings", raw({"input": "a"}), J, 422, "model: Field required"),
    ("openai empty input list", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": []}), J, 422, "input is empty"),
    ("openai empty string", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": ""}), J, 422, "input is empty"),
    ("openai token ids", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": [1, 2, 3]}), J, 422, "input: token ids are not supported"),
    ("openai input a number", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": 5}), J, 422,
     "input: must be a string or a list of strings, got a JSON number"),
    ("openai input null", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": None}), J, 422,
     "input: must be a string or a list of strings, got a JSON null"),
    ("openai a number among inputs", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": ["a", 1]}), J, 422,
     "input: item 1 must be a string, got a JSON number"),
    ("openai token id lists", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": [[1, 2], [3]]}), J, 422, "token ids"),
    ("openai unknown format", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": "a", "encoding_format": "binary"}), J, 422, "encoding_format"),
    ("openai unknown model", "POST", "/v1/embeddings", raw({"model": "text-embedding-3-small", "input": "a"}), J, 404, "does not exist"),
    ("openai wrong dimensions", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": "a", "dimensions": 64}), J, 422, "dimensions must be 32"),
    ("openai too many inputs", "POST", "/v1/embeddings", raw({"model": "cqg-mbqa", "input": ["a"] * (MAX_TEXTS + 1)}), J, 413, "input has"),
    ("GET on a POST route", "GET", "/embed", None, {}, 405, "GET is not allowed on /embed"),
    ("POST on a GET route", "POST", "/questions", raw({}), J, 405, "POST is not allowed"),
    ("unknown route", "GET", "/nowhere", None, {}, 404, "no route /nowhere"),
    ("root with POST", "POST", "/", raw({"texts": ["a"]}), J, 404, "no route /"),
]

AUTH_BAD = [
    ("no Authorization header", {}, "missing Authorization header"),
    ("wrong token", {"Authorization": "Bearer not-the-token"}, "invalid bearer token"),
    ("Basic instead of Bearer", {"Authorization": "Basic dXNlcjpwYXNz"}, "must be 'Bearer <token>'"),
    ("Bearer with no token", {"Authorization": "Bearer"}, "must be 'Bearer <token>'"),
]


def test_there_are_at_least_30_kinds():
    assert len(BAD) + len(AUTH_BAD) >= 30
    assert len({b[0] for b in BAD}) == len(BAD)


@pytest.mark.parametrize("name,method,path,body,headers,status,message", BAD, ids=[b[0] for b in BAD])
def test_bad_request(client, name, method, path, body, headers, status, message):
    r = client.request(method, path, content=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert message in err["message"], err
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("name,headers,message", AUTH_BAD, ids=[b[0] for b in AUTH_BAD])
def test_bad_token(server, name, headers, message):
    import httpx

    r = httpx.post(server.secure_url + "/embed", json={"texts": ["a"]}, headers=headers, timeout=60)
    assert r.status_code == 401, r.text
    assert message in r.json()["error"]["message"]


def test_still_serving_after_bad_requests(client):
    """Every kind once more in a row, then good requests are answered."""
    for _, method, path, body, headers, status, _ in BAD:
        assert client.request(method, path, content=body, headers=headers).status_code == status
    r = client.post("/embed", json={"texts": ["The film was wonderful.", "A new vaccine was tested."]})
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 2
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.post("/explain", json={"text_a": "a movie", "text_b": "a film"}).status_code == 200


def test_oversized_headers_get_431(client):
    """Serve's proxy (uvicorn) takes headers of any size; the app refuses them past MAX_HEADER_BYTES in all."""
    from cqg_ray.serve.app import MAX_HEADER_BYTES

    for r in (client.get("/healthz", headers={"x-big": "a" * 200_000}),
              client.post("/embed", json={"texts": ["a"]}, headers={f"x-h{i}": "b" * 100 for i in range(200)})):
        assert r.status_code == 431, r.text
        err = r.json()["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "headers_too_large", None)
        assert f"at most {MAX_HEADER_BYTES}" in err["message"]
    assert client.get("/healthz", headers={"x-big": "a" * (MAX_HEADER_BYTES - 1000)}).status_code == 200


def test_streamed_body_over_the_limit_gets_413(client):
    """A chunked body (no Content-Length) is counted as it arrives."""

    def chunks():
        yield b'{"texts": ["'
        for _ in range(MAX_BYTES // 1000 + 1):
            yield b"z" * 1000
        yield b'"]}'

    r = client.post("/embed", content=chunks(), headers=J)
    assert r.status_code == 413, r.text
    assert r.json()["error"] == {"message": f"request body over {MAX_BYTES} bytes", "type": "invalid_request_error",
                                 "code": "body_too_large", "param": None}


def test_a_body_that_stops_arriving_gets_408_through_serves_proxy(server):
    """A raw socket sends the headers and the first bytes of a body, then nothing: the replica answers 408 after its
    `body_timeout_s` (an app of its own with 2 s), through Ray Serve's proxy, and the connection is closed. Without
    the limit the request would hold one of the replica's in-flight slots for as long as the client kept it open."""
    import socket
    import time

    from ray import serve

    from cqg_ray.serve.app import build_app

    cfg = server.cfg.model_copy(update={"body_timeout_s": 2.0, "num_cpus_per_replica": 0.25})
    serve.run(build_app(server.model_path, cfg), name="slow-body", route_prefix="/slow-body")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=120) as s:
            start = time.monotonic()
            s.sendall(b"POST /slow-body/embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b'Content-Length: 40\r\n\r\n{"texts": ["a sl')
            data = b""
            while chunk := s.recv(65536):  # to the end: the server closes the connection after its answer
                data += chunk
            took = time.monotonic() - start
    finally:
        serve.delete("slow-body")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower() and took >= 2.0, data[:2000]
    assert json.loads(body)["error"] == {"message": "request body not received within 2 s (16 bytes came)", "type": "invalid_request_error",
                                         "code": "body_timeout", "param": None}
