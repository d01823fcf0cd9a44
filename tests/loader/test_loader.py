"""The Loader: every sample once over ranks, same batches for any worker count, exact resumption,
filters/transforms accounting, errors."""

from __future__ import annotations

import inspect
import itertools
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.core.errors import ConfigError, DataFileError, ResumeStateError, SchemaError
from datamill.core.source import TableSource
from datamill.loader import Batching, Loader, Workers, per_sample
from tests.contracts import assert_same_items, check_resume
from tests.strategies import FakeSource, batch_sizes, seeds, shard_sizes, world_sizes


def xs(loader: Loader) -> list[list[int]]:
    return [b["x"].tolist() for b in loader]


@given(
    sizes=shard_sizes(),
    bs=batch_sizes,
    world=world_sizes,
    workers=st.integers(0, 3),
    seed=seeds,
    window=st.one_of(st.none(), st.integers(1, 4)),
    drop_last=st.booleans(),
)
def test_union_over_ranks_is_a_permutation_for_any_workers(
    sizes: list[int],
    bs: int,
    world: int,
    workers: int,
    seed: int,
    window: int | None,
    drop_last: bool,
) -> None:
    src = FakeSource(sizes)
    n = sum(sizes)
    per_rank = [
        xs(
            Loader(
                src,
                bs,
                seed=seed,
                rank=r,
                world_size=world,
                batching=Batching(window=window, drop_last=drop_last),
                workers=Workers(threads=workers),
            )
        )
        for r in range(world)
    ]
    got = [x for batches in per_rank for b in batches for x in b]
    assert len(got) == len(set(got))  # no duplicate
    if drop_last:
        assert len({len(b) for b in per_rank}) <= 1  # every rank the same number of batches
        assert all(len(b) == bs for batches in per_rank for b in batches)
    else:
        assert sorted(got) == list(range(n))  # no loss
    # the batches do not depend on the number of workers
    assert per_rank[0] == xs(
        Loader(
            src,
            bs,
            seed=seed,
            rank=0,
            world_size=world,
            batching=Batching(window=window, drop_last=drop_last),
            workers=Workers(threads=(workers + 1) % 4),
        )
    )


@given(
    sizes=shard_sizes(max_shards=8),
    bs=batch_sizes,
    seed=seeds,
    workers=st.integers(0, 2),
    resume_workers=st.integers(0, 2),
    data=st.data(),
)
@settings(max_examples=20)
def test_resume_from_any_batch_equals_uninterrupted(
    sizes: list[int], bs: int, seed: int, workers: int, resume_workers: int, data: st.DataObject
) -> None:
    src = FakeSource(sizes)
    total = len(Loader(src, bs))
    midpoint = data.draw(st.integers(0, total), label="midpoint")

    def make(state: dict[str, Any] | None) -> Loader:
        if state is None:
            return Loader(
                src, bs, seed=seed, batching=Batching(window=2), workers=Workers(threads=workers)
            )
        return Loader.from_state(src, state, workers=Workers(threads=resume_workers))

    check_resume(make, midpoint)


def test_two_epochs_differ_and_set_epoch_replays() -> None:
    src = FakeSource([50, 30, 70, 20])
    loader = Loader(src, 16, seed=3)
    e0, e1 = xs(loader), xs(loader)
    assert e0 != e1 and sorted(itertools.chain.from_iterable(e0)) == sorted(
        itertools.chain.from_iterable(e1)
    ) == list(range(170))
    loader.set_epoch(0)
    assert xs(loader) == e0
    assert xs(Loader(src, 16, seed=3, epoch=1)) == e1


def test_reads_each_shard_once_per_epoch_and_skips_consumed_shards_on_resume() -> None:
    src = FakeSource([40] * 10)
    loader = Loader(src, 8, seed=0, batching=Batching(window=2), workers=Workers(prefetch=3))
    it = iter(loader)
    for _ in range(26):  # past the first window (80 samples = 10 batches) and the second
        next(it)
    state = loader.state_dict()
    it.close()
    assert src.reads.max() == 1
    src.reads[:] = 0
    list(Loader.from_state(src, state))
    assert src.reads.sum() == 10 - 4  # the first two windows (4 shards) are not read again


def test_collate_numpy_layout() -> None:
    batch = next(iter(Loader(FakeSource([5, 3]), 8, batching=Batching(shuffle=False))))
    assert batch["x"].dtype == np.int64 and batch["x"].tolist() == list(range(8))
    assert batch["vec"].shape == (8, 2) and batch["vec"][3].tolist() == [3, -3]
    assert batch["ids"].shape == (8, 3) and batch["ids_mask"].sum(axis=1).tolist() == [
        i % 4 for i in range(8)
    ]
    assert batch["ids"][7].tolist() == [7, 7, 7] and batch["ids"][5].tolist() == [5, 0, 0]
    assert batch["uid"].dtype == object and batch["uid"][2] == "u2"


