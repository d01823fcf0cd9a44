"""``datamill tokenize``: every input kind gives the tokens of its documents, the output is a
shardset the Loader and Mix read, bad input is located or skipped and counted, runs are
byte-identical whatever the workers or the task size."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datamill.cli import main
from datamill.core.errors import ConfigError, DataFileError, SchemaError
from datamill.loader import Batching, Loader, Mix
from datamill.shards import ShardsetDataset
from datamill.text import tokenize
from datamill.text.tok_build import tokenizer_path
from datamill.text.tok_inputs import InputFile, expand_inputs, plan_tasks
from datamill.text.tok_read import BadRecords, ReadOptions, read_task
from datamill.text.tok_task import UID_SHIFT
from datamill.text.tok_vocab import train_bpe

DOCS = [
    "The cat sat on the mat.",
    "A much longer document about tokenization. " * 30,
    "Ünïcödé text: naïve café, 東京, emoji 🙂.",
    "short",
    "Lines\nwithin one document\nare kept.",
] * 8


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train_bpe(DOCS * 3, vocab_size=400), encoding="utf-8")
    return path


def _reference(tok_file: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_file))
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _tokens(out: Path) -> pa.Table:
    return ShardsetDataset(out).to_table().sort_by("uid")


def _jsonl(path: Path, docs: list[str], **extra: Any) -> Path:
    lines = [json.dumps({"text": d, "n": i, **extra}) for i, d in enumerate(docs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _files(tmp_path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    j = _jsonl(tmp_path / "docs.jsonl", DOCS)
    gz = tmp_path / "docs.jsonl.gz"
    gz.write_bytes(gzip.compress(j.read_bytes()))
    zst = tmp_path / "docs.jsonl.zst"
    with pa.output_stream(str(zst), compression="zstd") as f:
        f.write(j.read_bytes())
    pqf = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": DOCS}), pqf, row_group_size=7)
    txt = tmp_path / "docs.txt"
    txt.write_text("\n\n  \n".join(d.replace("\n", " ") for d in DOCS) + "\n", encoding="utf-8")
    one = tmp_path / "one.txt"
    one.write_text(DOCS[1], encoding="utf-8")
    return {
        "jsonl": (j, {}),
        "gzip": (gz, {}),
        "zstd": (zst, {}),
        "parquet": (pqf, {"read": ReadOptions(text_field="body")}),
        "text": (txt, {}),
        "file": (one, {"read": ReadOptions(text_unit="file")}),
    }


@pytest.mark.parametrize("kind", ["jsonl", "gzip", "zstd", "parquet", "text", "file"])
def test_every_input_kind_gives_the_tokens_of_its_documents(
    kind: str, tmp_path: Path, tok_file: Path
) -> None:
    path, opts = _files(tmp_path)[kind]
    res = tokenize(path, out=tmp_path / "out", tokenizer=tok_file, workers=1, **opts)
    docs = [DOCS[1]] if kind == "file" else DOCS
    if kind == "text":
        docs = [d.replace("\n", " ").strip() for d in DOCS]
    t = _tokens(tmp_path / "out")
    assert t.column("tokens").to_pylist() == _reference(tok_file, docs)
    assert t.column("length").to_pylist() == [len(x) for x in _reference(tok_file, docs)]
    assert res.documents == len(docs) and res.tokens == sum(t.column("length").to_pylist())
    assert t.schema.field("tokens").type == pa.list_(pa.uint16())
    assert (tmp_path / "out.tokenizer.json").read_text() == tok_file.read_text()
    assert main(["shards", "check", str(tmp_path / "out")]) == 0


def test_bos_eos_kept_fields_metadata_and_stable_uids(tmp_path: Path, tok_file: Path) -> None:
    j = _jsonl(tmp_path / "a.jsonl", DOCS, src="wiki")
    t2 = tmp_path / "b.txt"
    t2.write_text("first block\n\nsecond block\n", encoding="utf-8")
    res = tokenize(
        [j, t2], out=tmp_path / "out", tokenizer=tok_file, bos="<s>", eos="</s>",
        read=ReadOptions(keep=("n",)), workers=1,
    )  # fmt: skip
    ds = ShardsetDataset(tmp_path / "out")
    t = _tokens(tmp_path / "out")
    toks = t.column("tokens").to_pylist()
    assert all(x[0] == 1 and x[-1] == 2 for x in toks)  # <s> = 1, </s> = 2 in a trained vocab
    assert t.column("n").to_pylist()[:3] == ["0", "1", "2"] and t.column("n").null_count == 2
    uids = np.asarray(t.column("uid"))
    assert (uids >> UID_SHIFT).tolist() == [0] * len(DOCS) + [1, 1]
    starts = [0, *np.cumsum([len(x) + 1 for x in j.read_bytes().split(b"\n")])[:-2].tolist()]
    assert (uids[: len(DOCS)] & ((1 << UID_SHIFT) - 1)).tolist() == starts
    assert (uids[len(DOCS) :] & 0xFFFF).tolist() == [0, 13]
    meta = json.loads(ds.manifest["shardsets"][0]["source_metadata"])
    assert meta["documents"] == res.documents == len(DOCS) + 2
    assert [f["documents"] for f in meta["files"]] == [len(DOCS), 2]
    assert meta["tokens"] == sum(len(x) for x in toks) and meta["bos"] == 1


def test_any_task_size_and_worker_count_give_the_same_bytes(tmp_path: Path, tok_file: Path) -> None:
    files = [p for p, _ in list(_files(tmp_path).values())[:3]]
    outs = []
    for i, (workers, task_bytes) in enumerate([(1, 300), (2, 300), (2, None)]):
        out = tmp_path / f"run{i}" / "tok"
        tokenize(files, out=out, tokenizer=tok_file, workers=workers, task_bytes=task_bytes)
        outs.append(out)
    assert _tokens(outs[0]).equals(_tokens(outs[2]))
    assert len(ShardsetDataset(outs[0]).shard_sizes()) > 10
    assert bytes_of(outs[0]) == bytes_of(outs[1])


def bytes_of(root: Path) -> dict[str, bytes]:
    """Every file of an output folder, by relative path (what "byte-identical" compares)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@settings(max_examples=25, deadline=None)
