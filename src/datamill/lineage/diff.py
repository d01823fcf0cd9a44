"""``datamill diff A B``: what changed between two builds of the same kind.

Both builds are opened as :class:`~datamill.core.source.Source` objects (a shardset dataset, a
preprocessed HDF5, a BERT/word2vec output...). One pass over each build's shards computes a content
hash per row and column (:mod:`datamill.lineage.rowhash`) and the statistics of its number and
category columns; both are cached beside the build (``.rowhash.npz`` in a folder build,
``X.rowhash.npz`` beside a file ``X.hdf5``; :func:`sidecar_path`), stamped with the build's
fingerprint and pointed at from the build's ``dataset.json`` or ``meta.json``
(:mod:`datamill.lineage.hashcache`), so the second diff against the same build reads no data and a
rebuilt build is hashed again. The report:

* **columns** added, removed and retyped;
* **samples** added, removed and changed (per column) by UID when the builds have a UID column,
  else rows compared as a multiset of row contents (plus rows changed at the same position);
* **vocabularies** (``meta.json`` features, ``vocab.json``): tokens added and removed, ids moved;
* **statistics drift**: mean/std/quantiles per number column (drift: the mean moved by more than
  ``mean_shift`` standard deviations, or the median by more than ``quantile_shift`` of the 5-95%
  range), the top values per category column (drift: total variation distance over ``tvd``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat
from numpy.typing import NDArray

from datamill.core.errors import ConfigError
from datamill.lineage.hashcache import sidecar_path
from datamill.lineage.summary import BuildSummary, summarize

__all__ = ["BuildSummary", "DiffReport", "Thresholds", "diff", "sidecar_path", "summarize"]

EXAMPLES = 5


@dataclass(frozen=True)
class Thresholds:
    """When a statistic counts as drifted (see the module docstring)."""

    mean_shift: float = 0.1
    quantile_shift: float = 0.1
    tvd: float = 0.05


def _samples_text(s: dict[str, Any]) -> list[str]:
    line = f"samples: +{s['added']:,} -{s['removed']:,}"
    if "changed" in s:
        line += f" changed {s['changed']:,} unchanged {s['unchanged']:,}"
        if s["changed_by_column"]:
            line += " (" + ", ".join(f"{k}: {v:,}" for k, v in s["changed_by_column"].items()) + ")"
    if "moved_rows" in s:
        line += f"; rows changed at the same position {s['moved_rows']:,}"
    examples = [
        f"  e.g. {what}: {s['examples'][what]}"
        for what in ("added", "removed", "changed")
        if s["examples"].get(what)
    ]
    return [line, *examples]


def _vocab_text(name: str, v: dict[str, Any]) -> str:
    return (
        f"vocabulary {name}: {v['size'][0]:,} -> {v['size'][1]:,} tokens; "
        f"+{v['added']:,} -{v['removed']:,} ids moved {v['moved']:,}"
        + "".join(
            f"; e.g. {k} {v['examples'][k]}"
            for k in ("added", "removed", "moved")
            if v["examples"][k]
        )
    )


def _drift_text(d: dict[str, Any]) -> str:
    flag = "DRIFT" if d["drifted"] else "ok"
    if d["type"] == "number":
        return (
            f"{flag:>5} {d['column']}: mean {d['a']['mean']:.4g} -> {d['b']['mean']:.4g} "
            f"({d['mean_shift']:+.3f} std), std {d['a']['std']:.4g} -> {d['b']['std']:.4g}, "
            f"median {d['a']['q50']:.4g} -> {d['b']['q50']:.4g}"
        )
    return (
        f"{flag:>5} {d['column']}: total variation {d['tvd']:.3f}; top {d['a']['top'][:3]} -> "
        f"{d['b']['top'][:3]}"
    )


@dataclass
class DiffReport:
    """What :func:`diff` found (``as_dict()`` for JSON, ``as_text()`` for people)."""

    kind: str
    a: str
    b: str
    rows: tuple[int, int]
    keyed_by: str
    columns: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] = field(default_factory=dict)
    vocab: dict[str, Any] = field(default_factory=dict)
    drift: list[dict[str, Any]] = field(default_factory=list)
    thresholds: Thresholds = field(default_factory=Thresholds)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-able dict."""
        return asdict(self)

    @property
    def changed(self) -> bool:
        """Whether anything differs (columns, samples, vocabularies or drifted statistics)."""
        s, c = self.samples, self.columns
        return bool(
            c["added"]
            or c["removed"]
            or c["retyped"]
            or s["added"]
            or s["removed"]
            or s.get("changed")
            or any(v["added"] or v["removed"] or v["moved"] for v in self.vocab.values())
            or any(d["drifted"] for d in self.drift)
        )

    def as_text(self, *, all_stats: bool = False) -> str:
        """A readable report (statistics: only the drifted columns unless ``all_stats``)."""
        s, c = self.samples, self.columns
        out = [
            (
                f"{self.kind}: {self.a} ({self.rows[0]:,} rows) -> {self.b} ({self.rows[1]:,} "
                "rows); samples keyed by "
                f"{self.keyed_by}"
            )
        ]
        out.append(
            f"columns: +{len(c['added'])} {c['added']}  -{len(c['removed'])} {c['removed']}  "
            f"retyped {len(c['retyped'])} {[f'{n}: {x} -> {y}' for n, x, y in c['retyped']]}"
        )
        out += _samples_text(s)
        out += [_vocab_text(name, v) for name, v in self.vocab.items()]
        drifted = [d for d in self.drift if d["drifted"]]
        out.append(
            f"statistics: {len(self.drift)} columns compared, {len(drifted)} drifted "
            f"(thresholds: mean {self.thresholds.mean_shift} std, median "
            f"{self.thresholds.quantile_shift} of "
            f"the 5-95% range, total variation {self.thresholds.tvd})"
        )
        out += [_drift_text(d) for d in (self.drift if all_stats else drifted)]
        out.append("no differences" if not self.changed else "differences found")
        return "\n".join(out)


