"""The HTTP layer without Ray: `build_api` (FastAPI) through FastAPI's TestClient: request limits (431, 413, 408), the
key (401), typed bodies and the OpenAI error shape (400, 415, 422); the Serve deployment's options and builder.

The real server (Ray Serve's proxy and a replica) answers the same requests in test_bad_requests.py and test_routes.py.
"""

import pytest
from fastapi.testclient import TestClient

from cqg_ray.config import ServeConfig
from cqg_ray.serve.app import MAX_HEADER_BYTES, build_api, check_bearer, read_api_key
from cqg_ray.serve.protocol import ApiError
from cqg_ray.serve.service import EmbeddingService
from tests.serve.conftest import TEST_CFG, TOKEN
from tests.serve.test_bad_requests import AUTH_BAD, BAD

J = {"content-type": "application/json"}
ERROR_KEYS = {"message", "type", "code", "param"}


@pytest.fixture(scope="module")
def api(model):
    with TestClient(build_api(EmbeddingService(model, ServeConfig(**TEST_CFG)))) as c:
        yield c


@pytest.fixture(scope="module")
def secure_api(model):
    with TestClient(build_api(EmbeddingService(model, ServeConfig(**TEST_CFG)), api_key=TOKEN)) as c:
        yield c


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    return body["error"]