@given(
    docs=st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=60), max_size=25),
    task_bytes=st.integers(1, 200),
    blocks=st.booleans(),
)
def test_byte_ranges_partition_the_documents(
    tmp_path_factory: pytest.TempPathFactory, docs: list[str], task_bytes: int, blocks: bool
) -> None:
    d = tmp_path_factory.mktemp("ranges")
    if blocks:
        docs = [" ".join(x.split()) for x in docs]
        docs = [x for x in docs if x]
        p = d / "x.txt"
        p.write_text("\n\n".join(docs) + ("\n" if docs else ""), encoding="utf-8")
    else:
        p = _jsonl(d / "x.jsonl", docs)
    files = expand_inputs(p)
    got: list[str] = []
    pos: list[int] = []
    for t in plan_tasks(files, task_bytes=task_bytes):
        for b in read_task(files[0], t, ReadOptions(), BadRecords()):
            got += b.texts
            pos += b.positions.tolist()
    assert got == docs
    assert pos == sorted(set(pos))


def test_loader_and_mix_read_the_output(tmp_path: Path, tok_file: Path) -> None:
    a = tokenize(_jsonl(tmp_path / "a.jsonl", DOCS), out=tmp_path / "a", tokenizer=tok_file)
    b = tokenize(
        _files(tmp_path)["text"][0], out=tmp_path / "b", tokenizer=tok_file, task_bytes=400
    )
    batch = next(iter(Loader(a.dataset(), 8, seed=0, collate="arrow")))
    assert batch.num_rows == 8 and set(batch.column_names) >= {"uid", "tokens", "length"}
    rows = [
        r
        for bt in Loader(a.dataset(), 7, collate="arrow", batching=Batching(shuffle=False))
        for r in bt.to_pylist()
    ]
    assert [r["tokens"] for r in rows] == _reference(tok_file, DOCS)
    mix = Mix([(a.dataset(), 0.5), (b.dataset(), 0.5)], epoch_size=20, names=["a", "b"])
    out = next(iter(Loader(mix, 20, seed=1, collate="arrow")))
    assert sorted(out.column("source").to_pylist()) == ["a"] * 10 + ["b"] * 10


def test_a_previous_output_is_replaced_a_file_of_yours_is_not(
    tmp_path: Path, tok_file: Path
) -> None:
    j = _jsonl(tmp_path / "a.jsonl", DOCS)
    tokenize(j, out=tmp_path / "out", tokenizer=tok_file, eos="</s>")
    res = tokenize(j, out=tmp_path / "out", tokenizer=tok_file)
    assert res.tokens == sum(len(x) for x in _reference(tok_file, DOCS))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(DataFileError, match="refusing to replace"):
        tokenize(j, out=tmp_path / "mine", tokenizer=tok_file)
    with pytest.raises(ConfigError, match="exactly one"):
        tokenize(j, out=tmp_path / "x")
    with pytest.raises(ConfigError, match="not in the tokenizer"):
        tokenize(j, out=tmp_path / "x", tokenizer=tok_file, eos="<nope>")


