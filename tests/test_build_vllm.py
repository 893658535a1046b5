"""The offline from-source build of vLLM's CUDA extensions (`kimi kernels build-vllm`, `kimi kernels
prepare`): the configure command and environment of each subset, the errors for missing sources and
tools, jobs sized to memory, and preparing sources from local wheels, checkouts and archives.

No GPU, no network and no compiler: a miniature vLLM tree (the CMake statements the code reads,
written as vLLM 0.26.0 writes them, and 0.32.0's where the code reads more) and a stated toolchain.
Two tests read real trees: the laid one where `kimi sync` laid it (its expectations chosen by the
release the mainline pins) and 0.26.0's from the cached sdist where `kimi sync` left it (the v0.26 line);
one runs CMake (pip's, a second) on the compiler waiver; the real CMake configure is marked ``build``
(set KIMI_TEST_BUILD=1; minutes).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import OWN_PIN
from kimi.errors import KimiError
from kimi.kernels import build as fork_build
from kimi.kernels import build_plan as bp
from kimi.kernels import cmake_tree as ct
from kimi.kernels import fill_sources
from kimi.kernels import sources as srcs
from kimi.kernels import toolchain as tcm
from kimi.kernels import vllm_build as vb

ROOT = Path(__file__).resolve().parents[1]
CUDA_HOME = os.environ.get("CUDA_HOME")  # the real configure test uses the caller's toolkit
FLASHMLA_SHA = "a8f794d1251cbfd88a5011445dd5582289c727e4"
FA_SHA = "caaa4eb59845388a20b1f435ecaafb4bd9517ad8"
SRC_VARS = ("VLLM_CUTLASS_SRC_DIR", "FLASH_MLA_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "TRITON_KERNELS_SRC_DIR",
            "TML_FA4_SRC_DIR", "FMHA_SM100_SRC_DIR")

CMAKELISTS = """cmake_minimum_required(VERSION 3.26)
set(VLLM_STABLE_EXT_SRC
  "csrc/libtorch_stable/torch_bindings.cpp")
set(CUTLASS_REVISION "v4.4.2")
if (DEFINED ENV{VLLM_CUTLASS_SRC_DIR})
  set(VLLM_CUTLASS_SRC_DIR $ENV{VLLM_CUTLASS_SRC_DIR})