@pytest.mark.parametrize("name,method,path,body,headers,status,message", BAD, ids=[b[0] for b in BAD])
def test_bad_request(api, name, method, path, body, headers, status, message):
    err = error_of(api.request(method, path, content=body, headers=headers), status)
    assert message in err["message"], err
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("name,headers,message", AUTH_BAD, ids=[b[0] for b in AUTH_BAD])
def test_bad_key(secure_api, name, headers, message):
    r = secure_api.post("/embed", json={"texts": ["a"]}, headers=headers)
    err = error_of(r, 401)
    assert message in err["message"] and err["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"


def test_key_guards_every_route_but_health_and_page(secure_api, api):
    for method, path, body in [("POST", "/embed", {"texts": ["a"]}), ("POST", "/explain", {"text_a": "a", "text_b": "b"}),
                               ("GET", "/questions", None), ("POST", "/v1/embeddings", {"model": "cqg-mbqa", "input": "a"}),
                               ("GET", "/v1/models", None)]:
        assert error_of(secure_api.request(method, path, json=body), 401)["code"] == "missing_token"
        wrong = secure_api.request(method, path, json=body, headers={"Authorization": "Bearer not-the-token"})
        assert error_of(wrong, 401)["code"] == "invalid_token"
        assert secure_api.request(method, path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert api.request(method, path, json=body).status_code == 200  # no key configured: nothing to send
    assert secure_api.get("/healthz").status_code == 200
    head = secure_api.head("/healthz")  # uptime probes ask with HEAD (a 405 before)
    assert head.status_code == 200 and head.content == b""
    assert secure_api.get("/ui").status_code == 200
    # the schema is behind the key; the browsable docs pages, which fetch it without the key, are off
    assert error_of(secure_api.get("/openapi.json"), 401)["code"] == "missing_token"
    import warnings

    with warnings.catch_warnings():  # GET and HEAD /healthz as one route gave FastAPI's "Duplicate Operation ID" warning
        warnings.simplefilter("error")
        spec = secure_api.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert list(spec["paths"]["/healthz"]) == ["get"]
    assert spec == api.get("/openapi.json").json() and "/embed" in spec["paths"]
    assert [secure_api.get(p).status_code for p in ("/docs", "/redoc")] == [404, 404]
    assert [api.get(p).status_code for p in ("/docs", "/redoc")] == [200, 200]
    # the key is checked after the body is read as JSON (docs/serving.md: the order of the checks), before its schema
    assert error_of(secure_api.post("/embed", content=b'{"texts": 5}', headers=J), 401)["code"] == "missing_token"
    assert error_of(secure_api.post("/embed", content=b'{"texts": ', headers=J), 400)["code"] == "invalid_json"


def test_oversized_headers_get_431(api):
    err = error_of(api.get("/healthz", headers={"x-big": "a" * 200_000}), 431)
    assert err["code"] == "headers_too_large" and f"at most {MAX_HEADER_BYTES}" in err["message"]
    many = {f"x-h{i}": "b" * 100 for i in range(200)}  # the total counts, not one header
    assert error_of(api.post("/embed", json={"texts": ["a"]}, headers=many), 431)["code"] == "headers_too_large"
    assert api.get("/healthz", headers={"x-big": "a" * (MAX_HEADER_BYTES - 1000)}).status_code == 200


def test_oversized_body_gets_413(api):
    limit = TEST_CFG["max_request_bytes"]
    big = b'{"texts": ["' + b"y" * limit + b'"]}'
    err = error_of(api.post("/embed", content=big, headers=J), 413)
    assert (err["code"], err["message"]) == ("body_too_large", f"request body of {len(big)} bytes; at most {limit}")

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"texts": ["'
        for _ in range(limit // 1000 + 1):
            yield b"z" * 1000
        yield b'"]}'

    err = error_of(api.post("/embed", content=chunks(), headers=J), 413)
    assert (err["code"], err["message"]) == ("body_too_large", f"request body over {limit} bytes")
    fits = b'{"texts": ["' + b"w " * 900 + b'"]}'
    assert api.post("/embed", content=fits, headers=J).status_code == 200


def test_a_content_length_of_other_digits_is_a_400(api):
    """"²" is a digit to str.isdigit but not to int(): raw ASGI (an HTTP client would not send it; uvicorn refuses it
    first, but the app does not rely on that)."""
    import asyncio
    import json

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/embed",
             "raw_path": b"/embed", "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", "\u00b2".encode("latin-1"))]}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b'{"texts": ["a"]}', "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(api.app(scope, receive, send))
    assert sent[0]["status"] == 400
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["error"]["code"] == "bad_content_length"


def test_a_body_that_stops_arriving_gets_408_and_the_connection_closes(model):
    """Raw ASGI: the headers and the first bytes of a body come, the rest never does; after `body_timeout_s` the
    client gets a 408 in the error shape and the connection is closed (the unread rest would be taken for the next
    request). A body that arrives in time is answered."""
    import asyncio
    import json
    import time

    app = build_api(EmbeddingService(model, ServeConfig(**TEST_CFG, body_timeout_s=0.5)))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/embed",
             "raw_path": b"/embed", "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json")]}

    def answer(parts: list[bytes], whole: bool) -> tuple[list[dict], float]:
        sent: list[dict] = []
        chunks = iter(parts)

        async def receive():
            part = next(chunks, None)
            if part is None:
                await asyncio.sleep(3600)  # the client sends nothing more
            return {"type": "http.request", "body": part, "more_body": not (whole and part == parts[-1])}

        async def send(message):
            sent.append(message)

        start = time.monotonic()
        asyncio.run(asyncio.wait_for(app(scope, receive, send), 60))
        return sent, time.monotonic() - start

    sent, took = answer([b'{"texts": ["a sl', b"ow"], whole=False)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"] and 0.5 <= took < 30
    assert json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"] == {
        "message": "request body not received within 0.5 s (18 bytes came)", "type": "invalid_request_error", "code": "body_timeout", "param": None}
    sent, _ = answer([b'{"texts": ["in', b' time"]}'], whole=True)
    assert sent[0]["status"] == 200


def test_malformed_bodies_get_openai_errors(api):
    """What the hand-written parser answered, FastAPI's parsing answers the same (message, code, param)."""
    e = error_of(api.post("/embed", content=b'{"texts": [1, 2]}', headers=J), 422)
    assert (e["message"], e["param"], e["code"]) == ("texts.0: Input should be a valid string (and 1 more problem)", "texts.0", "invalid_value")
    assert error_of(api.post("/embed", content=b"[1]", headers=J), 422)["message"] == "request body must be a JSON object, got a JSON array"
    assert error_of(api.post("/embed", content=b'{\n"texts": [\n"a",,]}', headers=J), 400) == {
        "message": "request body is not valid JSON: Expecting value at line 3 column 5", "type": "invalid_request_error",
        "code": "invalid_json", "param": None}
    assert error_of(api.post("/embed", content=b"{", headers=J), 400)["code"] == "invalid_json"
    assert error_of(api.post("/embed", content=b'{"texts": ["a\tb"]}', headers=J), 400)["message"] == (
        "request body is not valid JSON: Invalid control character at line 1 column 14")
    assert error_of(api.post("/embed", content=b"", headers=J), 400)["code"] == "empty_body"
    assert error_of(api.post("/embed", content=b'{"texts": ["a"]}', headers={"content-type": "text/plain"}), 415)["code"] == "unsupported_media_type"
    assert error_of(api.post("/explain", json={"text_a": "x"}), 422)["param"] == "text_b"
    # a body without a Content-Type is read as JSON; typed bodies parse as the schemas say
    assert len(api.post("/embed", content=b'{"texts": ["a", "b"]}').json()["embeddings"]) == 2
    assert api.post("/explain", json={"text_a": "x", "text_b": "y", "tau": 0.3}).json()["budget"] == "tau=0.3"


