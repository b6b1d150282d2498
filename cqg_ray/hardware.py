"""This machine's CPU, from /proc/cpuinfo: its feature flags, its model name, the float type it multiplies fastest.

    "avx512_bf16" in cpu_flags()     cpu_model() == "AMD EPYC 9R14 96-Core Processor"     pick_dtype() == "bfloat16"

Stdlib only: ``scripts/install_llama_cpp.py`` loads this file by path before the package's dependencies exist.

``CQG_RAY_MAX_CPU_ISA=avx2`` makes the machine's flags read as an AVX2-only CPU's (no AVX-512, AMX, AVX-VNNI), so
every choice made from them (dtype, engines, encoder backend) is the one an AVX2 machine makes; ``AVX2_ONLY_ENV`` adds
the settings that make torch, oneDNN, OpenBLAS, numpy and faiss run their AVX2 kernels too (``scripts/test.sh --cpu
avx2``; ``python -m cqg_ray.hardware --avx2-env`` prints them as shell exports).
"""

from __future__ import annotations

import os
import platform
import shlex
import sys

MAX_ISA_VAR = "CQG_RAY_MAX_CPU_ISA"
ABOVE_AVX2 = ("avx512", "amx", "avx_vnni", "avx_ne_convert", "avx_ifma", "avx10")  # flag prefixes an AVX2-only CPU lacks

# What makes each library choose its AVX2 kernels on a newer CPU; tests/test_hardware.py checks that each is read.
AVX2_ONLY_ENV = {
    MAX_ISA_VAR: "avx2",  # our own choices (cpu_flags)
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's ATen kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN: torch's linear layers, packed weights
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # torch's MKL BLAS (its choice is visible in MKL_VERBOSE on Intel CPUs only)
    "OPENBLAS_CORETYPE": "Haswell",  # the OpenBLAS of numpy and of faiss
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",  # numpy's own SIMD loops (numpy >= 2.4's groups)
    "FAISS_SIMD_LEVEL": "AVX2",  # faiss's dynamically dispatched kernels
}


def _cpuinfo_field(name: str, cpuinfo: str | None) -> str | None:
    """The value of the first ``name`` line of /proc/cpuinfo (or of the text given); None if there is none."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:  # the whole key: "model" is not "model name"
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | None = None, capped: bool = True) -> set[str]:
    """The CPU's feature flags (avx2, avx512_bf16, amx_tile, ...); empty where /proc/cpuinfo is unreadable.

    This machine's flags (no ``cpuinfo`` given) lose those above AVX2 under ``CQG_RAY_MAX_CPU_ISA=avx2`` unless
    ``capped`` is False (what the hardware really does, e.g. for a crash workaround)."""
    flags = set((_cpuinfo_field("flags", cpuinfo) or "").split())
    if cpuinfo is None and capped and max_isa() == "avx2":
        flags = {f for f in flags if not f.startswith(ABOVE_AVX2)}
    return flags


def max_isa() -> str | None:
    """``CQG_RAY_MAX_CPU_ISA`` (only ``avx2`` is known); None where unset."""
    value = os.environ.get(MAX_ISA_VAR, "").strip().lower()
    if value in ("", "none"):
        return None
    if value != "avx2":
        raise ValueError(f"{MAX_ISA_VAR}={value!r}: only 'avx2' (or unset) is known")
    return value


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity; the whole machine where there is none to read)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, e.g. 'AMD EPYC'."""
    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine() or "?"


def cpu_signature(cpuinfo: str | None = None) -> str:
    """What tells CPU kinds apart where their model names agree (a VM's 'AMD EPYC' is a Zen 1 to a Zen 5): the model
    name, family, model and stepping, and a digest of the flags this process may use (`cpu_flags`: capped under
    ``CQG_RAY_MAX_CPU_ISA``), e.g. 'AMD EPYC|26|2|0|3f9a1c2e'. Speeds measured on one signature hold for it only."""
    import hashlib

    flags = " ".join(sorted(cpu_flags(cpuinfo)))
    return "|".join([cpu_model(cpuinfo), *(_cpuinfo_field(k, cpuinfo) or "?" for k in ("cpu family", "model", "stepping")),
                     hashlib.sha256(flags.encode()).hexdigest()[:8]])


def pick_dtype(flags: set[str] | None = None) -> str:
    """bfloat16 where the CPU multiplies it natively (AMX or AVX-512-BF16), float32 elsewhere."""
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if {"amx_bf16", "avx512_bf16"} & flags else "float32"


def shell_exports(env: dict[str, str]) -> str:
    """``export K=V`` lines for a shell's ``eval``."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


if __name__ == "__main__":
    if sys.argv[1:] != ["--avx2-env"]:
        sys.exit("usage: python -m cqg_ray.hardware --avx2-env   (prints the exports that make libraries use AVX2 kernels only)")
    print(shell_exports(AVX2_ONLY_ENV))
