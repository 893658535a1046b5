"""Bad input and interruptions: nothing is lost, errors are one clear message (exit 1, no traceback)."""

from __future__ import annotations

import fcntl
import json

import pytest

from conftest import VERSION, Fork, speculative_patch


def _fail_cleanly(result, *needles: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def test_refresh_refuses_to_overwrite_a_patch_diff_edited_since_sync(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "TEN"))
    fork.add_patch(*speculative_patch(2, 30, "THIRTY"))
    assert fork.sync().returncode == 0
    first = fork.patches / "0001-change-line-10.patch"
    first.write_text(first.read_text().replace("+TEN", "+TEN-EDITED"))
    laid = fork.root / "vllm" / "config" / "speculative.py"
    laid.write_text(laid.read_text().replace("line 31\n", "line 31 edited\n"))
    _fail_cleanly(fork.kimi("refresh", "--into", "0002"), "0001-change-line-10: its diff was edited")
    assert "+TEN-EDITED" in first.read_text()
    assert "line 31 edited" in laid.read_text()


def test_refresh_refuses_when_a_patch_was_removed_since_sync(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "TEN"))
    fork.add_patch(*speculative_patch(2, 30, "THIRTY"))
    assert fork.sync().returncode == 0
    (fork.patches / "0002-change-line-30.patch").unlink()
    (fork.root / "csrc" / "kernel.cu").write_text("// edited\n")
    _fail_cleanly(fork.kimi("refresh", "--new", "kern"), "0002-change-line-30: removed since the last sync")
    assert sorted(p.name for p in fork.patches.iterdir()) == ["0001-change-line-10.patch"]


def test_a_failed_refresh_changes_nothing(fork: Fork) -> None:
    fork.add_patch(*speculative_patch(1, 10, "TEN"))
    fork.add_patch(*speculative_patch(2, 30, "THIRTY"))
    assert fork.sync().returncode == 0
    work_head = fork.git("-C", ".kimi/work", "rev-parse", "HEAD")
    first = fork.patches / "0001-change-line-10.patch"
    good_header = first.read_text()
    first.write_text("Subject x\n" + good_header)  # an unreadable header line
    laid = fork.root / "vllm" / "config" / "speculative.py"
    laid.write_text(laid.read_text().replace("line 31\n", "line 31 edited\n"))
    _fail_cleanly(fork.kimi("refresh", "--into", "0002"), "header line is not 'Key: value'")
    assert fork.git("-C", ".kimi/work", "rev-parse", "HEAD") == work_head
    first.write_text(good_header)
    done = fork.kimi("refresh", "--into", "0002")
    assert done.returncode == 0, done.stderr
    assert "+line 31 edited" in (fork.patches / "0002-change-line-30.patch").read_text()


def test_crlf_and_non_utf8_bytes_survive_refresh_and_sync(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    target = fork.root / "vllm" / "entrypoints" / "cli" / "main.py"
    content = b"def main():\r\n    return 'caf\xe9'\r\n"
    target.write_bytes(content)
    assert fork.kimi("refresh", "--new", "bytes").returncode == 0
    patch = fork.patches / "0001-bytes.patch"
    header, diff = patch.read_bytes().split(b"\n\ndiff --git ", 1)
    filled = b"Subject: bytes\nWhat: w\nWhy: y\nUpstream: fork-only\nForwarded: no\nTests: t\n"
    patch.write_bytes(filled + b"\ndiff --git " + diff)
    result = fork.sync("--force")
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == content


def test_a_second_kimi_command_waits_for_no_one(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    lock = fork.root / ".kimi" / "lock"
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        _fail_cleanly(fork.sync("--force"), "another kimi command (pid 4242)")
        _fail_cleanly(fork.kimi("refresh"), "another kimi command")


def test_an_interrupted_sync_is_finished_by_the_next_one(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    state_file = fork.root / ".kimi" / "state.json"
    state = json.loads(state_file.read_text())
    # as if interrupted while copying: some files not yet written, the state marked incomplete
    (fork.root / "setup.py").unlink()
    (fork.root / "csrc" / "kernel.cu").write_text("half-written")
    state["incomplete"] = True
    state_file.write_text(json.dumps(state))
    status = json.loads(fork.kimi("status", "--json").stdout)
    assert any("interrupted" in note for note in status["notes"])
    resumed = fork.sync()
    assert resumed.returncode == 0, resumed.stderr
    assert "finishing an interrupted sync" in resumed.stderr
    assert (fork.root / "setup.py").is_file() and (fork.root / "csrc" / "kernel.cu").read_text() == "// kernel\n"
    assert json.loads(fork.kimi("status", "--json").stdout)["clean"]


def test_a_file_not_laid_by_kimi_is_not_overwritten(fork: Fork) -> None:
    mine = fork.root / "setup.py"
    mine.write_text("mine\n")  # untracked, before the first sync
    _fail_cleanly(fork.sync(), "setup.py (not laid by kimi)", "move them away")
    assert mine.read_text() == "mine\n"
    assert not (fork.root / "vllm").exists()


def test_a_damaged_state_names_the_way_out_and_force_recovers(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    (fork.root / ".kimi" / "state.json").write_text('{"manifest": []}')
    _fail_cleanly(fork.kimi("status"), "state.json is damaged", "kimi sync --force")
    recovered = fork.sync("--force")
    assert recovered.returncode == 0, recovered.stderr
    assert fork.kimi("status").returncode == 0


def test_an_upstream_file_committed_by_mistake_is_named(fork: Fork) -> None:
    assert fork.sync().returncode == 0
    fork.git("add", "-f", "vllm/version.py")
    fork.git("commit", "-q", "-m", "oops")
    _fail_cleanly(fork.sync("--force"), "tracks files inside the upstream tree: vllm/version.py",
                  "git rm --cached -r -- vllm")


@pytest.mark.parametrize("pin, needle", [
    ("5", "pin must be an object"),
    ('{"line": "mainline", "version": "9.9.0", "fork_release": 1, "torch": "2.11.0", "artifacts": {"sdist": 5}}',
     "artifacts.sdist must be an object"),
    ('{"line": "mainline", "version": "9.9.0", "fork_release": true, "torch": "2.11.0", "artifacts": {"sdist": '
     '{"project": "vllm", "file": "x.tar.gz", "sha256": "' + "a" * 64 + '"}}}', "fork_release must be of type int"),
    ('{"line": "mainline", "version": "9.9.0", "fork_release": 1, "torch": "2.11.0", "artifacts": {"sdist": '
     '{"project": "vllm", "file": "../x.tar.gz", "sha256": "' + "a" * 64 + '"}}}', "must be a plain file name"),
    ("\xff\xfe not json", "not valid JSON"),
])
def test_malformed_pins_are_clear_errors(fork: Fork, pin: str, needle: str) -> None:
    fork.pin_path.write_bytes(pin.encode("latin-1"))
    _fail_cleanly(fork.sync(), "pin.json", needle)


def test_a_corrupt_cached_file_is_fetched_again(fork: Fork) -> None:
    fork.cache.mkdir(parents=True)
    cached = fork.cache / f"vllm-{VERSION}.tar.gz"
    cached.write_bytes(b"truncated")
    result = fork.sync()
    assert result.returncode == 0, result.stderr
    assert "fetching it again" in result.stderr
    assert cached.read_bytes() == (fork.from_dir / cached.name).read_bytes()
