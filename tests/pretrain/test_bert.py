"""End to end on a slice of WikiText-2: the Parquet file holds exactly what the issue specifies."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamill.pretrain.bert import BertSamples, build_bert_samples, load_tokenizer, read_metadata
from datamill.pretrain.bert import _run as _bert_run
from datamill.pretrain.bert._docs import TokenizedDocuments, split_documents, tokenize_documents
from datamill.pretrain.bert._tok import resolve_tokenizer

L = 128
MAXP = 12


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path
) -> tuple[BertSamples, TokenizedDocuments]:
    tmp = tmp_path_factory.mktemp("bert")
    lines = (data_dir / "wikitext2_test.raw").read_text(encoding="utf-8").splitlines()[:700]
    raw = tmp / "wiki.raw"
    raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = build_bert_samples(
        raw,
        out=tmp / "out" / "bert.parquet",
        vocab_size=1000,
        max_seq_length=L,
        dupe_factor=3,
        max_predictions_per_seq=MAXP,
        seed=5,
    )
    tok = resolve_tokenizer(res.tokenizer_path)
    assert tok is not None
    sentences, sent_doc = split_documents([raw])
    return res, tokenize_documents(sentences, sent_doc, tok)


def arrays(res: BertSamples) -> dict[str, object]:
    t = pq.read_table(res.path)
    return {c: t.column(c).to_pylist() for c in t.column_names}


def test_counts_metadata_and_schema(built: tuple[BertSamples, TokenizedDocuments]) -> None:
    res, corpus = built
    assert res.documents == corpus.num_documents > 20
    assert res.samples == pq.read_metadata(res.path).num_rows > 300
    meta = read_metadata(res.path)
    assert meta["format"] == "datamill.bert/1" and meta["samples"] == res.samples
    assert meta["max_seq_length"] == L and meta["special_ids"]["pad"] == 0
    assert (res.path.parent / meta["tokenizer_file"]).exists()
    stored = load_tokenizer(res.path)  # the tokenizer also travels inside the file
    assert stored.to_str() == (res.path.parent / meta["tokenizer_file"]).read_text("utf-8")
    assert "datamill.tokenizer" not in (
        pq.read_schema(res.path).metadata or {}
    )  # not in every table
    assert [f.name for f in pq.read_schema(res.path)] == [
        "tokens",
        "segment_ids",
        "is_random_next",
        "masked_positions",
        "masked_labels",
    ]
    assert not [p for p in res.path.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_samples_layout_masks_and_document_continuity(
    built: tuple[BertSamples, TokenizedDocuments],
) -> None:
    res, corpus = built
    meta = read_metadata(res.path)
    sp = meta["special_ids"]
    specials = set(sp.values())
    cols = arrays(res)
    docs = [corpus.document(d).tobytes() for d in range(corpus.num_documents)]
    checked_adjacent = 0
    for toks, segs, rnd, poss, labs in zip(
        cols["tokens"],
        cols["segment_ids"],
        cols["is_random_next"],
        cols["masked_positions"],
        cols["masked_labels"],
        strict=True,
    ):
        assert len(toks) == len(segs) == L
        k = L - segs.count(-1)
        la = segs.count(0) - 2
        lb = segs.count(1) - 1
        assert la >= 1 and lb >= 1 and la + lb + 3 == k
        assert segs == [0] * (la + 2) + [1] * (lb + 1) + [-1] * (L - k)
        assert toks[0] == sp["cls"] and toks[la + 1] == sp["sep"] and toks[k - 1] == sp["sep"]
        assert toks[k:] == [sp["pad"]] * (L - k)
        original = list(toks)
        for p, lab in zip(poss, labs, strict=True):
            assert 0 < p < k - 1 and p != la + 1 and lab not in specials
            original[p] = lab
        cand = sum(t not in specials for t in original[1 : la + 1] + original[la + 2 : k - 1])
        assert len(poss) == min(MAXP, max(1, round((la + lb) * 0.15)), cand)
        assert poss == sorted(set(poss))
        a = np.asarray(original[1 : la + 1], dtype=np.int32).tobytes()
        b = np.asarray(original[la + 2 : k - 1], dtype=np.int32).tobytes()
        if rnd:
            assert any(_find(doc, b) >= 0 for doc in docs)  # B is a run of some document
            continue
        # a non-random B continues A inside the same document (after truncation at A's end/B's
        # start)
        found = False
        for doc in docs:
            start = _find(doc, a)
            while start >= 0 and not found:
                after = doc[start + len(a) :]
                gap = _find(after, b)
                if gap >= 0 and (la + lb < L - 3 and gap == 0 or la + lb == L - 3):
                    found = True
                    checked_adjacent += la + lb < L - 3
                start = _find(doc, a, start + 4)
            if found:
                break
        assert found, "a non-random B does not follow its A in any document"
    assert checked_adjacent > 10


def _find(hay: bytes, needle: bytes, start: int = 0) -> int:
    """Token-aligned bytes.find (int32 tokens)."""
    i = hay.find(needle, start)
    while i >= 0 and i % 4:
        i = hay.find(needle, i + 1)
    return i


def test_nsp_rate_and_mask_rates_on_real_text(
    built: tuple[BertSamples, TokenizedDocuments],
) -> None:
    res, _ = built
    cols = arrays(res)
    sp = read_metadata(res.path)["special_ids"]
    rnd = np.asarray(cols["is_random_next"])
    # 1/2 of multi-sentence chunks + every one-sentence chunk (WikiText lines are long paragraphs)
    assert rnd.mean() > 0.5 - 4.5 * math.sqrt(0.25 / len(rnd))
    shown = np.asarray(
        [t[p] for t, ps in zip(cols["tokens"], cols["masked_positions"], strict=True) for p in ps]
    )
    labels = np.asarray([x for ls in cols["masked_labels"] for x in ls])
    m = len(shown)
    masked = (shown == sp["mask"]).mean()
    assert abs(masked - 0.8) < 4.5 * math.sqrt(0.16 / m)
    kept = (shown == labels).mean()
    assert abs(kept - 0.1) < 4.5 * math.sqrt(0.09 / m) + 0.001


def test_period_split_gives_multi_sentence_chunks_and_half_random(
    tmp_path: Path, built: tuple[BertSamples, TokenizedDocuments]
) -> None:
    res, _ = built
    raw = res.path.parent.parent / "wiki.raw"
    per = build_bert_samples(
        raw,
        out=tmp_path / "p.parquet",
        tokenizer=res.tokenizer_path,
        max_seq_length=L,
        dupe_factor=3,
        seed=5,
        sentence_split="period",
    )
    assert per.sentences > 2 * res.sentences
    rnd = pq.read_table(per.path, columns=["is_random_next"]).column(0).to_numpy()
    assert abs(rnd.mean() - 0.5) < 0.1  # only document-final one-sentence chunks are forced random


def test_same_seed_same_file_any_worker_count_other_seed_differs(
    tmp_path: Path,
    data_dir: Path,
    built: tuple[BertSamples, TokenizedDocuments],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    res, _ = built
    monkeypatch.setattr(_bert_run, "SHARD_TOKENS", 20000)  # several shards, so workers really share
    raw = tmp_path / "wiki.raw"
    raw.write_text(
        "\n".join((data_dir / "wikitext2_test.raw").read_text("utf-8").splitlines()[:300])
    )
    kw = {"tokenizer": res.tokenizer_path, "max_seq_length": 64, "dupe_factor": 2, "seed": 1}
    one = build_bert_samples(raw, out=tmp_path / "w1.parquet", workers=1, **kw)
    two = build_bert_samples(raw, out=tmp_path / "w2.parquet", workers=2, **kw)
    assert pq.read_metadata(one.path).num_row_groups > 2
    assert pq.read_table(one.path).equals(pq.read_table(two.path))
    other = build_bert_samples(raw, out=tmp_path / "s2.parquet", workers=1, **{**kw, "seed": 2})
    assert not pq.read_table(one.path).equals(pq.read_table(other.path))


def test_reading_in_small_blocks_changes_nothing(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datamill.pretrain.bert import _docs as _bert_docs

    path = data_dir / "wikitext2_test.raw"
    whole, whole_doc = split_documents([path])
    monkeypatch.setattr(_bert_docs, "_BLOCK_BYTES", 997)  # blocks end mid-line and mid-character
    small, small_doc = split_documents([path])
    assert small.equals(whole)
    changes = lambda d: np.flatnonzero(np.diff(d)).tolist()
    assert changes(small_doc) == changes(whole_doc)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b" = T = \n" + b"fine words here\n" * 300 + b"caf\xe9\n")
    from datamill.core.errors import DataFileError

    with pytest.raises(DataFileError) as exc:
        split_documents([bad])
    assert exc.value.line == 302


def test_several_files_split_in_threads_keep_file_order_and_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of several files are split in two threads; the sentences stay in file order, a file
    end ends a document, and a blank file among them is named in the error (not a later one)."""
    from datamill.core.errors import DataFileError
    from datamill.pretrain.bert import _docs as _bert_docs

    texts = [
        " = A = \n" + "".join(f"a{i} words here\n" for i in range(200)),
        "".join(f"b{i} more words\n" for i in range(150)) + "\n" + "c last doc\n",
        "d only line",
    ]
    files = []
    for i, t in enumerate(texts):
        files.append(tmp_path / f"f{i}.txt")
        files[-1].write_text(t)
    monkeypatch.setattr(_bert_docs, "_BLOCK_BYTES", 301)  # many blocks per file, in flight at once
    sentences, doc = split_documents(files)
    want = [
        ln.strip()
        for t in texts
        for ln in t.splitlines()
        if ln.strip() and not ln.strip().startswith("=")
    ]
    assert sentences.to_pylist() == want
    # documents: file 0 (a*), file 1 (b*), file 1 after the blank line (c), file 2 (d)
    first = {s[0] for s in want}
    starts = np.flatnonzero(np.diff(doc)) + 1
    assert [want[0][0], *[want[i][0] for i in starts]] == ["a", "b", "c", "d"] and first == {
        "a",
        "b",
        "c",
        "d",
    }
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    with pytest.raises(DataFileError) as exc:
        split_documents([files[0], blank, tmp_path / "f1.txt"])
    assert "blank.txt" in str(exc.value)
    (tmp_path / "zero.txt").write_bytes(b"")
    with pytest.raises(DataFileError) as exc:
        split_documents([files[0], files[1], tmp_path / "zero.txt"])
    assert "zero.txt" in str(exc.value) and "empty" in str(exc.value)


def test_raw_text_to_samples_twice_gives_the_same_file(tmp_path: Path, data_dir: Path) -> None:
    """With the tokenizer trained on the text (the library's trainer alone would differ from run to
    run), the same text and seed give the same tokenizer and the same samples."""
    kw = {"vocab_size": 5000, "max_seq_length": 64, "dupe_factor": 1, "seed": 3}
    raw = data_dir / "wikitext2_test.raw"
    one = build_bert_samples(raw, out=tmp_path / "a.parquet", **kw)
    two = build_bert_samples(raw, out=tmp_path / "b.parquet", **kw)
    assert one.tokenizer_path.read_text() == two.tokenizer_path.read_text()
    assert pq.read_table(one.path).equals(pq.read_table(two.path))