endif()
FetchContent_Declare(cutlass GIT_REPOSITORY https://github.com/nvidia/cutlass.git GIT_TAG ${CUTLASS_REVISION})
  if(SCALED_MM_ARCHS)
    set(SCALED_MM_SM100_SRCS
      "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_c3x_sm100.cu"
      "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm100_fp8.cu"
    )
    list(APPEND VLLM_STABLE_EXT_SRC "${SCALED_MM_SM100_SRCS}")
    set(CUTLASS_MOE_SM100_SRCS "csrc/libtorch_stable/quantization/w8a8/cutlass/moe/grouped_mm_c3x_sm100.cu")
    list(APPEND VLLM_STABLE_EXT_SRC "${CUTLASS_MOE_SM100_SRCS}")
    set(FP4_SM100_SRCS
      "csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu"
      "csrc/libtorch_stable/quantization/fp4/mxfp4_blockwise_moe_kernel.cu")
    list(APPEND VLLM_STABLE_EXT_SRC "${FP4_SM100_SRCS}")
    set(CUTLASS_MLA_SRCS
      "csrc/libtorch_stable/attention/mla/sm100_cutlass_mla_kernel.cu")
    list(APPEND VLLM_STABLE_EXT_SRC "${CUTLASS_MLA_SRCS}")
  endif()
  define_extension_target(
    _C_stable_libtorch
    DESTINATION vllm
    LANGUAGE ${VLLM_GPU_LANG}
    SOURCES ${VLLM_STABLE_EXT_SRC}
    USE_SABI 3)
"""
EXTERNAL = {
    "flashmla.cmake": f"""if (DEFINED ENV{{FLASH_MLA_SRC_DIR}})
  set(FLASH_MLA_SRC_DIR $ENV{{FLASH_MLA_SRC_DIR}})
endif()
FetchContent_Declare(flashmla GIT_REPOSITORY https://github.com/vllm-project/FlashMLA GIT_TAG {FLASHMLA_SHA})
file(READ "${{flashmla_SOURCE_DIR}}/flash_mla/flash_mla_interface.py" FLASHMLA_INTERFACE_CONTENT)
set(FlashMLA_SOURCES
    ${{flashmla_SOURCE_DIR}}/csrc/api/api.cpp
    ${{flashmla_SOURCE_DIR}}/csrc/sm90/decode/dense/instantiations/bf16.cu)
""",
    "vllm_flash_attn.cmake": f"""if (DEFINED ENV{{VLLM_FLASH_ATTN_SRC_DIR}})
  set(VLLM_FLASH_ATTN_SRC_DIR $ENV{{VLLM_FLASH_ATTN_SRC_DIR}})
endif()
FetchContent_Declare(vllm-flash-attn GIT_REPOSITORY https://github.com/vllm-project/flash-attention.git
  GIT_TAG {FA_SHA})
install(DIRECTORY ${{vllm-flash-attn_SOURCE_DIR}}/vllm_flash_attn/ DESTINATION vllm/vllm_flash_attn)
""",
    "triton_kernels.cmake": """set(DEFAULT_TRITON_KERNELS_TAG "v3.5.1")
if (DEFINED ENV{TRITON_KERNELS_SRC_DIR})
  FetchContent_Declare(triton_kernels SOURCE_DIR $ENV{TRITON_KERNELS_SRC_DIR})
else()
  FetchContent_Declare(triton_kernels GIT_REPOSITORY https://github.com/triton-lang/triton.git
    GIT_TAG ${DEFAULT_TRITON_KERNELS_TAG})
endif()
""",
    "tml_fa4.cmake": """if(DEFINED ENV{TML_FA4_SRC_DIR})
  set(TML_FA4_SRC_DIR $ENV{TML_FA4_SRC_DIR})
endif()
FetchContent_Declare(tml_fa4 GIT_REPOSITORY https://github.com/vllm-project/tml-fa4.git
  GIT_TAG b206834606ed5b5f21f8eed6b0683f528ea9cf7d)
""",
    "fmha_sm100.cmake": """if(DEFINED ENV{FMHA_SM100_SRC_DIR})
  set(FMHA_SM100_SRC_DIR $ENV{FMHA_SM100_SRC_DIR})
endif()
FetchContent_Declare(fmha_sm100 GIT_REPOSITORY https://github.com/vllm-project/MSA.git
  GIT_TAG 2e63ec37a0fc29bc20f39cd1a52e0f5affc33a73)
""",
}


@pytest.fixture(autouse=True)
def _no_src_env(monkeypatch):
    """The machine's own *_SRC_DIR settings must not leak into these tests."""
    for var in (*srcs.REQUIRED, "KIMI_SOURCES_DIR", "CUDA_HOME", "CMAKE_ARGS"):
        monkeypatch.delenv(var, raising=False)


def make_tree(root: Path) -> Path:
    """A miniature laid vLLM tree with the CMake statements the build code reads."""
    (root / "cmake" / "external_projects").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(CMAKELISTS)
    for name, text in EXTERNAL.items():
        (root / "cmake" / "external_projects" / name).write_text(text)
    (root / "kimi" / "lines" / "mainline" / "patches").mkdir(parents=True)
    return root


def required(variable: str) -> list[str]:
    """What the miniature tree's CMake file of ``variable`` makes a folder need (srcs.required_files)."""
    text = next((t for t in EXTERNAL.values() if f"ENV{{{variable}}}" in t), "")
    return srcs.required_files(variable, text)


def fill(folder: Path, variable: str, need: list[str] | None = None) -> Path:
    """A complete source folder for ``variable`` (every entry the miniature tree requires, empty files;
    a folder entry holds one file)."""
    for rel in required(variable) if need is None else need:
        path = folder / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            (path / "x").write_text("")
        elif Path(rel).suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        else:
            path.mkdir(parents=True, exist_ok=True)
    return folder


def toolchain(**kw) -> tcm.Toolchain:
    """A stated toolchain (no programs are run)."""
    base = dict(cmake="/opt/bin/cmake", cmake_version="4.4.5", ninja="/opt/bin/ninja",
                nvcc="/opt/cuda/bin/nvcc", cuda_home="/opt/cuda", cuda_release="13.0", python="/opt/venv/bin/python",
                torch="2.11.0+cu130", torch_cuda="13.0", python_path=[])
    return tcm.Toolchain(**{**base, **kw})


def plan(root: Path, subset: str = "sm100", **kw) -> bp.Plan:
    kw.setdefault("toolchain", toolchain())
    kw.setdefault("cores", 2)
    kw.setdefault("available_gb", 21.0)
    return bp.make_plan(root, subset, build_dir=root / "build", **kw)


# ---------------------------------------------------------------------------------------------
# Jobs sized to memory

@pytest.mark.parametrize("cores, available, per_job, jobs", [
    (2, 21.5, 11, 1),      # this machine: 2 cores, ~21 GB available -> one heavy CUTLASS unit at a time
    (2, 24.0, 11, 2),
    (2, 5.0, 11, 1),       # never fewer than one
    (16, 128.0, 11, 11),   # memory-bound
    (8, 500.0, 11, 8),     # core-bound
    (4, 30.0, 4.5, 4),
])
def test_jobs_for_memory(cores, available, per_job, jobs):
    assert bp.jobs_for_memory(cores, available, per_job) == jobs


def test_jobs_for_memory_refuses_a_non_positive_size():
    with pytest.raises(KimiError, match="per-job-gb"):
        bp.jobs_for_memory(2, 20, 0)


def test_plan_sizes_jobs_and_prints_them(tmp_path):
    root = make_tree(tmp_path / "vllm")
    fill(tmp_path / "vllm" / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root, cores=16, available_gb=100.0)
    assert p.jobs == 9
    assert "-DCMAKE_JOB_POOLS:STRING=compile=9" in p.configure and p.build[p.build.index("-j") + 1] == "9"
    text = bp.render_plan(p)
    assert "jobs: 9 (cores 16, available memory 100.0 GiB, 11 GiB per job" in text
    assert plan(root, jobs=3).jobs == 3  # an explicit -j wins
    assert not any("may be killed for memory" in w for w in p.warnings)
    assert any("may be killed for memory" in w for w in plan(root, available_gb=6.0).warnings)


# ---------------------------------------------------------------------------------------------
# Units of the subsets

def test_sm100_units_read_from_cmake(tmp_path):
    root = make_tree(tmp_path)
    units = ct.sm100_units(root)
    assert [u.group for u in units] == ["SCALED_MM_SM100_SRCS"] * 2 + ["CUTLASS_MOE_SM100_SRCS"] + \
        ["FP4_SM100_SRCS"] * 2 + ["CUTLASS_MLA_SRCS"]
    assert {u.target for u in units} == {"_C_stable_libtorch"}
    assert units[-1].object == ("CMakeFiles/_C_stable_libtorch.dir/csrc/libtorch_stable/attention/mla/"
                                "sm100_cutlass_mla_kernel.cu.o")
    (root / "CMakeLists.txt").write_text(CMAKELISTS.replace("CUTLASS_MLA_SRCS", "MLA_SOURCES"))
    with pytest.raises(KimiError, match="CUTLASS_MLA_SRCS"):
        ct.sm100_units(root)


# What each release's CMake has, as read from its source by hand (the laid tree is the mainline's pin;
# 0.26.0, the v0.26 line, also from the cached sdist).
_V026_VARS = {"VLLM_CUTLASS_SRC_DIR", "FLASH_MLA_SRC_DIR", "VLLM_FLASH_ATTN_SRC_DIR", "DEEPGEMM_SRC_DIR",
              "QUTLASS_SRC_DIR", "FMHA_SM100_SRC_DIR", "TML_FA4_SRC_DIR", "TRITON_KERNELS_SRC_DIR"}
RELEASES = {
    "0.26.0": dict(units=13, prefix="csrc/libtorch_stable/", new_units=(), cutlass="v4.4.2", variables=_V026_VARS,
                   gcc=["11.3"], deepgemm_submodules={"third-party/cutlass/", "third-party/fmt/"},
                   fmha_folders=("python/fmha_sm100/cute/",)),
    "0.32.0": dict(units=14, prefix="csrc/", new_units=("nvfp4_ds_mla_cache_kernels.cu",), cutlass="v4.7.1",
                   variables=_V026_VARS | {"DEEPSELECT_SRC_DIR", "FLASH_KDA_SRC_DIR"}, gcc=["11.3", "13"],
                   deepgemm_submodules={"third-party/cutlass/", "third-party/deep_jit/"},
                   fmha_folders=("python/fmha_sm100/kvouter/", "python/fmha_sm100/decode_q8kv4/")),
    # QuTLASS gone; triton_kernels fetched as a source archive (set(TRITON_KERNELS_TAG ...), no GIT_TAG)
    "0.34.0": dict(units=14, prefix="csrc/", new_units=("nvfp4_ds_mla_cache_kernels.cu",), cutlass="v4.7.1",
                   variables=(_V026_VARS - {"QUTLASS_SRC_DIR"}) | {"DEEPSELECT_SRC_DIR", "FLASH_KDA_SRC_DIR"},
                   gcc=["11.3", "13"], deepgemm_submodules={"third-party/cutlass/", "third-party/deep_jit/"},
                   fmha_folders=("python/fmha_sm100/kvouter/", "python/fmha_sm100/decode_q8kv4/",
                                 "python/fmha_sm100/prefill_q8kv4/")),
}
SDIST_026 = ROOT / ".kimi" / "cache" / "vllm-0.26.0.tar.gz"


def _pinned_version() -> str:
    return json.loads(OWN_PIN.read_text())["version"]


def _sdist_tree(sdist: Path, dest: Path) -> Path:
    """The CMake files and csrc/ of a vLLM sdist, unpacked under ``dest``."""
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(
            (f"{top}/CMakeLists.txt", f"{top}/cmake/", f"{top}/csrc/"))]
        tar.extractall(dest, members=members, filter="data")
    return dest / top


def _check_release(root: Path, release: str) -> None:
    """The tree at ``root`` has the sm_100-only group, external sources and GCC checks of ``release``."""
    want = RELEASES.get(release)
    assert want, f"no expectations for vLLM {release}: read its CMakeLists.txt and add RELEASES[{release!r}]"
    units = ct.sm100_units(root)
    names = [Path(u.source).name for u in units]
    assert len(units) == want["units"] and {u.target for u in units} == {"_C_stable_libtorch"}
    for name in ("scaled_mm_c3x_sm100.cu", "scaled_mm_blockwise_sm100_fp8.cu", "grouped_mm_c3x_sm100.cu",
                 "nvfp4_scaled_mm_kernels.cu", "mxfp4_experts_quant.cu", "nvfp4_kv_cache_kernels.cu",
                 "sm100_cutlass_mla_kernel.cu", *want["new_units"]):
        assert name in names, name
    assert all(u.source.startswith(want["prefix"]) and (root / u.source).is_file() for u in units)
    found = {s.variable: s for s in srcs.external_sources(root, root / "no-such-sources")}
    assert set(found) == want["variables"], "a new *_SRC_DIR: give it REQUIRED files in kimi/kernels/sources.py"
    assert set(found) <= set(srcs.REQUIRED)
    assert found["VLLM_CUTLASS_SRC_DIR"].tag == want["cutlass"]
    assert all(s.repository.startswith("https://github.com/") and s.tag != "?" for s in found.values())
    dg = found["DEEPGEMM_SRC_DIR"].required
    assert {r for r in dg if r.startswith("third-party/") and r.count("/") == 2} == want["deepgemm_submodules"]
    assert all(f in found["FMHA_SM100_SRC_DIR"].required for f in want["fmha_folders"])
    assert not any("python/triton_kernels" in r for r in found["TRITON_KERNELS_SRC_DIR"].required)
    assert "csrc/api/api.cpp" in found["FLASH_MLA_SRC_DIR"].required
    own = ("vllm/third_party/flashmla/flash_mla_interface.py", "tools/build_deepgemm_C.py")  # ${CMAKE_SOURCE_DIR}/...
    assert not any(r in own for s in found.values() for r in s.required)
    assert [c.version for c in ct.compiler_checks(root)] == want["gcc"]
    assert ct.project_name(root) == "vllm_extensions"


@pytest.mark.skipif(not (ROOT / "CMakeLists.txt").is_file(), reason="the vLLM tree is not laid (`kimi sync`)")
def test_real_tree_sm100_group_and_sources():
    """The laid tree (the pinned release of the line this checkout is for): its sm_100-only units of
    _C_stable_libtorch, every *_SRC_DIR known, what the tree makes each source need, its GCC checks."""
    _check_release(ROOT, _pinned_version())


@pytest.mark.skipif(not SDIST_026.is_file(), reason="no cached vllm-0.26.0.tar.gz (`kimi sync --line v0.26`)")
def test_real_026_tree_keeps_its_group_and_sources(tmp_path):
    """0.26.0 (the v0.26 line) read by the same code: 13 units under csrc/libtorch_stable/, eight sources,
    DeepGEMM's fmt submodule, no GCC 13 check."""
    _check_release(_sdist_tree(SDIST_026, tmp_path), "0.26.0")


def test_fork_subset_builds_the_draft_head_and_the_series_units(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "vllm")
    p = plan(root, "fork")
    assert p.fork_library and p.configure is None and p.build is None and not p.problems
    assert "no CMake configure is needed" in bp.render_plan(p)
    with monkeypatch.context() as m:
        m.setattr(fork_build, "find_nvcc", lambda: None)
        assert "no nvcc for the draft-head library" in plan(root, "fork", toolchain=tcm.Toolchain()).problems[0]
    (root / "kimi" / "lines" / "mainline" / "patches" / "0001-x.patch").write_text(
        "Subject: x\n\ndiff --git a/csrc/libtorch_stable/topk.cu b/csrc/libtorch_stable/topk.cu\n--- a/x\n+++ b/x\n")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root, "fork")
    assert [u["source"] for u in p.units] == ["csrc/libtorch_stable/topk.cu"]
    assert p.build[-1] == "CMakeFiles/_C_stable_libtorch.dir/csrc/libtorch_stable/topk.cu.o"
    assert ct.owner_target(CMAKELISTS, "csrc/libtorch_stable/quantization/fp4/nvfp4_quant_kernels.cu") == \
        "_C_stable_libtorch"
    assert ct.owner_target(CMAKELISTS, "csrc/libtorch_stable/moe/new.cu") == "_moe_C_stable_libtorch"