def test_columns_collate_callable_and_arrow() -> None:
    src = FakeSource([6])
    b = next(
        iter(
            Loader(
                src, 4, columns="x", collate=lambda t: t.num_rows, batching=Batching(shuffle=False)
            )
        )
    )
    assert b == 4
    t = next(
        iter(
            Loader(src, 4, columns=["uid", "x"], collate="arrow", batching=Batching(shuffle=False))
        )
    )
    assert isinstance(t, pa.Table) and t.column_names == ["uid", "x"]


def test_filter_and_transform_accounting() -> None:
    src = FakeSource([25, 25, 25, 25])

    def double(t: pa.Table) -> pa.Table:
        return t.set_column(0, "x", pc.multiply(t.column("x"), 2))

    loader = Loader(
        src,
        10,
        seed=1,
        columns=["x"],
        batching=Batching(
            filter=lambda t: pc.equal(pc.bit_wise_and(t["x"], 1), 0), transform=double
        ),
    )
    got = sorted(x for b in loader for x in b["x"].tolist())
    assert got == [2 * i for i in range(0, 100, 2)]
    s = loader.stats()
    assert (s["read"], s["filtered"], s["failed"], s["yielded"]) == (100, 50, 0, 50)
    assert s["samples_per_s"] > 0 and s["position"]["epoch"] == 1
    rows = Loader(
        src,
        10,
        columns=["x"],
        batching=Batching(filter=per_sample(lambda r: r["x"] < 15), shuffle=False),
    )
    assert [len(b["x"]) for b in rows] == [10, 5]  # batches emptied by the filter are skipped


def _fragile(t: pa.Table) -> pa.Table:
    if any(x % 7 == 3 for x in t.column("x").to_pylist()):
        raise RuntimeError("bad sample")
    return t


def test_failing_samples_are_isolated_skipped_and_counted() -> None:
    src = FakeSource([30, 30])
    loader = Loader(
        src,
        8,
        seed=2,
        batching=Batching(transform=_fragile, max_errors=10),
        workers=Workers(threads=2),
    )
    got = sorted(x for b in loader for x in b["x"].tolist())
    bad = [x for x in range(60) if x % 7 == 3]
    assert got == [x for x in range(60) if x not in bad]
    assert loader.stats()["failed"] == len(bad) == 9


def test_max_errors_exceeded_raises_with_uid_and_cause() -> None:
    loader = Loader(
        FakeSource([30, 30]), 8, batching=Batching(transform=_fragile, max_errors=2, shuffle=False)
    )
    with pytest.raises(DataFileError) as info:
        list(loader)
    assert info.value.uid == "u17"  # the third failure: 3, 10, 17
    assert isinstance(info.value.__cause__, RuntimeError)
    # without a uid column the global index is the uid
    loader = Loader(
        FakeSource([30]), 8, columns=["x"], batching=Batching(filter=lambda t: 1 / 0, shuffle=False)
    )
    with pytest.raises(DataFileError) as info:
        list(loader)
    assert info.value.uid == 0 and isinstance(info.value.__cause__, ZeroDivisionError)


def test_resume_state_is_tiny_json_and_mismatches_are_listed() -> None:
    src = FakeSource([20, 20])
    loader = Loader(src, 4, seed=9)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert (
        len(json.dumps(state)) < 600 and state["batches_seen"] == 1 and state["samples_seen"] == 4
    )
    with pytest.raises(ResumeStateError) as info:
        Loader(FakeSource([20, 21]), 5, seed=9).load_state_dict(state)
    msg = str(info.value)
    assert "dataset_fingerprint" in msg and "batch_size: saved 4, now 5" in msg
    Loader(src, 5, seed=9).load_state_dict(state, allow_mismatch=["batch_size"])
    with pytest.raises(ResumeStateError):
        Loader(src, 4).load_state_dict({"format": "datamill.loader/0"})
    with pytest.raises(ResumeStateError):
        Loader(src, 4).load_state_dict({**state, "epoch": -1})


def test_resume_after_last_batch_gives_empty_rest_then_next_epoch() -> None:
    src = FakeSource([10])
    loader = Loader(src, 4, seed=1)
    it = iter(loader)
    epoch0 = [next(it)["x"].tolist() for _ in range(3)]
    state = loader.state_dict()
    resumed = Loader.from_state(src, state)
    assert xs(resumed) == [] and xs(resumed) == xs(Loader(src, 4, seed=1, epoch=1))
    assert sorted(itertools.chain.from_iterable(epoch0)) == list(range(10))


