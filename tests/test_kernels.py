"""The fork's draft-head kernels: build and cubins (needs nvcc), the torch path on the CPU,
and the CUDA kernels against a float64 reference at Kimi shapes (marker ``gpu``).

Kimi shapes: draft vocabulary 32000, target vocabulary 163840, 1-512 token rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi.errors import KimiError
from kimi.kernels import build

torch = pytest.importorskip("torch")

from kimi.kernels import draft_head  # noqa: E402  (needs torch)

DRAFT_VOCAB, TARGET_VOCAB = 32000, 163840
ROOT = Path(__file__).resolve().parents[1]


def make_d2t(vocab: int, target_vocab: int, generator: torch.Generator) -> torch.Tensor:
    """int64 offsets of a draft vocabulary that is a sorted random subset of the target's."""
    targets = torch.randperm(target_vocab, generator=generator)[:vocab].sort().values
    return targets - torch.arange(vocab)


def make_logits(rows: int, vocab: int, dtype: torch.dtype, generator: torch.Generator, ties: bool = False):
    """Random logits; with ``ties`` small integers (many exact ties, also for the maximum) and
    the row maximum written at a second, earlier-or-later position."""
    if ties:
        x = torch.randint(-4, 4, (rows, vocab), generator=generator).to(dtype)
        hi = torch.randint(0, vocab, (rows, 2), generator=generator)
        x[torch.arange(rows), hi[:, 0]] = 9
        x[torch.arange(rows), hi[:, 1]] = 9
        return x
    return (torch.randn(rows, vocab, generator=generator, dtype=torch.float32) * 4).to(dtype)


# ---------------------------------------------------------------------------------------------
# Build and cubins (runs where nvcc is; no GPU needed)

def test_parse_archs_and_gencodes():
    assert build.parse_archs("9.0a;10.0a") == ("9.0a", "10.0a")
    assert build.parse_archs("sm_90a, 10.0a 10.0a") == ("9.0a", "10.0a")
    assert build.gencode_flags(("9.0a", "10.0a")) == [
        "-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_100a,code=sm_100a"]
    with pytest.raises(KimiError, match="bad CUDA architecture"):
        build.parse_archs("hopper")
    with pytest.raises(KimiError, match="no CUDA architecture"):
        build.parse_archs(" ; ")


@pytest.mark.skipif(build.find_nvcc() is None, reason="needs nvcc (CUDA toolkit 13): set CUDA_HOME or NVCC")
def test_build_lists_sm90a_and_sm100a_cubins(tmp_path_factory):
    """`kimi kernels build` + `cuobjdump --list-elf`: one sm_90a and one sm_100a cubin."""
    if build.find_cuobjdump() is None:
        pytest.skip("needs a cuobjdump of CUDA >= 13 (`pip install nvidia-cuda-cuobjdump`, or set CUOBJDUMP)")
    root = Path(os.environ.get("KIMI_KERNELS_BUILD_DIR") or build.default_build_root())
    result = build.build(("9.0a", "10.0a"), build_root=root)
    library = Path(result.library)
    assert library.is_file() and result.archs == ["9.0a", "10.0a"]
    assert build.list_cubins(library) == ["sm_90a", "sm_100a"]
    assert build.find_library(root) == library
    again = build.build(("9.0a", "10.0a"), build_root=root)
    assert again.cached and again.library == result.library
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    exported = sorted(line.split()[-1] for line in symbols.splitlines() if " T " in line)
    assert exported == ["kimi_draft_argmax", "kimi_draft_head_abi_version", "kimi_draft_head_error_string",
                        "kimi_draft_head_max_k", "kimi_draft_head_probe", "kimi_draft_topk"]


def test_library_c_interface_without_a_gpu():
    """The built library loads through ctypes and refuses bad arguments before touching CUDA."""
    library = build.find_library()
    if library is None:
        pytest.skip("no draft-head library built here (`python3 -m kimi kernels build`, needs nvcc)")
    lib = draft_head._load(library)
    assert lib.kimi_draft_head_abi_version() == draft_head.ABI_VERSION
    assert lib.kimi_draft_head_max_k() == draft_head.MAX_K
    fake = 1 << 20  # never dereferenced: every call below fails its argument checks or has no rows
    assert lib.kimi_draft_argmax(fake, 7, 1, 8, 8, None, fake, None, 0, None) == -1
    assert lib.kimi_draft_argmax(fake, 2, 1, 8, 4, None, fake, None, 0, None) == -2
    assert lib.kimi_draft_argmax(fake, 2, 1, 8, 8, None, fake, None, 48, None) == -3
    assert lib.kimi_draft_argmax(fake, 2, 0, 8, 8, None, fake, None, 0, None) == 0
    assert lib.kimi_draft_topk(fake, 2, 1, 8, 8, None, None, 1.0, 17, fake, fake, None, 0, None) == -4
    assert lib.kimi_draft_topk(fake, 2, 1, 8, 8, None, None, 1.0, 4, fake, fake, None, 1024, None) == -3
    assert b"multiple of 32" in lib.kimi_draft_head_error_string(-3)


