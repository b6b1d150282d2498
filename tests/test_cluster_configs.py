"""cluster/ and jobs/ configs, checked offline: the YAMLs parse, the KubeRay manifests are ray.io/v1 with a CPU head and
GPU workers running our image and entrypoint, the launcher YAML passes the checks `ray up` makes before it talks to
the cloud (Ray's own schema and prepare/validate functions), `ray start` flags exist, and the Dockerfile installs the
vllm extra with Ray and vLLM pinned to versions that pyproject.toml's ranges admit."""

import copy
import json
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from cqg_ray.configs import config_file

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
DOCKERFILE = CLUSTER / "Dockerfile"


def load_all(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=\"?([^\"\n]*)\"?$", DOCKERFILE.read_text(), re.M))


def admits(requirements: list[str], name: str, version: str) -> bool:
    """Whether the requirement on ``name`` in a requirement list allows ``version``."""
    from packaging.requirements import Requirement

    (req,) = [r for r in map(Requirement, requirements) if r.name == name]
    return req.specifier.contains(version)


# the image pins Ray and vLLM exactly; the library asks for ranges that must admit them
RAY_VERSION = dockerfile_args()["RAY_VERSION"]
VLLM_VERSION = dockerfile_args()["VLLM_VERSION"]


def image_name() -> str:
    """The tag the Dockerfile's build comment produces; every manifest must run it."""
    m = re.search(r"docker build -f cluster/Dockerfile -t (\S+) \.", DOCKERFILE.read_text())
    assert m, "the Dockerfile documents its build command"
    return m.group(1)


def containers(pod_template: dict) -> list[dict]:
    return pod_template["spec"]["containers"]


def ray_start_flags() -> set[str]:
    from ray.scripts.scripts import start

    return {o.lstrip("-") for p in start.params for o in p.opts if o.startswith("--")}


def check_cluster_spec(spec: dict, image: str) -> None:
    """A RayCluster spec: CPU-only head, a GPU worker group with min/max replicas, our image everywhere."""
    assert spec["rayVersion"] == RAY_VERSION
    head = spec["headGroupSpec"]
    flags = ray_start_flags()
    for group in [head, *spec["workerGroupSpecs"]]:
        assert set(group["rayStartParams"]) <= flags, set(group["rayStartParams"]) - flags
        for c in containers(group["template"]):
            assert c["image"] == image
    head_res = containers(head["template"])[0]["resources"]
    assert "nvidia.com/gpu" not in head_res["limits"] and "nvidia.com/gpu" not in head_res["requests"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    gpu = [g for g in spec["workerGroupSpecs"] if any("nvidia.com/gpu" in c["resources"]["limits"] for c in containers(g["template"]))]
    assert gpu, "no worker group asks for nvidia.com/gpu"
    for g in gpu:
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        assert g["maxReplicas"] >= 1
        res = containers(g["template"])[0]["resources"]
        assert int(res["limits"]["nvidia.com/gpu"]) >= 1 and res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
        assert any(t.get("key") == "nvidia.com/gpu" for t in g["template"]["spec"].get("tolerations", []))
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(names) == len(set(names))


def entrypoint_config(cmd: str) -> str:
    """The --config value of a `python -m cqg_ray.cli run --config ...` command line (which the CLI must parse)."""
    from cqg_ray.cli import build_parser

    words = shlex.split(cmd)
    assert words[:4] == ["python", "-m", "cqg_ray.cli", "run"]
    return build_parser().parse_args(words[3:]).config


# ------------------------------------------------------------------------------------------------ KubeRay


def test_raycluster_manifest():
    docs = load_all(CLUSTER / "kuberay" / "raycluster.yaml")
    rc = next(d for d in docs if d["kind"] == "RayCluster")
    assert rc["apiVersion"] == "ray.io/v1"
    check_cluster_spec(rc["spec"], image_name())
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    sa = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
    for group in [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]:
        assert group["template"]["spec"]["serviceAccountName"] in sa


def test_rayjob_manifest_runs_the_pipeline_entrypoint():
    (rj,) = load_all(CLUSTER / "kuberay" / "rayjob.yaml")
    assert rj["apiVersion"] == "ray.io/v1" and rj["kind"] == "RayJob"
    spec = rj["spec"]
    config = entrypoint_config(spec["entrypoint"])
    assert config == "paper" and config_file(config).is_file()
    check_cluster_spec(spec["rayClusterSpec"], image_name())
    assert spec["shutdownAfterJobFinishes"] is True
    # the runtime env is valid for Ray and its working dir is where the image keeps the repository
    from ray.runtime_env import RuntimeEnv

    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert env["working_dir"] == "/home/ray/cqg-ray"
    RuntimeEnv(**{**env, "working_dir": str(ROOT)})  # Ray checks that the path exists: here the checkout the image copies
    assert re.search(r"^WORKDIR /home/ray/cqg-ray$", DOCKERFILE.read_text(), re.M)
    # every --set in the entrypoint is a valid override of cqg_ray/configs/paper.yaml
    from cqg_ray.config import load_config

    words = shlex.split(spec["entrypoint"])
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    cfg = load_config(config, sets)
    assert cfg.run_dir.startswith("s3://") and cfg.llm.vllm.replicas == max(g["maxReplicas"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]
                                                                            if g["groupName"] == "gpu")
    # the stages ask for the GPU workers the cluster has (a stage that asked for none would leave them idle), and the
    # LLM is a chat model: the paper's prompts are chat messages (cqg_ray/llm/prompts.py)
    assert cfg.llm.backend == "vllm" and cfg.train.use_gpu and cfg.encode.num_gpus_per_actor >= 1 and cfg.embed.num_gpus_per_actor >= 1
    assert "instruct" in cfg.llm.vllm.model.lower()


# ------------------------------------------------------------------------------------------------ cluster launcher


def test_launcher_yaml_passes_ray_up_offline_checks():
    import jsonschema
    import ray
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type", "max_workers", "docker"):
        assert key in cfg
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    assert schema_path.exists(), "ray no longer ships ray-schema.json"
    jsonschema.validate(cfg, json.loads(schema_path.read_text()))  # the raw file, as written
    prepared = prepare_config(copy.deepcopy(cfg))  # what `ray up` does before it contacts AWS: merge defaults, ...
    validate_config(prepared)  # ... then validate (schema, head type, min_workers vs max_workers)
    assert prepared["setup_commands"] == []  # our empty list replaced the launcher's default `pip install ray-nightly`
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types and "GPU" not in types[cfg["head_node_type"]]["resources"]
    gpu_types = [t for t in types.values() if t["resources"].get("GPU", 0) >= 1]
    assert gpu_types and all(t["max_workers"] >= 1 for t in gpu_types)
    assert cfg["docker"]["image"] == image_name()
    flags = ray_start_flags()
    for cmd in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]:
        if "ray start" in cmd:
            used = {w.split("=")[0].lstrip("-") for w in shlex.split(cmd.split("ray start", 1)[1]) if w.startswith("--")}
            assert used <= flags, used - flags
    for local in cfg["file_mounts"].values():
        assert (ROOT / local).exists()


