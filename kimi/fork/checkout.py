"""A fresh checkout of the fork's own files, as a clean clone would have them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def fresh_copy(root: Path, dest: Path) -> None:
    """Copy the files ``root`` tracks or would track (not the laid tree, nothing ignored) into a new git
    repository at ``dest`` with one commit: what a clone of the working tree would be."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        if (root / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest / rel)
    commit_all(dest)


def commit_all(path: Path, message: str = "fork") -> None:
    """``git init`` ``path`` (branch main) and commit everything in it."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=kimi", "-c", "user.email=kimi@localhost",
                    "-c", "commit.gpgsign=false", "commit", "-q", "-m", message], check=True)
