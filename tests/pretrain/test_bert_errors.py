"""Bad input fails loudly: error type and location attributes; nothing half-written is left."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.cli import main
from datamill.core.errors import ConfigError, DataFileError, DataFileNotFoundError
from datamill.pretrain.bert import _run as _bert_run
from datamill.pretrain.bert import build_bert_samples
from datamill.pretrain.bert._io import read_bert_metadata

TEXT = (
    " = A = \n the cat sat on the mat . \n the dog sat on the log . \n"
    " = B = \n a bird sang in the old tree . \n the sun rose over the green hill . \n"
)


@pytest.fixture()
def raw(tmp_path: Path) -> Path:
    p = tmp_path / "raw.txt"
    p.write_text(TEXT * 3, encoding="utf-8")
    return p


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.txt"
    p.write_text("  \n\n", encoding="utf-8")
    with pytest.raises(DataFileError) as exc:
        build_bert_samples(p, out=tmp_path / "o.parquet", vocab_size=50)
    assert exc.value.path == str(p)


def test_only_titles(tmp_path: Path) -> None:
    p = tmp_path / "titles.txt"
    p.write_text(" = A = \n\n = = B = = \n", encoding="utf-8")
    with pytest.raises(DataFileError) as exc:
        build_bert_samples(p, out=tmp_path / "o.parquet", vocab_size=50)
    assert exc.value.path == str(p)


def test_single_document(tmp_path: Path) -> None:
    p = tmp_path / "one.txt"
    p.write_text(
        " = A = \n the cat sat on the mat . \n the dog sat on the log . \n", encoding="utf-8"
    )
    out = tmp_path / "o.parquet"
    with pytest.raises(DataFileError, match="at least two") as exc:
        build_bert_samples(p, out=out, vocab_size=50)
    assert exc.value.path == str(p)
    assert not out.exists()


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "latin.txt"
    p.write_bytes(b" = A = \n fine line\n caf\xe9 line\n")
    with pytest.raises(DataFileError) as exc:
        build_bert_samples(p, out=tmp_path / "o.parquet", vocab_size=50)
    assert (exc.value.path, exc.value.line) == (str(p), 3)


def test_missing_input(tmp_path: Path) -> None:
    with pytest.raises(DataFileNotFoundError) as exc:
        build_bert_samples(tmp_path / "nope.txt", out=tmp_path / "o.parquet")
    assert exc.value.path == str(tmp_path / "nope.txt")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_seq_length": 4},
        {"dupe_factor": 0},
        {"mask_prob": 0.0},
        {"mask_prob": 1.5},
        {"max_predictions_per_seq": 0},
        {"short_seq_prob": -0.1},
        {"vocab_size": 3},
        {"layout": "dense"},
        {"workers": 0},
        {"sentence_split": "comma"},
        {"pairing": "random"},
    ],
)
def test_bad_parameters(raw: Path, tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as exc:
        build_bert_samples(raw, out=tmp_path / "o.parquet", **kwargs)  # type: ignore[arg-type]
    assert next(iter(kwargs)) in str(exc.value)


def _tokenizer_without_mask() -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        TEXT.splitlines(),
        trainers.WordPieceTrainer(
            vocab_size=60, special_tokens=["[PAD]", "[UNK]", "[CLS]"], show_progress=False
        ),
    )
    return tok


def test_tokenizer_file_without_specials(raw: Path, tmp_path: Path) -> None:
    path = tmp_path / "tok.json"
    _tokenizer_without_mask().save(str(path))  # type: ignore[attr-defined]
    with pytest.raises(DataFileError, match=r"\[SEP\].*\[MASK\]|\[MASK\].*\[SEP\]") as exc:
        build_bert_samples(raw, out=tmp_path / "o.parquet", tokenizer=path)
    assert exc.value.path == str(path)


def test_tokenizer_object_without_specials(raw: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[MASK\]"):
        build_bert_samples(raw, out=tmp_path / "o.parquet", tokenizer=_tokenizer_without_mask())


def test_tokenizer_file_not_json(raw: Path, tmp_path: Path) -> None:
    path = tmp_path / "tok.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataFileError) as exc:
        build_bert_samples(raw, out=tmp_path / "o.parquet", tokenizer=path)
    assert exc.value.path == str(path)


def test_failure_midway_leaves_no_output(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = _bert_run._run_task

    def boom(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk on fire")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(_bert_run, "_run_task", boom)
    out = tmp_path / "out" / "o.parquet"
    with pytest.raises(OSError, match="disk on fire"):
        build_bert_samples(raw, out=out, vocab_size=50, max_seq_length=16, dupe_factor=3)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temp file, no scratch folder


def test_reading_a_parquet_that_is_not_bert(tmp_path: Path) -> None:
    p = tmp_path / "x.parquet"
    pq.write_table(pa.table({"x": [1]}), p)
    with pytest.raises(DataFileError) as exc:
        read_bert_metadata(p)
    assert exc.value.path == str(p)


def test_cli_prints_counts_and_errors_in_one_line(
    raw: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "-q",
                "bert",
                str(raw),
                "--out",
                str(tmp_path / "b.parquet"),
                "--vocab-size",
                "60",
                "--max-seq-length",
                "16",
                "--dupe-factor",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "documents 6" in out and "samples" in out and "tokens" in out and "samples/s" in out
    assert (
        main(
            ["-q", "bert", str(raw), "--out", str(tmp_path / "c.parquet"), "--max-seq-length", "4"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_seq_length" in err and err.count("\n") == 1


def test_tokenizer_objects_are_accepted(raw: Path, tmp_path: Path) -> None:
    from datamill.pretrain.bert import load_tokenizer

    first = build_bert_samples(
        raw, out=tmp_path / "a.parquet", vocab_size=60, max_seq_length=16, dupe_factor=2
    )
    inner = load_tokenizer(first.path)

    class Wrapper:  # shaped like datamill.tokenize.HFTokenizer: the library tokenizer in .inner
        def __init__(self, inner: object) -> None:
            self.inner = inner

    for tok in (inner, Wrapper(inner), first.tokenizer_path):
        again = build_bert_samples(
            raw, out=tmp_path / "b.parquet", tokenizer=tok, max_seq_length=16, dupe_factor=2
        )
        assert pq.read_table(again.path).equals(pq.read_table(first.path))
    with pytest.raises(ConfigError):
        build_bert_samples(raw, out=tmp_path / "c.parquet", tokenizer=42)


def test_cli_pairing_and_api_flag_names(raw: Path, tmp_path: Path) -> None:
    """--pairing reaches the metadata; --max-predictions-per-seq and its old spelling both work."""
    for flag, pairing in [
        ("--max-predictions-per-seq", "google"),
        ("--max-predictions", "chunk_past_target"),
    ]:
        out = tmp_path / f"{pairing}.parquet"
        assert (
            main(
                [
                    "bert",
                    str(raw),
                    "--out",
                    str(out),
                    "--vocab-size",
                    "60",
                    "--max-seq-length",
                    "16",
                    "--dupe-factor",
                    "2",
                    flag,
                    "3",
                    "--pairing",
                    pairing,
                    "--quiet",
                ]
            )
            == 0
        )
        meta = read_bert_metadata(out)
        assert (meta["pairing"], meta["max_predictions_per_seq"]) == (pairing, 3)


def test_pairing_seed_is_a_deprecated_alias_and_bert_config_is_the_keyword_call(
    raw: Path, tmp_path: Path
) -> None:
    """pairing="seed" (the old name: read as a random seed) warns and builds the chunk_past_target
    samples."""
    from datamill.pretrain.bert import BertConfig

    kw = {"vocab_size": 200, "max_seq_length": 32, "dupe_factor": 1}
    new = build_bert_samples(
        raw, out=tmp_path / "new.parquet", config=BertConfig(pairing="chunk_past_target", **kw)
    )
    with pytest.warns(DeprecationWarning, match="chunk_past_target"):
        old = build_bert_samples(raw, out=tmp_path / "old.parquet", pairing="seed", **kw)
    assert pq.read_table(new.path).equals(pq.read_table(old.path))
    with pytest.raises(ConfigError, match="unknown BERT option 'max_len'") as info:
        build_bert_samples(raw, out=tmp_path / "x.parquet", max_len=8)
    assert "max_seq_length" in str(info.value.hint)
