"""``kimi rebase`` on synthetic releases: clean replay, a conflict stopped and continued, an absorbed patch."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import UPSTREAM_FILES, Fork, make_sdist, patch_text, speculative_patch
from kimi.fork.candidates import deleted_targets
from kimi.fork.layout import Layout
from kimi.fork.rebase_report import add_upstream_tests

SPEC = "vllm/config/speculative.py"


def release(fork: Fork, version: str, speculative: str) -> None:
    make_sdist(fork.from_dir, version, {**UPSTREAM_FILES, SPEC: speculative})


def lines(*replace: tuple[int, str], header: int = 0) -> str:
    """speculative.py with ``header`` new lines on top and some lines replaced."""
    body = {i: f"line {i}" for i in range(1, 41)}
    body.update(dict(replace))
    return "".join(f"new {i}\n" for i in range(header)) + "".join(f"{body[i]}\n" for i in range(1, 41))


@pytest.fixture
def synced(fork: Fork) -> Fork:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.add_patch(*speculative_patch(2, 30, "line 30 patched"))
    fork.commit("two patches")
    assert fork.sync().returncode == 0
    return fork


def rebase(fork: Fork, *args: str):
    extra = ["--from", str(fork.from_dir)] if "--to" in args else []
    return fork.kimi("rebase", *args, *extra)


def report(fork: Fork) -> dict:
    return json.loads((fork.root / ".kimi" / "rebase" / "report.json").read_text())


def test_clean_replay_rewrites_pin_and_series(synced: Fork) -> None:
    release(synced, "9.9.1", lines(header=5))
    result = rebase(synced, "--to", "9.9.1")
    assert result.returncode == 0, result.stderr
    pin = json.loads(synced.pin_path.read_text())
    assert pin["version"] == "9.9.1" and pin["artifacts"]["sdist"]["file"] == "vllm-9.9.1.tar.gz"
    assert report(synced)["applied"] == ["0001-change-line-10", "0002-change-line-30"]
    first = (synced.patches / "0001-change-line-10.patch").read_text()
    assert first.startswith("Subject: 0001-change-line-10\nWhat: changes") and "@@ -12,7 +12,7 @@" in first
    synced.commit("rebased")
    laid = synced.sync()
    assert laid.returncode == 0, laid.stderr
    text = (synced.root / SPEC).read_text()
    assert text.startswith("new 0\n") and "line 10 patched\n" in text and "line 30 patched\n" in text


def test_conflict_stops_with_a_report_and_continues(synced: Fork) -> None:
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    stopped = rebase(synced, "--to", "9.9.1")
    assert stopped.returncode == 1
    assert "patch 0002-change-line-30 conflicts with vllm 9.9.1 in vllm/config/speculative.py" in stopped.stderr
    assert "kimi rebase --continue" in stopped.stderr
    assert report(synced)["conflicts"][0]["name"] == "0002-change-line-30"
    assert "| 0002-change-line-30 | conflict |" in (synced.root / ".kimi" / "rebase" / "report.md").read_text()
    assert json.loads(synced.pin_path.read_text())["version"] == "9.9.0"  # nothing rewritten yet
    work_file = synced.root / ".kimi" / "rebase" / "repo" / SPEC
    assert "<<<<<<<" in work_file.read_text()
    early = rebase(synced, "--continue")
    assert early.returncode == 1 and "conflict markers are still in" in early.stderr
    work_file.write_text(lines((10, "line 10 patched"), (30, "line 30 upstream and patched")))
    resumed = rebase(synced, "--continue")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(synced.pin_path.read_text())["version"] == "9.9.1"
    assert "+line 30 upstream and patched" in (synced.patches / "0002-change-line-30.patch").read_text()
    synced.commit("rebased")
    assert synced.sync().returncode == 0
    assert "line 30 upstream and patched\n" in (synced.root / SPEC).read_text()


def test_a_resolution_is_kept_and_replays_the_rebase(synced: Fork) -> None:
    """`--continue` keeps the resolved patch as a port for the release; a later rebase onto the same release (here a
    dry run from the unrebased series) applies the port at that conflict instead of stopping."""
    before = {p.name: p.read_text() for p in synced.patches.iterdir()}
    pin_before = synced.pin_path.read_text()
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    assert rebase(synced, "--to", "9.9.1").returncode == 1
    work_file = synced.root / ".kimi" / "rebase" / "repo" / SPEC
    work_file.write_text(lines((10, "line 10 patched"), (30, "line 30 upstream and patched")))
    resumed = rebase(synced, "--continue")
    assert resumed.returncode == 0, resumed.stderr
    port = synced.root / "kimi" / "lines" / "mainline" / "ports" / "9.9.1" / "0002-change-line-30.patch"
    assert "resolution kept in kimi/lines/mainline/ports/9.9.1/0002-change-line-30.patch" in resumed.stderr
    assert port.read_text() == (synced.patches / "0002-change-line-30.patch").read_text()
    # back to the 9.9.0 series, the port kept: the replay needs no hand
    for name, text in before.items():
        (synced.patches / name).write_text(text)
    synced.pin_path.write_text(pin_before)
    assert synced.sync("--force").returncode == 0
    replay = rebase(synced, "--to", "9.9.1", "--dry-run")
    assert replay.returncode == 0, replay.stderr
    assert "0002-change-line-30: conflict in vllm/config/speculative.py; resolved with the kept port" in replay.stderr
    got = report(synced)
    assert got["conflicts"] == [] and got["ported"] == [{"name": "0002-change-line-30", "port": str(port)}]


def test_a_port_that_no_longer_applies_is_named(synced: Fork) -> None:
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    port = synced.root / "kimi" / "lines" / "mainline" / "ports" / "9.9.1" / "0002-change-line-30.patch"
    port.parent.mkdir(parents=True)
    port.write_text((synced.patches / "0002-change-line-30.patch").read_text())  # made for 9.9.0, not 9.9.1
    stopped = rebase(synced, "--to", "9.9.1", "--dry-run")
    assert stopped.returncode == 1
    assert f"the kept resolution {port} does not apply" in stopped.stderr and "resolve the conflict" in stopped.stderr


def test_abort_changes_nothing(synced: Fork) -> None:
    before = {p.name: p.read_text() for p in synced.patches.iterdir()}
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    assert rebase(synced, "--to", "9.9.1").returncode == 1
    aborted = rebase(synced, "--abort")
    assert aborted.returncode == 0 and "nothing was changed" in aborted.stderr
    assert {p.name: p.read_text() for p in synced.patches.iterdir()} == before
    assert json.loads(synced.pin_path.read_text())["version"] == "9.9.0"
    assert not (synced.root / ".kimi" / "rebase").exists()
    assert rebase(synced, "--abort").returncode == 1  # none in progress


def test_absorbed_patch_is_dropped_and_named(synced: Fork) -> None:
    release(synced, "9.9.1", lines((10, "line 10 patched")))
    result = rebase(synced, "--to", "9.9.1")
    assert result.returncode == 0, result.stderr
    assert report(synced)["absorbed"] == [{"name": "0001-change-line-10", "in": "9.9.1", "how": "replay"}]
    assert sorted(p.name for p in synced.patches.iterdir()) == ["0002-change-line-30.patch"]
    assert "absorbed in 9.9.1" in (synced.root / ".kimi" / "rebase" / "report.md").read_text()


def declared(fork: Fork, number: int, line_no: int, upstream: str) -> None:
    """A patch of ``line N`` whose header says ``Upstream: <upstream>``, with an Absorbed-check test."""
    name, text = speculative_patch(number, line_no, f"line {line_no} patched")
    text = text.replace("Upstream: fork-only\n", f"Upstream: {upstream}\nAbsorbed-check: tests/t.py::test_{number}\n")
    fork.add_patch(name, text)


def test_patch_declared_absorbed_is_dropped_with_its_hunks_named(fork: Fork) -> None:
    """Upstream fixed line 30 its own way (a conflict) and line 20 elsewhere (the patch would still apply):
    both patches say so in their headers and are dropped; the rebase does not stop."""
    declared(fork, 1, 20, "absorbed in 9.9.1 - upstream fixed it elsewhere")
    declared(fork, 2, 30, "absorbed in 9.9 - upstream's own fix")
    fork.add_patch(*speculative_patch(3, 10, "line 10 patched"))
    fork.commit("three patches")
    assert fork.sync().returncode == 0
    release(fork, "9.9.1", lines((30, "line 30 fixed upstream")))
    result = rebase(fork, "--to", "9.9.1")
    assert result.returncode == 0, result.stderr
    assert "0002-change-line-30: absorbed (its header: absorbed in 9.9; the replay gave conflict" in result.stderr
    got = report(fork)
    assert got["applied"] == ["0003-change-line-10"] and got["conflicts"] == []
    assert got["absorbed"] == [
        {"name": "0001-change-line-20", "in": "9.9.1", "how": "declared", "declared": "9.9.1", "replay": "applied",
         "remaining_hunks": ["vllm/config/speculative.py @@ -17,7 +17,7 @@ line 16"], "verify": ["tests/t.py::test_1"]},
        {"name": "0002-change-line-30", "in": "9.9.1", "how": "declared", "declared": "9.9", "replay": "conflict",
         "remaining_hunks": ["vllm/config/speculative.py @@ -27,7 +27,7 @@ line 26"], "verify": ["tests/t.py::test_2"]}]
    md = (fork.root / ".kimi" / "rebase" / "report.md").read_text()
    assert "| 0002-change-line-30 | absorbed in 9.9.1 (declared: absorbed in 9.9; replay: conflict) |" in md
    assert "## Declared absorbed" in md and "- `tests/t.py::test_2`" in md
    assert sorted(p.name for p in fork.patches.iterdir()) == ["0003-change-line-10.patch"]


def test_patch_declared_absorbed_later_is_replayed(fork: Fork) -> None:
    declared(fork, 1, 30, "absorbed in 9.10.0")
    fork.commit("one patch")
    assert fork.sync().returncode == 0
    release(fork, "9.9.1", lines((30, "line 30 fixed upstream")))
    stopped = rebase(fork, "--to", "9.9.1")
    assert stopped.returncode == 1 and "patch 0001-change-line-30 conflicts with vllm 9.9.1" in stopped.stderr


def test_dry_run_writes_only_the_report(synced: Fork) -> None:
    before = {p.name: p.read_text() for p in synced.patches.iterdir()}
    release(synced, "9.9.1", lines((30, "line 30 upstream"), header=2))
    result = rebase(synced, "--to", "9.9.1", "--dry-run")
    assert result.returncode == 0, result.stderr
    got = report(synced)
    assert got["dry_run"] and got["applied"] == ["0001-change-line-10"]
    assert [c["name"] for c in got["conflicts"]] == ["0002-change-line-30"]
    assert {p.name: p.read_text() for p in synced.patches.iterdir()} == before
    assert json.loads(synced.pin_path.read_text())["version"] == "9.9.0"
    assert not (synced.root / ".kimi" / "rebase" / "state.json").exists()


def test_bad_requests_are_clear(synced: Fork) -> None:
    assert "give a release version" in rebase(synced, "--to", "latest").stderr
    missing = rebase(synced, "--to", "9.9.5")
    assert missing.returncode == 1 and "no vllm-9.9.5.tar.gz there" in missing.stderr
    (synced.root / SPEC).write_text("edited\n")
    release(synced, "9.9.1", lines())
    refused = rebase(synced, "--to", "9.9.1")
    assert refused.returncode == 1 and "edits that are not in the patch series" in refused.stderr


def test_a_patch_edited_since_the_sync_must_be_synced_first(synced: Fork) -> None:
    second = synced.patches / "0002-change-line-30.patch"
    second.write_text(second.read_text().replace("+line 30 patched", "+line 30 edited"))
    release(synced, "9.9.1", lines(header=1))
    refused = rebase(synced, "--to", "9.9.1")
    assert refused.returncode == 1 and "0002-change-line-30: its diff was edited" in refused.stderr
    assert "+line 30 edited" in second.read_text()


def test_usage_errors_exit_2(synced: Fork) -> None:
    assert synced.kimi("rebase").returncode == 2
    assert synced.kimi("rebase", "--continue", "--dry-run").returncode == 2
    same = rebase(synced, "--to", "9.9.0")
    assert same.returncode == 1 and "already at vllm 9.9.0" in same.stderr


def test_resolution_must_remove_every_marker(synced: Fork) -> None:
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    assert rebase(synced, "--to", "9.9.1").returncode == 1
    work_file = synced.root / ".kimi" / "rebase" / "repo" / SPEC
    text = work_file.read_text()
    work_file.write_text("\n".join(row for row in text.split("\n") if not row.startswith("<<<<<<<")))
    left = rebase(synced, "--continue")
    assert left.returncode == 1 and "conflict markers are still in" in left.stderr


def test_damaged_rebase_state_and_a_lost_repository(synced: Fork) -> None:
    release(synced, "9.9.1", lines((30, "line 30 upstream")))
    assert rebase(synced, "--to", "9.9.1").returncode == 1
    shutil.rmtree(synced.root / ".kimi" / "rebase" / "repo" / ".git")
    lost = rebase(synced, "--continue")
    assert lost.returncode == 1 and "Traceback" not in lost.stderr
    assert synced.git("status", "--porcelain") == ""  # git never fell back to the fork's own repository
    (synced.root / ".kimi" / "rebase" / "state.json").write_text("{")
    damaged = rebase(synced, "--continue")
    assert damaged.returncode == 1 and "kimi rebase --abort" in damaged.stderr
    assert rebase(synced, "--abort").returncode == 0
    assert json.loads(synced.pin_path.read_text())["version"] == "9.9.0"


def test_patches_of_files_the_release_deleted_are_candidates(fork: Fork) -> None:
    """The new release deletes vllm/entrypoints/cli/main.py and vllm/version.py: the patch of version.py alone
    (every file gone) and the patch of main.py and speculative.py (one of two gone) are named with the files;
    the patch of speculative.py alone is not."""
    main = patch_text("0001-main", "vllm/entrypoints/cli/main.py", "    return 0", "    return 1", 2, ["def main():"])
    name, spec = speculative_patch(1, 10, "line 10 patched", slug="main-and-spec")
    fork.add_patch(name, spec + main[main.index("diff --git"):])
    fork.add_patch("0002-version.patch", patch_text("0002-version", "vllm/version.py", "__version__ = 'dev'",
                                                    "__version__ = 'fork'", 1, []))
    fork.add_patch(*speculative_patch(3, 30, "line 30 patched"))
    fork.commit("three patches")
    assert fork.sync().returncode == 0
    kept = {k: v for k, v in UPSTREAM_FILES.items() if k not in ("vllm/entrypoints/cli/main.py", "vllm/version.py")}
    make_sdist(fork.from_dir, "9.9.1", kept)
    result = rebase(fork, "--to", "9.9.1", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert ("0002-version: candidate for dropping: vllm 9.9.1 deleted every file it changes: vllm/version.py"
            in result.stderr)
    assert report(fork)["candidates"] == [
        {"name": "0001-main-and-spec", "by": "rebase", "reason": "vllm 9.9.1 deleted 1 of the 2 files it changes",
         "evidence": ["vllm/entrypoints/cli/main.py"]},
        {"name": "0002-version", "by": "rebase", "reason": "vllm 9.9.1 deleted every file it changes",
         "evidence": ["vllm/version.py"]}]
    md = (fork.root / ".kimi" / "rebase" / "report.md").read_text()
    assert "## Candidates for dropping" in md
    assert "| 0002-version | rebase | vllm 9.9.1 deleted every file it changes | `vllm/version.py` |" in md
    assert "## Upstream's tests, pristine against patched" in md and "Not run for this line" in md
    layout = Layout.of(fork.root)
    assert add_upstream_tests(layout, "mainline", SUMMARY)  # a later `kimi upstream-tests` of the line
    md = (fork.root / ".kimi" / "rebase" / "report.md").read_text()
    assert "**1 regressions**" in md
    assert "| `tests/t.py::test_a` | failed | AttributeError: x | 0001-main-and-spec |" in md
    assert report(fork)["upstream_tests"] == SUMMARY and "## Candidates for dropping" in md
    assert not add_upstream_tests(layout, "v0.26", SUMMARY)


def test_a_file_the_release_deleted_is_resolved_by_leaving_it_deleted(fork: Fork) -> None:
    """A patch of main.py and speculative.py onto a release that deleted main.py and changed speculative.py's line:
    the resolution keeps the deletion (`git rm`) and rewrites the other file; `--continue` commits it, keeps it as
    a port and the rewritten patch names speculative.py only."""
    main = patch_text("0001-main", "vllm/entrypoints/cli/main.py", "    return 0", "    return 1", 2, ["def main():"])
    name, spec = speculative_patch(1, 10, "line 10 patched", slug="main-and-spec")
    fork.add_patch(name, spec + main[main.index("diff --git"):])
    fork.commit("one patch")
    assert fork.sync().returncode == 0
    kept = {k: v for k, v in UPSTREAM_FILES.items() if k != "vllm/entrypoints/cli/main.py"}
    make_sdist(fork.from_dir, "9.9.1", {**kept, SPEC: lines((10, "line 10 upstream"))})
    stopped = rebase(fork, "--to", "9.9.1")
    assert stopped.returncode == 1 and "changed on one side, deleted on the other" in stopped.stderr
    repo = fork.root / ".kimi" / "rebase" / "repo"
    subprocess.run(["git", "-C", str(repo), "rm", "-q", "vllm/entrypoints/cli/main.py"], check=True)
    (repo / SPEC).write_text(lines((10, "line 10 upstream and patched")))
    resumed = rebase(fork, "--continue")
    assert resumed.returncode == 0, resumed.stderr
    patch = (fork.patches / "0001-main-and-spec.patch").read_text()
    assert "+line 10 upstream and patched" in patch and "cli/main.py" not in patch
    assert (fork.root / "kimi" / "lines" / "mainline" / "ports" / "9.9.1" / "0001-main-and-spec.patch").is_file()


SUMMARY = {"line": "mainline", "version": "9.9.0", "written": "now", "files": 1, "tests": 2, "fixed": 0,
           "regressions": [{"test": "tests/t.py::test_a", "pristine": "passed", "patched": "failed",
                            "message": "AttributeError: x", "patches": ["0001-main-and-spec"]}],
           "fail_differently": [], "both_fail": 0, "changed": 0, "same": 1, "report": ".kimi/upstream-tests/report.md"}


def test_deleted_targets_ignore_files_a_patch_creates() -> None:
    patches = [("0001-new", ["vllm/new.py"]), ("0002-gone", ["vllm/a.py", "vllm/b.py"])]
    found = deleted_targets(patches, old_files={"vllm/a.py", "vllm/b.py"}, new_files={"vllm/b.py"}, version="1.0.0")
    assert [(c.name, c.evidence) for c in found] == [("0002-gone", ("vllm/a.py",))]