# ---------------------------------------------------------------------------------------------
# Configure command and environment

def test_sm100_configure_is_offline_with_local_sources_and_standins(tmp_path):
    root = make_tree(tmp_path / "vllm")
    cutlass = fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root, "sm100", archs=("9.0a", "10.0a"))
    assert not p.problems
    assert p.env["TORCH_CUDA_ARCH_LIST"] == "9.0a;10.0a" and p.env["CUDA_HOME"] == "/opt/cuda"
    assert p.env["PATH"] == "/opt/cuda/bin:$PATH"
    for var in SRC_VARS:
        assert var in p.env
    assert p.env["VLLM_CUTLASS_SRC_DIR"] == str(cutlass)
    assert p.standins == ["FLASH_MLA_SRC_DIR", "FMHA_SM100_SRC_DIR", "TML_FA4_SRC_DIR", "TRITON_KERNELS_SRC_DIR",
                          "VLLM_FLASH_ATTN_SRC_DIR"]
    assert p.env["FLASH_MLA_SRC_DIR"] == str(root / "build" / "standins" / "flash_mla")
    c = p.configure
    assert c[:8] == ["/opt/bin/cmake", "-S", str(root), "-B", str(root / "build"), "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    for flag in ("-DVLLM_TARGET_DEVICE=cuda", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON", "-DNVCC_THREADS=1",
                 "-DVLLM_PYTHON_EXECUTABLE=/opt/venv/bin/python", "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc",
                 f"-DFETCHCONTENT_BASE_DIR={root / 'build' / 'deps'}", f"-DVLLM_CUTLASS_SRC_DIR={cutlass}",
                 f"-DCUTLASS_DIR={cutlass}", f"-DCUTLASS_INCLUDE_DIR={cutlass}/include",
                 f"-DCUTLASS_TOOLS_UTIL_INCLUDE_DIR={cutlass}/tools/util/include",
                 "-DCMAKE_MAKE_PROGRAM=/opt/bin/ninja"):
        assert flag in c, flag
    assert not any(x.startswith("-DTRITON_KERNELS_SRC_DIR") for x in c)  # that cmake file reads the env only
    assert not any("LAUNCHER" in x for x in c)  # no ccache here
    assert plan(root, cmake_args=["-DCUDNN_ROOT=/x"]).configure[-1] == "-DCUDNN_ROOT=/x"
    assert p.build[:5] == ["/opt/bin/cmake", "--build", str(root / "build"), "-j", "1"]
    assert p.build[5] == "--target" and len(p.build[6:]) == 6 and all(t.endswith(".cu.o") for t in p.build[6:])
    assert not p.fork_library and p.install is None
    text = bp.render_plan(p)
    assert "export TORCH_CUDA_ARCH_LIST='9.0a;10.0a'" in text and "-DFETCHCONTENT_FULLY_DISCONNECTED=ON" in text
    assert "configure-only stand-ins" in text and "ccache: not found" in text


def test_only_keeps_the_named_units(tmp_path):
    root = make_tree(tmp_path / "vllm")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root, only=["cutlass_mla", "grouped_mm"])
    assert [Path(u["source"]).name for u in p.units] == ["grouped_mm_c3x_sm100.cu", "sm100_cutlass_mla_kernel.cu"]
    assert p.build[6:] == [u["object"] for u in p.units] and not p.problems
    assert plan(root, only=["cutlass_mla"], keep_going=True).build[-4:] == [p.units[1]["object"], "--", "-k", "0"]
    p = plan(root, only=["nothing_like_this"])
    assert "--only nothing_like_this matches none of the sm100 subset's 6 units" in p.problems[0]


def test_ccache_becomes_the_compiler_launcher(tmp_path):
    root = make_tree(tmp_path / "vllm")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root, toolchain=toolchain(ccache="/usr/bin/ccache"))
    for lang in ("C", "CXX", "CUDA"):
        assert f"-DCMAKE_{lang}_COMPILER_LAUNCHER=/usr/bin/ccache" in p.configure
    assert "ccache: /usr/bin/ccache" in bp.render_plan(p)