def test_cli_kernels_check_reports_missing_library(tmp_path):
    env = {**os.environ, "KIMI_KERNELS_BUILD_DIR": str(tmp_path / "none"), "PYTHONPATH": str(ROOT)}
    env.pop("KIMI_DRAFT_HEAD_LIB", None)
    proc = subprocess.run([sys.executable, "-m", "kimi", "kernels", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "kimi kernels build" in proc.stderr


def test_external_sources_report(tmp_path, monkeypatch):
    from kimi.kernels import sources

    (tmp_path / "cmake" / "external_projects").mkdir(parents=True)
    (tmp_path / "CMakeLists.txt").write_text(
        'set(CUTLASS_REVISION "v4.4.2")\nif (DEFINED ENV{VLLM_CUTLASS_SRC_DIR})\nendif()\n'
        "FetchContent_Declare(cutlass GIT_REPOSITORY https://github.com/nvidia/cutlass.git\n"
        "  GIT_TAG ${CUTLASS_REVISION})\n")
    (tmp_path / "cmake" / "external_projects" / "flashmla.cmake").write_text(
        "if (DEFINED ENV{FLASH_MLA_SRC_DIR})\n  set(FLASH_MLA_SRC_DIR $ENV{FLASH_MLA_SRC_DIR})\nendif()\n"
        "GIT_REPOSITORY https://github.com/vllm-project/FlashMLA\nGIT_TAG a8f794d\n")
    local = tmp_path / "fm"
    for rel in sources.REQUIRED["FLASH_MLA_SRC_DIR"]:
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_text("")
    monkeypatch.setenv("FLASH_MLA_SRC_DIR", str(local))
    monkeypatch.delenv("VLLM_CUTLASS_SRC_DIR", raising=False)
    found = {s.variable: s for s in sources.external_sources(tmp_path)}
    assert found["VLLM_CUTLASS_SRC_DIR"].tag == "v4.4.2" and not found["VLLM_CUTLASS_SRC_DIR"].present
    assert found["VLLM_CUTLASS_SRC_DIR"].path == str(tmp_path / ".kimi" / "sources" / "vllm_cutlass")
    assert found["FLASH_MLA_SRC_DIR"].present and found["FLASH_MLA_SRC_DIR"].tag == "a8f794d"
    text = sources.render(list(found.values()))
    assert f"export FLASH_MLA_SRC_DIR={local}" in text and "1 missing" in text
    (local / "csrc" / "api" / "api.cpp").unlink()
    found = {s.variable: s for s in sources.external_sources(tmp_path)}
    assert not found["FLASH_MLA_SRC_DIR"].present and found["FLASH_MLA_SRC_DIR"].missing_files == ["csrc/api/api.cpp"]
    assert "INCOMPLETE" in sources.render(list(found.values()))
    with pytest.raises(KimiError, match="kimi sync"):
        sources.external_sources(tmp_path / "nothing")


# ---------------------------------------------------------------------------------------------
# The torch path (CPU) against the float64 reference

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ties", [False, True])
def test_torch_path_matches_float64_reference(dtype, ties):
    g = torch.Generator().manual_seed(1)
    vocab, target_vocab = 997, 5003
    d2t = make_d2t(vocab, target_vocab, g)
    logits = make_logits(33, vocab, dtype, g, ties=ties)
    ref_p, ref_ids = draft_head.reference_topk(logits, d2t, 8, temperature=0.7)
    target = draft_head.draft_argmax(logits, d2t)  # CPU tensor: the torch path under "auto"
    assert target.dtype == torch.int64 and target.shape == (33,)
    assert torch.equal(target, ref_ids[:, 0])
    assert torch.equal(target, draft_head.scatter_argmax_upstream(logits, d2t, target_vocab))
    probs, ids, draft = draft_head.draft_topk(logits, d2t, 8, temperature=0.7, return_draft_ids=True)
    assert torch.equal(ids, ref_ids) and torch.equal(draft + d2t[draft], ids)
    assert probs.dtype == torch.float32
    assert ((probs.double() - ref_p).abs() / ref_p).max() < 1e-5


def test_torch_path_ties_nan_and_inf_follow_torch_argmax():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("-inf")] * 4, [0.0, float("nan"), 5.0, float("nan")]])
    d2t = torch.tensor([10, 10, 10, 10])
    assert draft_head.draft_argmax(x, d2t).tolist() == [11, 10, 11]
    assert draft_head.draft_argmax(x).tolist() == x.argmax(-1).tolist()
    _, ids = draft_head.draft_topk(x, None, 2)
    assert ids.tolist() == [[1, 2], [0, 1], [1, 3]]


