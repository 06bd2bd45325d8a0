"""The checker builds a homework's C++/CUDA the way the course's CMakeLists does, and falls back
to the CPU module alone when only CUDA fails, saying so in one line.

``course_layout/CMakeLists.txt`` follows the course's hw3/hw4 file: ``cmake_minimum_required
(VERSION 3.2)`` (which CMake 4 refuses unless told to try anyway), a CPU module, and, when
FindCUDA finds a toolkit but ``nvidia-smi`` finds no GPU, a CUDA module for ``compute_37``, which
nvcc 12 and later refuse.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from companion.check.runner import build

HERE = Path(__file__).resolve().parent
CMAKE = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
needs_cmake = pytest.mark.skipif(
    CMAKE is None or shutil.which("c++") is None, reason="no cmake or no C++ compiler"
)

CPU_SOURCE = """
#include <pybind11/pybind11.h>
PYBIND11_MODULE(ndarray_backend_cpu, m) { m.attr("__device_name__") = "cpu"; }
"""
CUDA_SOURCE = CPU_SOURCE.replace("ndarray_backend_cpu", "ndarray_backend_cuda").replace(
    '"cpu"', '"cuda"'
)


def course_folder(tmp_path: Path, cmakelists: str) -> Path:
    root = tmp_path / "hw3"
    (root / "src").mkdir(parents=True)
    (root / "python" / "needle" / "backend_ndarray").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(cmakelists)
    (root / "src" / "ndarray_backend_cpu.cc").write_text(CPU_SOURCE)
    (root / "src" / "ndarray_backend_cuda.cu").write_text(CUDA_SOURCE)
    return root


def _built(root: Path, name: str) -> bool:
    return any((root / "python" / "needle" / "backend_ndarray").glob(f"{name}*.so"))


# The course's CUDA block, with nvcc's refusal of compute_37 written out: runs without nvcc.
SIMULATED_NVCC = """
cmake_minimum_required(VERSION 3.2)
project(needle C CXX)
execute_process(COMMAND python3 -m pybind11 --cmakedir
  OUTPUT_VARIABLE __pybind_path OUTPUT_STRIP_TRAILING_WHITESPACE)
find_package(Python COMPONENTS Development Interpreter REQUIRED)
find_package(pybind11 PATHS ${__pybind_path})
pybind11_add_module(ndarray_backend_cpu MODULE src/ndarray_backend_cpu.cc)
set_target_properties(ndarray_backend_cpu PROPERTIES
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_SOURCE_DIR}/python/needle/backend_ndarray)
find_package(CUDA QUIET)
if(NOT CMAKE_DISABLE_FIND_PACKAGE_CUDA)
  add_custom_target(ndarray_backend_cuda ALL
    COMMAND sh -c "echo 'nvcc fatal   : Unsupported gpu architecture compute_37' >&2; exit 1")
endif()
"""


@needs_cmake
def test_a_failing_cuda_module_leaves_the_cpu_module_built_and_one_line(tmp_path):
    root = course_folder(tmp_path, SIMULATED_NVCC)
    lines = build(root, "hw3", timeout=300)
    assert lines == [
        "built the CPU module only (build/cpu-only): the CUDA module did not build "
        "(nvcc fatal   : Unsupported gpu architecture compute_37), so cuda() stays disabled"
    ]
    assert _built(root, "ndarray_backend_cpu")


def _gpu_visible() -> bool:
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@needs_cmake
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc: the real refusal needs one")
@pytest.mark.skipif(_gpu_visible(), reason="with a GPU the course's file asks for its own arch")
def test_the_course_cmakelists_with_a_real_nvcc_and_no_gpu(tmp_path):
    root = course_folder(tmp_path, (HERE / "course_layout" / "CMakeLists.txt").read_text())
    lines = build(root, "hw3", timeout=600)
    assert len(lines) == 1 and lines[0].startswith("built the CPU module only"), lines
    assert "compute_37" in lines[0], lines
    assert _built(root, "ndarray_backend_cpu") and not _built(root, "ndarray_backend_cuda")