def _examples(values: pa.Array | NDArray[Any], mask: NDArray[np.bool_]) -> list[Any]:
    idx = np.flatnonzero(mask)[:EXAMPLES]
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        out: list[Any] = values.take(pa.array(idx)).to_pylist()
        return out
    return [int(x) for x in np.asarray(values)[idx]]


def _samples(a: BuildSummary, b: BuildSummary, common: list[str]) -> tuple[str, dict[str, Any]]:
    if a.uids is not None and b.uids is not None and a.uid_column == b.uid_column:
        in_a, pos = _match(a.uids, b.uids, a.uid_hash, b.uid_hash, a.uid_order, b.uid_order)
        in_b = np.zeros(len(a.uids), dtype=bool)
        in_b[pos[in_a]] = True  # UIDs are unique within a build
        matched = np.flatnonzero(in_a)
        changed = np.zeros(len(matched), dtype=bool)
        by_column = {}
        rows_a = pos[matched]  # gathered once, not per column
        every = len(matched) == len(in_a)  # every UID of b is in a: b's hashes need no gather
        for c in common:
            diff = a.hashes[c][rows_a] != (b.hashes[c] if every else b.hashes[c][matched])
            if diff.any():
                by_column[c] = int(diff.sum())
            changed |= diff
        mask = np.zeros(len(in_a), dtype=bool)
        mask[matched[changed]] = True
        return f"uid column {a.uid_column!r}", {
            "added": int((~in_a).sum()),
            "removed": int((~in_b).sum()),
            "changed": int(changed.sum()),
            "unchanged": int(len(matched) - changed.sum()),
            "changed_by_column": by_column,
            "examples": {
                "added": _examples(b.uids, ~in_a),
                "removed": _examples(a.uids, ~in_b),
                "changed": _examples(b.uids, mask),
            },
        }
    ha, hb = _row_hashes(a, common), _row_hashes(b, common)
    ua, ca = np.unique(ha, return_counts=True)
    ub, cb = np.unique(hb, return_counts=True)
    values = np.union1d(ua, ub)
    na, nb = np.zeros(len(values), np.int64), np.zeros(len(values), np.int64)
    na[np.searchsorted(values, ua)] = ca
    nb[np.searchsorted(values, ub)] = cb
    more_b, more_a = values[nb > na], values[na > nb]
    out: dict[str, Any] = {
        "added": int(np.maximum(nb - na, 0).sum()),
        "removed": int(np.maximum(na - nb, 0).sum()),
        "changed_by_column": {},
        "examples": {
            "added": np.flatnonzero(np.isin(hb, more_b))[:EXAMPLES].tolist(),
            "removed": np.flatnonzero(np.isin(ha, more_a))[:EXAMPLES].tolist(),
        },
    }
    if len(ha) == len(hb):
        out["moved_rows"] = int((ha != hb).sum())
    return "row content (no UID column)", out


