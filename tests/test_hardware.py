"""The CPU facts read from /proc/cpuinfo."""

from cqg_ray.hardware import cpu_flags, cpu_model

ZEN4 = "processor : 0\nflags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16\n"


def test_cpu_flags_parse():
    assert cpu_flags(ZEN4) >= {"avx512f", "avx512_bf16", "avx2"}
    assert "avx_vnni" not in cpu_flags(ZEN4)
    assert cpu_flags("no flags here") == set()


def test_cpu_model_parse():
    assert cpu_model("processor : 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\nflags : avx2\n") == "AMD EPYC 9R14 96-Core Processor"