def test_all_needs_every_source_and_names_each_missing_one(tmp_path):
    root = make_tree(tmp_path / "vllm")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    (root / ".kimi" / "sources" / "flash_mla" / "csrc").mkdir(parents=True)  # there, but without its files
    p = plan(root, "all")
    assert not p.standins
    text = "\n".join(p.problems)
    assert len(p.problems) == 5
    assert "FLASH_MLA_SRC_DIR incomplete (lacks flash_mla/flash_mla_interface.py, csrc/api/api.cpp" in text
    assert f"https://github.com/vllm-project/flash-attention.git at {FA_SHA}" in text
    assert "flash-attention-<revision>.tar.gz for `kimi kernels prepare --from DIR`" in text
    assert "TRITON_KERNELS_SRC_DIR" in text and "python/triton_kernels/triton_kernels" in text
    assert "TML_FA4_SRC_DIR" in text and "the pinned vLLM CUDA wheel's copy" in text
    with pytest.raises(KimiError, match="cannot build") as err:
        vb.run(p)
    assert "VLLM_FLASH_ATTN_SRC_DIR" in str(err.value)
    assert not (root / "build").exists()  # failed before running anything


def test_all_with_every_source_builds_everything_and_installs(tmp_path):
    root = make_tree(tmp_path / "vllm")
    for var in SRC_VARS:
        fill(root / ".kimi" / "sources" / srcs.source_name(var), var)
    p = plan(root, "all", install=True)
    assert not p.problems and not p.standins and p.fork_library
    assert p.build == ["/opt/bin/cmake", "--build", str(root / "build"), "-j", "1"]
    assert p.install == ["/opt/bin/cmake", "--install", str(root / "build"), "--prefix", str(root)]


def test_sm100_needs_cutlass_and_a_10x_arch(tmp_path):
    root = make_tree(tmp_path / "vllm")
    p = plan(root, "sm100", archs=("9.0a",))
    text = "\n".join(p.problems)
    assert "VLLM_CUTLASS_SRC_DIR: a checkout of https://github.com/nvidia/cutlass.git at v4.4.2" in text
    assert "the package index's nvidia-cutlass, 4.2.0, with the pinned vLLM wheel's newer CUTLASS headers" in text
    assert "has none: add 10.0a" in text


def test_a_source_of_another_revision_is_used_and_reported(tmp_path):
    root = make_tree(tmp_path / "vllm")
    cutlass = fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    (cutlass / srcs.PROVENANCE).write_text(json.dumps({"origin": "nvidia_cutlass-4.2.0.0.whl", "revision": "4.2.0"}))
    p = plan(root)
    assert not p.problems
    assert any("4.2.0 (nvidia_cutlass-4.2.0.0.whl), not the pinned v4.4.2" in w for w in p.warnings)


