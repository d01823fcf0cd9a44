"""Charts as SVG strings rendered on the server: an iteration's throughput over time (from the
journal's acknowledged runs and their commit times: it survives restarts), a histogram.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from datamill.serve.journal.store import Journal

__all__ = ["ack_history", "bars_svg", "histogram_svg", "rewind_times", "throughput_svg"]

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 640, 230, 64, 40, 24, 16


def ack_history(journal: Journal, iteration: str) -> list[tuple[float, int]]:
    """``(commit time, batches)`` of every acknowledged run of ``iteration``, oldest first.

    A rewind's rows (the done set it wrote, all at one instant) are not acknowledgements and are
    left out: see :func:`rewind_times`.
    """
    return [
        (a, n) for a, n, lease in _done_rows(journal, iteration) if not lease.startswith("rewind.")
    ]


def rewind_times(journal: Journal, iteration: str) -> list[float]:
    """When ``iteration`` was rewound (every rewind's rows are kept)."""
    return sorted(
        {a for a, _, lease in _done_rows(journal, iteration) if lease.startswith("rewind.")}
    )


def _done_rows(journal: Journal, iteration: str) -> list[tuple[float, int, str]]:
    rows = journal.read(
        "SELECT at, stop - start, lease FROM done WHERE iteration = ? ORDER BY at", (iteration,)
    )
    return [(float(a), int(n), str(lease)) for a, n, lease in rows]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def _seconds(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def _chart(title: str, xlabel: str, ylabel: str, ymax: float | None, **parts: Any) -> str:
    """The ``_chart.html`` template (inline SVG): a frame with y ticks at 0, half and ``ymax``
    (none when ``None``), its labels, and the ``parts`` drawn inside."""
    from datamill.serve.ui.render import _ENV

    fracs = (0.0, 0.5, 1.0) if ymax is not None else ()
    yticks = [(round(H - PAD_B - f * (H - PAD_B - PAD_T), 1), _fmt((ymax or 0) * f)) for f in fracs]
    box = {"w": W, "h": H, "left": PAD_L, "right": W - PAD_R, "top": PAD_T, "bottom": H - PAD_B}
    return _ENV.get_template("_chart.html").render(
        **{**box, "xlabel_x": round((W + PAD_L) / 2), "xlabel_y": H - 3, **parts},
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        yticks=yticks,
    )


def throughput_svg(
    history: Sequence[tuple[float, int]],
    *,
    bins: int = 40,
    start: float | None = None,
    end: float | None = None,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """Batches/s over time as an SVG line: at most ``bins`` equal time slices of at least a
    second from ``start`` (the first ack) to ``end`` (the last); ``marks``: ``(time, label)``
    vertical lines.

    Examples:
        >>> svg = throughput_svg([(0.0, 16), (1.0, 16), (2.0, 16)])
        >>> all(x in svg for x in ("<svg", "polyline", "batches/s", "(s)</text>"))
        True
        >>> "no batch acknowledged yet" in throughput_svg([])
        True
        >>> "peak 3,000 batches/s" in throughput_svg([(5.0, 1000)] * 3)  # one instant: over 1 s
        True
    """
    if not history:
        return _chart("Throughput: no batch acknowledged yet", "time (s)", "batches/s", 1.0)
    t = np.asarray([h[0] for h in history], dtype=np.float64)
    n = np.asarray([h[1] for h in history], dtype=np.float64)
    t0 = float(t[0]) if start is None else min(float(start), float(t[0]))
    t1 = float(t[-1]) if end is None else max(float(end), float(t[-1]))
    t1 = max(t1, t0 + 1.0)
    bins = max(1, min(bins, len(history), int(t1 - t0)))  # slices of at least one second
    counts, edges = np.histogram(t, bins=bins, range=(t0, t1), weights=n)
    rate = counts / ((t1 - t0) / bins)
    ymax = float(max(rate.max(), 1e-9))
    span = W - PAD_L - PAD_R
    xs = PAD_L + (edges[:-1] + edges[1:] - 2 * t0) / 2 / (t1 - t0) * span
    ys = H - PAD_B - rate / ymax * (H - PAD_B - PAD_T)
    if len(xs) == 1:  # one slice: a flat line across the plot
        xs, ys = np.asarray([PAD_L, W - PAD_R], dtype=np.float64), np.repeat(ys, 2)
    at = [(round(PAD_L + (w - t0) / (t1 - t0) * span, 1), label) for w, label in marks]
    return _chart(
        f"Throughput: {int(n.sum()):,} batches acknowledged in {t1 - t0:,.1f} s, peak "
        f"{_fmt(ymax)} batches/s",
        "time since start (s)",
        "batches/s",
        ymax,
        points=" ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys)),
        marks=[(x, label) for (x, label), (w, _) in zip(at, marks) if t0 <= w <= t1],
        xticks=[(round(PAD_L + f * span, 1), _seconds(f * (t1 - t0))) for f in (0.0, 0.5, 1.0)],
    )


def histogram_svg(counts: Sequence[int], edges: Sequence[float], *, label: str) -> str:
    """Bars of a histogram as an SVG.

    Examples:
        >>> histogram_svg([1, 3], [0.0, 1.0, 2.0], label="value").count("<rect")
        2
    """
    ymax = float(max(max(counts, default=0), 1))
    bw, scale = (W - PAD_L - PAD_R) / max(len(counts), 1), (H - PAD_B - PAD_T) / ymax
    rects = [
        (round(PAD_L + i * bw + 1, 1), round(H - PAD_B - c * scale, 1), round(max(bw - 2, 1), 1))
        + (round(c * scale, 1), f"{_fmt(edges[i])} to {_fmt(edges[i + 1])}: {c:,}")
        for i, c in enumerate(counts)
    ]
    fracs = (0.0, 0.5, 1.0) if len(edges) else ()
    xticks = [
        (round(PAD_L + f * (W - PAD_L - PAD_R), 1), _fmt(edges[0] + f * (edges[-1] - edges[0])))
        for f in fracs
    ]
    return _chart(f"Histogram of {label}", label, "count (rows)", ymax, rects=rects, xticks=xticks)


def bars_svg(top: Sequence[tuple[str, int]], *, label: str) -> str:
    """The most common values as horizontal bars (value on the left, count on the right).

    Examples:
        >>> svg = bars_svg([("cat", 3), ("dog", 1)], label="label")
        >>> svg.count("<rect"), "cat" in svg and "count (rows)" in svg
        (2, True)
    """
    row, left, top_pad, span = 22, 150, 8, W - 70 - 150
    cmax = float(max((c for _, c in top), default=1) or 1)
    rows = [(top_pad + i * row, v, c, max(c / cmax * span, 1)) for i, (v, c) in enumerate(top)]
    h, title = top_pad + row * len(top) + 30, f"Most common values of {label}"
    axis = {"xlabel_x": round(left + span / 2), "xlabel_y": h - 6}
    return _chart(title, "count (rows)", "", None, h=h, left=left, row=row, rows=rows, **axis)