def test_bad_input_is_refused():
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"\[T, draft_vocab\]"):
        draft_head.draft_argmax(x[0])
    with pytest.raises(ValueError, match="at least 8"):
        draft_head.draft_argmax(x, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="k must be"):
        draft_head.draft_topk(x, None, 9)
    with pytest.raises(ValueError, match="temperature"):
        draft_head.draft_topk(x, None, 2, temperature=0.0)
    with pytest.raises(KimiError, match="backend='cuda'"):
        draft_head.draft_argmax(x, backend="cuda")


# ---------------------------------------------------------------------------------------------
# The CUDA kernels on the GPU (fresh random inputs: the seed comes from the clock)

def _kernel_or_skip():
    status = draft_head.kernel_status()
    if not status["available"]:
        pytest.fail(f"draft-head kernel not usable on this GPU: {status['reason']}")


@pytest.fixture
def fresh_generator():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator(device="cuda").manual_seed(seed)


def _gpu_inputs(rows, dtype, g, ties):
    cpu = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=g, device="cuda")))
    d2t = make_d2t(DRAFT_VOCAB, TARGET_VOCAB, cpu).cuda()
    if ties:
        logits = make_logits(rows, DRAFT_VOCAB, dtype, cpu, ties=True).cuda()
    else:
        logits = (torch.randn(rows, DRAFT_VOCAB, generator=g, device="cuda") * 4).to(dtype)
    return logits, d2t


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64, 256, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("ties", [False, True])
def test_gpu_argmax_matches_reference(rows, dtype, ties, fresh_generator):
    _kernel_or_skip()
    logits, d2t = _gpu_inputs(rows, dtype, fresh_generator, ties)
    target, draft = draft_head.draft_argmax(logits, d2t, return_draft_ids=True, backend="cuda")
    _, ref = draft_head.reference_topk(logits, d2t, 1)
    assert torch.equal(target.cpu(), ref[:, 0])
    assert torch.equal(draft, logits.argmax(-1))
    assert torch.equal(target, draft_head.scatter_argmax_upstream(logits, d2t, TARGET_VOCAB))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64, 256, 512])
@pytest.mark.parametrize("k", [1, 4, 8, 16])
@pytest.mark.parametrize("ties", [False, True])
def test_gpu_topk_matches_reference(rows, k, ties, fresh_generator):
    _kernel_or_skip()
    logits, d2t = _gpu_inputs(rows, torch.bfloat16, fresh_generator, ties)
    temperature = torch.rand(rows, generator=fresh_generator, device="cuda") + 0.5
    probs, ids = draft_head.draft_topk(logits, d2t, k, temperature=temperature, backend="cuda")
    ref_p, ref_ids = draft_head.reference_topk(logits, d2t, k, temperature=temperature)
    assert torch.equal(ids.cpu(), ref_ids)
    rel = ((probs.cpu().double() - ref_p).abs() / ref_p).max().item()
    assert rel < 1e-5, rel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_odd_shapes_strides_and_specials(dtype):
    """Vocabularies that are not a multiple of the vector width, a misaligned row start, rows of
    -inf, NaN (first NaN wins, as torch.argmax) and every block size."""
    _kernel_or_skip()
    g = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(7, 1003 + 5, generator=g, device="cuda").to(dtype)
    logits = base[:, 3:3 + 1001]  # row stride 1008, rows start 3 elements past 16-byte alignment
    logits[1] = float("-inf")
    logits[2, 17] = float("nan")
    logits[2, 900] = float("nan")
    logits[3, 1000] = 50.0
    d2t = torch.arange(1001, device="cuda") * 2
    want = logits.argmax(-1)
    for threads in (0, 32, 96, 256, 1024):
        target, draft = draft_head.draft_argmax(logits, d2t, return_draft_ids=True, backend="cuda", threads=threads)
        assert torch.equal(draft, want), threads
        assert torch.equal(target, want * 3), threads
    for threads in (0, 64, 512):
        _, ids = draft_head.draft_topk(logits[3:], d2t, 5, backend="cuda", threads=threads)
        ref_p, ref_ids = draft_head.reference_topk(logits[3:], d2t, 5)
        assert torch.equal(ids.cpu(), ref_ids), threads
    with pytest.raises(RuntimeError, match="threads"):
        draft_head.draft_topk(logits, d2t, 5, backend="cuda", threads=1024)


@pytest.mark.gpu
def test_gpu_kernel_under_cuda_graph():
    _kernel_or_skip()
    g = torch.Generator(device="cuda").manual_seed(5)
    logits = torch.randn(64, DRAFT_VOCAB, generator=g, device="cuda").bfloat16()
    d2t = make_d2t(DRAFT_VOCAB, TARGET_VOCAB, torch.Generator().manual_seed(5)).cuda()
    draft_head.draft_argmax(logits, d2t, backend="cuda")  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_head.draft_argmax(logits, d2t, backend="cuda")
    logits.copy_(torch.randn(64, DRAFT_VOCAB, generator=g, device="cuda").bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, draft_head.draft_argmax_torch(logits, d2t))