def test_tool_problems_name_their_fix(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "vllm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("cmake", "echo 'cmake version 3.25.1'"),
                         ("python", "echo '[\"2.11.0+cpu\", null, [\"/x\"]]'")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setattr(fork_build, "find_nvcc", lambda: None)
    tc = tcm.find_toolchain(root, str(bin_dir / "python"))
    text = "\n".join(tc.problems)
    assert "no cmake >= 3.26 (found only 3.25.1): `pip install cmake`" in text
    assert "no ninja: `pip install ninja`" in text
    assert "no nvcc" in text
    assert "torch 2.11.0+cpu" in text and "is a CPU build" in text


def test_toolkit_gaps_are_named(tmp_path):
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    gaps = tcm.toolkit_gaps(home)
    assert gaps[:2] == ["include/cublas_v2.h", "libnvrtc.so"]
    (home / "include" / "cublas_v2.h").write_text("")
    (home / "lib" / "stubs").mkdir(parents=True)
    (home / "lib" / "libnvrtc.so.13").write_text("")
    (home / "lib" / "stubs" / "libcuda.so").write_text("")
    assert tcm.toolkit_gaps(home) == []


def test_standins_let_cmake_configure_without_the_sources(tmp_path):
    root = make_tree(tmp_path / "vllm")
    laid = root / "vllm" / "third_party" / "flashmla" / "flash_mla_interface.py"
    laid.parent.mkdir(parents=True)
    laid.write_text("import torch\nimport vllm._flashmla_C\nflash_mla_cuda = torch.ops._flashmla_C\n")
    found = {s.variable: s.as_dict() for s in srcs.external_sources(root)}
    vb.make_standin(root, found["FLASH_MLA_SRC_DIR"], tmp_path / "fm")
    assert (tmp_path / "fm" / "csrc" / "api" / "api.cpp").is_file()
    assert (tmp_path / "fm" / "csrc" / "sm90" / "decode" / "dense" / "instantiations" / "bf16.cu").is_file()
    # configure re-inserts vLLM's import line: the laid file comes out unchanged
    assert (tmp_path / "fm" / "flash_mla" / "flash_mla_interface.py").read_text() == \
        "import torch\nflash_mla_cuda = torch.ops._flashmla_C\n"
    assert (tmp_path / "fm" / tcm.STANDIN_MARK).is_file()
    vb.make_standin(root, found["VLLM_FLASH_ATTN_SRC_DIR"], tmp_path / "fa")
    assert "add_custom_target(_vllm_fa2_C)" in (tmp_path / "fa" / "CMakeLists.txt").read_text()


def test_cli_dry_run_prints_commands_and_missing_sources(tmp_path):
    root = make_tree(tmp_path / "vllm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIMI_SOURCES_DIR": str(tmp_path / "no-sources")}
    for var in srcs.REQUIRED:
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "kimi", "kernels", "build-vllm", "--source-dir", str(root),
                           "--subset", "all", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "configure:" in proc.stdout and "-DFETCHCONTENT_FULLY_DISCONNECTED=ON" in proc.stdout
    assert "export TORCH_CUDA_ARCH_LIST='9.0a;10.0a'" in proc.stdout
    assert proc.stdout.count("MISSING: ") >= 6 and "MISSING: VLLM_CUTLASS_SRC_DIR" in proc.stdout
    assert not (root / ".kimi" / "build").exists()
    proc = subprocess.run([sys.executable, "-m", "kimi", "kernels", "build-vllm", "--source-dir", str(root),
                           "--subset", "sm100", "--arch", "10.0a", "--dry-run", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    assert data["env"]["TORCH_CUDA_ARCH_LIST"] == "10.0a" and len(data["units"]) == 6


# ---------------------------------------------------------------------------------------------
# What the tree's CMake file makes a source need (0.32.0's statements)

DEEPGEMM_032 = """if (DEFINED ENV{DEEPGEMM_SRC_DIR})
  set(DEEPGEMM_SRC_DIR $ENV{DEEPGEMM_SRC_DIR})
endif()
  set(_DEEPGEMM_UPSTREAM_REPO "https://github.com/vllm-project/DeepGEMM.git")
  set(_DEEPGEMM_UPSTREAM_TAG "1e1842a833699298f7afc02eefb2ed168fff6938")
  if(EXISTS "${_deepgemm_src}/deep_gemm/_C.py")
  else()
    FetchContent_Populate(deepgemm GIT_REPOSITORY "${_DEEPGEMM_UPSTREAM_REPO}" GIT_TAG "${_DEEPGEMM_UPSTREAM_TAG}"
      GIT_SUBMODULES "third-party/cutlass" "third-party/deep_jit"
      GIT_PROGRESS TRUE
    )
  endif()
  file(GLOB_RECURSE _dg_headers "${deepgemm_SOURCE_DIR}/csrc/*.h" "${deepgemm_SOURCE_DIR}/deep_gemm/include/*.cuh")
  add_custom_command(OUTPUT x
    COMMAND "${Python_EXECUTABLE}" "${CMAKE_SOURCE_DIR}/tools/build_deepgemm_C.py" "${deepgemm_SOURCE_DIR}" x
    DEPENDS "${CMAKE_SOURCE_DIR}/tools/build_deepgemm_C.py"
            "${deepgemm_SOURCE_DIR}/csrc/python_api.cpp"
            "${deepgemm_SOURCE_DIR}/deep_gemm/_C.py"
            "${deepgemm_SOURCE_DIR}/setup.py")
  install(DIRECTORY "${deepgemm_SOURCE_DIR}/deep_gemm/utils/" DESTINATION vllm/third_party/deep_gemm/utils)
  # install(DIRECTORY "${deepgemm_SOURCE_DIR}/commented_out/")
"""
FMHA_032 = """if(DEFINED ENV{FMHA_SM100_SRC_DIR})
  set(FMHA_SM100_SRC_DIR $ENV{FMHA_SM100_SRC_DIR})
endif()
FetchContent_Declare(fmha_sm100 GIT_REPOSITORY https://github.com/vllm-project/MSA.git
  GIT_TAG 968061ab16cb14991a5c7d4c0e8eabf531be0dcf)
set(FMHA_SM100_PY_ROOT "${fmha_sm100_SOURCE_DIR}/python/fmha_sm100")
install(FILES "${FMHA_SM100_PY_ROOT}/api.py" "${FMHA_SM100_PY_ROOT}/nvfp4_kv.py" DESTINATION x)
install(DIRECTORY "${FMHA_SM100_PY_ROOT}/kvouter/" DESTINATION y)
"""
FLASHKDA_032 = """if(DEFINED ENV{FLASH_KDA_SRC_DIR})
  set(FLASH_KDA_SRC_DIR $ENV{FLASH_KDA_SRC_DIR})
endif()
if(FLASH_KDA_SRC_DIR)
  FetchContent_Declare(flashkda SOURCE_DIR ${FLASH_KDA_SRC_DIR})
else()
  FetchContent_Declare(flashkda GIT_REPOSITORY https://github.com/vllm-project/FlashKDA.git
    GIT_TAG 17a037d98da546deb4591e967cf961a43c034d8b
    GIT_PROGRESS TRUE
    GIT_SUBMODULES cutlass
  )
endif()
  set(FLASH_KDA_SOURCES
    csrc/flashkda_registration.cpp
    ${flashkda_SOURCE_DIR}/csrc/flash_kda.cpp
    ${flashkda_SOURCE_DIR}/csrc/smxx/fwd_launch.cu)
  set(FLASH_KDA_INCLUDES ${flashkda_SOURCE_DIR}/csrc ${flashkda_SOURCE_DIR}/cutlass/include)
"""
DEEPSELECT_032 = """if (DEFINED ENV{DEEPSELECT_SRC_DIR})
  set(DEEPSELECT_SRC_DIR $ENV{DEEPSELECT_SRC_DIR})
endif()
FetchContent_Declare(deepselect GIT_REPOSITORY https://github.com/vllm-project/DeepSelect.git
  GIT_TAG d96d33afe1fab0d6066da49cdc91e64c2bee65ea)
    file(GLOB DeepSelect_SOURCES CONFIGURE_DEPENDS
        ${deepselect_SOURCE_DIR}/csrc/cuda_kernels/v3/instantiations/*.cu)
    list(PREPEND DeepSelect_SOURCES ${deepselect_SOURCE_DIR}/csrc/api.cpp)
"""


def test_tree_required_reads_files_folders_and_submodules():
    dg = srcs.tree_required("DEEPGEMM_SRC_DIR", DEEPGEMM_032)
    assert dg == ["csrc/python_api.cpp", "deep_gemm/_C.py", "setup.py", "deep_gemm/utils/", "third-party/cutlass/",
                  "third-party/deep_jit/"]  # no glob, no ${CMAKE_SOURCE_DIR} file, no comment, no GIT_PROGRESS
    assert "third-party/fmt/" in srcs.tree_required("DEEPGEMM_SRC_DIR", DEEPGEMM_032.replace("deep_jit", "fmt"))
    assert srcs.tree_required("FMHA_SM100_SRC_DIR", FMHA_032) == [  # through the FMHA_SM100_PY_ROOT alias
        "python/fmha_sm100/api.py", "python/fmha_sm100/nvfp4_kv.py", "python/fmha_sm100/kvouter/"]
    assert srcs.tree_required("FLASH_KDA_SRC_DIR", FLASHKDA_032) == ["csrc/flash_kda.cpp", "csrc/smxx/fwd_launch.cu",
                                                                    "cutlass/"]
    triton = ('set(T "${triton_kernels_SOURCE_DIR}/python/triton_kernels/triton_kernels/")\n'
              'install(DIRECTORY ${triton_kernels_SOURCE_DIR}/python/triton_kernels/triton_kernels/)\n')
    assert srcs.tree_required("TRITON_KERNELS_SRC_DIR", triton) == []  # the clone's layout, not the env folder's
    need = srcs.required_files("DEEPGEMM_SRC_DIR", DEEPGEMM_032)
    assert need[:len(srcs.REQUIRED["DEEPGEMM_SRC_DIR"])] == list(srcs.REQUIRED["DEEPGEMM_SRC_DIR"])
    assert srcs.required_files("DEEPGEMM_SRC_DIR") == list(srcs.REQUIRED["DEEPGEMM_SRC_DIR"])


def test_an_empty_submodule_folder_is_missing(tmp_path):
    root = make_tree(tmp_path / "vllm")
    (root / "cmake" / "external_projects" / "deepgemm.cmake").write_text(DEEPGEMM_032)
    need = srcs.required_files("DEEPGEMM_SRC_DIR", DEEPGEMM_032)
    folder = fill(root / ".kimi" / "sources" / "deepgemm", "DEEPGEMM_SRC_DIR", need)
    found = {s.variable: s for s in srcs.external_sources(root)}
    assert found["DEEPGEMM_SRC_DIR"].present and found["DEEPGEMM_SRC_DIR"].required == need
    (folder / "third-party" / "deep_jit" / "x").unlink()  # a checkout without `git submodule update`
    found = {s.variable: s for s in srcs.external_sources(root)}
    assert found["DEEPGEMM_SRC_DIR"].missing_files == ["third-party/deep_jit/"]
    assert "lacks: third-party/deep_jit/" in srcs.render(list(found.values()))


def test_032_sources_get_standins_and_a_build_needs_them(tmp_path):
    root = make_tree(tmp_path / "vllm")
    for name, text in (("flashkda.cmake", FLASHKDA_032), ("deepselect.cmake", DEEPSELECT_032)):
        (root / "cmake" / "external_projects" / name).write_text(text)
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    p = plan(root)
    assert {"DEEPSELECT_SRC_DIR", "FLASH_KDA_SRC_DIR"} <= set(p.standins) and not p.problems
    found = {s["variable"]: s for s in p.sources}
    vb.make_standin(root, found["FLASH_KDA_SRC_DIR"], tmp_path / "kda")
    assert (tmp_path / "kda" / "csrc" / "smxx" / "fwd_launch.cu").is_file()
    assert not (tmp_path / "kda" / "CMakeLists.txt").exists()  # FetchContent_MakeAvailable adds no subproject
    vb.make_standin(root, found["DEEPSELECT_SRC_DIR"], tmp_path / "ds")
    assert (tmp_path / "ds" / "csrc" / "api.cpp").is_file()
    problems = "\n".join(plan(root, "all").problems)
    assert "DeepSelect.git at d96d33afe1fab0d6066da49cdc91e64c2bee65ea" in problems and "FlashKDA.git" in problems


# ---------------------------------------------------------------------------------------------
# Host compiler checks (0.32.0: GCC >= 13 for DeepGEMM/DeepSelect) and the configure-only waiver

GCC_CHECKS = """project(vllm_extensions LANGUAGES CXX)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS "11.3")
  message(FATAL_ERROR
    "GCC >= 11.3 is required to build vLLM (found ${CMAKE_CXX_COMPILER_VERSION}). ")
endif()
if (VLLM_GPU_LANG STREQUAL "CUDA"
    AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU"
    AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS "13")
  message(FATAL_ERROR
    "GCC >= 13 is required to build vLLM with CUDA (found ${CMAKE_CXX_COMPILER_VERSION}). "
    "The DeepGEMM and DeepSelect dependencies use C++20 <format> in host code.")
endif()
"""
WAIVED = "GCC >= 13 is required to build vLLM with CUDA (found "


def test_compiler_checks_are_read_and_a_gcc_13_check_is_waived_for_sm100(tmp_path):
    root = make_tree(tmp_path / "vllm")
    (root / "CMakeLists.txt").write_text(CMAKELISTS + GCC_CHECKS)
    (root / "cmake" / "external_projects" / "deepgemm.cmake").write_text(DEEPGEMM_032)
    checks = ct.compiler_checks(root)
    assert [(c.version, c.prefix) for c in checks] == [("11.3", "GCC >= 11.3 is required to build vLLM (found "),
                                                       ("13", WAIVED)]
    assert "DeepGEMM and DeepSelect" in checks[1].message
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    gcc12 = toolchain(cxx="/usr/bin/c++", cxx_version="12.2.0", cxx_gnu=True)
    p = plan(root, toolchain=gcc12)
    assert p.waivers == [WAIVED] and not p.problems
    assert f"-DCMAKE_PROJECT_vllm_extensions_INCLUDE={root / 'build' / ct.WAIVERS_FILE}" in p.configure
    note = next(w for w in p.warnings if "GCC 12.2.0" in w)
    assert "for DeepGEMM, which the sm100 subset does not compile: waived" in note and "needs GCC >= 13" in note
    p = plan(root, "all", toolchain=gcc12)
    assert not p.waivers and any("stops for GCC < 13" in x and "install GCC >= 13" in x for x in p.problems)
    p = plan(root, toolchain=toolchain(cxx="/usr/bin/c++", cxx_version="11.2.0", cxx_gnu=True))
    assert p.waivers == [WAIVED] and any("stops for GCC < 11.3" in x for x in p.problems)  # vLLM's own: no waiver
    for tc in (toolchain(cxx="/usr/bin/c++", cxx_version="13.3.0", cxx_gnu=True),
               toolchain(cxx="/usr/bin/clang++", cxx_version="18.1.0", cxx_gnu=False)):
        p = plan(root, toolchain=tc)
        assert not p.waivers and not p.problems and not any("INCLUDE=" in x for x in p.configure)
    p = plan(root, toolchain=gcc12, cmake_args=["-DCMAKE_CXX_COMPILER=/opt/gcc-14/bin/g++"])
    assert not p.waivers and not p.problems  # the caller chose the compiler


def _cmake() -> str | None:
    for c in (ROOT / ".venv" / "bin" / "cmake", Path(sys.executable).parent / "cmake"):
        if c.is_file():
            return str(c)
    return shutil.which("cmake")


@pytest.mark.skipif(_cmake() is None, reason="no cmake")
def test_the_waiver_turns_only_that_fatal_error_into_a_warning(tmp_path):
    """Real CMake: the waived FATAL_ERROR becomes a warning, another one still stops, other messages
    pass unchanged (a list's semicolons, several arguments)."""
    waivers = tmp_path / ct.WAIVERS_FILE
    waivers.write_text(ct.waivers_cmake([WAIVED]))
    src = tmp_path / "src"
    src.mkdir()
    def configure(body: str) -> subprocess.CompletedProcess:
        (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.20)\nproject(vllm_extensions NONE)\n"
                                            "project(vllm_extensions NONE)\n" + body)  # a second project(): guarded
        shutil.rmtree(tmp_path / "b", ignore_errors=True)
        return subprocess.run([_cmake(), "-S", str(src), "-B", str(tmp_path / "b"),
                               f"-DCMAKE_PROJECT_vllm_extensions_INCLUDE={waivers}"], capture_output=True, text=True,
                              timeout=120)
    proc = configure('set(V 12.2.0)\nmessage(STATUS "archs: 9.0a;10.0a" " and more")\n'
                     'message(FATAL_ERROR "GCC >= 13 is required to build vLLM with CUDA (found ${V}). " "next")\n'
                     'message(STATUS "after the check")\n')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "-- archs: 9.0a;10.0a and more" in out and "-- after the check" in out
    assert "waived this check" in out and "(found 12.2.0).  next" in out.replace("\n  ", " ")
    proc = configure('message(FATAL_ERROR "GCC >= 11.3 is required to build vLLM (found 11.2)")\n')
    assert proc.returncode != 0 and "GCC >= 11.3 is required" in proc.stderr


# ---------------------------------------------------------------------------------------------
# The CUDA toolkit overlay (a pip-laid toolkit without cuBLAS, NVRTC or a libcuda stub)

def _pip_toolkit(tmp_path: Path) -> tuple[Path, Path]:
    """A toolkit laid out as the nvidia-cuda-nvcc wheels lay it, and a site-packages with nvidia/cu13."""
    home = tmp_path / "cuda-13.0"
    for rel in ("bin/nvcc", "bin/ptxas", "bin/nvcc.profile", "include/cuda_runtime_api.h", "lib/libcudart.so",
                "lib/libcudart.so.13", "nvvm/bin/cicc"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(rel)
    (home / "lib64").symlink_to("lib")
    (home / "targets" / "x86_64-linux").mkdir(parents=True)
    (home / "targets" / "x86_64-linux" / "include").symlink_to("../../include")
    (home / "targets" / "x86_64-linux" / "lib").symlink_to("../../lib")
    site = tmp_path / "site-packages"
    for rel in ("nvidia/cu13/include/cublas_v2.h", "nvidia/cu13/include/nvrtc.h", "nvidia/cu13/lib/libnvrtc.so.13",
                "nvidia/cu13/lib/libcublas.so.13", "nvidia/cu13/lib/libcudart.so.13", "nvidia/nccl/lib/libnccl.so.2"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(rel)
    return home, site


def test_toolkit_overlay_fills_the_gaps_from_the_cuda_wheels(tmp_path, monkeypatch):
    home, site = _pip_toolkit(tmp_path)
    monkeypatch.setattr(tcm, "toolkit_gaps", _gaps_without_the_machine)
    monkeypatch.setattr(bp, "toolkit_gaps", _gaps_without_the_machine)
    gaps = tcm.toolkit_gaps(home)
    assert gaps == ["include/cublas_v2.h", "libnvrtc.so", tcm.LIBCUDA_GAP]
    providers = tcm.overlay_providers(["", str(site), str(tmp_path / "nowhere")])
    assert providers == [site / "nvidia" / "cu13", site / "nvidia" / "nccl"]
    root = make_tree(tmp_path / "vllm")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    tc = toolchain(nvcc=str(home / "bin" / "nvcc"), cuda_home=str(home), toolkit_gaps=gaps, python_path=[str(site)])
    p = plan(root, toolchain=tc)
    overlay = root / "build" / tcm.OVERLAY_DIR
    assert not p.problems and p.overlay == {"path": str(overlay), "home": str(home), "providers": list(map(str,
                                                                                                          providers))}
    assert p.env["CUDA_HOME"] == str(overlay) and p.env["PATH"] == f"{overlay}/bin:$PATH"
    assert f"-DCMAKE_CUDA_COMPILER={overlay}/bin/nvcc" in p.configure
    assert any("an overlay of it and" in w for w in p.warnings)
    tcm.make_toolkit_overlay(home, providers, overlay)
    assert tcm.toolkit_gaps(overlay) == []
    assert not (overlay / "bin" / "nvcc").is_symlink() and (overlay / "bin" / "nvcc").read_text() == "bin/nvcc"
    assert (overlay / "bin" / "ptxas").resolve() == (home / "bin" / "ptxas").resolve()
    assert (overlay / "include" / "cuda_runtime_api.h").is_file() and (overlay / "include" / "nvrtc.h").is_file()
    assert (overlay / "targets" / "x86_64-linux" / "include" / "cublas_v2.h").is_file()
    assert (overlay / "lib64" / "libnvrtc.so").resolve() == (site / "nvidia/cu13/lib/libnvrtc.so.13").resolve()
    assert (overlay / "lib" / "libcudart.so.13").read_text() == "lib/libcudart.so.13"  # the toolkit's wins
    assert (overlay / "lib" / "stubs" / "libcuda.so").is_file() and (overlay / "nvvm" / "bin" / "cicc").is_file()
    tcm.make_toolkit_overlay(home, providers, overlay)  # again: replaced whole
    assert plan(root, "all", toolchain=tc).overlay is None  # all links: a real toolkit
    # without the wheels: a problem naming the fix
    p = plan(root, toolchain=toolchain(nvcc=str(home / "bin" / "nvcc"), cuda_home=str(home), toolkit_gaps=gaps))
    assert p.overlay is None and any("lacks include/cublas_v2.h, libnvrtc.so" in x and "nvidia-cublas" in x
                                     for x in p.problems)


real_gaps = tcm.toolkit_gaps


def _gaps_without_the_machine(home: Path, providers=()) -> list[str]:
    """toolkit_gaps with a libcuda.so looked for in the toolkit only (not a driver's in /usr/lib)."""
    stub = any((home / d / "libcuda.so").exists() for d in ("lib/stubs", "lib64/stubs", "lib", "lib64"))
    return [g for g in real_gaps(home, providers) if g != tcm.LIBCUDA_GAP] + ([] if stub else [tcm.LIBCUDA_GAP])


FAKE_CMAKE = r"""#!/bin/sh
# stands in for cmake: configure writes build.ninja with a rule per .cu the tree's CMakeLists.txt
# names; --build touches the objects it is asked for
if [ "$1" = "--build" ]; then
  dir=$2; shift 4; [ "$1" = "--target" ] && shift
  for t in "$@"; do mkdir -p "$dir/$(dirname "$t")"; : > "$dir/$t"; echo "[1/1] $t"; done
  exit 0
fi
root=$2; build=$4
[ -n "$FAKE_FAIL" ] && { echo "CMake Error: $FAKE_FAIL"; exit 3; }
echo "-- archs $TORCH_CUDA_ARCH_LIST flashmla $FLASH_MLA_SRC_DIR path $PATH"
ls "$FLASH_MLA_SRC_DIR/csrc/api/api.cpp" || exit 4
mkdir -p "$build"
for s in $(grep -o 'csrc/[^"]*[.]cu' "$root/CMakeLists.txt"); do
  echo "build CMakeFiles/_C_stable_libtorch.dir/$s.o: CUDA_COMPILER $root/$s" >> "$build/build.ninja"
done
"""


def test_run_configures_builds_the_objects_and_records(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "vllm")
    fill(root / ".kimi" / "sources" / "vllm_cutlass", "VLLM_CUTLASS_SRC_DIR")
    fake = tmp_path / "cmake"
    fake.write_text(FAKE_CMAKE)
    fake.chmod(0o755)
    p = plan(root, toolchain=toolchain(cmake=str(fake)))
    record = vb.run(p)
    assert record.result == "ok" and len(record.objects) == 6 and record.build_seconds is not None
    assert all((root / "build" / obj).is_file() for obj in record.objects)
    log = (root / "build" / "build.log").read_text()
    assert "-- archs 9.0a;10.0a flashmla " + str(root / "build" / "standins" / "flash_mla") in log
    assert f"path /opt/cuda/bin:{os.environ['PATH']}" in log  # $PATH expanded to the caller's
    assert (root / "build" / "standins" / "flash_mla" / tcm.STANDIN_MARK).is_file()
    saved = json.loads((root / "build" / "kimi-build.json").read_text())
    assert saved["result"] == "ok" and saved["plan"]["subset"] == "sm100" and saved["fork_library"] is None
    # a unit the configure made no rule for is named before anything is built
    stale = _replan_missing_mla(root, fake, tmp_path)
    with pytest.raises(KimiError, match="build.ninja has no rule for: .*sm100_cutlass_mla_kernel"):
        vb.run(stale)
    assert not (tmp_path / "b2" / stale.units[0]["object"]).exists()
    (root / "CMakeLists.txt").write_text(CMAKELISTS)
    monkeypatch.setenv("FAKE_FAIL", "boom")
    with pytest.raises(KimiError, match="configure failed .* see .*build.log"):
        vb.run(plan(root, toolchain=toolchain(cmake=str(fake))))
    assert json.loads((root / "build" / "kimi-build.json").read_text())["result"] == "configure failed (exit 3)"


def _replan_missing_mla(root: Path, fake: Path, tmp_path: Path) -> bp.Plan:
    """A plan for the original units, configured against a tree whose CMakeLists.txt lost the MLA unit."""
    (root / "CMakeLists.txt").write_text(CMAKELISTS)
    p = bp.make_plan(root, "sm100", build_dir=tmp_path / "b2", toolchain=toolchain(cmake=str(fake)), cores=2,
                     available_gb=21.0)
    (root / "CMakeLists.txt").write_text(CMAKELISTS.replace('"csrc/libtorch_stable/attention/mla/', '"x/'))
    return p


# ---------------------------------------------------------------------------------------------
# prepare: from local wheels, checkouts and archives

def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _pin(root: Path, wheel: Path) -> None:
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pin = {"line": "mainline", "version": "0.26.0", "fork_release": 1, "torch": "2.11.0", "artifacts": {
        "sdist": {"project": "vllm", "file": "vllm-0.26.0.tar.gz", "sha256": "0" * 64},
        "cuda_wheel": {"project": "vllm", "file": wheel.name, "sha256": sha}}}
    (root / "kimi" / "lines" / "mainline" / "pin.json").write_text(json.dumps(pin))


def test_prepare_from_local_wheels(tmp_path):
    root = make_tree(tmp_path / "vllm")
    from_dir = tmp_path / "from"
    from_dir.mkdir()
    src = "cutlass_library/source/"
    _zip(from_dir / "nvidia_cutlass-4.2.0.0-py3-none-any.whl", {
        f"{src}include/cutlass/cutlass.h": "", f"{src}include/cute/tensor.hpp": "",
        f"{src}include/cutlass/version.h":
            "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n",
        f"{src}tools/util/include/cutlass/util/packed_stride.hpp": "",
        f"{src}examples/77_blackwell_fmha/kernel/x.hpp": "", f"{src}examples/common/helper.h": "",
        "cutlass_library/__init__.py": "", "cutlass_library/generator.py": "",
        "nvidia_cutlass-4.2.0.0.dist-info/METADATA": "Name: nvidia-cutlass\n"})
    vllm_files = {
        "vllm/third_party/fmha_sm100/api.py": "", "vllm/third_party/fmha_sm100/csrc/a.cu": "",
        "vllm/third_party/fmha_sm100/cute/b.py": "", "vllm/third_party/fmha_sm100/cutlass/include/c.h": "",
        "vllm/third_party/fmha_sm100/cutlass/tools/util/include/d.h": "",
        "vllm/third_party/tml_fa4/interface.py": "from vllm.third_party.tml_fa4.utils import f\n",
        "vllm/third_party/triton_kernels/__init__.py": "", "vllm/third_party/triton_kernels/matmul_ogs.py": "",
        "vllm/_C_stable_libtorch.abi3.so": ""}
    wheel = _zip(from_dir / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", vllm_files)
    _pin(root, wheel)
    done = {d.variable: d for d in fill_sources.prepare(root, from_dir=from_dir, cache=tmp_path / "cache")}
    assert done["VLLM_CUTLASS_SRC_DIR"].action == "from nvidia-cutlass"
    assert "CUTLASS 4.2.0 headers (pinned v4.4.2)" in done["VLLM_CUTLASS_SRC_DIR"].detail
    assert done["FLASH_MLA_SRC_DIR"].action == "missing" and "FlashMLA" in done["FLASH_MLA_SRC_DIR"].detail
    sources = root / ".kimi" / "sources"
    assert (sources / "vllm_cutlass" / "python" / "cutlass_library" / "generator.py").is_file()
    assert not (sources / "vllm_cutlass" / "python" / "cutlass_library" / "source").exists()
    assert (sources / "tml_fa4" / "flash_attn" / "cute" / "interface.py").read_text() == \
        "from flash_attn.cute.utils import f\n"
    assert (sources / "fmha_sm100" / "python" / "fmha_sm100" / "api.py").is_file()
    found = {s.variable: s for s in srcs.external_sources(root)}
    assert found["VLLM_CUTLASS_SRC_DIR"].present and found["VLLM_CUTLASS_SRC_DIR"].revision == "4.2.0"
    assert found["VLLM_CUTLASS_SRC_DIR"].revision_ok is False
    for var in ("FMHA_SM100_SRC_DIR", "TML_FA4_SRC_DIR", "TRITON_KERNELS_SRC_DIR"):
        assert found[var].present and found[var].revision_ok is True, var
    assert (tmp_path / "cache" / wheel.name).is_file()  # verified against the pin, then cached
    text = srcs.render(list(found.values()))
    assert "2 missing:" in text and "NOT the pinned revision" in text
    # a wheel that does not match the pin is refused
    _zip(wheel, {"vllm/other.py": ""})
    (tmp_path / "cache" / wheel.name).unlink()
    with pytest.raises(KimiError, match="sha256 mismatch"):
        fill_sources.prepare(root, from_dir=from_dir, cache=tmp_path / "cache", force=True)
    # a vLLM wheel whose MSA copy has newer CUTLASS headers: they replace include/ and tools/util/include
    copy = "vllm/third_party/fmha_sm100/cutlass/"
    wheel = _zip(wheel, {**vllm_files,
        f"{copy}include/cutlass/version.h":
            "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 3\n#define CUTLASS_PATCH 4\n",
        f"{copy}include/cutlass/cutlass.h": "// 4.3.4", f"{copy}include/cute/tensor.hpp": "",
        f"{copy}tools/util/include/cutlass/util/packed_stride.hpp": "// 4.3.4"})
    _pin(root, wheel)
    done = {d.variable: d for d in fill_sources.prepare(root, from_dir=from_dir, cache=tmp_path / "cache", force=True)}
    assert "CUTLASS 4.3.4 headers (pinned v4.4.2)" in done["VLLM_CUTLASS_SRC_DIR"].detail
    tree = sources / "vllm_cutlass"
    assert (tree / "include" / "cutlass" / "cutlass.h").read_text() == "// 4.3.4"
    assert (tree / "tools" / "util" / "include" / "cutlass" / "util" / "packed_stride.hpp").read_text() == "// 4.3.4"
    assert (tree / "examples" / "77_blackwell_fmha" / "kernel" / "x.hpp").is_file()  # still nvidia-cutlass's
    cutlass = {s.variable: s for s in srcs.external_sources(root)}["VLLM_CUTLASS_SRC_DIR"]
    assert cutlass.present and cutlass.revision == "4.3.4" and cutlass.revision_ok is False


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_prepare_from_a_checkout_and_an_archive_checks_revisions(tmp_path):
    root = make_tree(tmp_path / "vllm")
    from_dir = tmp_path / "from"
    checkout = fill(from_dir / "FlashMLA", "FLASH_MLA_SRC_DIR")
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "pinned")
    head = _git(checkout, "rev-parse", "HEAD")
    for name, text in EXTERNAL.items():  # pin the checkout's commit
        (root / "cmake" / "external_projects" / name).write_text(text.replace(FLASHMLA_SHA, head))
    tree = fill(tmp_path / "fa" / f"flash-attention-{FA_SHA}", "VLLM_FLASH_ATTN_SRC_DIR")
    with tarfile.open(from_dir / f"flash-attention-{FA_SHA}.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    done = {d.variable: d for d in fill_sources.prepare(root, from_dir=from_dir, cache=tmp_path / "cache")}
    assert done["FLASH_MLA_SRC_DIR"].action == "linked" and done["VLLM_FLASH_ATTN_SRC_DIR"].action == "unpacked"
    found = {s.variable: s for s in srcs.external_sources(root)}
    assert found["FLASH_MLA_SRC_DIR"].present and found["FLASH_MLA_SRC_DIR"].revision_ok is True
    assert found["VLLM_FLASH_ATTN_SRC_DIR"].present and found["VLLM_FLASH_ATTN_SRC_DIR"].revision == FA_SHA
    assert found["VLLM_FLASH_ATTN_SRC_DIR"].revision_ok is True
    (checkout / "new.txt").write_text("x")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "later")
    found = {s.variable: s for s in srcs.external_sources(root)}
    assert found["FLASH_MLA_SRC_DIR"].revision_ok is False and "NOT the pinned revision" in srcs.render(
        list(found.values()))


def test_unpack_refuses_unsafe_paths(tmp_path):
    archive = tmp_path / "FlashMLA-abc.zip"
    _zip(archive, {"FlashMLA-abc/ok.txt": "", "../evil.txt": ""})
    with pytest.raises(KimiError):
        fill_sources.unpack_archive(archive, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo("../evil.txt")
        tar.addfile(info, io.BytesIO(b""))
    (tmp_path / "x-1.tar.gz").write_bytes(data.getvalue())
    with pytest.raises(KimiError, match="unsafe"):
        fill_sources.unpack_archive(tmp_path / "x-1.tar.gz", tmp_path / "out2")
    assert not (tmp_path / "evil.txt").exists()


# ---------------------------------------------------------------------------------------------
# The real configure (minutes; marked `build`)

@pytest.mark.build
@pytest.mark.skipif(not (ROOT / "CMakeLists.txt").is_file(), reason="the vLLM tree is not laid (`kimi sync`)")
def test_real_offline_configure_of_the_sm100_group(tmp_path, monkeypatch):
    """vLLM's CMake configure with local sources only (prepared CUTLASS, stand-ins for the rest, and
    where needed the compiler waiver and the toolkit overlay): build.ninja then has every sm_100-only
    object target of the laid tree (13 in 0.26.0, 14 in 0.32.0). KIMI_TEST_PYTHON names an environment
    with torch's CUDA build when .venv's is a CPU build."""
    if CUDA_HOME:
        monkeypatch.setenv("CUDA_HOME", CUDA_HOME)
    p = bp.make_plan(ROOT, "sm100", build_dir=tmp_path / "build", python=os.environ.get("KIMI_TEST_PYTHON"))
    if p.problems:
        pytest.skip("cannot configure here: " + "; ".join(p.problems))
    record = vb.run(p, configure_only=True)
    assert record.result == "configured"
    ninja = (tmp_path / "build" / "build.ninja").read_text()
    assert all(f"build {u['object']}:" in ninja for u in p.units)
    log = (tmp_path / "build" / "build.log").read_text()
    assert "Cloning into" not in log and "GIT_REPOSITORY" not in log
    assert not list((tmp_path / "build" / "deps").glob("*-subbuild"))  # FetchContent downloaded nothing
