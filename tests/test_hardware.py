"""The CPU facts read from /proc/cpuinfo."""

import pytest

from cqg_ray.hardware import cpu_flags, cpu_model, cpu_signature

ZEN4 = "processor : 0\nflags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16\n"


def test_cpu_flags_parse():
    assert cpu_flags(ZEN4) >= {"avx512f", "avx512_bf16", "avx2"}
    assert "avx_vnni" not in cpu_flags(ZEN4)
    assert cpu_flags("no flags here") == set()


def test_cpu_model_parse():
    assert cpu_model("processor : 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\nflags : avx2\n") == "AMD EPYC 9R14 96-Core Processor"


def test_cpu_signature_tells_cpu_kinds_apart_behind_one_model_name(monkeypatch):
    """A VM names a Zen 4 and a Zen 5 'AMD EPYC' alike: the family, model and stepping (of the first processor) and
    the flags this process may use tell them apart, and the AVX2 cap is a CPU of its own."""
    import hashlib

    from cqg_ray import hardware

    def info(family, model, flags):
        return (f"processor\t: 0\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\nstepping\t: 0\n"
                f"flags\t\t: {flags}\n\nprocessor\t: 1\ncpu family\t: 99\n")

    digest = hashlib.sha256(b"avx2 avx512_bf16 avx512f").hexdigest()[:8]
    assert cpu_signature(info(25, 17, "avx512f avx2 avx512_bf16")) == f"AMD EPYC|25|17|0|{digest}"
    assert cpu_signature(info(26, 2, "avx512f avx2 avx512_bf16")) == f"AMD EPYC|26|2|0|{digest}"
    assert cpu_signature("flags : avx2\n").split("|")[1:4] == ["?", "?", "?"]  # fields a cpuinfo lacks
    real = hardware._cpuinfo_field
    monkeypatch.setattr(hardware, "_cpuinfo_field", lambda name, cpuinfo: real(name, SAPPHIRE_RAPIDS if cpuinfo is None else cpuinfo))
    monkeypatch.delenv("CQG_RAY_MAX_CPU_ISA", raising=False)
    native = cpu_signature()
    monkeypatch.setenv("CQG_RAY_MAX_CPU_ISA", "avx2")
    capped = cpu_signature()
    assert capped != native and capped.split("|")[:4] == native.split("|")[:4]
    assert capped.split("|")[4] == hashlib.sha256(b"avx avx2 bmi2 f16c fma sse4_2").hexdigest()[:8]


SAPPHIRE_RAPIDS = "flags : sse4_2 avx f16c fma avx2 bmi2 avx_vnni avx512f avx512_bf16 avx512_vnni amx_tile amx_bf16 amx_int8\n"


def test_the_avx2_cap_reads_the_machine_as_an_avx2_cpu(monkeypatch):
    from cqg_ray import hardware
    from cqg_ray.encoder import installed_backends, pick_backend
    from cqg_ray.llm.base import resolve_engine

    real = hardware._cpuinfo_field
    monkeypatch.setattr(hardware, "_cpuinfo_field", lambda name, cpuinfo: real(name, SAPPHIRE_RAPIDS if cpuinfo is None else cpuinfo))
    monkeypatch.delenv("CQG_RAY_MAX_CPU_ISA", raising=False)
    assert {"amx_tile", "avx512_bf16", "avx_vnni"} <= cpu_flags() and resolve_engine("auto") == "torch-bfloat16"
    monkeypatch.setenv("CQG_RAY_MAX_CPU_ISA", "AVX2")
    assert cpu_flags() == {"sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"}
    assert "amx_tile" in cpu_flags(capped=False)  # what the hardware has (the llama.cpp AMX workaround reads this)
    assert cpu_flags(SAPPHIRE_RAPIDS) >= {"amx_tile", "avx512f"}  # a text given is read as it is
    assert hardware.pick_dtype() == "float32" and resolve_engine("auto") == "torch-float32"  # as on an AVX2 machine
    assert resolve_engine("auto", work="generate") == "llamacpp"
    assert pick_backend(cpu_flags(), False, installed_backends() - {"openvino"})[0] in ("onnx", "torch-float32")
    monkeypatch.setenv("CQG_RAY_MAX_CPU_ISA", "avx512")
    with pytest.raises(ValueError, match="only 'avx2'"):
        cpu_flags()


PROBE = r"""
import json, torch, numpy, faiss, threadpoolctl
from numpy._core._multiarray_umath import __cpu_features__ as npf
from cqg_ray.hardware import ABOVE_AVX2, cpu_flags
from cqg_ray.llm.base import resolve_engine
lin = torch.nn.Linear(64, 64)
torch.ops.mkldnn._linear_pointwise(torch.ones(2, 64), torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach(), 2), lin.bias.detach(), "none", [], "")
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "numpy": sorted(k for k in ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR") if npf.get(k)),
                  "openblas": sorted({i["architecture"] for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"}),
                  "faiss": faiss.SIMDConfig.get_level_name(), "above_avx2": sorted(f for f in cpu_flags() if f.startswith(ABOVE_AVX2)),
                  "engine": [resolve_engine("auto", work=w) for w in ("score", "generate")]}))
"""


def probe(env: dict) -> tuple[dict, str]:
    """The kernels each library chose in a fresh process under ``env`` (and oneDNN's ISA line)."""
    import json
    import os
    import subprocess
    import sys

    full = {**os.environ, **env, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300, check=True).stdout
    isa = next(line.split("isa:", 1)[1] for line in out.splitlines() if "isa:" in line)
    return json.loads(out.splitlines()[-1]), isa


def test_the_avx2_only_settings_make_each_library_use_avx2_kernels():
    """Under AVX2_ONLY_ENV every library reports AVX2 kernels or less (on an AVX-512 or AMX machine this is what the
    settings change; on an AVX2 one it is what it does anyway)."""
    from cqg_ray.hardware import AVX2_ONLY_ENV

    got, isa = probe(AVX2_ONLY_ENV)
    assert got["aten"] in ("AVX2", "DEFAULT")
    assert not {"X86_V4", "AVX512_ICL", "AVX512_SPR"} & set(got["numpy"])
    assert got["openblas"] == ["Haswell"]  # numpy's OpenBLAS and faiss's
    assert got["faiss"] in ("AVX2", "NONE")
    assert got["above_avx2"] == [] and got["engine"] == ["torch-float32", "llamacpp"]  # auto as on an AVX2 machine
    assert "AVX-512" not in isa and "AMX" not in isa and "AVX10" not in isa, isa


def test_each_library_reads_its_setting():
    """Each setting of AVX2_ONLY_ENV is read, shown on any x86 machine by asking for less than AVX2: torch's default
    kernels, oneDNN's SSE4.1, OpenBLAS's Prescott, numpy without X86_V3, faiss without SIMD."""
    from cqg_ray.hardware import AVX2_ONLY_ENV

    lower = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "OPENBLAS_CORETYPE": "Prescott",
             "NPY_DISABLE_CPU_FEATURES": AVX2_ONLY_ENV["NPY_DISABLE_CPU_FEATURES"] + " X86_V3", "FAISS_SIMD_LEVEL": "NONE"}
    assert set(lower) <= set(AVX2_ONLY_ENV)
    got, isa = probe({**AVX2_ONLY_ENV, **lower})
    assert got["aten"] == "DEFAULT" and got["numpy"] == [] and got["faiss"] == "NONE"
    assert "Haswell" not in got["openblas"] and len(got["openblas"]) == 2  # numpy 0.3.31 says Katmai, faiss 0.3.15 Prescott
    assert "SSE4.1" in isa, isa
