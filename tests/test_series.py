"""The patch series: failing and absorbed patches, ``kimi status``, ``kimi refresh``, headers."""

from __future__ import annotations

import json

from conftest import Fork, speculative_patch


def _status(fork: Fork) -> dict:
    result = fork.kimi("status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _states(fork: Fork) -> dict[str, str]:
    return {p["name"]: p["state"] for p in _status(fork)["patches"]}


def test_patch_that_does_not_apply_names_patch_file_hunk_and_leaves_last_good_state(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    name, text = speculative_patch(2, 30, "line 30 patched")
    fork.add_patch(name, text.replace(" line 28\n", " line 28 (not upstream)\n"))
    fork.add_patch(*speculative_patch(3, 35, "line 35 patched"))
    result = fork.sync()
    assert result.returncode == 1
    err = result.stderr
    assert "0002-change-line-30 does not apply" in err
    assert "vllm/config/speculative.py" in err and "@@ -27,7 +27,7 @@" in err
    assert "last good state: vllm 9.9.0 + 0001-change-line-10" in err
    assert "kimi refresh --into 0002-change-line-30" in err and "git checkout --" in err
    laid = (fork.root / "vllm" / "config" / "speculative.py").read_text()
    assert "line 10 patched" in laid and "line 30 patched" not in laid and "line 35 patched" not in laid
    assert _states(fork) == {"0001-change-line-10": "applied", "0002-change-line-30": "fails",
                             "0003-change-line-35": "pending"}


def test_resume_a_failed_patch_by_editing_the_tree_and_refreshing_into_it(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    filename, text = speculative_patch(2, 30, "line 30 patched")
    fork.add_patch(filename, text.replace(" line 28\n", " line 28 (not upstream)\n"))
    assert fork.sync().returncode == 1
    laid = fork.root / "vllm" / "config" / "speculative.py"
    laid.write_text(laid.read_text().replace("line 30\n", "line 30 patched\n"))
    refreshed = fork.kimi("refresh", "--into", "0002")
    assert refreshed.returncode == 0, refreshed.stderr
    rewritten = (fork.patches / filename).read_text()
    assert rewritten.startswith("Subject: 0002-change-line-30\n") and "+line 30 patched" in rewritten
    assert "line 28 (not upstream)" not in rewritten
    again = fork.sync()
    assert again.returncode == 0, again.stderr
    assert set(_states(fork).values()) == {"applied"} and _status(fork)["clean"]


def test_patch_upstream_already_contains_is_absorbed(fork: Fork) -> None:
    filename, text = speculative_patch(1, 10, "line 10 patched")
    # the change's result ("line 10") is what upstream already has; its old side is not
    fork.add_patch(filename, text.replace("-line 10\n+line 10 patched\n", "-line 10 old\n+line 10\n"))
    result = fork.sync()
    assert result.returncode == 0, result.stderr
    assert "absorbed" in result.stderr and "remove the patch" in result.stderr
    assert _states(fork) == {filename.removesuffix(".patch"): "absorbed"}


def test_refresh_folds_an_edit_into_the_patch_that_owns_the_file(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    fork.add_patch(*speculative_patch(2, 30, "line 30 patched"))
    assert fork.sync().returncode == 0
    laid = fork.root / "vllm" / "config" / "speculative.py"
    laid.write_text(laid.read_text().replace("line 12\n", "line 12 edited\n"))
    assert _status(fork)["edited"]["modified"] == ["vllm/config/speculative.py"]
    # two patches touch the file: refresh must be told which one
    ambiguous = fork.kimi("refresh")
    assert ambiguous.returncode == 1 and "touched by 0001-change-line-10, 0002-change-line-30" in ambiguous.stderr
    folded = fork.kimi("refresh", "--into", "0001")
    assert folded.returncode == 0, folded.stderr
    first = (fork.patches / "0001-change-line-10.patch").read_text()
    assert first.startswith("Subject: 0001-change-line-10\nWhat: changes vllm/config/speculative.py\n")
    assert "+line 12 edited" in first and "+line 30 patched" not in first
    assert "+line 30 patched" in (fork.patches / "0002-change-line-30.patch").read_text()
    assert _status(fork)["clean"]
    assert "up to date" in fork.sync().stderr
    # the refreshed series reproduces the edited tree from scratch
    assert fork.sync("--force").returncode == 0
    assert "line 12 edited\n" in laid.read_text() and "line 30 patched\n" in laid.read_text()


def test_refresh_sends_an_edit_to_its_only_owner(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "line 10 patched"))
    assert fork.sync().returncode == 0
    laid = fork.root / "vllm" / "config" / "speculative.py"
    laid.write_text(laid.read_text().replace("line 20\n", "line 20 edited\n"))
    result = fork.kimi("refresh")
    assert result.returncode == 0, result.stderr
    assert "+line 20 edited" in (fork.patches / "0001-change-line-10.patch").read_text()


def test_refresh_new_patch_needs_its_header_filled_before_sync(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    (fork.root / "csrc" / "kernel.cu").write_text("// kernel, edited\n")
    (fork.root / "vllm" / "new_module.py").write_text("X = 1\n")
    unowned = fork.kimi("refresh")
    assert unowned.returncode == 1 and "csrc/kernel.cu: in no patch" in unowned.stderr
    created = fork.kimi("refresh", "--new", "kernel-edit")
    assert created.returncode == 0, created.stderr
    patch = fork.patches / "0001-kernel-edit.patch"
    text = patch.read_text()
    assert "+// kernel, edited" in text and "+X = 1" in text and "What: TODO" in text
    states = _status(fork)["patches"]
    assert states[0]["state"] == "applied" and "still says TODO" in states[0]["detail"]
    refused = fork.sync("--force")
    assert refused.returncode == 1 and "0001-kernel-edit.patch: header field 'What' still says TODO" in refused.stderr


def test_header_fields_are_validated(fork: Fork) -> None:
    filename, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(filename, text.replace("Upstream: fork-only", "Upstream: maybe later"))
    result = fork.sync()
    assert result.returncode == 1 and "Upstream must be" in result.stderr and filename in result.stderr
    fork.add_patch(filename, text.replace("Tests: tests/\n", ""))
    result = fork.sync()
    assert result.returncode == 1 and "header field 'Tests' is missing" in result.stderr


def test_status_reports_a_patch_file_changed_since_sync(fork: Fork) -> None:
    filename, text = speculative_patch(1, 10, "line 10 patched")
    fork.add_patch(filename, text)
    assert fork.sync().returncode == 0
    fork.add_patch(filename, text.replace("line 10 patched", "line 10 patched again"))
    assert _states(fork) == {filename.removesuffix(".patch"): "changed"}
    human = fork.kimi("status")
    assert human.returncode == 0 and "changed" in human.stdout and "run `kimi sync`" in human.stdout


def test_cli_exit_codes(fork: Fork) -> None:
    assert fork.kimi("--help").returncode == 0
    for command in ("sync", "status", "refresh", "setup", "test"):
        helped = fork.kimi(command, "--help")
        assert helped.returncode == 0 and helped.stdout.startswith("usage: kimi " + command), command
    assert fork.kimi("sync", "--no-such-flag").returncode == 2
    assert fork.kimi("frobnicate").returncode == 2
    assert fork.kimi("status").returncode == 1  # nothing laid yet
