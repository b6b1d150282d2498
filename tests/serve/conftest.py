"""A real model folder (bundled MiniLM + hand-set heads) and a real Serve app on 127.0.0.1 for the serve tests."""

from types import SimpleNamespace

import pytest

from cqg_ray.config import ServeConfig
from tests.ports import free_port

TOKEN = "test-token-5f2c"


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory) -> str:
    from cqg_ray.mbqa.toy import build_toy_model

    return build_toy_model(str(tmp_path_factory.mktemp("toy") / "model"))


@pytest.fixture(scope="session")
def model(toy_model):
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    return InterpretableEmbedder.load(toy_model, device="cpu")


# small limits, so that the limit checks are cheap to hit
TEST_CFG = dict(max_texts_per_request=8, max_chars_per_text=2000, max_request_bytes=20_000, max_batch_size=16,
                batch_wait_timeout_s=0.005, num_cpus_per_replica=1)


@pytest.fixture(scope="package")
def server(ray_local, toy_model):
    """Serve on a free loopback port: app 'main' at / and app 'secure' (bearer token) at /secure."""
    from ray import serve

    from cqg_ray.serve.app import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"enable_access_log": False})
    cfg = ServeConfig(port=port, **TEST_CFG)
    serve.run(build_app(toy_model, cfg), name="main", route_prefix="/")
    secure = cfg.model_copy(update={"api_key_env": "CQG_RAY_TEST_TOKEN", "num_cpus_per_replica": 0.25})
    serve.run(build_app(toy_model, secure, env_vars={"CQG_RAY_TEST_TOKEN": TOKEN}), name="secure", route_prefix="/secure")
    url = f"http://127.0.0.1:{port}"
    yield SimpleNamespace(url=url, secure_url=url + "/secure", token=TOKEN, cfg=cfg, model_path=toy_model, port=port)
    serve.shutdown()


@pytest.fixture
def client(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
