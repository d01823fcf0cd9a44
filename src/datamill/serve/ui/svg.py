"""Charts as SVG strings rendered on the server: an iteration's throughput over time, a histogram.

The throughput comes from the journal's durable record (each acknowledged run of batches with its
commit time), read through a separate read-only SQLite connection, so it survives restarts and
needs nothing from the running iteration.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from html import escape
from pathlib import Path

import numpy as np

__all__ = ["ack_history", "histogram_svg", "throughput_svg"]

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 640, 210, 56, 28, 24, 12


def ack_history(db: str | Path, iteration: str) -> list[tuple[float, int]]:
    """``(commit time, batches)`` of every acknowledged run of ``iteration``, oldest first."""
    uri = f"file:{Path(db).resolve()}?mode=ro"
    con = sqlite3.connect(uri, uri=True, timeout=5)
    try:
        rows = con.execute("SELECT at, stop - start FROM done WHERE iteration = ? ORDER BY at", (iteration,)).fetchall()
    finally:
        con.close()
    return [(float(a), int(n)) for a, n in rows]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def _frame(title: str, xlabel: str, ylabel: str, ymax: float, body: str) -> str:
    ticks = "".join(
        f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(ymax * f)}</text>'
        for f in (0.0, 0.5, 1.0) for y in [H - PAD_B - f * (H - PAD_B - PAD_T)])
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" class="chart" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>{ticks}{body}'
            f'<text x="{(W + PAD_L) / 2:.0f}" y="{H - 4}" text-anchor="middle">{escape(xlabel)}</text>'
            f'<text x="4" y="12" class="ylabel">{escape(ylabel)}</text></svg>')


def throughput_svg(history: Sequence[tuple[float, int]], *, bins: int = 40) -> str:
    """Batches/s over time as an SVG line: equal time slices from the first to the last ack.

    At most ``bins`` slices, and about four acks per slice, so a short run is not drawn as spikes.

    Examples:
        >>> svg = throughput_svg([(0.0, 16), (1.0, 16), (2.0, 16)])
        >>> svg.startswith("<svg") and "polyline" in svg and "batches/s" in svg
        True
        >>> "no batch acknowledged yet" in throughput_svg([])
        True
    """
    if not history:
        return _frame("Throughput: no batch acknowledged yet", "time", "batches/s", 1.0, "")
    t = np.asarray([h[0] for h in history], dtype=np.float64)
    n = np.asarray([h[1] for h in history], dtype=np.float64)
    t0, t1 = float(t[0]), float(max(t[-1], t[0] + 1e-3))
    bins = max(1, min(bins, len(history) // 4))
    counts, edges = np.histogram(t, bins=bins, range=(t0, t1), weights=n)
    rate = counts / ((t1 - t0) / bins)
    ymax = float(max(rate.max(), 1e-9))
    xs = PAD_L + (edges[:-1] + edges[1:] - 2 * t0) / 2 / (t1 - t0) * (W - PAD_L - PAD_R)
    ys = H - PAD_B - rate / ymax * (H - PAD_B - PAD_T)
    if len(xs) == 1:  # one slice: a flat line across the plot
        xs, ys = np.asarray([PAD_L, W - PAD_R], dtype=np.float64), np.repeat(ys, 2)
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    title = f"Throughput: {int(n.sum()):,} batches in {t1 - t0:.1f} s, peak {_fmt(ymax)} batches/s"
    return _frame(title, f"time (0 to {t1 - t0:.1f} s)", "batches/s", ymax,
                  f'<polyline points="{pts}" class="line"/>')


def histogram_svg(counts: Sequence[int], edges: Sequence[float], *, label: str) -> str:
    """Bars of a histogram as an SVG.

    Examples:
        >>> histogram_svg([1, 3], [0.0, 1.0, 2.0], label="value").count("<rect")
        2
    """
    ymax = float(max(max(counts, default=0), 1))
    bw = (W - PAD_L - PAD_R) / max(len(counts), 1)
    bars = "".join(
        f'<rect x="{PAD_L + i * bw + 1:.1f}" y="{H - PAD_B - c / ymax * (H - PAD_B - PAD_T):.1f}" '
        f'width="{max(bw - 2, 1):.1f}" height="{c / ymax * (H - PAD_B - PAD_T):.1f}" class="bar">'
        f"<title>{_fmt(edges[i])} to {_fmt(edges[i + 1])}: {c:,}</title></rect>"
        for i, c in enumerate(counts))
    xl = f"{label} ({_fmt(edges[0])} to {_fmt(edges[-1])})" if len(edges) else label
    return _frame(f"Histogram of {label}", xl, "count", ymax, bars)
