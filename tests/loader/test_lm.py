"""Language-model batches: packing keeps every token once with boundaries marked, schedule windows
within one unit, balance within 2 %, and exact resume from any world size with everything on."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections import defaultdict
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, ResumeStateError
from datamill.core.source import TableSource
from datamill.loader import Batching, Loader, Mix, Packing, Schedule, Workers
from datamill.loader.balance import cost_function, deal, imbalance, round_robin, unit_costs
from datamill.loader.balance import lower_bound as balance_bound
from datamill.loader.lm import LMLoader
from datamill.loader.packing import IGNORE_INDEX, best_fit, collate_units, cut_stream, pack_window

SPAN = 1 << 20
"""Token ``d * SPAN + j`` is token ``j`` of document ``d`` (every token names its place)."""


def token_table(lengths: np.ndarray, *, base: int = 0) -> pa.Table:
    """Documents whose tokens name (document, position); plus a ``lang`` column to filter on."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    doc = np.repeat(np.arange(len(lengths)), lengths)
    values = (base + doc) * SPAN + (np.arange(offsets[-1]) - offsets[doc])
    tokens = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.int64()))
    return pa.table({"tokens": tokens, "lang": pa.array(np.arange(len(lengths)) % 5 != 0)})


def long_tail(
    n: int, seed: int, *, mu: float = 2.0, sigma: float = 1.0, cap: int = 80
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(mu, sigma, n).astype(np.int64) + 1, cap)


def keep_lang(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("lang").to_numpy(zero_copy_only=False), dtype=bool)


# ----------------------------------------------------------------------------------- packing
@given(
    lengths=st.lists(st.integers(0, 70), min_size=0, max_size=120),
    seq_len=st.integers(1, 40),
    split=st.sampled_from(["chunk", "drop"]),
    seed=st.integers(0, 2**32),
)
def test_best_fit_covers_every_token_once_and_fits(
    lengths: list[int], seq_len: int, split: str, seed: int
) -> None:
    ln = np.array(lengths, dtype=np.int64)
    units = pack_window(
        ln,
        packing=Packing(seq_len=seq_len, split_long=split),
        rng=np.random.default_rng(seed),  # type: ignore[arg-type]
    )
    assert (units.tokens() <= seq_len).all() and (units.tokens() > 0).all()
    covered: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for d, s, n in zip(units.seg_doc, units.seg_start, units.seg_len):
        covered[int(d)].append((int(s), int(n)))
    for d, n in enumerate(lengths):
        if split == "drop" and n > seq_len or n == 0:
            assert d not in covered
            continue
        pieces = sorted(covered[d])
        assert sum(p[1] for p in pieces) == n and pieces[0][0] == 0
        assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(pieces))


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=200), cap=st.integers(50, 80))
def test_best_fit_is_best_fit_decreasing(sizes: list[int], cap: int) -> None:
    bins, n = best_fit(np.array(sizes), capacity=cap)
    load = np.bincount(bins, weights=sizes, minlength=n)
    assert (load <= cap).all() and n >= math.ceil(sum(sizes) / cap)
    assert n <= max(1, 2 * math.ceil(sum(sizes) / cap))  # BFD never wastes half of every bin


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    seq_len=st.integers(1, 20),
    first=st.integers(0, 10),
)
def test_concat_cuts_the_stream_exactly(lengths: list[int], seq_len: int, first: int) -> None:
    ln = np.array(lengths, dtype=np.int64)
    first = min(first, int(ln.sum()))
    u = cut_stream(
        np.arange(len(ln)), np.zeros(len(ln), np.int64), ln, seq_len=seq_len, first=first
    )
    assert len(u) == (int(ln.sum()) - first) // seq_len
    assert (u.tokens() == seq_len).all()
    flat = [
        (int(d), int(s) + k) for d, s, n in zip(u.seg_doc, u.seg_start, u.seg_len) for k in range(n)
    ]
    stream = [(d, j) for d, n in enumerate(lengths) for j in range(n)][first:]
    assert flat == stream[: len(flat)]


