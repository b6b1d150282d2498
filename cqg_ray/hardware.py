"""This machine's CPU, from /proc/cpuinfo: its feature flags, its model name, the float type it multiplies fastest.

    "avx512_bf16" in cpu_flags()     cpu_model() == "AMD EPYC 9R14 96-Core Processor"     pick_dtype() == "bfloat16"

Stdlib only: ``scripts/install_llama_cpp.py`` loads this file by path before the package's dependencies exist.
"""

from __future__ import annotations

import platform


def _cpuinfo_field(name: str, cpuinfo: str | None) -> str | None:
    """The value of the first ``name`` line of /proc/cpuinfo (or of the text given); None if there is none."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith(name):
            return line.split(":", 1)[1].strip()
    return None


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (avx2, avx512_bf16, amx_tile, ...); empty where /proc/cpuinfo is unreadable."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name, e.g. 'AMD EPYC'."""
    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine() or "?"


def pick_dtype(flags: set[str] | None = None) -> str:
    """bfloat16 where the CPU multiplies it natively (AMX or AVX-512-BF16), float32 elsewhere."""
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if {"amx_bf16", "avx512_bf16"} & flags else "float32"