def test_bad_arguments() -> None:
    src = TableSource(pa.table({"x": [1, 2, 3]}))
    with pytest.raises(ConfigError):
        Loader(src, 0)
    with pytest.raises(ConfigError, match="lacks"):
        Loader([1, 2, 3], 2)  # type: ignore[arg-type]  # not a Source
    with pytest.raises(ConfigError):
        Loader(src, 2, rank=2, world_size=2)
    with pytest.raises(ConfigError):
        Loader(src, 2, collate="tensorflow")
    with pytest.raises(SchemaError) as info:
        Loader(src, 2, columns=["x", "nope"])
    assert info.value.column == "nope"
    with pytest.raises(ConfigError):
        list(Loader(src, 2, batching=Batching(filter=lambda t: [True])))


class _Broken(FakeSource):
    def read_shard(self, index: int, *, columns: Any = None) -> pa.Table:
        if index == 1:
            raise OSError("disk on fire")
        return super().read_shard(index, columns=columns)


class _Short(FakeSource):
    def read_shard(self, index: int, *, columns: Any = None) -> pa.Table:
        return super().read_shard(index, columns=columns).slice(1)


def test_source_failures_name_the_shard() -> None:
    with pytest.raises(DataFileError) as info:
        list(Loader(_Broken([5, 5]), 2, batching=Batching(shuffle=False)))
    assert info.value.shard == 1 and isinstance(info.value.__cause__, OSError)
    with pytest.raises(DataFileError, match="expected 5 rows") as info2:
        list(Loader(_Short([5]), 2, workers=Workers(threads=2)))
    assert info2.value.shard == 0


def test_empty_source_and_interrupted_iteration() -> None:
    assert xs(Loader(FakeSource([]), 3)) == [] and xs(Loader(FakeSource([0, 0]), 3)) == []
    loader = Loader(FakeSource([100] * 4), 7, workers=Workers(threads=2))
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    it.close()  # the worker threads stop; the position stays after the consumed batches
    assert loader.state_dict()["batches_seen"] == 3
    assert_same_items(
        [b["x"] for b in first],
        [b["x"] for b in list(Loader(FakeSource([100] * 4), 7))[:3]],
        "head",
    )


def test_progress_bar_and_top_level_export(capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    import datamill
    from datamill.core.progress import quiet

    assert datamill.Loader is Loader
    with quiet(False):
        assert len(xs(Loader(FakeSource([30]), 7, workers=Workers(progress=True)))) == 5
    assert "epoch 0" in capsys.readouterr().err
    code = "import sys, datamill, datamill.loader; datamill.Loader; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # the loader never imports torch unless asked


def test_memory_is_bounded_by_the_shuffle_window() -> None:
    src = FakeSource([50] * 40)
    loader = Loader(
        src, 8, seed=3, batching=Batching(window=4), workers=Workers(prefetch=2, threads=2)
    )
    assert sorted(x for b in loader for x in b["x"].tolist()) == list(range(2000))
    s = loader.stats()
    assert (
        s["shards_read"] == 40 and s["peak_shards_in_memory"] <= 2 * 4 + 2
    )  # two windows at a boundary + prefetch


def test_loader_pickles_after_iterating() -> None:
    import pickle

    loader = Loader(FakeSource([10, 10]), 4, seed=2, workers=Workers(threads=1))
    it = iter(loader)
    next(it)
    clone = pickle.loads(pickle.dumps(loader))  # what a spawned DataLoader worker does
    assert xs(clone) == [b["x"].tolist() for b in it]


def test_loader_init_takes_at_most_12_parameters() -> None:
    # issue #28: the common options stay keywords; the rest are grouped in Batching and Workers
    # (issue #40's packing= and balance= stay findable; #38 moved shuffle/drop_last into Batching)
    params = [p for p in inspect.signature(Loader.__init__).parameters if p != "self"]
    assert len(params) <= 12, params
    assert {"seed", "rank", "world_size", "packing", "balance"} <= set(params)
    with pytest.raises(ConfigError, match="batching must be a Batching"):
        Loader(FakeSource([4]), 2, batching={"refill": True})  # type: ignore[arg-type]


def test_from_state_keeps_the_saved_batching_and_takes_the_given_functions() -> None:
    src = FakeSource([7, 5, 9])
    keep = per_sample(lambda r: r["x"] % 3 != 0)
    a = Loader(
        src,
        4,
        seed=2,
        batching=Batching(window=2, filter=keep, refill=True),
        workers=Workers(threads=2),
    )
    it = iter(a)
    head = [next(it)["x"].tolist() for _ in range(2)]
    rest = [b["x"].tolist() for b in it]
    state = Loader(src, 4, seed=2, batching=Batching(window=2, filter=keep, refill=True))
    it2 = iter(state)
    next(it2), next(it2)
    b = Loader.from_state(
        src, state.state_dict(), batching=Batching(filter=keep)
    )  # window=2, refill from the state
    assert (b.batching.window, b.refill) == (2, True)
    assert head and [x["x"].tolist() for x in b] == rest
    with pytest.raises(ResumeStateError, match="window"):
        Loader.from_state(src, state.state_dict(), batching=Batching(window=3, filter=keep))
