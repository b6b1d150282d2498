"""The serving logic without Ray Serve: request parsing, token checks, deployment options, batching, answers."""

import argparse
import asyncio

import numpy as np
import pytest

from cqg_ray.config import ServeConfig
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.serve.protocol import ApiError, EmbeddingsRequest, EmbedRequest, ExplainRequest
from cqg_ray.serve.service import EmbeddingService, check_bearer, parse_json, read_token


def error_of(fn, *args):
    with pytest.raises(ApiError) as e:
        fn(*args)
    return e.value


def test_parse_json():
    assert parse_json(b'{"texts": ["a", "b"]}', EmbedRequest).texts == ["a", "b"]
    assert parse_json(b'{"text_a": "x", "text_b": "y", "tau": 0.3}', ExplainRequest).tau == 0.3
    e = error_of(parse_json, b'{"texts": [1, 2]}', EmbedRequest)
    assert (e.status, e.message) == (422, "texts.0: Input should be a valid string (and 1 more problem)")
    assert e.param == "texts.0"
    assert error_of(parse_json, b"[1]", EmbedRequest).message == "request body must be a JSON object, got a JSON array"
    assert error_of(parse_json, b"{", EmbedRequest).status == 400
    assert error_of(parse_json, b"", EmbedRequest).code == "empty_body"


def test_openai_request_schema():
    r = EmbeddingsRequest.model_validate({"input": "a", "model": "m", "some_future_field": 1})  # unknown fields ignored
    assert (r.input, r.encoding_format, r.dimensions) == ("a", "float", None)
    with pytest.raises(ValueError, match="token ids"):
        EmbeddingsRequest.model_validate({"input": [5, 6], "model": "m"})


def test_check_bearer_and_read_token(monkeypatch):
    check_bearer(None, None)
    check_bearer("Bearer anything", None)
    check_bearer("Bearer s3cret", "s3cret")
    check_bearer("bearer s3cret", "s3cret")
    assert error_of(check_bearer, None, "s3cret").code == "missing_token"
    assert error_of(check_bearer, "Bearer nope", "s3cret").code == "invalid_token"
    assert error_of(check_bearer, "Token s3cret", "s3cret").code == "bad_scheme"
    assert error_of(check_bearer, "Bearer s3cret", "s3cret2").status == 401
    assert read_token(ServeConfig()) is None
    monkeypatch.setenv("CQG_TEST_KEY", " k1 ")
    assert read_token(ServeConfig(api_key_env="CQG_TEST_KEY")) == "k1"
    monkeypatch.delenv("CQG_TEST_KEY")
    with pytest.raises(RuntimeError, match="CQG_TEST_KEY"):
        read_token(ServeConfig(api_key_env="CQG_TEST_KEY"))


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


def test_serve_cli_config(tmp_path):
    from cqg_ray.serve.cli import add_arguments, serve_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = serve_config(p.parse_args(["m"]))
    assert (cfg.host, cfg.port, cfg.num_replicas) == ("127.0.0.1", 8000, 1)
    y = tmp_path / "c.yaml"
    y.write_text("serve:\n  port: 9000\n  max_batch_size: 8\n")
    cfg = serve_config(p.parse_args(["m", "-c", str(y), "--replicas", "auto", "--set", "max_batch_size=64", "--port", "9100"]))
    assert (cfg.port, cfg.num_replicas, cfg.max_batch_size) == (9100, "auto", 64)


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


# ------------------------------------------------------------------ the service itself, in a plain asyncio loop


@pytest.fixture(autouse=True)
def no_replica_context(monkeypatch):
    """`@serve.batch` (Ray 2.60) reads the replica context only to warn when max_ongoing_requests is below
    max_batch_size; outside a replica there is no context, so give it one with no cap. The real Serve path is
    tested in test_routes.py."""
    from types import SimpleNamespace

    import ray.serve.batching

    ctx = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=10**6))
    monkeypatch.setattr(ray.serve.batching.serve, "get_replica_context", lambda: ctx)


# `@serve.batch` keeps one queue per decorated method (one replica = one instance = one loop), bound to the
# event loop of its first call: every test here runs on this one loop.
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
    assert np.allclose(probs, model.encode(texts, binary=False, progress=False), atol=1e-4)


def test_concurrent_requests_share_batches(model):
    async def go():
        svc = EmbeddingService(model, ServeConfig(max_batch_size=8, batch_wait_timeout_s=0.05))
        out = await asyncio.gather(*(svc.embed(EmbedRequest(texts=[f"a film review number {i}"])) for i in range(8)))
        return svc, out

    svc, out = run(go())
    assert len(out) == 8 and svc.batches == 1 and svc.texts_seen == 8


def test_explanation_matches_model_explain(model):
    a, b = "The film was a wonderful movie with great actors.", "I watched a terrible movie at the cinema."
    svc = EmbeddingService(model, ServeConfig())
    p = model.encode([a, b], binary=False, progress=False)
    got = svc.explanation(p[0], p[1], 0.5)
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
    assert error_of(svc.check_texts, [" "], "input").message == "input is empty or only whitespace"
    assert error_of(svc.check_texts, [], "input").status == 422
    assert svc.texts_seen == 0
