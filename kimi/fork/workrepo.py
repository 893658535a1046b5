"""The throw-away git repository under ``.kimi/work``: git does the patch work.

History: one commit holding the pristine upstream tree (tagged ``upstream``),
then one commit per applied patch whose message is the patch's name.  From
it come the laid tree (``HEAD``), the diff of each patch (``refresh``), and
the checks of ``status`` (does a patch apply, is it already contained in
upstream).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork.fsutil import decode, encode
from kimi.fork.patches import Patch

UPSTREAM_TAG = "upstream"
#: Release files never laid: the build writes them (setuptools-scm's version file).
GENERATED = frozenset({"vllm/_version.py"})
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "kimi", "GIT_AUTHOR_EMAIL": "kimi@localhost",
    "GIT_COMMITTER_NAME": "kimi", "GIT_COMMITTER_EMAIL": "kimi@localhost",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
}
_GIT_OPTS = ["-c", "safe.directory=*", "-c", "core.autocrlf=false", "-c", "core.hooksPath=/dev/null",
             "-c", "commit.gpgsign=false", "-c", "core.excludesFile=/dev/null", "-c", "advice.detachedHead=false"]


@dataclass(frozen=True)
class ApplyFailure:
    """Where a patch stopped applying.

    Attributes:
        patch: patch name.
        file: the first file git could not patch ('' if unknown).
        hunk: that hunk's ``@@ -a,b +c,d @@`` line ('' if unknown).
        detail: git's own message.
    """

    patch: str
    file: str
    hunk: str
    detail: str

    def describe(self) -> str:
        where = f"file {self.file}" if self.file else "a file"
        hunk = f", hunk {self.hunk}" if self.hunk else ""
        return f"patch {self.patch} does not apply: {where}{hunk}\n  git: {self.detail}"


class WorkRepo:
    """A git repository at ``path`` used only by the fork tooling."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def git(self, *args: str, input: str | None = None, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run git in the repository; raises KimiError with git's output when ``check`` fails.

        Input and output are exact text (``fsutil.decode``): CRLF and non-UTF-8
        bytes pass through unchanged.
        """
        # The ceiling stops git from falling back to an enclosing repository (the fork's own
        # checkout) if this one's .git has gone missing.
        full_env = {**os.environ, **_GIT_ENV, "GIT_CEILING_DIRECTORIES": str(self.path.resolve().parent),
                    **(env or {})}
        raw = subprocess.run(
            ["git", *_GIT_OPTS, "-C", str(self.path), *args],
            input=None if input is None else encode(input), capture_output=True, env=full_env,
        )
        proc = subprocess.CompletedProcess(raw.args, raw.returncode, decode(raw.stdout), decode(raw.stderr))
        if check and proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip() or "no message").replace("\n", " / ")
            raise KimiError(f"git {' '.join(args[:2])} failed in {self.path}: {said}")
        return proc

    @classmethod
    def create(cls, path: Path, message: str) -> WorkRepo:
        """Make ``path`` (already holding the upstream files) a repository with one commit.

        Every file of the release is committed except :data:`GENERATED` (written again by every build), also
        files that upstream's ``.gitignore`` matches: a release ships sources its ignore rules happen to match
        (the mainline's ``mxfp4/rdna3_hip.py`` and the rule ``*_hip*``), and leaving them out breaks imports.
        """
        repo = cls(path)
        repo.git("init", "-q", "-b", "work")
        repo.git("add", "-A")
        ignored = repo.git("ls-files", "-z", "--others", "--ignored", "--exclude-standard").stdout.split("\0")
        forced = [rel for rel in ignored if rel and rel not in GENERATED]
        if forced:
            repo.git("add", "-f", "--", *forced)
        repo.git("commit", "-q", "--no-verify", "-m", message)
        repo.git("tag", UPSTREAM_TAG)
        return repo

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").stdout.strip()

    def tracked_files(self, rev: str = "HEAD") -> list[str]:
        """Every file path in ``rev``'s tree."""
        out = self.git("ls-tree", "-r", "-z", "--name-only", rev).stdout
        return [p for p in out.split("\0") if p]

    def apply(self, patch: Patch) -> ApplyFailure | None:
        """Apply and commit ``patch``; on failure leave HEAD unchanged and say where it failed."""
        proc = self.git("apply", "--index", "--whitespace=nowarn", "-", input=patch.diff, check=False)
        if proc.returncode != 0:
            self.git("reset", "-q", "--hard", "HEAD")
            return _failure(patch, proc.stderr)
        self.git("commit", "-q", "--no-verify", "--allow-empty", "-m", patch.name)
        return None

    def contains(self, patch: Patch, rev: str = "HEAD") -> bool:
        """True if ``rev`` already holds the change: the patch applies in reverse and not forward."""

        def check(*flags: str) -> bool:
            with tempfile.TemporaryDirectory() as tmp:
                env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
                self.git("read-tree", rev, env=env)
                proc = self.git("apply", "--cached", "--check", *flags, "-", input=patch.diff, env=env, check=False)
                return proc.returncode == 0

        return check("--reverse") and not check()

    def same_change(self, diff: str, commit: str) -> bool:
        """True if ``diff`` applied to ``commit``'s parent gives ``commit``'s tree."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            self.git("read-tree", f"{commit}^", env=env)
            if self.git("apply", "--cached", "-", input=diff, env=env, check=False).returncode != 0:
                return False
            tree = self.git("write-tree", env=env).stdout.strip()
        return tree == self.git("rev-parse", f"{commit}^{{tree}}").stdout.strip()

    def patch_commits(self) -> list[tuple[str, str]]:
        """(patch name, commit) for each commit after the upstream one, oldest first."""
        out = self.git("log", "--reverse", "--format=%H %s", f"{UPSTREAM_TAG}..HEAD").stdout
        return [(line.split(" ", 1)[1], line.split(" ", 1)[0]) for line in out.splitlines() if line]

    def commit_diff(self, commit: str) -> str:
        """The diff a commit introduces, as a patch body (binary-safe, no colour)."""
        return self.git("diff", "--no-color", "--no-ext-diff", "--binary", f"{commit}^", commit).stdout

    def files_touched(self, commit: str) -> list[str]:
        out = self.git("diff", "--name-only", "-z", f"{commit}^", commit).stdout
        return [p for p in out.split("\0") if p]


def _failure(patch: Patch, stderr: str) -> ApplyFailure:
    """Turn ``git apply``'s stderr into file and hunk names."""
    detail = " / ".join(line.strip() for line in stderr.strip().splitlines()[:3])
    match = re.search(r"patch failed: (\S+):(\d+)", stderr)
    if match is None:
        other = re.search(r"error: (\S+?): (does not exist in index|No such file|already exists)", stderr)
        return ApplyFailure(patch.name, other.group(1) if other else "", "", detail)
    path, line = match.group(1), int(match.group(2))
    return ApplyFailure(patch.name, path, _hunk_at(patch.diff, path, line), detail)


def _hunk_at(diff: str, path: str, old_start: int) -> str:
    """The ``@@`` line of the hunk of ``path`` whose old side starts at ``old_start``."""
    current = None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current = line.split(" b/", 1)[-1]
        elif line.startswith("@@") and current == path:
            match = re.match(r"@@ -(\d+)", line)
            if match and int(match.group(1)) == old_start:
                return line
    return ""
