"""Install llama-cpp-python built for this CPU (compiled once per CPU feature set) and the bundled models.

    python scripts/install_llama_cpp.py                                # llama-cpp-python[server] + Qwen 0.5B + SmolLM2
    python scripts/install_llama_cpp.py --models qwen2.5-coder-1.5b    # another bundled model
    python scripts/install_llama_cpp.py --print                        # only print the commands

A build-machine tool (scripts/setup.sh runs it: the models always, llama-cpp-python where wanted, as for the tests). ``pip install "cqg-ray[llamacpp]"`` builds
llama-cpp-python with its default flags instead, for the machine that builds it (on CPUs with AMX the backend loads
models without ggml's AMX path, so that build works there too).

Why: llama-cpp-python is a source package (4-15 minutes to compile on 2 cores), and the right build flags
depend on the CPU. ``GGML_NATIVE=ON`` (the default) crashes on CPUs with AMX (ggml's AMX matmul), and a
fixed flag list is not portable either (AVX-VNNI is on Intel's Sapphire Rapids but not on AMD's Zen 4:
such a build dies with "Illegal instruction" there). So the flags are read from /proc/cpuinfo: every
x86 extension ggml can use that this CPU has, AMX never, ``GGML_NATIVE=OFF``, no llava/mtmd library
(multimodal only), no llama.cpp ``common`` library (the bindings never load it: ~45% fewer objects to
compile). The wheel is cached under ``~/.cache/cqg-ray/wheels/<version>-<hash of the flags>/``
(or ``$CQG_RAY_CACHE``), so CI compiles once per machine type and later runs install in seconds.

Stdlib only, and it loads ``cqg_ray/hardware.py`` and ``cqg_ray/llm/engines/bundled.py`` by file path: it runs before the
package's dependencies are installed.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cqg_ray")

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
DEFAULT_MODELS = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"]


# llama.cpp's `common` library, which llama-cpp-python forces on and its bindings never load, left out of the build
NO_COMMON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_cpp_no_common.cmake")


def cmake_args(flags: set[str]) -> list[str]:
    """CMake options for a portable-to-this-CPU build: each ggml x86 option ON iff the CPU has it; AMX off; no
    llama.cpp `common` library (``NO_COMMON``, read at llama.cpp's ``project()``)."""
    args = ["-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
            f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={NO_COMMON}"]
    if flags:
        args += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in CPU_FLAGS]
    return args


def machine_cache():
    """cqg_ray/cache.py loaded from its file: this script runs before the package is installed."""
    spec = importlib.util.spec_from_file_location("cqg_ray_cache", Path(__file__).resolve().parents[1] / "cqg_ray" / "cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wheel_dir(args: list[str], cache_dir: str | None = None) -> str:
    root = str(machine_cache().cache_root(cache_dir))
    # the include file by its content, not its path: a checkout elsewhere reuses the wheel
    named = [a if not a.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE=") else Path(a.split("=", 1)[1]).read_text() for a in args]
    key = hashlib.sha256(" ".join([LLAMA_CPP_VERSION, *sorted(named)]).encode()).hexdigest()[:12]
    return os.path.join(root, "wheels", f"llama-cpp-python-{LLAMA_CPP_VERSION}-{key}")


def llama_commands(constraints: str | None, cache_dir: str | None = None) -> tuple[dict[str, str], list[list[str]], str]:
    """(environment, commands, wheel folder) that build (if needed) and install llama-cpp-python[server]."""
    args = cmake_args(cpu_flags())
    out = wheel_dir(args, cache_dir)
    env = {"CMAKE_ARGS": shlex.join(args)}  # scikit-build-core splits it as a shell would
    pip = [sys.executable, "-m", "pip"]
    c = ["-c", constraints] if constraints else []
    # --no-cache-dir: pip's own wheel cache is keyed by the sdist, not by CMAKE_ARGS
    build = [*pip, "wheel", "--no-deps", "--no-cache-dir", "-w", out, *c, f"llama-cpp-python=={LLAMA_CPP_VERSION}"]
    wheel = os.path.join(out, f"llama_cpp_python-{LLAMA_CPP_VERSION}-py3-none-linux_x86_64.whl")
    # --force-reinstall: a build of the same version for another CPU may be installed already
    install = [*pip, "install", "--force-reinstall", "--no-deps", wheel]
    extras = [*pip, "install", *c, "--find-links", out, f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}"]
    return env, [build, install, extras], out


def load_file(relpath: str):
    """A module of the package loaded from its file, without importing the package (nor putting its folders on
    sys.path, which would shadow real packages such as `openai` with cqg_ray/llm/engines/openai.py)."""
    path = os.path.join(PACKAGE, relpath)
    spec = importlib.util.spec_from_file_location("_cqg_ray_" + os.path.basename(relpath)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(mod)
    return mod


def cpu_flags() -> set[str]:
    return load_file("hardware.py").cpu_flags()


def model_commands(names: list[str], constraints: str | None) -> list[list[str]]:
    MODELS = load_file("llm/engines/bundled.py").MODELS

    cmds = []
    for name in names:
        if name not in MODELS:
            raise SystemExit(f"unknown bundled model {name!r}; known: {', '.join(MODELS)}")
        m = MODELS[name]
        c = ["-c", constraints] if constraints and not m.pip_flags else []
        cmds.append([sys.executable, "-m", "pip", "install", *c, *([m.pip_flags] if m.pip_flags else []), *m.pip])
    return cmds


def requirements(extra: str, pyproject: str | None = None) -> list[str]:
    """The package's requirements with ``extra`` (its ``cqg-ray[...]`` references resolved), llama-cpp-python left out:
    what set-up installs while llama-cpp-python compiles."""
    import re
    import tomllib

    with open(pyproject or os.path.join(os.path.dirname(PACKAGE), "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    out, seen, todo = list(project["dependencies"]), set(), [extra]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in project["optional-dependencies"][name]:
            if (m := re.match(r"cqg-ray\[(.+)\]$", req.strip())):
                todo += [e.strip() for e in m.group(1).split(",")]
            else:
                out.append(req)
    return [r for r in dict.fromkeys(out) if not re.match(r"llama[-_]cpp[-_]python\b", r)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="install llama-cpp-python (built for this CPU, cached) and bundled GGUF models")
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS, help=f"bundled models to install (default: {' '.join(DEFAULT_MODELS)})")
    ap.add_argument("--constraints", default="/tmp/constraints.txt" if os.path.exists("/tmp/constraints.txt") else None,
                    help="pip constraints file (keeps torch pinned)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--no-llama", action="store_true", help="only the models")
    ap.add_argument("--build-only", action="store_true", help="only build llama-cpp-python's wheel into the cache (no install, "
                                                               "no models): it may run beside other pip installs")
    ap.add_argument("--no-models", action="store_true", help="llama-cpp-python only (from the cached wheel once built)")
    ap.add_argument("--print-deps", metavar="EXTRA", default=None,
                    help="print the requirements of the package with this extra (its own extras resolved), llama-cpp-python "
                         "left out, one a line, and exit")
    ap.add_argument("--print", dest="dry", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    if a.print_deps:
        print("\n".join(requirements(a.print_deps)))
        return 0
    steps: list[tuple[dict[str, str], list[str]]] = []
    if not a.no_llama:
        env, (build, install, extras), out = llama_commands(a.constraints, a.cache_dir)
        if a.dry or not glob.glob(os.path.join(out, f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
            steps.append((env, build))
        else:
            print(f"# cached wheel for this CPU: {out}", flush=True)
        if not a.build_only:
            steps += [({}, install), ({}, extras)]
    if not (a.build_only or a.no_models):
        steps += [({}, cmd) for cmd in model_commands(a.models, a.constraints)]
    for env, cmd in steps:
        line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, cmd)])
        print(line, flush=True)
        if not a.dry:
            subprocess.run(cmd, env={**os.environ, **env}, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