@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    seq_len=st.integers(2, 24),
    mask=st.booleans(),
)
def test_collate_marks_boundaries(lengths: list[int], seq_len: int, mask: bool) -> None:
    ln = np.array(lengths, dtype=np.int64)
    values = token_table(ln).column("tokens").combine_chunks()
    vals, offs = values.values.to_numpy(), np.asarray(values.offsets, dtype=np.int64)
    units = pack_window(ln, packing=Packing(seq_len=seq_len), rng=np.random.default_rng(0))
    out = collate_units(units, offs, vals, width=seq_len, mask_boundaries=mask)
    ids, lab, pos, seg = (out[k] for k in ("input_ids", "labels", "position_ids", "segment_ids"))
    real = seg > 0
    assert int(real.sum()) == int(ln.sum())
    assert (ids[~real] == 0).all() and (lab[~real] == IGNORE_INDEX).all()
    doc, j = ids // SPAN, ids % SPAN
    same = real[:, 1:] & (seg[:, 1:] == seg[:, :-1])
    # inside a segment: the next token of the same document, positions counting up from 0
    assert (doc[:, 1:][same] == doc[:, :-1][same]).all() and (
        j[:, 1:][same] == j[:, :-1][same] + 1
    ).all()
    assert (pos[:, 1:][same] == pos[:, :-1][same] + 1).all()
    starts = real & np.concatenate(
        [np.ones((len(seg), 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1
    )
    assert (pos[starts] == 0).all()
    assert (lab[:, :-1][same] == ids[:, 1:][same]).all()
    ends = real[:, :-1] & ~same
    if mask:
        assert (lab[:, :-1][ends] == IGNORE_INDEX).all() and (lab[:, -1] == IGNORE_INDEX).all()


def test_best_fit_padding_on_wikitext_like_lengths(data_dir: Any) -> None:
    """WikiText-2 articles' real lengths (words), repeated: best_fit pads <= 1 % at window 1000."""
    text = (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8")
    import re

    arts = [a for a in re.split(r"\n = [^=\n]+ = \n", text) if a.strip()]
    real = np.array([len(a.split()) for a in arts])
    ln = np.random.default_rng(0).choice(real, 20_000)
    toks = slots = 0
    for w in range(0, len(ln), 1000):
        u = pack_window(
            ln[w : w + 1000], packing=Packing(seq_len=512), rng=np.random.default_rng(w)
        )
        toks, slots = toks + int(u.tokens().sum()), slots + 512 * len(u)
    assert toks == int(ln.sum()) and 1 - toks / slots <= 0.01


# ----------------------------------------------------------------------------------- schedule
@given(
    w0=st.integers(0, 9),
    w1=st.integers(0, 9),
    change=st.integers(1, 30),
    batch=st.integers(1, 40),
    linear=st.booleans(),
)
def test_two_source_schedule_windows_within_one(
    w0: int, w1: int, change: int, batch: int, linear: bool
) -> None:
    sched = Schedule(
        [(0, {"a": w0 + 0.5, "b": 9.5 - w0}), (change, {"a": w1 + 0.25, "b": 9.75 - w1})],
        interpolation="linear" if linear else "constant",
    )
    counts, got = [0, 0], [[0, 0]]
    for step in range(50):
        q = sched.quotas(step, counts, global_batch=batch)
        assert sum(q) == batch and all(v >= 0 for v in q)
        counts = [c + v for c, v in zip(counts, q)]
        got.append(list(counts))
    target = [[batch * c for c in sched.cumulative(s)] for s in range(51)]
    for i in range(2):
        dev = [Fraction(got[s][i]) - target[s][i] for s in range(51)]
        assert max(dev) - min(dev) <= 1  # so every window of steps is within one unit


def test_schedule_errors() -> None:
    with pytest.raises(ConfigError):
        Schedule([(5, {"a": 1})])
    with pytest.raises(ConfigError):
        Schedule([(0, {"a": 1}), (3, {"b": 1})])
    with pytest.raises(ConfigError):
        Schedule([(0, {"a": 0})])
    with pytest.raises(ConfigError):
        Mix(
            [(TableSource(token_table(np.ones(3, int))), 1)],
            names=["x"],
            schedule=Schedule([(0, {"y": 1})]),
        )


# ----------------------------------------------------------------------------------- balance
def lower_bound(costs: np.ndarray, *, world: int, per: int) -> float:
    """max/mean no deal of ``per`` units per rank beats (one step)."""
    return float(balance_bound(costs[None, :], world_size=world)[0])


@functools.lru_cache(maxsize=4)
def packed_costs(kind: str) -> np.ndarray:
    """The costs of the sequences (2,048 slots) best_fit packs from 40,000 long-tailed documents."""
    docs = long_tail(40_000, 11, mu=5.0, sigma=1.2, cap=50_000)
    cost, rng, out = cost_function(kind), np.random.default_rng(0), []
    for w in range(0, len(docs), 1000):
        u = pack_window(docs[w : w + 1000], packing=Packing(seq_len=2048), rng=rng)
        out.append(unit_costs(u.unit_ptr, u.seg_len, cost))
    return np.concatenate(out)


@given(
    shape=st.sampled_from([(2, 16), (4, 32), (8, 16), (16, 16), (64, 4), (64, 8)]),
    kind=st.sampled_from(["tokens", "tokens_squared"]),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=10)
def test_balance_packed_sequences_within_two_percent(
    shape: tuple[int, int], kind: str, seed: int
) -> None:
    """Every step's packed sequences dealt with max/mean cost <= 1.02 (where equal counts allow it;
    8 or more sequences per rank), deterministic."""
    world, per = shape
    c = np.random.default_rng(seed).permutation(packed_costs(kind))
    steps = min(200, len(c) // (world * per))
    c = c[: steps * world * per].reshape(steps, world * per)
    ranks = deal(c, world_size=world, rng=np.random.default_rng(seed))
    again = deal(c, world_size=world, rng=np.random.default_rng(seed))
    assert (ranks == again).all()
    for s in range(steps):
        assert (np.bincount(ranks[s], minlength=world) == per).all()
        # with equal counts a sequence left short at the end of a packing window can make 1.02
        # unreachable: then the deal must be within 0.5 % of the lower bound
        bound = lower_bound(c[s], world=world, per=per)
        # 4 per rank on 64 ranks: a third of the sequences are one 2,048-token document (cost
        # 0.65 of a rank's mean), too coarse for the local search to reach 1.02 in every step
        goal = 1.04 if (world, per) == (64, 4) else 1.02
        assert imbalance(c[s], ranks[s], world_size=world) <= max(goal, bound * 1.005)
    rr = [
        imbalance(c[s], round_robin(world * per, world_size=world), world_size=world)
        for s in range(steps)
    ]
    assert kind == "tokens" or np.mean(rr) > 1.02


# ----------------------------------------------------------------------------------- the loader
def lm_mix(*, seed: int = 0) -> Mix:
    a = TableSource(token_table(long_tail(400, seed)), shard_size=64)
    b = TableSource(token_table(long_tail(250, seed + 1, mu=2.5), base=10_000), shard_size=50)
    sched = Schedule(
        [(0, {"a": 0.7, "b": 0.3}), (3, {"a": 0.25, "b": 0.75})], interpolation="linear"
    )
    return Mix([(a, 0.7), (b, 0.3)], names=["a", "b"], schedule=sched)


def make(
    mix: Mix,
    *,
    world: int,
    rank: int,
    global_batch: int,
    strategy: str = "best_fit",
    threads: int = 0,
) -> LMLoader:
    ld = Loader(
        mix,
        global_batch // world,
        seed=7,
        rank=rank,
        world_size=world,
        packing=Packing(seq_len=12, strategy=strategy, window=40),  # type: ignore[arg-type]
        balance="tokens_squared",
        batching=Batching(filter=keep_lang),
        workers=Workers(threads=threads),
    )
    assert isinstance(ld, LMLoader)
    return ld


def digests(loaders: list[LMLoader], steps: int) -> list[str]:
    """Per global step: a hash of the global batch (every rank's rows in global order)."""
    its = [iter(ld) for ld in loaders]
    out = []
    for _ in range(steps):
        parts = [next(it) for it in its]
        idx = np.concatenate([p["global_index"] for p in parts])
        order = np.argsort(idx)
        assert (idx[order] == np.arange(len(idx))).all()
        h = hashlib.sha256()
        for key in ("input_ids", "labels", "position_ids", "segment_ids", "source"):
            h.update(np.ascontiguousarray(np.concatenate([p[key] for p in parts])[order]).tobytes())
        out.append(h.hexdigest())
    return out


_REFERENCE: dict[tuple[int, str], list[str]] = {}


def reference(global_batch: int, strategy: str, steps: int) -> list[str]:
    key = (global_batch, strategy)
    if key not in _REFERENCE or len(_REFERENCE[key]) < steps:
        _REFERENCE[key] = digests(
            [make(lm_mix(), world=1, rank=0, global_batch=global_batch, strategy=strategy)], steps
        )
    return _REFERENCE[key][:steps]


@given(
    n=st.integers(1, 64),
    m=st.integers(1, 64),
    stop=st.integers(0, 5),
    strategy=st.sampled_from(["best_fit", "concat"]),
)
@example(n=64, m=1, stop=2, strategy="best_fit")
@example(n=1, m=64, stop=4, strategy="concat")
@example(n=48, m=64, stop=3, strategy="best_fit")
@settings(max_examples=6)
def test_resume_n_to_m_ranks_is_byte_identical(n: int, m: int, stop: int, strategy: str) -> None:
    """Packing + schedule (crossing its change) + filter + balance, saved with N ranks at step s and
    resumed with M (other threads too): the global batches from s + 1 on equal the unbroken run."""
    if math.lcm(n, m) > 192:  # keep the example cheap: world sizes dividing 192 instead
        n, m = math.gcd(n, 192), math.gcd(m, 192)
    g = math.lcm(n, m)
    while g < 8:
        g *= 2
    after = 3
    want = reference(g, strategy, stop + after)
    mix = lm_mix()
    old = [make(mix, world=n, rank=r, global_batch=g, strategy=strategy) for r in range(n)]
    assert digests(old, stop) == want[:stop]
    states = [json.loads(json.dumps(ld.state_dict())) for ld in old]
    assert all(len(json.dumps(s)) <= 4096 for s in states)
    new = [
        make(lm_mix(), world=m, rank=r, global_batch=g, strategy=strategy, threads=2)
        for r in range(m)
    ]
    for ld in new:
        ld.load_state_dict(states)
    assert digests(new, after) == want[stop:]


def test_state_is_small_and_independent_of_dataset_size() -> None:
    small = make(lm_mix(), world=2, rank=0, global_batch=8)
    next(iter(small))
    big_a = TableSource(token_table(long_tail(20_000, 3)), shard_size=1000)
    big = Loader(big_a, 4, packing=Packing(seq_len=12), world_size=2, balance="tokens")
    next(iter(big))
    assert len(json.dumps(small.state_dict())) <= 4096 and len(json.dumps(big.state_dict())) <= 4096
    assert set(small.state_dict()) == set(big.state_dict())


def test_resume_refuses_other_global_batch_or_schedule() -> None:
    ld = make(lm_mix(), world=2, rank=0, global_batch=8)
    next(iter(ld))
    st = ld.state_dict()
    with pytest.raises(ResumeStateError) as info:
        make(lm_mix(), world=2, rank=0, global_batch=16).load_state_dict(st)
    assert "global_batch" in str(info.value)
    other = lm_mix()
    other.schedule = Schedule([(0, {"a": 0.5, "b": 0.5})])
    with pytest.raises(ResumeStateError, match="schedule"):
        make(other, world=2, rank=0, global_batch=8).load_state_dict(st)


def test_schedule_change_neither_repeats_nor_skips_a_source_sample() -> None:
    """Across the schedule's change each source's units are its stream in order, whatever the
    weights: the same units as a run with other weights, just consumed at another pace."""
    ld = make(lm_mix(), world=1, rank=0, global_batch=8)
    seen: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    pos, taken = ld.positions, ld.taken
    for step in range(12):
        plan = ld.plan_step(step, pos, taken)
        for u in range(8):
            for src, _, sample, start, n in plan.segments(u):
                seen[src].append((sample, start, n, step))
        pos = [tuple(p) for p in plan.after["sources"]]  # type: ignore[misc]
        taken = plan.after["taken"]
    for src, segs in seen.items():
        keys = [(s, a) for s, a, _, _ in segs]
        assert len(keys) == len(set(keys)), f"source {src} repeated a document piece"


@given(
    seed=st.integers(0, 2**16),
    seq_len=st.integers(2, 40),
    window=st.integers(4, 120),
    strategy=st.sampled_from(["best_fit", "concat"]),
    split=st.sampled_from(["chunk", "drop"]),
    world=st.integers(1, 4),
)
@settings(max_examples=15)
def test_epoch_covers_every_kept_token_once(
    seed: int, seq_len: int, window: int, strategy: str, split: str, world: int
) -> None:
    """One source, a filter, balanced: each epoch's sequences hold every token of every kept
    document exactly once (none of the filtered ones; with split_long="drop" none of the longer
    ones under best_fit), and the rows' tokens are those pieces, in order."""
    lengths = long_tail(150, seed)
    table = token_table(lengths)
    ld = Loader(
        TableSource(table, shard_size=40),
        2,
        world_size=world,
        seed=seed,
        packing=Packing(seq_len=seq_len, window=window, strategy=strategy, split_long=split),  # type: ignore[arg-type]
        balance="tokens",
        batching=Batching(filter=keep_lang),
    )
    keep = keep_lang(table)
    if strategy == "best_fit" and split == "drop":
        keep &= lengths <= seq_len
    want = {int(v) for d in np.flatnonzero(keep) for v in d * SPAN + np.arange(lengths[d])}
    pos, taken, got = ld.positions, ld.taken, []
    while True:
        plan = ld.plan_step(ld.step, pos, taken)
        ld.step += 1
        for u in range(2 * world):
            got += [(e, s * SPAN + a + k) for _, e, s, a, n in plan.segments(u) for k in range(n)]
        rows = ld.build(plan)  # rank 0's rows: the tokens of their units' pieces, in order
        for i, g in enumerate(rows["global_index"]):
            real = rows["segment_ids"][i] > 0
            pieces = [s * SPAN + a + k for _, _, s, a, n in plan.segments(int(g)) for k in range(n)]
            assert rows["input_ids"][i][real].tolist() == pieces
            inner = real[:-1] & (rows["segment_ids"][i][1:] == rows["segment_ids"][i][:-1])
            assert (rows["labels"][i][:-1][inner] == rows["input_ids"][i][1:][inner]).all()
            assert (rows["labels"][i][:-1][~inner] == IGNORE_INDEX).all()
        pos, taken = [tuple(p) for p in plan.after["sources"]], plan.after["taken"]  # type: ignore[misc]
        if pos[0][0] >= 1:
            break
    first = [t for e, t in got if e == 0]
    assert len(first) == len(set(first)) and set(first) == want


def test_batches_carry_the_documents_tokens() -> None:
    ld = make(lm_mix(), world=2, rank=1, global_batch=8)
    batch = next(iter(ld))
    ids, seg = batch["input_ids"], batch["segment_ids"]
    assert ids.shape == (4, 12) and batch["global_index"].shape == (4,)
    doc = np.where(seg > 0, ids // SPAN, -1)
    for row in range(4):
        for s in range(1, int(seg[row].max()) + 1):
            assert len(set(doc[row][seg[row] == s].tolist())) == 1


def test_unpacked_balance_and_torch() -> None:
    torch = pytest.importorskip("torch")
    src = TableSource(token_table(long_tail(200, 1)), shard_size=64)
    ld = Loader(src, 4, balance="tokens", world_size=2, rank=0, collate="torch", seed=2)
    b = next(iter(ld))
    assert isinstance(b["input_ids"], torch.Tensor) and b["input_ids"].dtype == torch.int64
    assert b["input_ids"].shape[0] == 4


def test_bad_arguments() -> None:
    src = TableSource(token_table(np.ones(5, int)))
    with pytest.raises(ConfigError):
        Packing(seq_len=0)
    with pytest.raises(ConfigError):
        Packing(seq_len=8, strategy="first_fit")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Loader(src, 2, balance="flops")
    with pytest.raises(ConfigError):
        Loader(src, 2, packing=512)  # type: ignore[arg-type]
    st = Loader(src, 2, packing=Packing(seq_len=4)).state_dict()
    with pytest.raises(ResumeStateError):
        Loader(src, 2, packing=Packing(seq_len=4)).load_state_dict({**st, "sources": [[0, 0]]})


def test_concat_steps_use_every_slot() -> None:
    src = TableSource(token_table(long_tail(200, 2)), shard_size=64)
    ld = Loader(src, 4, packing=Packing(seq_len=16, strategy="concat"), seed=1)
    for b in itertools.islice(iter(ld), 5):
        assert (b["segment_ids"] > 0).all()


def test_trace_maps_each_packed_sequence_to_its_documents() -> None:
    from datamill.loader.lm_trace import trace_lm

    mix = lm_mix()
    loaders = [make(mix, world=2, rank=r, global_batch=8) for r in range(2)]
    its = [iter(ld) for ld in loaders]
    batches = [[next(it) for it in its] for _ in range(3)]
    record = json.loads(json.dumps(loaders[0].run_record()))
    assert record["until"]["step"] == 3
    rows = trace_lm(record, lm_mix(), step=2, filter=keep_lang, balance="tokens_squared")
    by_global = {
        int(g): (r, i) for r, b in enumerate(batches[2]) for i, g in enumerate(b["global_index"])
    }
    for row in rows:
        r, i = by_global[row["global_index"]]
        assert row["rank"] == r
        ids = batches[2][r]["input_ids"][i][batches[2][r]["segment_ids"][i] > 0]
        base = 10_000 if row["source"] == "b" else 0
        want = [
            (base + d["sample"]) * SPAN + d["start"] + k
            for d in row["documents"]
            for k in range(d["length"])
        ]
        assert ids.tolist() == want


def test_trace_cli_lists_a_steps_sequences(tmp_path: Any, capsys: Any) -> None:
    import pyarrow.parquet as pq

    from datamill.cli import main
    from datamill.core.parquet import ParquetSource

    path = tmp_path / "docs.parquet"
    pq.write_table(token_table(long_tail(120, 9)).select(["tokens"]), path)
    ld = Loader(ParquetSource(str(path)), 2, packing=Packing(seq_len=16, window=50), seed=3)
    first = [next(iter(ld))["input_ids"] for _ in range(2)]
    (tmp_path / "run.json").write_text(json.dumps(ld.run_record()))
    assert (
        main(["trace", str(tmp_path / "run.json"), "--source", str(path), "--step", "1", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["sequences"]) == 2 and first[1].shape == (2, 16)
    doc = out["sequences"][0]["documents"][0]
    assert first[1][0][0] == doc["sample"] * SPAN + doc["start"]


def test_lm_loader_pickles_mid_run() -> None:
    import pickle

    ld = make(lm_mix(), world=2, rank=1, global_batch=8)
    it = iter(ld)
    next(it)
    clone = pickle.loads(pickle.dumps(ld))  # what a spawned worker process does
    for a, b in zip(itertools.islice(iter(clone), 2), itertools.islice(it, 2)):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_explicit_none_keeps_the_plain_loader() -> None:
    src = TableSource(token_table(np.ones(4, int)))
    assert type(Loader(src, 2, packing=None, balance=None)).__name__ == "Loader"


def deviations(sched: Schedule, *, batch: int, steps: int) -> list[list[Fraction]]:
    """Each source's units taken minus its cumulative target after each of ``steps`` steps
    (checking every step's quotas: floor or ceil of the step's target, summing to ``batch``)."""
    counts = [0] * len(sched.names)
    dev = [[Fraction(0)] for _ in counts]
    for step in range(steps):
        q = sched.quotas(step, counts, global_batch=batch)
        x = [batch * w for w in sched.weights(step)]
        assert sum(q) == batch and all(abs(a - b) < 1 for a, b in zip(q, x))
        counts = [c + v for c, v in zip(counts, q)]
        for d, c, t in zip(dev, counts, sched.cumulative(step + 1)):
            d.append(c - batch * t)
    return dev


@given(
    points=st.lists(
        st.tuples(st.integers(1, 12), st.lists(st.integers(0, 40), min_size=8, max_size=8)),
        min_size=1,
        max_size=4,
    ),
    n=st.integers(2, 8),
    batch=st.integers(1, 40),
    linear=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_schedule_windows_for_two_to_eight_sources(
    points: list[tuple[int, list[int]]], n: int, batch: int, linear: bool
) -> None:
    """Every prefix of steps within one unit of its target, so every window within two (one with
    two sources); every step within one unit (the quotas floor or ceil of their targets)."""
    names = [f"s{i}" for i in range(n)]
    pts, step = [], 0
    for gap, ws in points:
        w = [v + 0.1 * (k % 3) for k, v in enumerate(ws[:n])]
        pts.append((step, dict(zip(names, w))))
        step += gap
    sched = Schedule(pts, interpolation="linear" if linear else "constant")
    for d in deviations(sched, batch=batch, steps=step + 8):
        assert max(abs(v) for v in d) < 1
        assert max(d) - min(d) <= (1 if n == 2 else Fraction(2) - Fraction(1, 10**9))


def window_feasible(sched: Schedule, *, batch: int, steps: int) -> bool:
    """Whether ANY quotas keep every window of steps within one unit of its target: an exact
    search over each source's (deviation - its minimum, its maximum - deviation) so far, keeping
    only the states no other state dominates."""
    n = len(sched.names)
    x = [[batch * w for w in sched.weights(s)] for s in range(steps)]
    den = math.lcm(*(v.denominator for row in x for v in row))
    xs = [[int(v * den) for v in row] for row in x]
    deals = [a for a in itertools.product(range(batch + 1), repeat=n) if sum(a) == batch]
    states: set[tuple[int, ...]] = {(0,) * (2 * n)}
    for row in xs:
        nxt = set()
        for s, a in itertools.product(states, deals):
            d = [a[i] * den - row[i] for i in range(n)]
            u = [max(0, s[2 * i] + d[i]) for i in range(n)]
            v = [max(0, s[2 * i + 1] - d[i]) for i in range(n)]
            if all(p + q <= den for p, q in zip(u, v)):
                nxt.add(tuple(val for pair in zip(u, v) for val in pair))
        states = {s for s in nxt if not any(o != s and all(map(int.__le__, o, s)) for o in nxt)}
        if not states:
            return False
    return True


def test_no_quotas_keep_every_window_within_one_for_three_sources() -> None:
    """A piecewise-constant schedule of three sources (global batch 2) where no rounding at all
    keeps every window within one unit: the exact search finds none, so the guarantee for three
    or more sources is the one above (windows within two)."""
    segs = [((1, 7, 1), 1), ((2, 7, 0), 6), ((3, 1, 5), 7), ((2, 0, 7), 8), ((4, 5, 0), 3)]
    pts, step = [], 0
    for w, k in segs:
        pts.append((step, dict(zip("abc", w))))
        step += k
    sched = Schedule(pts)
    assert not window_feasible(sched, batch=2, steps=step)
    assert window_feasible(Schedule(pts[:2]), batch=2, steps=step)  # the search can succeed
    assert max(max(d) - min(d) for d in deviations(sched, batch=2, steps=step)) < 2


class StepsOf:
    """An LMLoader seen in "epochs" of ``steps`` global steps, for the shared resume harness."""

    def __init__(self, loader: LMLoader, steps: int) -> None:
        self.loader, self.steps = loader, steps

    def __iter__(self) -> Any:
        it = iter(self.loader)
        while True:
            yield next(it)
            if self.loader.state_dict()["step"] % self.steps == 0:
                return

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()


@pytest.mark.parametrize(("strategy", "threads"), [("best_fit", 0), ("concat", 0), ("best_fit", 2)])
def test_check_resume_contract(strategy: str, threads: int) -> None:
    from tests.contracts import check_resume

    def fresh(state: dict[str, Any] | None) -> StepsOf:
        ld = make(lm_mix(), world=2, rank=1, global_batch=8, strategy=strategy, threads=threads)
        if state is not None:
            ld.load_state_dict(state)
        return StepsOf(ld, 4)

    check_resume(fresh, 2)