def test_trained_vocabulary_is_deterministic(tmp_path: Path) -> None:
    j = _jsonl(tmp_path / "a.jsonl", DOCS)
    r1 = tokenize(j, out=tmp_path / "r1" / "tok", train_vocab=300, workers=1)
    r2 = tokenize(j, out=tmp_path / "r2" / "tok", train_vocab=300, workers=2, task_bytes=500)
    assert tokenizer_path(r1.path).read_bytes() == tokenizer_path(r2.path).read_bytes()
    assert _tokens(r1.path).equals(_tokens(r2.path))


BAD = [
    (b'{"text": "ok"}\n{"text": "bad \xff byte"}\n{"text": "ok2"}\n', 2, None, "invalid UTF-8"),
    (b'{"text": "ok"}\n\n{"text": "ok2"}\n{"text": "cut\n', 4, None, "not a JSON line"),
    (b'{"text": "ok"}\n{"body": "x"}\n{"text": "ok2"}\n', 2, "text", "missing"),
    (b'{"text": "ok"}\n{"text": 5}\n{"text": "ok2"}\n', 2, "text", "not a string"),
    (b'{"text": "ok"}\n[1, 2]\n{"text": "ok2"}\n', 2, None, "JSON object"),
]


@pytest.mark.parametrize(("data", "line", "column", "what"), BAD)
def test_bad_records_are_located_or_skipped_and_counted(
    tmp_path: Path, tok_file: Path, data: bytes, line: int, column: str | None, what: str
) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "pad"}\n' * 50 + data)
    with pytest.raises(DataFileError, match=what) as info:
        tokenize(p, out=tmp_path / "out", tokenizer=tok_file, task_bytes=300)
    err = info.value
    assert (err.path, err.line, err.column) == (str(p), 50 + line, column)
    assert not (tmp_path / "out").exists()
    res = tokenize(
        p, out=tmp_path / "out", tokenizer=tok_file, task_bytes=300, read=ReadOptions(skip_bad=True)
    )
    assert res.bad == 1 and res.documents == 50 + 2
    meta = json.loads(ShardsetDataset(res.path).manifest["shardsets"][0]["source_metadata"])
    assert meta["bad"]["count"] == 1 and meta["bad"]["examples"][0]["line"] == 50 + line


def test_bad_text_and_parquet_inputs_are_located(tmp_path: Path, tok_file: Path) -> None:
    t = tmp_path / "bad.txt"
    t.write_bytes(b"good block\n\nline two\nbad \xfe here\n\nlast\n")
    with pytest.raises(DataFileError, match="invalid UTF-8") as info:
        tokenize(t, out=tmp_path / "o1", tokenizer=tok_file)
    assert info.value.line == 4
    res = tokenize(t, out=tmp_path / "o1", tokenizer=tok_file, read=ReadOptions(skip_bad=True))
    assert (res.documents, res.bad) == (2, 1)
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["a", None, "b"]}), p)
    with pytest.raises(DataFileError, match="null") as info:
        tokenize(p, out=tmp_path / "o2", tokenizer=tok_file)
    assert (info.value.row, info.value.column) == (1, "text")
    with pytest.raises(SchemaError, match="no column 'body'"):
        tokenize(p, out=tmp_path / "o2", tokenizer=tok_file, read=ReadOptions(text_field="body"))


def test_cli_prints_a_summary_or_one_error_line(
    tmp_path: Path, tok_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    j = _jsonl(tmp_path / "a.jsonl", DOCS)
    assert (
        main(["tokenize", str(j), "--tokenizer", str(tok_file), "--out", str(tmp_path / "o"), "-q"])
        == 0
    )
    assert f"{len(DOCS)} documents" in capsys.readouterr().out
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(b'{"text": "x"}\n{"txt": "y"}\n')
    args = ["tokenize", str(bad), "--tokenizer", str(tok_file), "--out", str(tmp_path / "p"), "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 2" in err and 'column "text"' in err
    assert main([*args, "--skip-bad"]) == 0
    assert "skipped 1 bad records" in capsys.readouterr().out


def test_input_errors(tmp_path: Path) -> None:
    from datamill.core.errors import DataFileNotFoundError

    with pytest.raises(DataFileNotFoundError, match="no file matches"):
        expand_inputs(str(tmp_path / "*.jsonl"))
    tasks = plan_tasks([InputFile("a", "text", None, 10)], task_bytes=4)
    assert [(t.start, t.end) for t in tasks] == [(0, 4), (4, 8), (8, 10)]
