"""`kimi docs patches`: docs/patches.md generated from the series' headers, and `--check` catching a stale one."""

from __future__ import annotations

from conftest import Fork, speculative_patch
from kimi.fork.layout import Layout
from kimi.fork.patch_docs import GENERATED, Churn, churn_by_file, docs_path

DIFF = """diff --git a/vllm/a.py b/vllm/a.py
index 1111111..2222222 100644
--- a/vllm/a.py
+++ b/vllm/a.py
@@ -1,3 +1,3 @@
 keep
--- a removed line that looks like a file header
+++ an added line that looks like one
@@ -9,2 +9,3 @@
 keep
+one more
diff --git a/vllm/new.py b/vllm/new.py
new file mode 100644
--- /dev/null
+++ b/vllm/new.py
@@ -0,0 +1,2 @@
+x = 1
+y = 2
"""


def test_churn_counts_hunk_lines_not_file_headers() -> None:
    assert churn_by_file(DIFF) == {"vllm/a.py": Churn(2, 1), "vllm/new.py": Churn(2, 0)}
    assert str(Churn(2, 1)) == "+2 -1"


def test_docs_path_per_line(tmp_path) -> None:
    layout = Layout(root=tmp_path, cache=tmp_path / "cache")
    assert docs_path(layout, "mainline") == tmp_path / "docs" / "patches.md"
    assert docs_path(layout, "origin") == tmp_path / "docs" / "patches-origin.md"


def test_generate_check_and_a_stale_header(fork: Fork) -> None:
    for number, line_no in ((1, 10), (2, 20)):
        fork.add_patch(*speculative_patch(number, line_no, f"changed {line_no}"))
    docs = fork.root / "docs" / "patches.md"

    missing = fork.kimi("docs", "patches", "--check")
    assert missing.returncode == 1 and "docs/patches.md is missing" in missing.stderr, missing.stderr

    made = fork.kimi("docs", "patches")
    assert made.returncode == 0, made.stderr
    text = docs.read_text()
    assert text.splitlines()[0] == GENERATED
    assert "vLLM 9.9.0" in text and "The series: 2 patches, 4 upstream lines changed (+2 -2) in 1 file." in text
    assert "| [0001-change-line-10](#0001-change-line-10) | 0001-change-line-10 | fork-only | no | +1 -1 |" in text
    assert "- **Why:** a test" in text and "`vllm/config/speculative.py` (+1 -1)" in text
    assert fork.kimi("docs", "patches", "--check").returncode == 0

    patch = fork.patches / "0002-change-line-20.patch"
    patch.write_text(patch.read_text().replace("Why: a test\n", "Why: a better reason\n"))
    stale = fork.kimi("docs", "patches", "--check")
    assert stale.returncode == 1
    assert "docs/patches.md is not current" in stale.stderr and "`python3 -m kimi docs patches`" in stale.stderr
    assert docs.read_text() == text  # --check writes nothing

    assert fork.kimi("docs", "patches").returncode == 0
    assert "- **Why:** a better reason" in docs.read_text()
    assert fork.kimi("docs", "patches", "--check").returncode == 0


def test_unknown_line_is_an_error(fork: Fork) -> None:
    result = fork.kimi("docs", "patches", "--line", "nope")
    assert result.returncode == 1 and "unknown line 'nope'" in result.stderr
