"""``kimi sync`` against a synthetic upstream release: layout, idempotence, bad input."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path

import pytest

from conftest import VERSION, Fork, make_sdist, speculative_patch


def test_sync_lays_the_release_and_leaves_git_clean(fork: Fork) -> None:
    result = fork.sync()
    assert result.returncode == 0, result.stderr
    root = fork.root
    for laid in ("vllm/__init__.py", "vllm/config/speculative.py", "csrc/kernel.cu", "CMakeLists.txt", "setup.py",
                 "pyproject.toml", "requirements/common.txt", "vllm/kernels/rdna3_hip.py"):
        assert (root / laid).is_file(), laid
    # upstream's tests/docs/benchmarks/examples and sdist metadata stay out; generated files are not laid
    for absent in ("tests", "docs", "benchmarks", "examples", "PKG-INFO", "vllm/_version.py"):
        assert not (root / absent).exists(), absent
    # our own files are never overwritten
    assert (root / "README.md").read_text() == "our readme\n"
    assert fork.git("status", "--porcelain") == ""
    assert fork.git("ls-files", "vllm", "csrc") == ""
    state = json.loads((root / ".kimi" / "state.json").read_text())
    assert state["version"] == VERSION and state["failed"] is None and "README.md" in state["kept_ours"]


def test_second_sync_is_a_no_op(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    laid = fork.root / "vllm" / "config" / "speculative.py"
    before = laid.stat().st_mtime_ns
    again = fork.sync()
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stderr
    assert laid.stat().st_mtime_ns == before


def test_sync_applies_the_series_one_commit_per_patch(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.add_patch(*speculative_patch(2, 30, "line 30 patched"))
    result = fork.sync()
    assert result.returncode == 0, result.stderr
    text = (fork.root / "vllm" / "config" / "speculative.py").read_text()
    assert "line 10 patched\n" in text and "line 30 patched\n" in text
    log = fork.git("-C", ".kimi/work", "log", "--format=%s").split("\n")
    assert log[:2] == ["0002-change-line-30", "0001-change-line-10"]


def test_sha256_mismatch_names_file_and_digests_and_touches_nothing(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    snapshot = {p: p.read_bytes() for p in fork.root.rglob("*") if p.is_file() and ".git" not in p.parts}
    _, sha = make_sdist(fork.from_dir)
    fork.write_pin("0" * 64)
    fork.commit("bad pin")
    (fork.cache / f"vllm-{VERSION}.tar.gz").unlink()
    result = fork.sync("--force")
    assert result.returncode == 1
    assert f"vllm-{VERSION}.tar.gz" in result.stderr and "0" * 64 in result.stderr and sha in result.stderr
    after = {p: p.read_bytes() for p in fork.root.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert after.keys() - {fork.pin_path} == snapshot.keys() - {fork.pin_path}
    assert all(after[p] == snapshot[p] for p in snapshot if p != fork.pin_path)
    assert not (fork.cache / f"vllm-{VERSION}.tar.gz").exists()


def test_unknown_line_is_one_clear_line(fork: Fork) -> None:
    result = fork.kimi("sync", "--line", "nosuch")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown line 'nosuch'" in lines[0] and "mainline" in lines[0]


def test_no_cache_and_no_index_is_one_clear_line(fork: Fork) -> None:
    result = fork.kimi("sync")  # no --from, empty cache, KIMI_INDEX_URL points at a closed port
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not reachable" in lines[0] and "--from" in lines[0]


def test_edits_are_protected_and_force_discards_them(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    edited = fork.root / "vllm" / "config" / "speculative.py"
    edited.write_text("edited\n")
    refused = fork.sync()
    assert refused.returncode == 1
    assert "vllm/config/speculative.py" in refused.stderr and "kimi refresh" in refused.stderr
    assert edited.read_text() == "edited\n"
    forced = fork.sync("--force")
    assert forced.returncode == 0, forced.stderr
    assert edited.read_text().startswith("line 1\n")


def test_build_outputs_are_not_edits(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    (fork.root / "vllm" / "_C.abi3.so").write_bytes(b"\x7fELF")
    (fork.root / "vllm" / "_version.py").write_text("__version__ = '9.9.0+kimi.1.cpu'\n")
    (fork.root / "vllm" / "__pycache__").mkdir()
    (fork.root / "vllm" / "__pycache__" / "x.pyc").write_bytes(b"")
    status = fork.kimi("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["edited"] == {"modified": [], "deleted": [], "new": []}
    assert fork.git("status", "--porcelain") == ""


class _Index:
    """A PEP 503 (HTML) simple index on localhost serving ``files`` for project ``vllm``."""

    def __init__(self, base: Path, files: list[Path]) -> None:
        project = base / "simple" / "vllm"
        project.mkdir(parents=True)
        for f in files:
            (base / f.name).write_bytes(f.read_bytes())
        links = "".join(f'<a href="../../{f.name}#sha256=x">{f.name}</a>\n' for f in files)
        (project / "index.html").write_text(f"<html><body>{links}</body></html>")
        handler = functools.partial(_QuietHandler, directory=str(base))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def index(fork: Fork, tmp_path: Path):
    served = _Index(tmp_path / "index", [fork.from_dir / f"vllm-{VERSION}.tar.gz"])
    yield served
    served.server.shutdown()


def test_sync_from_the_index_then_offline_from_the_cache(fork: Fork, index: _Index) -> None:
    online = fork.kimi("sync", env={"KIMI_INDEX_URL": index.url})
    assert online.returncode == 0, online.stderr
    assert "downloading from the package index" in online.stderr
    assert (fork.cache / f"vllm-{VERSION}.tar.gz").is_file()
    index.server.shutdown()
    offline = fork.kimi("sync", "--force")  # default env: the index URL is a closed port
    assert offline.returncode == 0, offline.stderr
    assert "cached, sha256 ok" in offline.stderr
    assert (fork.root / "vllm" / "__init__.py").is_file()


def test_version_not_on_the_index_lists_what_is(fork: Fork, index: _Index) -> None:
    fork.write_pin("1" * 64, version="9.9.7")
    fork.commit("unknown version")
    result = fork.kimi("sync", env={"KIMI_INDEX_URL": index.url})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "vllm-9.9.7.tar.gz is not on the package index" in lines[0] and VERSION in lines[0]


def test_a_laid_name_the_fork_starts_tracking_is_kept_and_not_an_edit(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    ours = fork.root / "CMakeLists.txt"
    ours.write_text("# ours now\n")
    with open(fork.root / ".gitignore", "a") as fh:
        fh.write("!/CMakeLists.txt\n")
    fork.commit("track our own CMakeLists.txt")
    status = fork.kimi("status", "--json")
    assert json.loads(status.stdout)["edited"] == {"modified": [], "deleted": [], "new": []}
    again = fork.sync("--force")
    assert again.returncode == 0, again.stderr
    assert ours.read_text() == "# ours now\n"
    assert "CMakeLists.txt" in json.loads((fork.root / ".kimi" / "state.json").read_text())["kept_ours"]