def test_openapi_names_the_typed_bodies(api):
    spec = api.get("/openapi.json").json()
    for path, schema in [("/embed", "EmbedRequest"), ("/explain", "ExplainRequest"), ("/v1/embeddings", "EmbeddingsRequest")]:
        assert spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{schema}"}
    assert spec["paths"]["/embed"]["post"]["responses"]["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}


def test_no_route_to_the_model_hops_to_a_worker_thread_on_its_way():
    """FastAPI runs a plain-def dependency or route on a worker thread: a thread hop per request, on the cores the
    encoder needs. The routes that reach the model, and every dependency of every route, are coroutines."""
    import inspect

    from fastapi.routing import APIRoute

    def calls(dependant):
        for d in dependant.dependencies:
            yield d.call
            yield from calls(d)

    from cqg_ray.serve.app import router

    routes = {r.path: r for r in router.routes if isinstance(r, APIRoute)}
    assert [p for p in ("/embed", "/explain", "/v1/embeddings") if not inspect.iscoroutinefunction(routes[p].endpoint)] == []
    assert sorted({c.__name__ for r in routes.values() for c in calls(r.dependant) if not inspect.iscoroutinefunction(c)}) == []
    assert sorted({c.__name__ for r in routes.values() for c in calls(r.dependant)}) == ["get_service", "require_key"]


def test_check_bearer_and_read_api_key(monkeypatch):
    def error_of_check(*args):
        with pytest.raises(ApiError) as e:
            check_bearer(*args)
        return e.value

    check_bearer(None, None)
    check_bearer("Bearer anything", None)
    check_bearer("Bearer s3cret", "s3cret")
    check_bearer("bearer s3cret", "s3cret")
    assert error_of_check(None, "s3cret").code == "missing_token"
    assert error_of_check("Bearer nope", "s3cret").code == "invalid_token"
    assert error_of_check("Token s3cret", "s3cret").code == "bad_scheme"
    assert error_of_check("Bearer s3cret", "s3cret2").status == 401
    assert read_api_key(ServeConfig()) is None
    monkeypatch.setenv("CQG_TEST_KEY", " k1 ")
    assert read_api_key(ServeConfig(api_key_env="CQG_TEST_KEY")) == "k1"
    monkeypatch.delenv("CQG_TEST_KEY")
    with pytest.raises(RuntimeError, match="CQG_TEST_KEY"):
        read_api_key(ServeConfig(api_key_env="CQG_TEST_KEY"))
    monkeypatch.setenv("CQG_TEST_KEY", "k\u00e9y")
    with pytest.raises(RuntimeError, match="CQG_TEST_KEY'?: that environment variable holds characters other than printable ASCII"):
        read_api_key(ServeConfig(api_key_env="CQG_TEST_KEY"))
    monkeypatch.setenv("CQG_TEST_KEY", "k\x01y")
    with pytest.raises(RuntimeError, match="other than printable ASCII"):
        read_api_key(ServeConfig(api_key_env="CQG_TEST_KEY"))


def test_deployment_options():
    from cqg_ray.serve.app import deployment_options

    o = deployment_options(ServeConfig(num_replicas=3, max_batch_size=8, num_gpus_per_replica=1))
    assert o["num_replicas"] == 3 and "autoscaling_config" not in o
    assert o["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1.0}
    assert o["max_ongoing_requests"] == 32 and o["logging_config"] == {"enable_access_log": False}
    a = deployment_options(ServeConfig(num_replicas="auto", min_replicas=0, max_replicas=6, target_ongoing_requests=16,
                                       max_ongoing_requests=100), env_vars={"K": "v"})
    assert a["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 6, "target_ongoing_requests": 16.0}
    assert "num_replicas" not in a and a["max_ongoing_requests"] == 100
    assert a["ray_actor_options"]["runtime_env"] == {"env_vars": {"K": "v"}}


def test_app_builder_checks_args(tmp_path):
    from cqg_ray.serve.app import app_builder

    with pytest.raises(ValueError, match="args.model"):
        app_builder({})
    with pytest.raises(ValueError, match="max_batch_size"):
        app_builder({"model": str(tmp_path), "serve": {"max_batch_size": 0}})
    from ray.serve.deployment import Application

    assert isinstance(app_builder({"model": str(tmp_path), "serve": {"num_replicas": "auto"}}), Application)


def test_serve_yaml_is_valid():
    """cqg_ray/configs/serve.yaml parses with Serve's own schema and points at the app builder."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "cqg_ray" / "configs" / "serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(data) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(data)
    app = schema.applications[0]
    assert app.import_path == "cqg_ray.serve.app:app_builder"
    assert schema.http_options.host == "127.0.0.1"
    ServeConfig.model_validate(app.args["serve"])


def test_the_page_reads_only_fields_the_answers_have():
    """Each `r.<field>` that the page's script reads from /questions and /explain is a field of that answer's schema
    (the page showed 'budget undefined' when /questions had no budget)."""
    import importlib.resources
    import re

    from cqg_ray.serve.protocol import ExplainResponse, QuestionsResponse

    page = importlib.resources.files("cqg_ray.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    for function, schema in (("loadQuestions", QuestionsResponse), ("compare", ExplainResponse)):
        body = page.split(f"async function {function}()")[1].split("\n}\n")[0]
        read = set(re.findall(r"\br\.(\w+)", body))
        assert read and read <= set(schema.model_fields), (function, read - set(schema.model_fields))


def test_questions_name_the_models_budget(api, model):
    body = api.get("/questions").json()
    assert body["budget"] == model.budget.name and body["m"] == 32


def test_a_bad_openai_input_names_the_input_field(api):
    """Not input.str or input.list[str] (pydantic's union members) and not the whole body."""
    for bad in (5, None, {"a": 1}, ["a", 1], [1, 2], [[1, 2]]):
        err = error_of(api.post("/v1/embeddings", json={"model": "cqg-mbqa", "input": bad}), 422)
        assert err["param"] == "input" and err["message"].startswith("input: ") and "more problem" not in err["message"], (bad, err)


def test_the_route_table_names_every_request_field():
    """docs/serving.md's route table lists each field the request schemas accept (it left out dimensions and user)."""
    from pathlib import Path

    from cqg_ray.serve.protocol import EmbeddingsRequest, EmbedRequest, ExplainRequest

    doc = (Path(__file__).parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    for route, schema in (("POST /embed", EmbedRequest), ("POST /explain", ExplainRequest), ("POST /v1/embeddings", EmbeddingsRequest)):
        cell = next(line for line in doc.splitlines() if line.startswith(f"| `{route}` |")).split(" | ")[1]
        assert [f for f in schema.model_fields if f'"{f}"' not in cell and f"`{f}`" not in cell] == [], route


def test_an_unknown_route_names_the_routes_under_the_prefix(model):
    with TestClient(build_api(EmbeddingService(model, ServeConfig(**TEST_CFG))), root_path="/api") as c:
        err = error_of(c.get("/api/nowhere"), 404)
    assert err["message"] == "no route /api/nowhere: see GET /api/ui, GET /api/questions, POST /api/embed, POST /api/explain, POST /api/v1/embeddings"


def test_a_check_across_fields_is_told_without_a_body_prefix(api):
    err = error_of(api.post("/embed", json={"texts": ["a"], "k": 3, "tau": 0.5}), 422)
    assert (err["message"], err["param"]) == ("give tau (the paper's rule) or k (top-k), not both", None)
    err = error_of(api.post("/embed", json={"texts": ["a"], "output": "sparse", "packed": True}), 422)
    assert err["message"] == "packed applies to output 'bits' only"
