"""kill -9 and a full disk during a run that replaces a previous output: the previous output
survives byte-identical and loads, the rerun succeeds, and no temporary file or folder is left after
it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from tests.faults._harness import assert_one_line_error, litter, run, snapshot

pytestmark = pytest.mark.faults


@dataclass
class Writer:
    """A command that replaces its previous output, and how to load that output."""

    first: list[str]
    replace: list[str]
    outputs: list[str]  # relative to the working folder
    load: Callable[[Path], object]
    points: list[str]
    fsize: int
    skip: Callable[[Path], bool] = field(default=lambda p: False)


def _csv(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    pcsv.write_csv(
        pa.table(
            {
                "uid": np.arange(n),
                "color": rng.choice(["red", "green", "blue", "gold"], n),
                "size": rng.normal(size=n).round(3),
            }
        ),
        path,
    )


def _load_preprocess(d: Path) -> object:
    from datamill.preprocessing.api import load

    return load(d / "d.hdf5")


def _load_corpus(d: Path) -> object:
    from datamill.text.corpus import Corpus

    return Corpus.load(d / "c").tokens.sum()


def _load_w2v(d: Path) -> object:
    from datamill.pretrain.word2vec import SkipGramSamples

    return SkipGramSamples.load(d / "w").centers.sum()


def _load_bert(d: Path) -> object:
    from datamill.pretrain.bert import read_metadata

    return read_metadata(d / "b.parquet")


def _load_ds(d: Path) -> object:
    from datamill.shards import ShardsetDataset

    return ShardsetDataset(d / "ds").to_table()


def _load_export(d: Path) -> object:
    import pyarrow.parquet as pq

    return pq.read_table(d / "out.parquet")


def _load_csv_export(d: Path) -> object:
    return pcsv.read_csv(d / "out.csv")


def _setup(d: Path, data_dir: Path) -> None:
    _csv(d / "d.csv", 3000, 0)
    (d / "c1.yaml").write_text(
        "input_features: [{name: color, type: category}, {name: size, type: number}]\n"
    )
    (d / "c2.yaml").write_text(
        "input_features: [{name: color, type: category, preprocessing: {most_common: 2}},"
        " {name: size, type: number, preprocessing: {normalization: minmax}}]\n"
    )
    shutil.copy(data_dir / "timemachine.txt", d / "t.txt")
    lines = (
        (data_dir / "wikitext2_test.raw")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)[:1500]
    )
    (d / "raw.txt").write_text("".join(lines), encoding="utf-8")
    pcsv.write_csv(pa.table({"uid": np.arange(500), "y": np.arange(500) * 2}), d / "y.csv")


_DS = ["shards", "create", "ds", "--uid", "uid", "--shardset", "a", "d.csv", "--shard-size", "500"]
_BERT = [
    "bert",
    "raw.txt",
    "--out",
    "b.parquet",
    "--vocab-size",
    "400",
    "--max-seq-length",
    "48",
    "--dupe-factor",
    "3",
    "--workers",
    "1",
]

WRITERS: dict[str, Writer] = {
    "preprocess": Writer(
        ["preprocess", "d.csv", "-c", "c1.yaml"],
        ["preprocess", "d.csv", "-c", "c2.yaml"],
        ["d.hdf5", "d.meta.json"],
        _load_preprocess,
        ["preprocess.block_written", "preprocess.before_switch", "preprocess.between_renames"],
        8192,
    ),
    "corpus": Writer(
        ["corpus", "t.txt", "--level", "word", "--out", "c"],
        ["corpus", "t.txt", "--level", "char", "--out", "c"],
        ["c"],
        _load_corpus,
        ["corpus.array_written", "corpus.before_switch"],
        50_000,
    ),
    "word2vec": Writer(
        ["word2vec", "t.txt", "--out", "w", "--min-freq", "2"],
        ["word2vec", "t.txt", "--out", "w", "--min-freq", "2", "--window", "3", "--seed", "1"],
        ["w"],
        _load_w2v,
        ["word2vec.array_written@2", "word2vec.before_switch"],
        20_000,
    ),
    "bert": Writer(
        _BERT,
        [*_BERT, "--seed", "1"],
        ["b.parquet", "b.tokenizer.json"],
        _load_bert,
        ["bert.row_group_written", "bert.before_switch"],
        30_000,
    ),
    "shards-create": Writer(
        _DS,
        [*_DS[:-1], "1000", "--overwrite"],
        ["ds"],
        _load_ds,
        ["shards.shard_written@2", "shards.before_commit", "shards.before_manifest"],
        2_000,
    ),
    "shards-add": Writer(
        _DS,
        ["shards", "add", "ds", "--shardset", "y", "y.csv", "--route"],
        ["ds"],
        _load_ds,
        ["shards.shard_written@3", "shards.before_commit", "shards.before_manifest"],
        1_000,
        skip=lambda p: "/ds/y/" in p.as_posix(),
    ),
    "shards-export": Writer(
        _DS,
        ["shards", "export", "ds", "out.parquet", "--columns", "color"],
        ["out.parquet"],
        _load_export,
        ["shards.export_written"],
        1_000,
    ),
    # a CSV export's marker lists the old and the new file's hash while they switch: after a kill
    # there, the next export still recognises the old file as its own and replaces it
    "shards-export-csv": Writer(
        _DS,
        ["shards", "export", "ds", "out.csv", "--columns", "color"],
        ["out.csv"],
        _load_csv_export,
        ["shards.export_written"],
        1_000,
    ),
}


def _prepare(name: str, d: Path, data_dir: Path) -> tuple[Writer, dict[str, dict[str, str]]]:
    w = WRITERS[name]
    _setup(d, data_dir)
    res = run(w.first, cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    if name.startswith("shards-export"):
        out = w.outputs[0]
        res = run(["shards", "export", "ds", out], cwd=d)
        assert res.returncode == 0, res.stderr[-3000:]
    return w, {o: snapshot(d / o, skip=w.skip) for o in w.outputs}


Prepared = Callable[[str, Path], tuple[Writer, dict[str, dict[str, str]]]]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Prepared:
    """``prepare(name, folder)``: ``folder`` holds a copy of the writer's working folder after its
    first run (and an export's first export), made once for the module's three tests of the writer
    (each took 1-2 CLI processes to make its own: 20 of the module's 79); the outputs hold no
    absolute path (checked: the copy's bytes equal the original's)."""
    made: dict[str, tuple[Path, dict[str, dict[str, str]]]] = {}

    def prepare(name: str, folder: Path) -> tuple[Writer, dict[str, dict[str, str]]]:
        if name not in made:
            d = tmp_path_factory.mktemp(f"prepared-{name}")
            made[name] = (d, _prepare(name, d, data_dir)[1])
        src, before = made[name]
        shutil.copytree(src, folder, symlinks=True, dirs_exist_ok=True)
        w = WRITERS[name]
        assert {o: snapshot(folder / o, skip=w.skip) for o in w.outputs} == before
        return w, before

    return prepare


def _assert_previous_intact(w: Writer, d: Path, before: dict[str, dict[str, str]]) -> None:
    # loading repairs a switch killed between its renames (preprocess), then the bytes are the old
    # ones
    w.load(d)
    assert {o: snapshot(d / o, skip=w.skip) for o in w.outputs} == before


def _assert_rerun_clean(w: Writer, d: Path) -> None:
    res = run(w.replace, cwd=d)
    assert res.returncode == 0, res.stderr[-3000:]
    assert litter(d) == []
    w.load(d)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_kill_at_every_point_keeps_previous_output(
    name: str, tmp_path: Path, prepared: Prepared
) -> None:
    w, before = prepared(name, tmp_path)
    for point in w.points:
        res = run(w.replace, cwd=tmp_path, fault=point)
        assert res.returncode == -9, (point, res.returncode, res.stderr[-3000:])
        _assert_previous_intact(w, tmp_path, before)
    _assert_rerun_clean(w, tmp_path)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_full_disk_is_one_located_error_and_keeps_previous_output(
    name: str, tmp_path: Path, prepared: Prepared
) -> None:
    w, before = prepared(name, tmp_path)
    res = run(w.replace, cwd=tmp_path, fsize=w.fsize)
    assert_one_line_error(res, path=w.outputs[0] if name != "shards-add" else "ds")
    assert "full" in res.stderr or "size limit" in res.stderr
    _assert_previous_intact(w, tmp_path, before)
    _assert_rerun_clean(w, tmp_path)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_sigterm_cleans_up_at_once_and_keeps_previous_output(
    name: str, tmp_path: Path, prepared: Prepared
) -> None:
    w, before = prepared(name, tmp_path)
    res = run(w.replace, cwd=tmp_path, fault=w.points[-1], signal_name="TERM")
    assert res.returncode == 143, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr
    assert litter(tmp_path) == []  # removed by the terminated run itself, not only by the next one
    _assert_previous_intact(w, tmp_path, before)
