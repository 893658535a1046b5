"""``kimi rebase --to X.Y.Z``: move a line to a new upstream release, replaying the series with git.

The new release's files are found on the package index (or ``--from DIR``),
its sdist is unpacked into ``.kimi/rebase/repo`` as an upstream commit, and
each patch commit of ``.kimi/work`` is cherry-picked onto it - a three-way
merge whose base is the old release.  Per patch:

* ``applied``  - the merge is clean;
* ``absorbed`` - the result is empty: the new release already contains the
  change, so the patch is dropped and the report says in which release;
  or the patch's header says ``Upstream: absorbed in X.Y[.Z]`` with X.Y.Z at
  or below the new release: upstream fixed the same problem its own way,
  which a text merge cannot recognise.  Such a patch is dropped too; the
  replay is still run and reported (``applied`` or ``conflict``) and the
  patch's hunks that the new release does not contain are named, with the
  tests of its ``Absorbed-check`` field (else ``Tests``) to run against the
  new release: the evidence that upstream's fix covers the patch's symptom;
* ``conflict`` - git leaves conflict markers in ``.kimi/rebase/repo``; the
  rebase stops with a report (patch, files, marker lines).  Resolve the files
  and run ``kimi rebase --continue``, or ``kimi rebase --abort``;
* ``ported`` - the patch conflicts, and a resolution for this release is kept
  in the repository: ``kimi/lines/<line>/ports/<release>/<patch>.patch`` (or
  ``--ports DIR``), the patch as a maintainer rewrote it for the release.  Its
  diff is applied instead of the three-way merge, so a resolved rebase can be
  replayed (``--dry-run`` too).  ``kimi rebase --continue`` keeps each
  resolution there itself (the patch's header with the resolved diff).

When every patch is through, the patch files are rewritten from the new
commits (headers kept, absorbed patches removed) and ``pin.json`` names the
new release; ``kimi sync`` then lays it.  ``--dry-run`` replays everything in
the same way but records conflicts and goes on, writes only the report and
leaves the pin, the series and the laid tree alone.

Candidates for dropping (:mod:`kimi.fork.candidates`): the rebase names each patch that changes files the new
release deleted; ``kimi rebase --probe`` adds, to the report of the rebase onto the release it probed, each patch
whose tests pass without it.  The latest ``kimi upstream-tests`` comparison of the line (upstream's own tests,
pristine against patched) is part of the report too.

Reports: ``.kimi/rebase/report.md`` and ``report.json``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi.errors import KimiError
from kimi.fork import index as pkgindex
from kimi.fork.artifacts import obtain
from kimi.fork.candidates import Candidate, deleted_targets
from kimi.fork.fsutil import sha256_file, staged_folder, write_atomic, write_json_atomic
from kimi.fork.layout import Layout
from kimi.fork.lock import exclusive
from kimi.fork.patches import load_series, read_patch, write_patch
from kimi.fork.pin import Artifact, Pin, line_pin
from kimi.fork.rebase_report import rebase_dir, write_report
from kimi.fork.state import SyncState
from kimi.fork.sync import check_no_unrefreshed_edits, check_series_in_step
from kimi.fork.tree import extract_sdist
from kimi.fork.upstream_tests.report import load_summary
from kimi.fork.workrepo import UPSTREAM_TAG, WorkRepo
from kimi.log import say

_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_MARKERS = ("<<<<<<< ", "=======", ">>>>>>> ")
_PIN_KEYS = ("line", "version", "fork_release", "torch", "artifacts")


@dataclass
class PatchOutcome:
    """What happened to one patch: ``applied``, ``absorbed``, ``conflict`` or ``not reached``.

    For a patch dropped because its header declares it absorbed (``declared``
    holds the release), ``replay`` is what the three-way merge gave
    (``applied`` / ``conflict``, markers in ``conflicts``), ``remaining`` the
    patch's hunks the new release does not contain (``file @@ ... @@``) and
    ``verify`` the tests that show upstream's fix.
    """

    name: str
    outcome: str
    files: list[str] = field(default_factory=list)
    conflicts: dict[str, list[int]] = field(default_factory=dict)
    declared: str | None = None
    replay: str | None = None
    remaining: list[str] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)
    resolved: bool = False
    port: str | None = None


@dataclass
class RebaseState:
    """A rebase in progress (``.kimi/rebase/state.json``)."""

    line: str
    source: str
    target: str
    dry_run: bool
    new_pin: dict
    pending: list[list[str]]
    outcomes: list[dict] = field(default_factory=list)
    started: str = ""
    head: str = ""
    ports: str = ""
    candidates: list[dict] = field(default_factory=list)


def _save(layout: Layout, state: RebaseState) -> None:
    write_json_atomic(rebase_dir(layout) / "state.json", asdict(state))


def _new_pin(pin: Pin, version: str, from_dir: Path | None) -> dict:
    """The pin of ``version``: the same artifacts renamed, with sha256s from the index or ``--from``.

    Raises:
        KimiError: the sdist is not available (the index's versions are listed), or the index
            gives no sha256 for a file.
    """
    artifacts = {}
    index = pkgindex.index_url() if from_dir is None else None
    listings: dict[str, dict[str, pkgindex.IndexFile]] = {}
    for role, old in pin.artifacts.items():
        filename = old.file.replace(pin.version, version)
        if from_dir is not None:
            path = from_dir / filename
            if path.is_file():
                artifacts[role] = {"project": old.project, "file": filename, "sha256": sha256_file(path)}
            elif role == "sdist":
                raise KimiError(f"--from {from_dir}: no {filename} there")
            else:
                say(f"warning: --from {from_dir} has no {filename}; the new pin has no {role}")
            continue
        if old.project not in listings:
            listings[old.project] = pkgindex.list_files(index, old.project)
        listed = listings[old.project].get(filename)
        if listed is None:
            if role == "sdist":
                pkgindex.find_file(index, old.project, filename)  # raises, naming the versions there are
            say(f"warning: {filename} is not on the package index; the new pin has no {role}")
            continue
        if listed.sha256 is None:
            raise KimiError(f"the package index gives no sha256 for {filename}; pass --from DIR with the files")
        artifacts[role] = {"project": old.project, "file": filename, "sha256": listed.sha256}
    return {"line": pin.line, "version": version, "fork_release": 1, "torch": pin.torch, "artifacts": artifacts}


def _torch_of(tree: Path, fallback: str) -> str:
    """The torch version the release builds against (``pyproject.toml`` build requirements)."""
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text(errors="replace") if pyproject.is_file() else ""
    match = re.search(r'"torch\s*==\s*([\d.]+)"', text)
    return match.group(1) if match else fallback


def _conflict_lines(repo: WorkRepo, files: list[str]) -> dict[str, list[int]]:
    lines: dict[str, list[int]] = {}
    for rel in files:
        path = repo.path / rel
        if path.is_file():
            text = path.read_text(errors="replace").splitlines()
            lines[rel] = [i for i, line in enumerate(text, 1) if line.startswith(_MARKERS)]
    return lines


_DECLARED = re.compile(r"^absorbed in (\d+\.\d+(?:\.\d+)?)\b")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.M)


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(x) for x in version.split("."))
    return parts + (0,) * (3 - len(parts))


def declared_absorbed(header: dict[str, str], target: str) -> str | None:
    """The release a patch header says absorbed the change (``Upstream: absorbed in X.Y[.Z]``), if it
    is ``target`` or older; else None."""
    match = _DECLARED.match(header.get("Upstream", ""))
    return match.group(1) if match and _release(match.group(1)) <= _release(target) else None


def check_tests(header: dict[str, str]) -> list[str]:
    """The tests that show a declared-absorbed fix upstream: ``Absorbed-check``, else ``Tests`` (comma or
    newline separated)."""
    text = header.get("Absorbed-check") or header.get("Tests", "")
    return [t.strip() for t in re.split(r"[,\n]", text) if t.strip()]


def remaining_hunks(repo: WorkRepo, diff: str) -> list[str]:
    """The hunks of ``diff`` whose result (context and added lines, in order) is not in the file at HEAD:
    what the new release does not contain.  Named ``file @@ -a,b +c,d @@ context``."""
    remaining = []
    for section in re.split(r"^(?=diff --git )", diff, flags=re.M):
        match = re.match(r"diff --git a/(\S+) b/(\S+)", section)
        if not match:
            continue
        path = match.group(2)
        shown = repo.git("show", f"HEAD:{path}", check=False)
        text = shown.stdout if shown.returncode == 0 else ""
        starts = [m.start() for m in _HUNK.finditer(section)] + [len(section)]
        for begin, end in zip(starts, starts[1:], strict=False):
            head, *body = section[begin:end].rstrip("\n").split("\n")
            after = "".join(line[1:] + "\n" for line in body if line[:1] in (" ", "+"))
            if after not in text:
                remaining.append(f"{path} {head}")
    return remaining


def _pick(repo: WorkRepo, name: str, commit: str, header: dict[str, str] | None = None,
          target: str = "") -> PatchOutcome:
    """Cherry-pick one patch commit; on a conflict the markers stay in the tree.

    A patch whose header declares it absorbed by ``target`` or earlier is
    replayed for the report, then undone and reported ``absorbed``.
    """
    declared = declared_absorbed(header or {}, target) if target else None
    outcome = _cherry_pick(repo, name, commit)
    if declared is None or outcome.outcome == "absorbed":
        return outcome
    diff = repo.commit_diff(commit)
    if outcome.outcome == "conflict":
        repo.git("cherry-pick", "--abort", check=False)
    else:
        repo.git("reset", "-q", "--hard", "HEAD~1")
    return PatchOutcome(name, "absorbed", outcome.files, outcome.conflicts, declared=declared,
                        replay=outcome.outcome, remaining=remaining_hunks(repo, diff),
                        verify=check_tests(header or {}))


def _cherry_pick(repo: WorkRepo, name: str, commit: str) -> PatchOutcome:
    proc = repo.git("cherry-pick", commit, check=False, env={"GIT_EDITOR": "true"})
    files = [p for p in repo.git("diff-tree", "--no-commit-id", "--name-only", "-r", commit).stdout.split("\n") if p]
    if proc.returncode == 0:
        return PatchOutcome(name, "applied", files)
    conflicted = [p for p in repo.git("diff", "--name-only", "--diff-filter=U").stdout.split("\n") if p]
    if not conflicted and "empty" in (proc.stdout + proc.stderr):
        repo.git("cherry-pick", "--skip", check=False)
        return PatchOutcome(name, "absorbed", files)
    if not conflicted:
        raise KimiError(f"git cherry-pick of {name} failed: {(proc.stderr or proc.stdout).strip()}")
    return PatchOutcome(name, "conflict", files, _conflict_lines(repo, conflicted))


def _apply_port(repo: WorkRepo, outcome: PatchOutcome, port: Path) -> PatchOutcome:
    """Replace the conflicted cherry-pick of ``outcome`` by the kept resolution ``port`` (a patch file).

    Raises:
        KimiError: the port does not apply to the new release (it was made for another tree: make it again).
    """
    repo.git("cherry-pick", "--abort", check=False)
    applied = repo.git("apply", "--index", "--whitespace=nowarn", "-", input=read_patch(port).diff, check=False)
    if applied.returncode != 0:
        repo.git("reset", "-q", "--hard", "HEAD", check=False)
        raise KimiError(f"{outcome.name}: the kept resolution {port} does not apply: "
                        f"{(applied.stderr or applied.stdout).strip()}\n  move it away and resolve the conflict "
                        "by hand (`kimi rebase --continue`), then keep the new patch file there")
    repo.git("commit", "-q", "-m", outcome.name)
    return PatchOutcome(outcome.name, "ported", outcome.files, outcome.conflicts, port=str(port))


def _replay(layout: Layout, state: RebaseState) -> bool:
    """Pick the pending patches, saving the state after each; returns False when stopped at a conflict.

    An interruption puts the repository back at the last finished patch and
    keeps the state, so ``--continue`` goes on and ``--abort`` drops it.
    """
    repo = WorkRepo(rebase_dir(layout) / "repo")
    patches_dir = layout.patches_dir(state.line)
    while state.pending:
        name, commit = state.pending[0]
        patch_file = patches_dir / f"{name}.patch"
        header = read_patch(patch_file).header if patch_file.is_file() else {}
        port = Path(state.ports) / f"{name}.patch" if state.ports else None
        try:
            outcome = _pick(repo, name, commit, header, state.target)
            if outcome.outcome == "conflict" and port is not None and port.is_file():
                outcome = _apply_port(repo, outcome, port)
        except KeyboardInterrupt:
            repo.git("cherry-pick", "--abort", check=False)
            repo.git("reset", "-q", "--hard", state.head, check=False)
            _save(layout, state)
            raise
        state.pending.pop(0)
        state.outcomes.append(asdict(outcome))
        if outcome.declared:
            say(f"{name}: absorbed (its header: absorbed in {outcome.declared}; the replay gave {outcome.replay}, "
                f"{len(outcome.remaining)} hunks not in {state.target}); verify with: {', '.join(outcome.verify)}")
        elif outcome.port:
            say(f"{name}: conflict in {', '.join(outcome.conflicts)}; resolved with the kept port {outcome.port}")
        else:
            say(f"{name}: {outcome.outcome}"
                + (f" in {', '.join(outcome.conflicts)}" if outcome.conflicts else ""))
        if outcome.outcome == "conflict" and state.dry_run:
            repo.git("cherry-pick", "--abort", check=False)
        state.head = repo.head()
        _save(layout, state)
        if outcome.outcome == "conflict" and not state.dry_run:
            return False
    return True


def _report(layout: Layout, state: RebaseState, finished: bool) -> dict:
    outcomes = state.outcomes + [{"name": n, "outcome": "not reached", "files": [], "conflicts": {}}
                                 for n, _ in state.pending]
    report = {
        "line": state.line, "from": state.source, "to": state.target, "dry_run": state.dry_run,
        "finished": finished, "started": state.started, "written": time.strftime("%Y-%m-%d %H:%M:%S"),
        "applied": [o["name"] for o in outcomes if o["outcome"] == "applied"],
        "ported": [{"name": o["name"], "port": o.get("port")} for o in outcomes if o["outcome"] == "ported"],
        "absorbed": [_absorbed_entry(o, state.target) for o in outcomes if o["outcome"] == "absorbed"],
        "conflicts": [{"name": o["name"], "files": o["conflicts"]} for o in outcomes if o["outcome"] == "conflict"],
        "candidates": state.candidates, "upstream_tests": load_summary(layout, state.line),
        "patches": outcomes, "new_pin": state.new_pin,
    }
    write_report(layout, report)
    return report


def _absorbed_entry(outcome: dict, target: str) -> dict:
    entry = {"name": outcome["name"], "in": target}
    if outcome.get("declared"):
        entry.update(how="declared", declared=outcome["declared"], replay=outcome["replay"],
                     remaining_hunks=outcome["remaining"], verify=outcome["verify"])
    else:
        entry["how"] = "replay"
    return entry


def _pin_text(pin: dict) -> str:
    """pin.json in its usual key order."""
    ordered = {key: pin[key] for key in _PIN_KEYS}
    ordered["artifacts"] = {role: {k: art[k] for k in ("project", "file", "sha256")}
                            for role, art in pin["artifacts"].items()}
    return json.dumps(ordered, indent=2) + "\n"


def _finish(layout: Layout, state: RebaseState) -> None:
    """Write the new pin and series beside the line's folder, then swap the folder in (all or nothing)."""
    repo = WorkRepo(rebase_dir(layout) / "repo")
    line_dir = layout.line_dir(state.line)
    patches_dir = line_dir / "patches"
    kept = repo.patch_commits()
    headers = {}
    for name, _ in kept:
        path = patches_dir / f"{name}.patch"
        if not path.is_file():
            raise KimiError(f"{path} was removed during the rebase; restore it, or `kimi rebase --abort`")
        headers[name] = read_patch(path).header
    with staged_folder(line_dir) as staging:
        (staging / "patches").mkdir()
        for name, commit in kept:
            write_patch(staging / "patches" / f"{name}.patch", headers[name], repo.commit_diff(commit))
        write_atomic(staging / "pin.json", _pin_text(state.new_pin))
        for other in line_dir.iterdir():
            if other.name in ("pin.json", "patches"):
                continue
            if other.is_dir():
                shutil.copytree(other, staging / other.name)
            else:
                shutil.copy2(other, staging)


def rebase(layout: Layout, version: str, dry_run: bool = False, from_dir: Path | None = None,
           ports: Path | None = None) -> dict:
    """Start a rebase of the synced line onto upstream ``version``; returns the report.

    ``ports``: the folder of kept conflict resolutions (default ``kimi/lines/<line>/ports/<version>/``
    where it exists).

    Raises:
        KimiError: a bad version, nothing synced, edits not refreshed, a
            rebase already in progress, the release not obtainable, or (not
            in a dry run) a conflict - the report names it.
    """
    if not _VERSION.match(version):
        raise KimiError(f"--to {version!r}: give a release version X.Y.Z")
    with exclusive(layout.private):
        state = SyncState.load(layout.state_file)
        if state is None or state.failed or not layout.work.is_dir():
            raise KimiError("rebase starts from a fully synced line: run `kimi sync` first")
        check_no_unrefreshed_edits(layout, state)
        check_series_in_step(WorkRepo(layout.work), state, layout.patches_dir(state.line), "rebase")
        load_series(layout.patches_dir(state.line))  # every header readable before anything starts
        if (rebase_dir(layout) / "state.json").is_file():
            raise KimiError("a rebase is in progress: `kimi rebase --continue` or `kimi rebase --abort`")
        pin = line_pin(layout, state.line)
        if version == pin.version:
            raise KimiError(f"the {state.line} line is already at vllm {version}")
        new_pin = _new_pin(pin, version, from_dir)
        sdist = obtain(Artifact("sdist", **new_pin["artifacts"]["sdist"]), layout.cache, from_dir)
        shutil.rmtree(rebase_dir(layout), ignore_errors=True)
        repo_dir = rebase_dir(layout) / "repo"
        repo_dir.mkdir(parents=True)
        say(f"unpacking {sdist.name}")
        extract_sdist(sdist, repo_dir)
        new_pin["torch"] = _torch_of(repo_dir, pin.torch)
        digest = new_pin["artifacts"]["sdist"]["sha256"][:12]
        repo = WorkRepo.create(repo_dir, f"vllm {version} (upstream sdist {digest})")
        repo.git("fetch", "-q", "--no-tags", str(layout.work), "+work:refs/heads/old")
        old = WorkRepo(layout.work)
        pending = [[name, commit] for name, commit in old.patch_commits()]
        candidates = _deleted_targets(old, repo, pending, version)
        if ports is None and (layout.line_dir(state.line) / "ports" / version).is_dir():
            ports = layout.line_dir(state.line) / "ports" / version
        if ports is not None and not ports.is_dir():
            raise KimiError(f"--ports {ports}: not a folder")
        rebase_state = RebaseState(line=state.line, source=pin.version, target=version, dry_run=dry_run,
                                   new_pin=new_pin, pending=pending, started=time.strftime("%Y-%m-%d %H:%M:%S"),
                                   head=repo.head(), ports=str(ports.resolve()) if ports else "",
                                   candidates=[c.as_dict() for c in candidates])
        _save(layout, rebase_state)
        return _proceed(layout, rebase_state)


def _deleted_targets(old: WorkRepo, new: WorkRepo, pending: list[list[str]], version: str) -> list[Candidate]:
    """The candidates whose files the new release deleted, each said as it is found."""
    found = deleted_targets([(name, old.files_touched(commit)) for name, commit in pending],
                            set(old.tracked_files(UPSTREAM_TAG)), set(new.tracked_files()), version)
    for c in found:
        say(f"{c.name}: candidate for dropping: {c.reason}: {', '.join(c.evidence)}")
    return found


def _proceed(layout: Layout, state: RebaseState) -> dict:
    done = _replay(layout, state)
    report = _report(layout, state, finished=done)
    if not done:
        conflict = report["conflicts"][-1]
        raise KimiError(
            f"patch {conflict['name']} conflicts with vllm {state.target} in "
            + ", ".join(f"{f} (markers at lines {', '.join(map(str, lines))})" if lines else
                        f"{f} (no markers: changed on one side, deleted on the other)"
                        for f, lines in conflict["files"].items())
            + f"\n  resolve them in {rebase_dir(layout) / 'repo'}, then `kimi rebase --continue`; or "
              "`kimi rebase --abort`"
            + f"\n  report: {rebase_dir(layout) / 'report.md'}"
        )
    if not state.dry_run:
        _finish(layout, state)
    (rebase_dir(layout) / "state.json").unlink(missing_ok=True)
    shutil.rmtree(rebase_dir(layout) / "repo", ignore_errors=True)
    say(f"{'dry run: ' if state.dry_run else ''}{len(report['applied'])} applied, {len(report['ported'])} ported, "
        f"{len(report['absorbed'])} absorbed, "
         f"{len(report['conflicts'])} conflicts, {len(report['candidates'])} candidates for dropping; "
         f"report: {rebase_dir(layout) / 'report.md'}"
         + ("" if state.dry_run else f"; run `kimi sync` to lay vllm {state.target}"))
    return report


def _in_progress(layout: Layout) -> RebaseState:
    path = rebase_dir(layout) / "state.json"
    if not path.is_file():
        raise KimiError("no rebase is in progress")
    try:
        return RebaseState(**json.loads(path.read_bytes()))
    except (ValueError, TypeError) as exc:
        raise KimiError(f"{path} is damaged ({exc}); `kimi rebase --abort` removes the rebase") from None


def _keep_port(layout: Layout, state: RebaseState, repo: WorkRepo, name: str) -> Path:
    """Write the resolved patch ``name`` (HEAD's commit) to ``kimi/lines/<line>/ports/<target>/`` for replays."""
    old = layout.patches_dir(state.line) / f"{name}.patch"
    port = layout.line_dir(state.line) / "ports" / state.target / f"{name}.patch"
    port.parent.mkdir(parents=True, exist_ok=True)
    write_patch(port, read_patch(old).header, repo.commit_diff("HEAD"))
    return port


def _resolve(repo: WorkRepo, last: dict) -> None:
    """Commit the user's resolution of the conflicted patch (``last``), or skip it if nothing is left."""
    if not (repo.path / ".git" / "CHERRY_PICK_HEAD").is_file():
        raise KimiError(f"git's cherry-pick of {last['name']} is no longer in progress in {repo.path}; "
                        "`kimi rebase --abort` and start again")
    left = {f: lines for f, lines in _conflict_lines(repo, list(last["conflicts"])).items() if lines}
    if left:
        raise KimiError("conflict markers are still in " + ", ".join(f"{f} (lines {', '.join(map(str, lines))})"
                                                                    for f, lines in left.items()) + f" ({repo.path})")
    paths = sorted(set(last["files"]) | set(last["conflicts"]))
    # a file the user deleted to resolve a modify/delete conflict is neither on disk nor, once `git rm`-ed, in
    # the index: naming it to `git add` would fail
    known = set(repo.git("ls-files", "--", *paths).stdout.split("\n")) | {p for p in paths if (repo.path / p).exists()}
    if known - {""}:
        repo.git("add", "-A", "--", *sorted(known - {""}))
    unmerged = [p for p in repo.git("diff", "--name-only", "--diff-filter=U").stdout.split("\n") if p]
    if unmerged:
        raise KimiError(f"still unmerged in {repo.path}: {', '.join(unmerged)}")
    if repo.git("diff", "--cached", "--quiet", check=False).returncode == 0:
        repo.git("cherry-pick", "--skip", check=False)
        last["outcome"] = "absorbed"  # the resolution is upstream's own text
    else:
        repo.git("cherry-pick", "--continue", env={"GIT_EDITOR": "true"})
        last["outcome"], last["resolved"] = "applied", True
    say(f"{last['name']}: resolved ({last['outcome']})")


def rebase_continue(layout: Layout) -> dict:
    """Commit the resolved conflict (if stopped at one) and go on with the remaining patches.

    Raises:
        KimiError: no rebase in progress, markers or unmerged files left, or a next conflict.
    """
    with exclusive(layout.private):
        state = _in_progress(layout)
        repo = WorkRepo(rebase_dir(layout) / "repo")
        if state.outcomes and state.outcomes[-1]["outcome"] == "conflict" and not state.dry_run:
            _resolve(repo, state.outcomes[-1])
            if state.outcomes[-1]["outcome"] == "applied":
                port = _keep_port(layout, state, repo, state.outcomes[-1]["name"])
                say(f"{state.outcomes[-1]['name']}: resolution kept in {port.relative_to(layout.root)} for replays")
            state.head = repo.head()
            _save(layout, state)
        return _proceed(layout, state)


def rebase_abort(layout: Layout) -> None:
    """Drop the rebase in progress; the pin, the series and the laid tree are as they were."""
    with exclusive(layout.private):
        if not (rebase_dir(layout) / "state.json").is_file():
            raise KimiError("no rebase is in progress")
        shutil.rmtree(rebase_dir(layout))
        say("rebase aborted; nothing was changed")
