"""``datamill iterate --save-record`` and ``datamill trace``: both directions from the command line,
errors in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.csv as pacsv
import pytest

from datamill.cli import main
from datamill.loader import Loader
from datamill.shards.dataset import ShardsetDataset


@pytest.fixture
def houses(data_dir: Path, tmp_path: Path) -> Path:
    ShardsetDataset.create(
        tmp_path / "houses",
        pacsv.read_csv(data_dir / "house_prices_train.csv"),
        uid="Id",
        shardset="raw",
        shard_size=200,
    )
    return tmp_path / "houses"


def test_cli_records_a_resized_run_and_traces_both_ways(
    houses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec, state = str(tmp_path / "run.json"), str(tmp_path / "state.json")
    assert (
        main(
            [
                "-q",
                "iterate",
                str(houses),
                "--batch-size",
                "32",
                "--world-size",
                "2",
                "--limit",
                "10",
                "--save-state",
                state,
                "--save-record",
                rec,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "-q",
                "iterate",
                str(houses),
                "--batch-size",
                "32",
                "--world-size",
                "3",
                "--resume",
                state,
                "--save-record",
                rec,
            ]
        )
        == 0
    )
    record = json.loads(Path(rec).read_text())
    assert [r["world_size"] for r in record["runs"]] == [2, 3] and record["runs"][1]["elastic"] == [
        [2, [320, 320]]
    ]
    # ground truth: the same runs in process, every rank, every batch
    src = ShardsetDataset(houses)
    truth: dict[tuple[int, int], list[int]] = {}
    old = [Loader(src, 32, rank=r, world_size=2, collate="arrow") for r in range(2)]
    for r, ld in enumerate(old):
        it = iter(ld)
        for s in range(10):
            truth[(r, s)] = next(it).column("Id").to_pylist()
    new = [Loader(src, 32, rank=r, world_size=3, collate="arrow") for r in range(3)]
    for r, ld in enumerate(new):
        ld.load_state_dict(old[0].state_dict())
        for b, batch in enumerate(ld):
            truth[(r, 10 + b)] = batch.column("Id").to_pylist()
    capsys.readouterr()
    for (r, s), ids in list(truth.items())[::7]:
        assert (
            main(
                [
                    "trace",
                    rec,
                    "--step",
                    str(s),
                    "--rank",
                    str(r),
                    "--epoch",
                    "0",
                    "--source",
                    str(houses),
                    "--json",
                ]
            )
            == 0
        )
        got = json.loads(capsys.readouterr().out)["batches"][0]
        assert got["uids"] == ids, (r, s)
    uid = truth[(2, 12)][5]
    assert main(["trace", rec, "--uid", str(uid), "--json"]) == 0  # the UID index is stored now
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [(h["epoch"], h["rank"], h["step"], h["position"]) for h in hits] == [(0, 2, 12, 5)]
    assert (
        main(
            [
                "trace",
                rec,
                "--step",
                "12",
                "--rank",
                "2",
                "--epoch",
                "0",
                "--source",
                str(houses),
                "--show",
                "--columns",
                "Id,SalePrice",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "segment 1, batch 2" in out and f"Id={uid}" in out


def test_cli_errors_are_one_line(
    houses: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rec = str(tmp_path / "run.json")
    assert (
        main(
            [
                "-q",
                "iterate",
                str(houses),
                "--batch-size",
                "32",
                "--limit",
                "3",
                "--save-record",
                rec,
            ]
        )
        == 0
    )
    capsys.readouterr()
    for argv, words in (
        (["trace", rec], "nothing to trace"),
        (["trace", rec, "--step", "1"], "--rank"),
        (["trace", rec, "--step", "3", "--rank", "0", "--epoch", "0"], "had not run"),
        (["trace", rec, "--step", "0", "--rank", "5", "--epoch", "0"], "rank 5"),
        (["trace", rec, "--step", "0", "--rank", "0", "--show"], "--source"),
        (["trace", str(tmp_path / "nope.json"), "--sample", "1"], "not found"),
        (["trace", rec, "--uid", "99999", "--source", str(houses)], "not in the dataset"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and len(err.strip().splitlines()) == 1, (
            argv,
            err,
        )
    (tmp_path / "mine.txt").write_text("mine")
    assert (
        main(
            [
                "-q",
                "iterate",
                str(houses),
                "--batch-size",
                "32",
                "--limit",
                "1",
                "--save-record",
                str(tmp_path / "mine.txt"),
            ]
        )
        == 2
    )
    assert (tmp_path / "mine.txt").read_text() == "mine"