def _match(
    a: pa.Array,
    b: pa.Array,
    ha: NDArray[np.uint64] | None = None,
    hb: NDArray[np.uint64] | None = None,
    oa: NDArray[np.int64] | None = None,
    ob: NDArray[np.int64] | None = None,
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """For each UID of ``b``: whether ``a`` has it, and its row in ``a`` (0 when not).

    With the UIDs' cached hashes (``ha``, ``hb``) and their sorted orders (``oa``, ``ob``) the
    lookup is one merge of two sorted ``uint64`` arrays, and every match is then checked on the
    UIDs themselves; a UID whose match fails the check (a 64-bit collision) is looked up again by
    value, so the answer is exact.
    """
    if (
        ha is not None
        and hb is not None
        and len(ha) == len(a)
        and len(hb) == len(b)
        and not pat.is_integer(a.type)
    ):
        return _match_hashed(a, b, ha, hb, oa, ob)
    dense = _match_dense(a, b)
    if dense is not None:
        return dense
    where = pc.index_in(b, value_set=a)
    found = np.asarray(where.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return found, np.asarray(where.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _match_hashed(
    a: pa.Array,
    b: pa.Array,
    ha: NDArray[np.uint64],
    hb: NDArray[np.uint64],
    oa: NDArray[np.int64] | None,
    ob: NDArray[np.int64] | None,
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """:func:`_match` by one merge of the sorted hashes, every match checked on the UIDs."""
    oa = np.argsort(ha, kind="stable") if oa is None or len(oa) != len(a) else oa
    ob = np.argsort(hb, kind="stable") if ob is None or len(ob) != len(b) else ob
    sa, sb = ha[oa], hb[ob]
    i = np.searchsorted(sa, sb).clip(max=max(len(sa) - 1, 0))  # sorted keys: a merge
    hit = np.flatnonzero(sa[i] == sb) if len(sa) else np.zeros(0, np.int64)
    cand, at = ob[hit], oa[i[hit]]
    found = np.zeros(len(b), dtype=bool)
    pos = np.zeros(len(b), dtype=np.int64)
    found[cand], pos[cand] = True, at
    rows_b = np.flatnonzero(found)  # checked in b's order: only a's side is gathered at random
    left = b if len(rows_b) == len(b) else b.take(pa.array(rows_b))
    same = pc.equal(left, a.take(pa.array(pos[rows_b]))).fill_null(False)
    bad = rows_b[~np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)]
    if len(bad):
        again = pc.index_in(b.take(pa.array(bad)), value_set=a)
        found[bad] = np.asarray(again.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        pos[bad] = np.asarray(again.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    pos[~found] = 0
    return found, pos


def _match_dense(a: pa.Array, b: pa.Array) -> tuple[NDArray[np.bool_], NDArray[np.int64]] | None:
    """:func:`_match` of dense integer UIDs by a direct table (no hashing), or ``None``."""
    if not (pat.is_integer(a.type) and pat.is_integer(b.type) and len(a) and len(b)):
        return None
    if a.null_count or b.null_count:
        return None
    ua, ub = a.to_numpy(), b.to_numpy()
    lo, hi = min(int(ua.min()), int(ub.min())), max(int(ua.max()), int(ub.max()))
    if hi - lo > 4 * (len(ua) + len(ub)) + 1024:
        return None
    table = np.full(hi - lo + 1, -1, dtype=np.int64)
    table[ua - lo] = np.arange(len(ua), dtype=np.int64)
    pos = table[ub - lo]
    return pos >= 0, np.maximum(pos, 0)


def _row_hashes(s: BuildSummary, columns: list[str]) -> NDArray[np.uint64]:
    from datamill.lineage.rowhash import mix64

    h = np.zeros(s.rows, dtype=np.uint64)
    for c in columns:
        h = mix64(h * np.uint64(0x100000001B3) + s.hashes[c])
    return h


def _vocab_files(path: Path) -> dict[str, dict[str, Any]]:
    """Vocabularies found with a build: ``meta.json`` features with ``idx2str`` and ``vocab.json``
    files."""
    out: dict[str, dict[str, Any]] = {}
    cands = [
        path.with_suffix(".meta.json"),
        path / "meta.json",
        path / "vocab.json",
        path.parent / (path.name.removesuffix(".shards") + ".meta.json"),
    ]
    for p in cands:
        if not p.is_file():
            continue
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("idx2str"), list):
            out[p.name] = doc
        elif isinstance(doc, dict):
            for name, feat in doc.items():
                if isinstance(feat, dict) and isinstance(feat.get("idx2str"), list):
                    out[f"{name}"] = feat
    return out


def _vocab_diff(va: dict[str, Any], vb: dict[str, Any]) -> dict[str, Any]:
    a, b = [str(t) for t in va["idx2str"]], [str(t) for t in vb["idx2str"]]
    ia, ib = {t: i for i, t in enumerate(a)}, {t: i for i, t in enumerate(b)}
    added = [t for t in b if t not in ia]
    removed = [t for t in a if t not in ib]
    moved = [(t, ia[t], ib[t]) for t in b if t in ia and ia[t] != ib[t]]
    return {
        "size": [len(a), len(b)],
        "added": len(added),
        "removed": len(removed),
        "moved": len(moved),
        "examples": {
            "added": added[:EXAMPLES],
            "removed": removed[:EXAMPLES],
            "moved": [list(m) for m in moved[:EXAMPLES]],
        },
    }


def _drift(
    a: BuildSummary, b: BuildSummary, common: list[str], th: Thresholds
) -> list[dict[str, Any]]:
    out = []
    for c in common:
        sa, sb = a.stats.get(c), b.stats.get(c)
        if (
            not sa
            or not sb
            or sa["type"] != sb["type"]
            or not sa.get("count")
            or not sb.get("count")
        ):
            continue
        if sa["type"] == "number":
            spread = max(sa["q95"] - sa["q05"], 1e-12)
            mean_shift = (sb["mean"] - sa["mean"]) / max(sa["std"], 1e-12)
            q_shift = (sb["q50"] - sa["q50"]) / spread
            out.append(
                {
                    "column": c,
                    "type": "number",
                    "a": sa,
                    "b": sb,
                    "mean_shift": mean_shift,
                    "median_shift": q_shift,
                    "drifted": bool(
                        abs(mean_shift) > th.mean_shift or abs(q_shift) > th.quantile_shift
                    ),
                }
            )
        elif sa.get("shares") is not None and sb.get("shares") is not None:
            keys = set(sa["shares"]) | set(sb["shares"])
            tvd = 0.5 * sum(abs(sa["shares"].get(k, 0.0) - sb["shares"].get(k, 0.0)) for k in keys)
            out.append(
                {
                    "column": c,
                    "type": "category",
                    "a": {"top": sa["top"], "distinct": sa["distinct"]},
                    "b": {"top": sb["top"], "distinct": sb["distinct"]},
                    "tvd": tvd,
                    "drifted": bool(tvd > th.tvd),
                }
            )
    return out


def _column_changes(sa: BuildSummary, sb: BuildSummary) -> tuple[list[str], dict[str, Any]]:
    """The columns both builds have with one type, and the added, removed and retyped ones."""
    cols_a = [c for c in sa.schema if c != sa.uid_column]
    cols_b = [c for c in sb.schema if c != sb.uid_column]
    common = [c for c in cols_a if c in cols_b and sa.schema[c] == sb.schema[c]]
    return common, {
        "added": [c for c in cols_b if c not in sa.schema],
        "removed": [c for c in cols_a if c not in sb.schema],
        "retyped": [
            [c, sa.schema[c], sb.schema[c]]
            for c in cols_a
            if c in sb.schema and sa.schema[c] != sb.schema[c]
        ],
    }


def _vocab_changes(va: dict[str, Any], vb: dict[str, Any]) -> dict[str, Any]:
    """Per vocabulary file: the diff when both builds have it, else its whole size added or
    removed."""
    vocab = {n: _vocab_diff(va[n], vb[n]) for n in va if n in vb}
    for n in set(va) ^ set(vb):
        size_a = len(va[n]["idx2str"]) if n in va else 0
        size_b = len(vb[n]["idx2str"]) if n in vb else 0
        vocab[n] = {
            "size": [size_a, size_b],
            "added": size_b,
            "removed": size_a,
            "moved": 0,
            "examples": {"added": [], "removed": [], "moved": []},
        }
    return vocab


def diff(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    /,
    *,
    thresholds: Thresholds | None = None,
    cache: bool = True,
) -> DiffReport:
    """Compare two builds of the same kind (see the module docstring).

    Args:
        a: the old build (a path :func:`datamill.sources.open_source` opens).
        b: the new build.
        thresholds: when statistics count as drifted. Defaults to ``None`` (:class:`Thresholds`).
        cache: keep and reuse each build's row hashes and statistics. Defaults to ``True``.

    Raises:
        ConfigError: the builds are of different kinds.
    """
    from datamill.sources import open_source

    sa_src, sb_src = open_source(a), open_source(b)
    if type(sa_src) is not type(sb_src):
        raise ConfigError(
            f"{a} is a {type(sa_src).__name__} and {b} a {type(sb_src).__name__}; diff compares "
            "two "
            "builds of the same kind",
            path=os.fspath(b),
        )
    sa = summarize(sa_src, cache=cache, location=a)
    sb = summarize(sb_src, cache=cache, location=b)
    th = thresholds or Thresholds()
    common, columns = _column_changes(sa, sb)
    keyed, samples = _samples(sa, sb, common)
    vocab = _vocab_changes(_vocab_files(Path(a)), _vocab_files(Path(b)))
    return DiffReport(
        sa.kind,
        os.fspath(a),
        os.fspath(b),
        (sa.rows, sb.rows),
        keyed,
        columns,
        samples,
        dict(sorted(vocab.items())),
        _drift(sa, sb, common, th),
        th,
    )
