"""Bad input to every command: exit status 2, one ``error:`` line naming where, no traceback,
nothing lost.

The cases are generated from small templates (command x bad target / bad file / bad option) and run
in-process through :func:`datamill.cli.main` in one prepared folder. A case that refuses an output
also asserts that what was at the target is byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.cli import main


@dataclass(frozen=True)
class Case:
    """``datamill ARGS`` must exit 2 with ``where`` in its one error line; ``keep`` must stay
    unchanged."""

    id: str
    args: tuple[str, ...]
    where: str
    keep: str | None = None


def _digest(path: Path) -> str:
    if not path.exists():
        return "absent"
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return hashlib.sha256(
        json.dumps(
            sorted(
                (os.fspath(p.relative_to(path)), _digest(p)) for p in path.rglob("*") if p.is_file()
            )
        ).encode()
    ).hexdigest()


def _run(args: list[str]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return main(["-q", *args])
        except SystemExit as exc:  # a value refused by its option's type: argparse's one error line
            return int(exc.code or 0)


# ---------------------------------------------------------------------------------------- workspace
_NESTED = [
    ("color", "category"),
    ("size", "number"),
    ("flag", "text"),
    ("color", "text"),
    ("size", "binary"),
    ("flag", "category"),
]  # list, struct and binary Parquet columns read as the wrong kind
CFG = "input_features: [{name: color, type: category}, {name: size, type: number}]\n"


def _write_inputs(d: Path, data_dir: Path) -> None:
    rng = np.random.default_rng(0)
    n = 40
    good = pa.table(
        {
            "uid": np.arange(n),
            "color": rng.choice(["red", "blue"], n),
            "size": rng.normal(size=n),
            "flag": rng.choice(["yes", "no"], n),
        }
    )
    pcsv.write_csv(good, d / "good.csv")
    pq.write_table(good, d / "good.parquet")
    (d / "cfg.yaml").write_text(CFG)
    shutil.copy(data_dir / "timemachine.txt", d / "text.txt")
    lines = (
        (data_dir / "wikitext2_test.raw")
        .read_text(encoding="utf-8")
        .splitlines(keepends=True)[:400]
    )
    (d / "raw.txt").write_text("".join(lines), encoding="utf-8")
    (d / "notes.txt").write_text("my precious notes\n")
    (d / "userdir").mkdir()
    (d / "userdir" / "keep.md").write_text("mine")
    (d / "pp_user").mkdir()
    (d / "pp_user" / "good.hdf5").write_text("not an hdf5 file: mine")
    # bad tables
    (d / "empty.csv").write_text("")
    (d / "header_only.csv").write_text("uid,color,size,flag\n")
    (d / "bad_utf8.csv").write_bytes(b"uid,color,size,flag\n1,r\xe9d,1.0,yes\n")
    (d / "ragged.csv").write_text("uid,color,size,flag\n1,red,1.0,yes\n2,blue\n")
    (d / "nonnumeric.csv").write_text("uid,color,size,flag\n1,red,1.0,yes\n2,blue,abc,no\n")
    (d / "no_color.csv").write_text("uid,size,flag\n1,1.0,yes\n")
    (d / "typechange.jsonl").write_text(
        '{"uid": 1, "color": "red", "size": 1.0}\n{"uid": 2, "color": "blue", "size": "big"}\n'
    )
    (d / "not_json.jsonl").write_text('{"uid": 1, "color": "red", "size": 1.0}\n{"uid": 2, oops\n')
    (d / "dupuid.csv").write_text("uid,color,size,flag\n1,red,1.0,yes\n1,blue,2.0,no\n")
    (d / "nulluid.csv").write_text("uid,color,size,flag\n1,red,1.0,yes\n,blue,2.0,no\n")
    (d / "data.xyz").write_text("a,b\n1,2\n")
    pq.write_table(
        pa.table(
            {
                "uid": [1, 2],
                "color": pa.array([[1, 2], [3]]),
                "size": pa.array([{"a": 1}, {"a": 2}]),
                "flag": pa.array([b"\x00", b"\x01"], pa.binary()),
            }
        ),
        d / "nested.parquet",
    )
    (d / "trunc.parquet").write_bytes((d / "good.parquet").read_bytes()[:200])
    with zipfile.ZipFile(d / "arch.zip", "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("good.csv", (d / "good.csv").read_text())
        zf.writestr("text.txt", (d / "text.txt").read_text())
    raw = bytearray((d / "arch.zip").read_bytes())
    for word in (
        b"red",
        b"Time Machine",
    ):  # flip a byte inside each member: its CRC no longer matches
        raw[raw.find(word)] ^= 0x20
    (d / "badcrc.zip").write_bytes(bytes(raw))
    (d / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (d / "blank.txt").write_text("\n\n  \n")
    (d / "bad_tok.json").write_text('{"not": "a tokenizer"}')
    # configs
    configs = {
        "cfg_unknown_type": "input_features: [{name: color, type: colour}]\n",
        "cfg_unknown_key": "input_features: [{name: color, type: category, prepro: {}}]\n",
        # '/' is fine now (#30)
        "cfg_slash": 'input_features: [{name: "a\\0b", type: category, column: color}]\n',
        "cfg_header": "input_features: [{name: datamill, type: category, column: color}]\n",
        "cfg_missing_col": "input_features: [{name: shade, type: category}]\n",
        "cfg_probs": "input_features: [{name: color, type: category}]\npreprocessing: {split: "
        "{probabilities: [0.5, 0.5, 0.5]}}\n",
        "cfg_most_common": "input_features: [{name: color, type: category, preprocessing: "
        "{most_common: -1}}]\n",
        "cfg_fixed_nocol": "input_features: [{name: color, type: category}]\npreprocessing: "
        "{split: {type: fixed}}\n",
        "cfg_yaml": "input_features: [{name: color, type: category\n",
        "cfg_list": "- a\n- b\n",
        "cfg_scalar": "42\n",
        "cfg_empty": "",
        "cfg_no_features": "output_features: []\n",
        "cfg_norm": "input_features: [{name: size, type: number, preprocessing: {normalization: "
        "cubic}}]\n",
        "cfg_mvs": "input_features: [{name: size, type: number, preprocessing: "
        "{missing_value_strategy: guess}}]\n",
        "cfg_dup": "input_features: [{name: color, type: category}, "
        "{name: color, type: category}]\n",
        "cfg_bool_name": "input_features: [{name: 1, type: category}]\n",
        "cfg_features_map": "input_features: {color: category}\n",
    }
    for name, text in configs.items():
        (d / f"{name}.yaml").write_text(text)
    for col, typ in _NESTED:
        (d / f"cfg_nested_{col}_{typ}.yaml").write_text(
            f"input_features: [{{name: {col}, type: {typ}}}]\n"
        )


def _write_outputs(d: Path) -> None:
    assert _run(["preprocess", "good.csv", "-c", "cfg.yaml"]) == 0
    assert _run(["corpus", "text.txt", "--level", "word", "--out", "corpus"]) == 0
    assert _run(["word2vec", "text.txt", "--out", "w2v", "--min-freq", "2"]) == 0
    assert (
        _run(
            [
                "bert",
                "raw.txt",
                "--out",
                "b.parquet",
                "--vocab-size",
                "300",
                "--max-seq-length",
                "32",
                "--dupe-factor",
                "1",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert (
        _run(
            [
                "shards",
                "create",
                "ds",
                "--uid",
                "uid",
                "--shardset",
                "a",
                "good.csv",
                "--shard-size",
                "10",
            ]
        )
        == 0
    )
    assert (
        _run(["iterate", "ds", "--batch-size", "8", "--limit", "1", "--save-state", "state.json"])
        == 0
    )
    meta = json.loads((d / "good.meta.json").read_text())
    edits = {
        "meta_type": lambda m: m["size"].update(type="category"),
        "meta_missing": lambda m: m.pop("size"),
        "meta_mean": lambda m: m["size"].update(mean="1.5"),
        "meta_ids": lambda m: m["color"]["str2idx"].update(red="one"),
        "meta_vocab": lambda m: m["color"].update(vocab_size=99),
        "meta_swapped": lambda m: m["color"]["str2idx"].update(red=m["color"]["str2idx"]["blue"]),
        "meta_feature_list": lambda m: m.update(color=[1, 2]),
        "meta_header_list": lambda m: m.update(datamill=[1]),
    }
    for name, edit in edits.items():
        m = json.loads(json.dumps(meta))
        edit(m)
        (d / f"{name}.meta.json").write_text(json.dumps(m))
    (d / "meta_notjson.meta.json").write_text("{not json")
    state = json.loads((d / "state.json").read_text())
    (d / "state_trunc.json").write_text((d / "state.json").read_text()[:25])
    (d / "state_list.json").write_text("[1, 2]")
    for key, value in [
        ("epoch", "three"),
        ("seed", None),
        ("format", "other/9"),
        ("dataset_fingerprint", "0"),
    ]:
        (d / f"state_{key}.json").write_text(json.dumps({**state, key: value}))
    (d / "state_empty.json").write_text("")
    (d / "state_dir").mkdir()
    # broken shardset datasets
    for name in ("ds_lost_rows", "ds_swapped", "ds_manifest_list", "ds_manifest_shards"):
        shutil.copytree(d / "ds", d / name)
    t = pq.read_table(d / "ds_lost_rows/a/shard.00001.parquet")
    pq.write_table(t.slice(0, 5), d / "ds_lost_rows/a/shard.00001.parquet")
    a, b = d / "ds_swapped/a/shard.00000.parquet", d / "ds_swapped/a/shard.00001.parquet"
    tmp = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(tmp)
    (d / "ds_manifest_list/dataset.json").write_text("[]")
    man = json.loads((d / "ds/dataset.json").read_text())
    (d / "ds_manifest_shards/dataset.json").write_text(json.dumps({**man, "num_shards": "five"}))


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("bad_inputs")
    old = os.getcwd()
    os.chdir(d)
    try:
        _write_inputs(d, data_dir)
        _write_outputs(d)
        yield d
    finally:
        os.chdir(old)


# ---------------------------------------------------------------------------------------- the cases
def _output_guard_cases() -> Iterator[Case]:
    writers = {
        "corpus": (
            ["corpus", "text.txt", "--out"],
            ["text.txt", "notes.txt", "userdir", "w2v", "ds", "b.parquet", "good.csv", "arch.zip"],
        ),
        "word2vec": (
            ["word2vec", "text.txt", "--min-freq", "1", "--out"],
            ["text.txt", "notes.txt", "userdir", "corpus", "ds", "good.hdf5"],
        ),
        "bert": (
            ["bert", "raw.txt", "--vocab-size", "300", "--out"],
            ["raw.txt", "notes.txt", "userdir", "good.parquet", "good.hdf5", "corpus"],
        ),
        "export": (
            ["shards", "export", "ds"],
            [
                "ds/dataset.json",
                "ds/samples.parquet",
                "ds/a/shard.00000.parquet",
                "ds",
                "notes.txt",
                "userdir",
                "good.parquet",
                "b.parquet",
            ],
        ),
        "create": (
            [
                "shards",
                "create",
                "--uid",
                "uid",
                "--shardset",
                "a",
                "good.csv",
                "--shard-size",
                "5",
                "--",
            ],
            ["notes.txt", "userdir", "ds", "good.csv", "corpus"],
        ),
        "save-state": (
            ["iterate", "ds", "--batch-size", "4", "--limit", "1", "--save-state"],
            ["notes.txt", "userdir", "good.csv", "ds", "ds/dataset.json"],
        ),
    }
    for name, (cmd, targets) in writers.items():
        for target in targets:
            args = [*cmd[:-1], target] if name == "create" else [*cmd, target]
            if name == "create":  # root comes first
                args = ["shards", "create", target, *cmd[2:-1]]
            yield Case(f"out-{name}-{target}", tuple(args), target, keep=target)
    yield Case(
        "out-preprocess-user-hdf5",
        ("preprocess", "good.csv", "-c", "cfg.yaml", "-o", "pp_user"),
        "pp_user/good.hdf5",
        keep="pp_user",
    )
    yield Case(
        "out-preprocess-into-dataset",
        ("preprocess", "good.csv", "-c", "cfg.yaml", "-o", "ds"),
        "ds",
        keep="ds",
    )
    yield Case(
        "out-corpus-overwrite-input",
        ("corpus", "text.txt", "--out", "text.txt", "--overwrite"),
        "text.txt",
        keep="text.txt",
    )
    yield Case(
        "out-bert-overwrite-user",
        ("bert", "raw.txt", "--out", "notes.txt", "--overwrite"),
        "notes.txt",
        keep="notes.txt",
    )
    yield Case(
        "out-export-overwrite-in-ds",
        ("shards", "export", "ds", "ds/samples.parquet", "--overwrite"),
        "ds/samples.parquet",
        keep="ds",
    )
    yield Case(
        "out-corpus-under-file",
        ("corpus", "text.txt", "--out", "notes.txt/sub"),
        "notes.txt",
        keep="notes.txt",
    )


_BAD_TABLES = {
    "empty.csv": "empty.csv",
    "header_only.csv": "header_only.csv",
    "bad_utf8.csv": "line 2",
    "ragged.csv": "line 3",
    "typechange.jsonl": "line 2",
    "not_json.jsonl": "line 2",
    "missing.csv": "missing.csv",
    "userdir": "userdir",
    "data.xyz": "data.xyz",
    "trunc.parquet": "trunc.parquet",
    "badcrc.zip:good.csv": "badcrc.zip",
    "arch.zip:nope.csv": "nope.csv",
    "no_color.csv": "color",
}


def _table_cases() -> Iterator[Case]:
    for f, where in _BAD_TABLES.items():
        yield Case(f"preprocess-{f}", ("preprocess", f, "-c", "cfg.yaml", "--skip-save"), where)
        if f != "no_color.csv":
            sw = (
                f if f.endswith(".jsonl") else where
            )  # shard files are Parquet/CSV only: the file is named
            yield Case(
                f"create-{f}",
                (
                    "shards",
                    "create",
                    f"ds_{len(f)}_{f[:3]}",
                    "--uid",
                    "uid",
                    "--shardset",
                    "a",
                    f,
                    "--shard-size",
                    "5",
                ),
                sw,
            )
            yield Case(
                f"add-{f}", ("shards", "add", "ds", "--shardset", "z", f, "--route"), sw, keep="ds"
            )
    yield Case(
        "preprocess-nonnumeric",
        ("preprocess", "nonnumeric.csv", "-c", "cfg.yaml", "--skip-save"),
        "line 3",
    )
    for col, typ in _NESTED:
        cfg = f"cfg_nested_{col}_{typ}.yaml"
        yield Case(
            f"nested-{col}-{typ}", ("preprocess", "nested.parquet", "-c", cfg, "--skip-save"), col
        )
    yield Case(
        "create-dupuid",
        (
            "shards",
            "create",
            "ds_dup",
            "--uid",
            "uid",
            "--shardset",
            "a",
            "dupuid.csv",
            "--shard-size",
            "5",
        ),
        "dupuid.csv",
    )
    yield Case(
        "create-nulluid",
        (
            "shards",
            "create",
            "ds_null",
            "--uid",
            "uid",
            "--shardset",
            "a",
            "nulluid.csv",
            "--shard-size",
            "5",
        ),
        "nulluid.csv",
    )
    yield Case(
        "create-no-uid-col",
        (
            "shards",
            "create",
            "ds_nouid",
            "--uid",
            "id",
            "--shardset",
            "a",
            "good.csv",
            "--shard-size",
            "5",
        ),
        "good.csv",
    )
    yield Case(
        "create-shard-size-0",
        (
            "shards",
            "create",
            "ds_s0",
            "--uid",
            "uid",
            "--shardset",
            "a",
            "good.csv",
            "--shard-size",
            "0",
        ),
        "shard_size",
    )
    yield Case(
        "create-bad-shardset",
        (
            "shards",
            "create",
            "ds_bad",
            "--uid",
            "uid",
            "--shardset",
            "../x",
            "good.csv",
            "--shard-size",
            "5",
        ),
        "ds_bad",
    )


def _config_cases() -> Iterator[Case]:
    names = [
        "cfg_unknown_type",
        "cfg_unknown_key",
        "cfg_slash",
        "cfg_header",
        "cfg_missing_col",
        "cfg_probs",
        "cfg_most_common",
        "cfg_fixed_nocol",
        "cfg_yaml",
        "cfg_list",
        "cfg_scalar",
        "cfg_empty",
        "cfg_no_features",
        "cfg_norm",
        "cfg_mvs",
        "cfg_dup",
        "cfg_features_map",
    ]
    for n in names:
        # a fixed split's column defaults to `split` (as in Ludwig): good.csv lacks it, so the data
        # is named
        where = "good.csv" if n in ("cfg_missing_col", "cfg_fixed_nocol") else f"{n}.yaml"
        yield Case(
            f"config-{n}", ("preprocess", "good.csv", "-c", f"{n}.yaml", "--skip-save"), where
        )
    yield Case("config-missing-file", ("preprocess", "good.csv", "-c", "nope.yaml"), "nope.yaml")
    yield Case("config-is-dir", ("preprocess", "good.csv", "-c", "userdir"), "userdir")
    yield Case("config-none", ("preprocess", "good.csv"), "--config")
    metas = [
        "meta_type",
        "meta_missing",
        "meta_mean",
        "meta_ids",
        "meta_vocab",
        "meta_swapped",
        "meta_feature_list",
        "meta_header_list",
        "meta_notjson",
    ]
    for m in metas:
        yield Case(
            f"apply-{m}",
            ("preprocess", "good.csv", "-c", "cfg.yaml", "-m", f"{m}.meta.json", "--skip-save"),
            f"{m}.meta.json",
        )
    yield Case(
        "apply-missing-meta",
        ("preprocess", "good.csv", "-m", "nope.meta.json", "--skip-save"),
        "nope.meta.json",
    )
    yield Case(
        "apply-meta-no-config",
        ("preprocess", "good.csv", "-m", "notes.txt", "--skip-save"),
        "notes.txt",
    )


_BAD_TEXTS = {
    "missing.txt": "missing.txt",
    "userdir": "userdir",
    "blank.txt": "blank.txt",
    "binary.txt": "binary.txt",
    "badcrc.zip:text.txt": "badcrc.zip",
    "arch.zip:nope.txt": "nope.txt",
    "empty.csv": "empty.csv",
}


def _text_cases() -> Iterator[Case]:
    for f, where in _BAD_TEXTS.items():
        yield Case(f"corpus-{f}", ("corpus", f, "--out", "c_bad"), where)
        yield Case(f"corpus-word-{f}", ("corpus", f, "--level", "word", "--out", "c_bad"), where)
        yield Case(f"word2vec-{f}", ("word2vec", f, "--out", "w_bad", "--min-freq", "1"), where)
        yield Case(f"bert-{f}", ("bert", f, "--out", "b_bad.parquet", "--vocab-size", "300"), where)
    options = [
        ("corpus", ("--max-size", "-1"), "max_size"),
        ("corpus", ("--min-freq", "-3"), "min_freq"),
        ("corpus", ("--level", "bpe", "--vocab-size", "0"), "vocab_size"),
        ("corpus", ("--level", "bpe", "--tokenizer", "bad_tok.json"), "bad_tok.json"),
        ("corpus", ("--level", "bpe", "--tokenizer", "nope.json"), "nope.json"),
        ("word2vec", ("--window", "0"), "window"),
        ("word2vec", ("--num-negatives", "-1"), "num_negatives"),
        ("word2vec", ("--subsample-t", "0"), "subsample_t"),
        ("word2vec", ("--min-freq", "0"), "min_freq"),
        ("bert", ("--max-seq-length", "2"), "max_seq_length"),
        ("bert", ("--mask-prob", "2"), "mask_prob"),
        ("bert", ("--dupe-factor", "0"), "dupe_factor"),
        ("bert", ("--short-seq-prob", "-1"), "short_seq_prob"),
        ("bert", ("--workers", "0"), "workers"),
        ("bert", ("--tokenizer", "bad_tok.json"), "bad_tok.json"),
        ("bert", ("--tokenizer", "nope.json"), "nope.json"),
        ("bert", ("--vocab-size", "3"), "vocab_size"),
    ]
    for cmd, opts, where in options:
        src = "raw.txt" if cmd == "bert" else "text.txt"
        out = {"corpus": "c_opt", "word2vec": "w_opt", "bert": "b_opt.parquet"}[cmd]
        yield Case(f"{cmd}-opt-{'-'.join(opts)}", (cmd, src, *opts, "--out", out), where)


def _shards_cases() -> Iterator[Case]:
    for sub in ("info", "check", "get"):
        extra = ("1",) if sub == "get" else ()
        for target in (
            "notes.txt",
            "missing_ds",
            "userdir",
            "ds_manifest_list",
            "ds_manifest_shards",
        ):
            if sub == "check" and target.startswith("ds_manifest"):
                continue  # check lists manifest problems with exit 1 (tested in tests/shards)
            yield Case(f"shards-{sub}-{target}", ("shards", sub, target, *extra), target)
    yield Case("shards-get-unknown-uid", ("shards", "get", "ds", "12345"), "12345")
    yield Case("shards-get-bad-column", ("shards", "get", "ds", "1", "--columns", "nope"), "nope")
    yield Case("shards-get-lost-rows", ("shards", "get", "ds_lost_rows", "17"), "shard.00001")
    yield Case("shards-get-swapped", ("shards", "get", "ds_swapped", "1"), "shard.00000")
    yield Case(
        "shards-export-lost-rows",
        ("shards", "export", "ds_lost_rows", "lost.parquet"),
        "shard.00001",
    )
    yield Case(
        "shards-export-bad-column",
        ("shards", "export", "ds", "cols.parquet", "--columns", "nope"),
        "nope",
    )
    yield Case(
        "shards-add-dup-name",
        ("shards", "add", "ds", "--shardset", "a", "good.csv", "--route"),
        "a",
        keep="ds",
    )
    yield Case(
        "shards-add-bad-name",
        ("shards", "add", "ds", "--shardset", "../x", "good.csv", "--route"),
        "ds",
        keep="ds",
    )
    yield Case(
        "shards-add-count", ("shards", "add", "ds", "--shardset", "n", "good.csv"), "ds", keep="ds"
    )
    yield Case(
        "shards-add-unknown-uid",
        ("shards", "add", "ds", "--shardset", "n", "dupuid.csv", "--route"),
        "dupuid.csv",
        keep="ds",
    )
    yield Case(
        "shards-add-to-file",
        ("shards", "add", "notes.txt", "--shardset", "n", "good.csv", "--route"),
        "notes.txt",
        keep="notes.txt",
    )


def _iterate_cases() -> Iterator[Case]:
    for f in (
        "state_trunc.json",
        "state_list.json",
        "state_epoch.json",
        "state_seed.json",
        "state_format.json",
        "state_dataset_fingerprint.json",
        "state_empty.json",
        "state_dir",
        "nope_state.json",
        "notes.txt",
    ):
        yield Case(
            f"iterate-resume-{f}",
            ("iterate", "ds", "--batch-size", "4", "--limit", "1", "--resume", f),
            f,
        )
    for src in ("missing_src", "notes.txt", "userdir", "ds_lost_rows", "ds_manifest_list"):
        yield Case(f"iterate-source-{src}", ("iterate", src, "--batch-size", "4"), src)
    yield Case("iterate-bad-column", ("iterate", "ds", "--columns", "nope"), "nope")


CASES = [
    *_output_guard_cases(),
    *_table_cases(),
    *_config_cases(),
    *_text_cases(),
    *_shards_cases(),
    *_iterate_cases(),
]


def test_there_are_at_least_150_cases() -> None:
    assert len(CASES) >= 150 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_located_line(
    case: Case, ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(ws / case.keep) if case.keep else None
    capsys.readouterr()
    status = _run(list(case.args))
    err = capsys.readouterr().err
    assert status == 2, (status, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert case.where in lines[0], (case.where, lines[0])
    if case.keep:
        assert _digest(ws / case.keep) == before, f"{case.keep} was modified"


# ------------------------------------------------------------------------------------------ API,
# warnings
def test_api_bad_dataset_objects_are_located_errors() -> None:
    import pandas as pd

    from datamill.core.errors import ConfigError, DataFileError
    from datamill.preprocessing.api import preprocess

    cfg = {"input_features": [{"name": "x", "type": "category"}]}
    with pytest.raises(ConfigError, match="got int"):
        preprocess(42, cfg)
    with pytest.raises(
        DataFileError
    ) as info:  # a column of mixed types (the seed's pandas traceback)
        preprocess(pd.DataFrame({"x": [1, "a", [2]]}), cfg)
    assert info.value.column == "x" and info.value.path == "<DataFrame>"


def test_dubious_input_warns_once(tmp_path: Path) -> None:
    from datamill.preprocessing.api import preprocess
    from datamill.text.corpus_build import VocabLimits, build_corpus

    cases = [
        (
            lambda: preprocess(
                pa.table({"x": pa.array([None, None], pa.string()), "y": ["a", "b"]}),
                {
                    "input_features": [
                        {
                            "name": "x",
                            "type": "binary",
                            "preprocessing": {"missing_value_strategy": "drop_row"},
                        },
                        {"name": "y", "type": "category"},
                    ]
                },
            ),
            "drop_row removed all 2 rows",
        ),
        (
            lambda: preprocess(
                pa.table({"x": [1.0, float("inf"), 2.0]}),
                {
                    "input_features": [
                        {
                            "name": "x",
                            "type": "number",
                            "preprocessing": {"normalization": "zscore"},
                        }
                    ]
                },
            ),
            "1 inf values",
        ),
        (
            lambda: preprocess(
                pa.table({"x": [1.0, 3.0, 2.0]}),
                {
                    "input_features": [{"name": "x", "type": "number"}],
                    "preprocessing": {"split": {"probabilities": [0, 0.5, 0.5]}},
                },
            ),
            "no training rows",
        ),
        (
            lambda: build_corpus(["a b c", "b c"], level="word", vocab=VocabLimits(min_freq=10)),
            "every token maps to '<unk>'",
        ),
        (
            lambda: build_corpus(["abc"], level="char", vocab=VocabLimits(max_size=0)),
            "every token maps to '<unk>'",
        ),
    ]
    for make, text in cases:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            make()
        messages = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
        assert len(messages) == 1 and text in messages[0], (text, messages)


def test_image_files_are_part_of_the_cache_key(data_copy: Any) -> None:
    from datamill.preprocessing.api import preprocess

    folder = data_copy("cifar10_tiny")
    cfg = {
        "input_features": [
            {"name": "image_path", "type": "image", "preprocessing": {"num_channels": 1}}
        ]
    }
    first = preprocess(folder / "labels.csv", cfg).data["image_path"][0].copy()
    assert preprocess(folder / "labels.csv", cfg).cached
    shutil.copy(folder / "images/2.png", folder / "images/1.png")  # same name, other pixels
    again = preprocess(folder / "labels.csv", cfg)
    assert not again.cached
    assert not np.array_equal(again.data["image_path"][0], first)


def test_closed_stdout_exits_quietly(tmp_path: Path, data_dir: Path) -> None:
    import subprocess
    import sys

    shutil.copy(data_dir / "timemachine.txt", tmp_path / "t.txt")
    assert (
        main(["-q", "corpus", os.fspath(tmp_path / "t.txt"), "--out", os.fspath(tmp_path / "c")])
        == 0
    )
    code = "import sys; from datamill.cli import main; sys.exit(main())"
    with subprocess.Popen(
        [sys.executable, "-c", code, "shards", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # like `| head -0`
        err = proc.stderr.read().decode()
        proc.wait()
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert proc.returncode in (0, 141)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=60)
@given(data=st.data())
def test_any_edit_of_a_resume_state_is_accepted_or_a_located_error(data: st.DataObject) -> None:
    import tempfile

    from datamill.core.errors import DatamillError
    from datamill.core.source import TableSource
    from datamill.loader.cli import _resume
    from datamill.loader.loader import Loader

    loader = Loader(TableSource(pa.table({"x": list(range(50))}), shard_size=10), 8, seed=3)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    how = data.draw(st.sampled_from(["replace", "drop", "add", "whole", "truncate"]))
    text: str
    if how == "whole":
        text = json.dumps(data.draw(_JSON))
    elif how == "truncate":
        full = json.dumps(state)
        text = full[: data.draw(st.integers(0, len(full) - 1))]
    else:
        key = data.draw(
            st.sampled_from(sorted(state)) if how != "add" else st.text(min_size=1, max_size=6)
        )
        if how == "drop":
            state.pop(key)
        else:
            state[key] = data.draw(_JSON)
        text = json.dumps(state)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "state.json")
        Path(path).write_text(text)
        fresh = Loader(TableSource(pa.table({"x": list(range(50))}), shard_size=10), 8, seed=3)
        try:
            _resume(fresh, path)
        except DatamillError as exc:
            assert exc.path == path, exc


def test_weak_messages_fixed(tmp_path: Path) -> None:
    from PIL import Image

    from datamill.core.errors import ConfigError
    from datamill.preprocessing.api import preprocess

    def binary(values: list[str | None], strategy: str) -> list[bool]:
        cfg = {
            "input_features": [
                {
                    "name": "b",
                    "type": "binary",
                    "preprocessing": {"missing_value_strategy": strategy},
                }
            ]
        }
        out = preprocess(pa.table({"b": pa.array(values, pa.string())}), cfg)
        return [bool(v) for v in out.data["b"]]  # type: ignore[union-attr]

    assert binary(["yes", "no", None], "bfill") == [
        True,
        False,
        False,
    ]  # the edge falls back to false, not ''
    assert binary([None, "yes", "no"], "ffill") == [False, True, False]
    with pytest.raises(
        ConfigError
    ) as info:  # binary fill_with_const without fill_value names the feature
        preprocess(
            pa.table({"b": pa.array(["yes", None], pa.string())}),
            {
                "input_features": [
                    {
                        "name": "b",
                        "type": "binary",
                        "preprocessing": {"missing_value_strategy": "fill_with_const"},
                    }
                ]
            },
        )
    assert info.value.column == "b" and "input_features[0]" in str(info.value)
    (tmp_path / "img").mkdir()
    Image.fromarray(np.full((4, 4, 3), 9, np.uint8)).save(tmp_path / "img/a.png")
    (tmp_path / "im.csv").write_text(
        'p,q\nimg/a.png,1\n"",2\n'
    )  # an empty image cell is a missing image
    out = preprocess(
        tmp_path / "im.csv", {"input_features": [{"name": "p", "type": "image"}]}, skip_save=True
    )
    img = out.data["p"]
    assert (
        isinstance(img, np.ndarray)
        and img.shape == (2, 4, 4, 3)
        and img[0].max() == 9
        and img[1].max() == 0
    )


# ------------------------------------------------------------------ issue 27: the examples and the
# fuzzer's finds Each test names the command that found the problem (the examples, or
# tests/fuzz shrunk to it).
def _one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``datamill ARGS``; assert exit 2 with exactly one ``error:`` line and no traceback;
    return it."""
    capsys.readouterr()
    status = _run(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, (status, err)
    return lines[0]


@pytest.fixture()
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder even root cannot write into: ``chattr +i`` (the issue's case); skipped where chattr
    fails."""
    import subprocess

    folder = tmp_path / "locked"
    folder.mkdir()
    if (
        not shutil.which("chattr")
        or subprocess.run(
            ["chattr", "+i", os.fspath(folder)], capture_output=True, check=False
        ).returncode
        != 0
    ):
        pytest.skip("chattr +i is not available here")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", os.fspath(folder)], capture_output=True, check=False)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A small table + config, text, raw text and a 1,000-sample shardset dataset."""
    d = tmp_path_factory.mktemp("issue27")
    house = pcsv.read_csv(data_dir / "house_prices_train.csv").select(
        ["Id", "LotArea", "SalePrice"]
    )
    pcsv.write_csv(house.slice(0, 1000), d / "h.csv")
    (d / "c.yaml").write_text(
        "input_features:\n  - {name: LotArea, type: number}\n"
        "output_features:\n  - {name: SalePrice, type: number}\n"
    )
    lines = (data_dir / "timemachine.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "t.txt").write_text("".join(lines[100:400]), encoding="utf-8")
    raw = (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "r.txt").write_text("".join(raw[:150]), encoding="utf-8")
    assert (
        _run(
            [
                "shards",
                "create",
                os.fspath(d / "ds"),
                "--uid",
                "Id",
                "--shardset",
                "m",
                os.fspath(d / "h.csv"),
                "--shard-size",
                "50",
            ]
        )
        == 0
    )
    assert (
        _run(
            [
                "preprocess",
                os.fspath(d / "h.csv"),
                "-c",
                os.fspath(d / "c.yaml"),
                "-o",
                os.fspath(d / "prep"),
            ]
        )
        == 0
    )
    shutil.copytree(d / "prep", d / "prep_bad")
    meta = d / "prep_bad" / "h.meta.json"
    meta.write_text(meta.read_text()[:50])  # a truncated meta.json
    return d


@pytest.mark.parametrize("command", ["preprocess", "corpus", "bert", "iterate --save-state"])
def test_unwritable_output_folder_is_one_output_error_line(
    command: str, small: Path, unwritable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`datamill preprocess|corpus|bert|iterate --save-state` into a `chattr +i` folder gave a
    PermissionError traceback."""
    s = os.fspath(small)
    args = {
        "preprocess": [
            "preprocess",
            f"{s}/h.csv",
            "-c",
            f"{s}/c.yaml",
            "-o",
            os.fspath(unwritable),
        ],
        "corpus": ["corpus", f"{s}/t.txt", "--out", os.fspath(unwritable / "c")],
        "bert": [
            "bert",
            f"{s}/r.txt",
            "--out",
            os.fspath(unwritable / "b.parquet"),
            "--vocab-size",
            "100",
            "--dupe-factor",
            "1",
            "--workers",
            "1",
        ],
        "iterate --save-state": [
            "iterate",
            f"{s}/ds",
            "--limit",
            "1",
            "--save-state",
            os.fspath(unwritable / "s.json"),
        ],
    }[command]
    line = _one_line(args, capsys)
    assert (
        os.fspath(unwritable) in line and "cannot write the output" in line and "chattr" in line
    ), line
    assert sorted(p.name for p in unwritable.iterdir()) == []


def test_output_error_names_the_final_path_not_the_temporary_one() -> None:
    import errno

    from datamill.core.errors import OutputError
    from datamill.core.io import as_output_error

    err = as_output_error(
        PermissionError(errno.EACCES, "Permission denied", "/x/.out.hdf5.tmp-12-0123abcd"), "o"
    )
    assert (
        isinstance(err, OutputError)
        and err.path == "/x/out.hdf5"
        and "permission denied" in str(err)
    )
    ro = as_output_error(OSError(errno.EROFS, "Read-only file system", "/mnt/ro/out"), "o")
    assert ro is not None and "read-only" in str(ro)


def test_png_bomb_is_a_located_error_and_the_limit_is_an_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PNG whose header declares 100000x100000 gave a raw PIL.DecompressionBombError (no row, no
    column)."""
    from PIL import Image

    from tests.fuzz.workspace import bomb_png

    (tmp_path / "images").mkdir()
    Image.new("RGB", (32, 32), (1, 2, 3)).save(tmp_path / "images/ok.png")
    (tmp_path / "images/bomb.png").write_bytes(bomb_png())
    (tmp_path / "l.csv").write_text("image_path,label\nimages/ok.png,a\nimages/bomb.png,b\n")
    (tmp_path / "c.yaml").write_text("input_features:\n  - {name: image_path, type: image}\n")
    line = _one_line(
        [
            "preprocess",
            os.fspath(tmp_path / "l.csv"),
            "-c",
            os.fspath(tmp_path / "c.yaml"),
            "--skip-save",
        ],
        capsys,
    )
    assert (
        "l.csv, line 3" in line and 'column "image_path"' in line and "--max-image-pixels" in line
    ), line
    (tmp_path / "ok.csv").write_text("image_path,label\nimages/ok.png,a\n")
    ok = [
        "preprocess",
        os.fspath(tmp_path / "ok.csv"),
        "-c",
        os.fspath(tmp_path / "c.yaml"),
        "--skip-save",
    ]
    assert _run(ok) == 0
    line = _one_line(
        [*ok, "--max-image-pixels", "100"], capsys
    )  # 1,024 pixels > 2 x 100: the limit applies
    assert "too large" in line and "line 2" in line
    line = _one_line([*ok, "--max-image-pixels", "0"], capsys)
    assert "--max-image-pixels" in line


@pytest.mark.parametrize(
    ("option", "where"),
    [
        (["--world-size", "1000000"], "larger than the 1,000 samples"),
        (["--window", "0"], "--window"),
        (["--cache-limit", "-1"], "--cache-limit"),
        (["--ranks-per-node", "0"], "--ranks-per-node"),
        (["--read-speed", "0"], "--read-speed"),
        (["--seed", "-1"], "--seed"),  # tests/fuzz: `plan --seed -1` raised a bare ValueError
        (["--cache-limit", "nan"], "--cache-limit"),
        (["--epochs", "1000000000000000000"], "--epochs"),
    ],
)
def test_absurd_plan_options_are_errors_not_silent_runs(
    option: list[str], where: str, small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`datamill plan --world-size 1000000` on 1,000 samples ran for minutes; --window 0 and friends
    were accepted."""
    import time

    start = time.perf_counter()
    line = _one_line(["plan", os.fspath(small / "ds"), "--read-speed", "100", *option], capsys)
    assert where in line and time.perf_counter() - start < 30, line


def test_mix_weights_must_be_finite() -> None:
    """`Mix([(a, nan), ...])` / inf weights: raw Python exceptions."""
    from datamill.core.errors import ConfigError
    from datamill.core.source import TableSource
    from datamill.loader import Mix

    src = TableSource(pa.table({"x": list(range(6))}), shard_size=2)
    for bad in (float("nan"), float("inf"), -1.0, "1"):
        with pytest.raises(ConfigError, match=r"weights\[0\]"):
            Mix([(src, bad), (src, 1.0)])  # type: ignore[list-item]


def test_cache_dir_that_is_a_file_is_a_cache_error(tmp_path: Path) -> None:
    """`--cache-dir FILE` (the shard cache of s3:// sources): a raw FileExistsError."""
    import pyarrow.fs as pafs

    from datamill.core.errors import CacheError
    from datamill.core.objstore import ShardFileCache

    (tmp_path / "file").write_text("mine")
    with pytest.raises(CacheError) as info:
        ShardFileCache(pafs.LocalFileSystem(), tmp_path / "file")
    assert (
        info.value.path == os.fspath(tmp_path / "file")
        and (tmp_path / "file").read_text() == "mine"
    )


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        (
            (
                "input_features:\n  - {name: LotArea, type: number}\ninput_features:\n  - {name: "
                "Id, type: number}\n"
            ),
            "input_features",
            3,
        ),
        ("input_features:\n  - name: LotArea\n    type: number\n    type: category\n", "type", 4),
        (
            (
                "input_features: [{name: LotArea, type: number, preprocessing: {normalization: "
                "zscore, normalization: minmax}}]\n"
            ),
            "normalization",
            1,
        ),
    ],
)
def test_duplicate_yaml_keys_are_a_config_error_with_the_line(
    text: str, key: str, line: int, small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config with `input_features:` twice exited 0 having dropped the first list (YAML's last key
    wins)."""
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.api import preprocess

    cfg = tmp_path / "dup.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        preprocess(small / "h.csv", cfg, skip_save=True)
    assert (info.value.path, info.value.line, info.value.column) == (os.fspath(cfg), line, key)
    out = _one_line(
        ["preprocess", os.fspath(small / "h.csv"), "-c", os.fspath(cfg), "--skip-save"], capsys
    )
    assert f"duplicate key '{key}'" in out and f"line {line}" in out


def test_duplicate_json_config_keys_are_a_config_error(tmp_path: Path) -> None:
    from datamill.core.errors import ConfigError
    from datamill.preprocessing.config import load_config

    (tmp_path / "c.json").write_text(
        '{"input_features": [], "input_features": [{"name": "x", "type": "number"}]}'
    )
    with pytest.raises(ConfigError, match="duplicate key 'input_features'"):
        load_config(tmp_path / "c.json")


def test_resume_state_past_the_epochs_end_is_an_error(
    small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume state with `batches_seen` past the epoch's end exited 0 having done nothing."""
    state = tmp_path / "s.json"
    assert (
        _run(
            [
                "iterate",
                os.fspath(small / "ds"),
                "--batch-size",
                "10",
                "--limit",
                "2",
                "--save-state",
                os.fspath(state),
            ]
        )
        == 0
    )
    edited = json.loads(state.read_text())
    edited["batches_seen"] = 10**6
    (tmp_path / "past.json").write_text(json.dumps(edited))
    line = _one_line(
        [
            "iterate",
            os.fspath(small / "ds"),
            "--batch-size",
            "10",
            "--resume",
            os.fspath(tmp_path / "past.json"),
        ],
        capsys,
    )
    assert "past.json" in line and "1,000,000 batches" in line and "only 100 batches" in line, line
    edited["batches_seen"] = 100  # exactly the end of the epoch: a valid state
    (tmp_path / "end.json").write_text(json.dumps(edited))
    assert (
        _run(
            [
                "iterate",
                os.fspath(small / "ds"),
                "--batch-size",
                "10",
                "--resume",
                os.fspath(tmp_path / "end.json"),
            ]
        )
        == 0
    )


@pytest.mark.ray
@pytest.mark.parametrize("command", ["preprocess", "bert"])
def test_unreachable_ray_address_is_one_line_within_30_s(
    command: str, small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--engine ray --address 127.0.0.1:1` (nothing there) did not finish within 5 minutes."""
    import time

    pytest.importorskip("ray")
    s = os.fspath(small)
    args = {
        "preprocess": ["preprocess", f"{s}/h.csv", "-c", f"{s}/c.yaml", "-o", f"{s}/never"],
        "bert": ["bert", f"{s}/r.txt", "--out", f"{s}/never.parquet"],
    }[command]
    start = time.perf_counter()
    line = _one_line([*args, "--engine", "ray", "--address", "127.0.0.1:1"], capsys)
    assert (
        time.perf_counter() - start <= 30
        and "127.0.0.1:1" in line
        and "cannot connect to Ray" in line
    )


@pytest.mark.ray
def test_a_ray_address_of_another_service_is_one_line_within_30_s(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--address` naming a port where an HTTP server answers: Ray retried it for minutes (> 200
    s)."""
    import http.server
    import threading
    import time

    pytest.importorskip("ray")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    worker = threading.Thread(target=httpd.serve_forever, daemon=True)
    worker.start()
    try:
        address = f"127.0.0.1:{httpd.server_address[1]}"
        s = os.fspath(small)
        args = ["bert", f"{s}/r.txt", "--out", f"{s}/never.parquet", "--engine", "ray"]
        start = time.perf_counter()
        line = _one_line([*args, "--address", address], capsys)
        assert time.perf_counter() - start <= 30, line
        assert address in line and "not as a Ray cluster" in line, line
    finally:
        httpd.shutdown()
        httpd.server_close()
        worker.join(timeout=10)


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--work-dir", "{notes}"],  # a file as the work folder: NotADirectoryError
        ["demo", "--work-dir", "{notes}/sub"],
        [
            "shards",
            "create",
            "{long}",
            "--uid",
            "Id",
            "--shardset",
            "m",
            "{csv}",
            "--shard-size",
            "10",
        ],  # ENAMETOOLONG
        ["word2vec", "{long}", "--out", "{tmp}/w"],
        [
            "shards",
            "create",
            "{tmp}/ds",
            "--uid",
            "Id",
            "--shardset",
            "m",
            "a\x00b",
        ],  # NUL byte: a bare ValueError
        [
            "shards",
            "add",
            "{ds}",
            "--shardset",
            "extra",
            "{csv}",
            "{csv}",
            "--route",
        ],  # exit 2 with no error line
        [
            "word2vec",
            "{txt}",
            "--out",
            "{tmp}/w",
            "--num-negatives",
            "1000000",
        ],  # ran past the 20 s limit
        [
            "word2vec",
            "{txt}",
            "--out",
            "{tmp}/w",
            "--num-negatives",
            "9223372036854775808",
        ],  # OverflowError
        [
            "corpus",
            "{txt}",
            "--out",
            "{tmp}/c",
            "--min-freq",
            "9223372036854775808",
        ],  # pyarrow TypeError
        ["corpus", "{txt}", "--out", "{tmp}/c", "--max-size", "-1"],
        ["bert", "{raw}", "--out", "{tmp}/b.parquet", "--dupe-factor", "1000000000000000000"],
        ["bert", "{raw}", "--out", "{tmp}/b.parquet", "--mask-prob", "nan"],
        ["iterate", "{ds}", "--batch-size", "0"],
        ["iterate", "{ds}", "--world-size", "2", "--rank", "5"],
        ["check-splits", "{ds}", "--columns", "nope", "--fail"],  # a raw KeyError from pyarrow
        ["check-splits", "{hdf5}", "--text-columns", "[]"],  # the same for a text column
        [
            "check-splits",
            "{bad_meta_hdf5}",
        ],  # a truncated meta.json beside it: a raw JSONDecodeError
    ],
)
def test_fuzzer_finds_are_one_line(
    args: list[str], small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shrunk failures of tests/fuzz (the command is the parameter): each is one error line now."""
    (tmp_path / "notes.txt").write_text("mine\n")
    subs = {
        "notes": os.fspath(tmp_path / "notes.txt"),
        "long": "x" * 100_000,
        "csv": os.fspath(small / "h.csv"),
        "tmp": os.fspath(tmp_path),
        "ds": os.fspath(small / "ds"),
        "txt": os.fspath(small / "t.txt"),
        "raw": os.fspath(small / "r.txt"),
        "hdf5": os.fspath(small / "prep" / "h.hdf5"),
        "bad_meta_hdf5": os.fspath(small / "prep_bad" / "h.hdf5"),
    }
    _one_line([a.format(**subs) for a in args], capsys)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_api_fuzzer_finds_raise_datamill_errors_or_type_errors(tmp_path: Path) -> None:
    """Shrunk failures of tests/fuzz/test_api_fuzz.py: each call raised something else (ValueError,
    AttributeError, a bare Exception from tokenizers, NotADirectoryError)."""
    from datamill import Vocab, build_bert_samples, load, preprocess
    from datamill.core.errors import DatamillError
    from datamill.core.source import TableSource
    from datamill.loader import (
        check_resume_compat,
        collate_numpy,
        epoch_order,
        read_batches,
        split_for_rank,
    )
    from datamill.pretrain.bert import is_bert_parquet, load_tokenizer
    from datamill.shards import ShardsetWriter
    from datamill.sources import ParquetSource, open_source
    from datamill.tokenize import HFTokenizer

    (tmp_path / "file.parquet").write_bytes(b"PAR1" + b"\x00" * 64)
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (epoch_order, (0,), {"seed": 0, "epoch": -1}),
        (epoch_order, (float("nan"),), {"seed": 0, "epoch": 0}),
        (split_for_rank, (np.arange(3),), {"rank": 0, "world_size": 0}),
        (check_resume_compat, (0, 0), {"fields": " "}),
        (collate_numpy, (0,), {}),
        (TableSource, (0,), {}),
        (HFTokenizer, (0,), {}),
        (ParquetSource, (tmp_path,), {"shard_by": 0}),
        (load_tokenizer, (tmp_path / "file.parquet",), {}),
        (ShardsetWriter, (tmp_path / "file.parquet",), {"uid": "u", "shardset": "s"}),
        (ShardsetWriter, ("x" * 10_000,), {"uid": "u", "shardset": "s"}),
        (open_source, ("x" * 10_000,), {}),  # ENAMETOOLONG from Path.exists()
        (open_source, ("a\x00b",), {}),
        (read_batches, ("x" * 10_000, 2), {}),  # (read_bert_batches before it moved to the loader)
        (build_bert_samples, (0,), {"out": 0, "config": 0}),  # an AttributeError from BertConfig.of
        # found after the tree's reformat reseeded the fuzzer (2026-11-26):
        (Vocab, (["a"],), {"str2freq": -1}),  # AttributeError: 'int' object has no attribute 'get'
        (Vocab, ("ab",), {}),  # a string taken as its characters
        (load, ("",), {}),  # ValueError: PosixPath('.') has an empty name
        (build_bert_samples, ("",), {"out": ""}),
        (is_bert_parquet, ("x" * 10_002,), {}),  # ENAMETOOLONG from Path.is_file()
        (ParquetSource, ("x" * 10_002,), {}),
        (preprocess, (0,), {"config": 0, "engine_options": np.array([1.0, np.nan])}),
    ]
    for fn, args, kwargs in calls:
        with pytest.raises((DatamillError, TypeError)):
            fn(*args, **kwargs)


def test_serve_state_folder_of_yours_is_left_alone(tmp_path: Path) -> None:
    """`datamill serve keys revoke 0123456789ab --state USER_FOLDER` changed the folder's mode to
    0700."""
    pytest.importorskip("fastapi")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    mode = mine.stat().st_mode
    _run(["serve", "keys", "revoke", "0123456789ab", "--state", os.fspath(mine)])
    assert mine.stat().st_mode == mode and sorted(p.name for p in mine.iterdir()) == [
        "notes.txt"
    ]  # and exit 2
