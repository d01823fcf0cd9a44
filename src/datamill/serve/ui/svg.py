"""Charts as SVG strings rendered on the server: an iteration's throughput over time, a histogram.

The throughput comes from the journal's durable record (each acknowledged run of batches with its
commit time), read through the journal's reading connection, so it survives restarts and needs
nothing from the running iteration.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

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


def _frame(
    title: str,
    xlabel: str,
    ylabel: str,
    ymax: float,
    body: str,
    *,
    xticks: Sequence[tuple[float, str]] = (),
) -> str:
    ticks = "".join(
        f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(ymax * f)}</text>'
        for f in (0.0, 0.5, 1.0)
        for y in [H - PAD_B - f * (H - PAD_B - PAD_T)]
    )
    ticks += "".join(
        f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{escape(t)}</text>'
        for x, t in xticks
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" '
        f'height="{H}" role="img" '
        f'class="chart" aria-label="{escape(title)}"><title>{escape(title)}</title>{ticks}{body}'
        f'<text x="{(W + PAD_L) / 2:.0f}" y="{H - 3}" text-anchor="middle" '
        f'class="axis">{escape(xlabel)}</text>'
        f'<text x="4" y="13" class="axis">{escape(ylabel)}</text></svg>'
    )


def throughput_svg(
    history: Sequence[tuple[float, int]],
    *,
    bins: int = 40,
    start: float | None = None,
    end: float | None = None,
    marks: Sequence[tuple[float, str]] = (),
) -> str:
    """Batches/s over time as an SVG line: equal time slices from ``start`` to ``end``.

    ``start`` defaults to the first ack, ``end`` to the last; the span is at least one second, so a
    burst of acks at one instant is not drawn as an absurd rate. At most ``bins`` slices, each at
    least one second long. ``marks`` are ``(time, label)`` drawn as vertical lines (a rewind, a
    cancel).

    Examples:
        >>> svg = throughput_svg([(0.0, 16), (1.0, 16), (2.0, 16)])
        >>> svg.startswith(
        ...     "<svg"
        ... ) and "polyline" in svg and "batches/s" in svg and "(s)</text>" in svg
        True
        >>> "no batch acknowledged yet" in throughput_svg([])
        True
        >>> "peak 3,000 batches/s" in throughput_svg(
        ...     [(5.0, 1000)] * 3
        ... )  # all at one instant: over 1 s
        True
    """
    if not history:
        return _frame("Throughput: no batch acknowledged yet", "time (s)", "batches/s", 1.0, "")
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
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    lines = "".join(
        f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_T}" y2="{H - PAD_B}" class="mark"/>'
        f'<text x="{x + 3:.1f}" y="{PAD_T + 10}" class="mark">{escape(label)}</text>'
        for when, label in marks
        if t0 <= when <= t1
        for x in [PAD_L + (when - t0) / (t1 - t0) * span]
    )
    xticks = [(PAD_L + f * span, _seconds(f * (t1 - t0))) for f in (0.0, 0.5, 1.0)]
    title = (
        f"Throughput: {int(n.sum()):,} batches acknowledged in {t1 - t0:,.1f} s, peak "
        f"{_fmt(ymax)} batches/s"
    )
    return _frame(
        title,
        "time since start (s)",
        "batches/s",
        ymax,
        f'<polyline points="{pts}" class="line"/>{lines}',
        xticks=xticks,
    )


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
        for i, c in enumerate(counts)
    )
    xticks = (
        [
            (PAD_L + f * (W - PAD_L - PAD_R), _fmt(edges[0] + f * (edges[-1] - edges[0])))
            for f in (0.0, 0.5, 1.0)
        ]
        if len(edges)
        else []
    )
    return _frame(f"Histogram of {label}", label, "count (rows)", ymax, bars, xticks=xticks)


def bars_svg(top: Sequence[tuple[str, int]], *, label: str) -> str:
    """The most common values as horizontal bars (value on the left, count on the right).

    Examples:
        >>> svg = bars_svg([("cat", 3), ("dog", 1)], label="label")
        >>> svg.count("<rect"), "cat" in svg and "count (rows)" in svg
        (2, True)
    """
    row, left, top_pad = 22, 150, 8
    height = top_pad + row * len(top) + 30
    cmax = float(max((c for _, c in top), default=1) or 1)
    span = W - left - 70
    body = "".join(
        f'<text x="{left - 6}" y="{top_pad + i * row + 15}" '
        f'text-anchor="end">{escape(_clip(v))}</text>'
        f'<rect x="{left}" y="{top_pad + i * row + 3}" width="{max(c / cmax * span, 1):.1f}" '
        f'height="{row - 6}" '
        f'class="bar"><title>{escape(v)}: {c:,}</title></rect>'
        f'<text x="{left + max(c / cmax * span, 1) + 4:.1f}" '
        f'y="{top_pad + i * row + 15}">{c:,}</text>'
        for i, (v, c) in enumerate(top)
    )
    title = f"Most common values of {label}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" '
        f'height="{height}" '
        'role="img" class="chart" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>{body}'
        f'<text x="{left + span / 2:.0f}" y="{height - 6}" text-anchor="middle" '
        'class="axis">count (rows)'
        f"</text></svg>"
    )


def _clip(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
