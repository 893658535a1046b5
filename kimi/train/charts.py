"""PNG charts of drafter training and served acceptance (matplotlib, Agg backend), written atomically.

``kimi setup`` installs matplotlib into the fork's venv; elsewhere (a GPU host with the fork put onto an
installed vLLM) it may be missing: :func:`pyplot` then returns None and the callers keep the data only.
"""

from __future__ import annotations

import io
from pathlib import Path

from kimi.fork.fsutil import write_atomic


def pyplot():
    """matplotlib's ``pyplot`` on the non-interactive Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_png(fig, path: Path, dpi: int = 100) -> Path:
    """Render ``fig`` to PNG in memory and write it to ``path`` atomically (temp file + rename); closes ``fig``."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    write_atomic(path, buf.getvalue())
    return path


def acceptance_chart(path: Path, series: dict[str, list[float]], title: str) -> Path | None:
    """Grouped bars of per-position acceptance, one group per draft position and one bar per series.

    Args:
        path: the PNG to write (atomically).
        series: label -> acceptance rate per draft position (floats in 0..1, the same length for every label).
        title: the chart's title (say k and tau there).

    Returns:
        ``path``, or None where matplotlib is not installed (nothing written).
    """
    plt = pyplot()
    if plt is None:
        return None
    positions = max(len(v) for v in series.values())
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, rates) in enumerate(series.items()):
        xs = [p - 0.4 + width * (i + 0.5) for p in range(len(rates))]
        bars = ax.bar(xs, rates, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(positions), [str(p) for p in range(positions)])
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.05), title=title)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    return save_png(fig, path)