# ------------------------------------------------------------------------------------------------ image


def test_dockerfile_installs_the_vllm_extra_with_pinned_ray_and_vllm():
    text = DOCKERFILE.read_text()
    args = dockerfile_args()
    project = pyproject()["project"]
    assert admits(project["dependencies"], "ray", RAY_VERSION) and admits(project["optional-dependencies"]["vllm"], "vllm", VLLM_VERSION)
    base = args["BASE_IMAGE"]
    assert base.startswith(f"rayproject/ray:{RAY_VERSION}-") and base.endswith("-gpu")
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    install = re.search(r"pip install -c /tmp/pins.txt (.+?)\\\n", text).group(1)
    assert '".[vllm' in install
    assert '"ray[default,data,train,serve]==${RAY_VERSION}"' in install and '"vllm==${VLLM_VERSION}"' in install
    assert "printf 'ray==%s\\nvllm==%s\\n'" in text  # the constraints file pins both (no extras in constraints)
    # every COPY source exists in the repository, and the build context leaves the venv out
    for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", text, re.M):
        *sources, _dest = line.split()
        for s in sources:
            assert (ROOT / s).exists(), s
    ignored = (CLUSTER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv/" in ignored and ".git/" in ignored


def test_image_matches_everywhere():
    image = image_name()
    for f in ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "aws-gpu.yaml"):
        found = set(re.findall(r"image:\s*(\S+)", (CLUSTER / f).read_text()))
        assert found == {image}, (f, found)


# ------------------------------------------------------------------------------------------------ jobs


def test_runtime_env_is_valid_and_keeps_the_venv_out():
    from ray.runtime_env import RuntimeEnv

    env = yaml.safe_load((ROOT / "jobs" / "runtime_env.yaml").read_text())
    RuntimeEnv(**env)
    assert env["working_dir"] == "."
    for path in (".venv/", ".git/", "runs/"):
        assert path in env["excludes"]
    assert all(isinstance(v, str) for v in env["env_vars"].values())


def test_entrypoint_scripts_named_in_docs_exist():
    """Every `python jobs/...` or `cluster/...` path that the cluster files and runtime env mention exists."""
    for f in [*CLUSTER.rglob("*.yaml"), DOCKERFILE, ROOT / "jobs" / "runtime_env.yaml"]:
        for p in re.findall(r"\b((?:jobs|cluster|cqg_ray/configs)/[\w./-]+\.(?:py|yaml))\b", f.read_text()):
            assert (ROOT / p).exists(), f"{f.name} names {p}"
