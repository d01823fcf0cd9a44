"""The BERT builder (:func:`build_bert_samples`); public through :mod:`datamill.pretrain.bert`.

BERT pretraining data: documents -> NSP sentence pairs -> truncation -> 15% masking -> Parquet.

Sentence pairs follow one of two rules (``pairing``; see :mod:`datamill.pretrain.bert._pairs`):

* ``"chunk_past_target"`` (the default; ``"seed"`` is its deprecated old name): the loop of the
  article this project started from. Its chunk scan runs one sentence past the
  sentence that reaches the target length, so a chunk holds at least two sentences whenever the
  document has two left, and B is random only when the chunk left no B or with probability 0.5;
  a random pair gives the sentences after A back to the document. On WikiText, whose lines are
  long paragraphs, about half of the samples get a random B, and there are more samples per
  document than with Google's rule. Where the seed's random-B scan would leave B empty (A alone
  reaches the target), datamill takes one sentence, so every pair has A and B.
* ``"google"``: Google's ``create_instances_from_document``: the chunk stops at the sentence that
  reaches the target, so a WikiText paragraph longer than the target is a one-sentence chunk
  whose B must be random: far more than half of the samples are random (about 0.9 at 128 tokens
  on wikitext2_test.raw).

Everything after the pairs follows Google's ``create_pretraining_data.py`` (``truncate_seq_pair``,
``create_masked_lm_predictions``), as used by d2l.ai's "The Dataset for Pretraining BERT", with
these deliberate differences:

* documents come from WikiText-style raw text: a blank line or a title line (``=`` ...) ends a
  document, every other line is a sentence;
* ``num_predictions = min(max_predictions_per_seq, max(1, round((len(A) + len(B)) * mask_prob)))``
  (specials not counted), drawn among non-special tokens only; the 10% random replacements are
  non-special ids;
* neither documents nor samples are shuffled in memory (the seed's two ``rng.shuffle`` calls):
  samples are written in production order and the loader shuffles them; random B documents are
  drawn uniformly either way;
* random numbers come from numpy generators (``rng_for(seed, "bert-*", dupe, shard)``) and
  truncation draws the front/back split of each pair as Binomial(removed, 1/2), the distribution of
  the seed's coin flips; each pair loop consumes uniforms in exactly its reference's order (checked
  draw for draw against pure-Python transcriptions in ``tests/pretrain/test_bert_pairs.py``).

The WordPiece tokenizer, when none is given, is trained from word counts of one vectorised cut of
the text (:mod:`._fasttok`, :mod:`._wptrain`): the same words and counts ``tokenizers``' own
trainer makes, fed to that trainer, about 3x faster than ``train_from_iterator`` on the lines; the
same cut then gives the token ids. The library's trainer alone is not deterministic run to run
(the ids of its ``##`` tokens follow hash-map order, and merge ties follow those ids,
huggingface/tokenizers#1794); this path gives it every initial token with a fixed, sorted id, so
the trained tokenizer is the same on every run, and the samples are a pure function of the text,
the parameters and the seed.

Stages: :mod:`._docs` (documents, tokenising), :mod:`._pairs` (pair loop per document,
vectorised truncation), :mod:`._mask` (vectorised assembly, masking, padding),
:mod:`._run` (tasks and worker pool), :mod:`._io` (Parquet writing and reading back).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datamill.core.errors import ConfigError, DataFileError, DatamillError
from datamill.core.fingerprint import fingerprint_file, fingerprint_obj
from datamill.core.io import PathLike, atomic_write, check_output, display_name, find_litter
from datamill.core.progress import progress
from datamill.core.storage import is_remote, local_path
from datamill.engines import LOCAL, check_engine, engine_job
from datamill.pretrain.bert._docs import (
    TokenizedDocuments,
    corpus_from_ids,
    split_documents,
    tokenize_documents,
)
from datamill.pretrain.bert._io import (
    BertParquetSource,
    collate_bert,
    is_bert_parquet,
    write_batches,
)
from datamill.pretrain.bert._remote import build_to_s3
from datamill.pretrain.bert._run import plan_tasks, run_tasks
from datamill.pretrain.bert._tok import (
    BERT_SPECIALS,
    BertTokenizer,
    cut,
    resolve_tokenizer,
    train_wordpiece_chunked,
)
from datamill.pretrain.bert.config import BertConfig, BertSamples
from datamill.pretrain.bert.engine import build_metadata, check_documents, task_config

__all__ = [
    "BERT_SPECIALS",
    "BertConfig",
    "BertParquetSource",
    "BertSamples",
    "build_bert_samples",
    "collate_bert",
    "is_bert_parquet",
    "load_tokenizer",
    "read_metadata",
]

if TYPE_CHECKING:  # third-party types only (tokenizers is imported when a tokenizer is loaded)
    from tokenizers import Tokenizer

_MIN_POOL_TOKENS = 4_000_000  # below (corpus tokens x dupe_factor) a pool costs more than it saves


def build_bert_samples(
    source: PathLike | Sequence[PathLike],
    /,
    *,
    out: PathLike,
    config: BertConfig | None = None,
    **options: Any,
) -> BertSamples:
    """Write BERT pretraining samples (NSP pairs + masked LM) from raw text to a Parquet file.

    Args:
        source: one raw text file (or ``archive.zip:member``), or several.
        out: the Parquet file to write (atomically). The tokenizer is stored in its metadata
            (:func:`load_tokenizer`) and copied beside it as ``<out stem>.tokenizer.json``. An
            ``s3://bucket/key.parquet`` is built locally and uploaded, the Parquet object last
            (credentials and endpoint from the ``AWS_*`` variables).
        config: the options (:class:`~datamill.pretrain.bert.config.BertConfig`: tokenizer,
            vocab_size, max_seq_length, dupe_factor, mask_prob, max_predictions_per_seq,
            short_seq_prob, seed, workers, layout, sentence_split, pairing, engine, engine_options,
            overwrite). Defaults to ``None`` (every default).
        **options: any of those options by name, replacing the config's (the keyword call
            ``build_bert_samples(text, out=..., max_seq_length=128)`` is the same as
            ``config=BertConfig(max_seq_length=128)``).

    Returns:
        :class:`BertSamples` with the path, counts and seconds per stage.

    Raises:
        ConfigError: a parameter is out of range, or the tokenizer object lacks a special token.
        DataFileError: an empty or non-UTF-8 file, fewer than two documents, or a tokenizer file
            without the special tokens.
        DataFileNotFoundError: a missing input or tokenizer file.

    Examples:
        >>> import tempfile, pathlib, pyarrow.parquet as pq
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "raw.txt").write_text(
        ...     " = A = \\n the cat sat on the mat . \\n the dog sat on the log . \\n"
        ...     " = B = \\n a bird sang in the tree . \\n the sun rose over the hill . \\n")
        >>> res = build_bert_samples(d / "raw.txt", out=d / "bert.parquet", vocab_size=60,
        ...                          max_seq_length=16, dupe_factor=2)
        >>> res.documents, res.samples > 0
        (2, True)
        >>> pq.read_table(d / "bert.parquet").column_names
        ['tokens', 'segment_ids', 'is_random_next', 'masked_positions', 'masked_labels']
    """
    conf = BertConfig.of(config, **options)
    check_engine(conf.engine)
    if conf.engine != LOCAL:  # the optional Ray engine, found through the engine registry
        result: BertSamples = engine_job(conf.engine, "build_bert_samples")(
            source,
            out=out,
            config=conf.model_copy(update={"engine": LOCAL, "engine_options": None}),
            **(conf.engine_options or {}),
        )
        return result
    if conf.engine_options:
        raise ConfigError("engine_options apply to engine='ray' only")
    if is_remote(out):  # built into a local scratch file, then uploaded (the Parquet object last)
        uploaded: BertSamples = build_to_s3(
            build_bert_samples, source, out=os.fspath(out), options=conf.build_options()
        )
        return uploaded
    return _build_local(source, out=local_path(out), conf=conf)


# long (64 lines): the local engine's steps in order (read, tokenise, pair, mask, write); split,
# they would pass the same dozen values around
def _build_local(
    source: PathLike | Sequence[PathLike], /, *, out: PathLike, conf: BertConfig
) -> BertSamples:
    """The local engine: read, tokenise, pair and mask in tasks, write Parquet (then the tokenizer
    copy)."""
    tokenizer, vocab_size, sentence_split = conf.tokenizer, conf.vocab_size, conf.sentence_split
    dupe_factor, workers, layout, overwrite = (
        conf.dupe_factor,
        conf.workers,
        conf.layout,
        conf.overwrite,
    )
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not paths:
        raise ConfigError("source must name at least one text file")
    out_path, tok_path = _check_outputs(out, paths, tokenizer, overwrite=overwrite)
    start = time.perf_counter()
    tok, corpus, n_sentences, timings = _read_and_tokenize(
        paths, tokenizer, vocab_size=vocab_size, sentence_split=sentence_split
    )
    check_documents(corpus.num_documents, paths)
    cfg = task_config(conf, tok)
    if workers is None:  # the parent's Parquet writer is the limit; processes pay off on many cores
        cores = os.cpu_count() or 1
        big = len(corpus.ids) * dupe_factor >= _MIN_POOL_TOKENS
        workers = min(cores - 1, 8) if big and cores > 4 else 1
    tokenizer_json = tok.to_json()
    meta = build_metadata(
        conf,
        tok,
        tokenizer_file=tok_path.name,
        tokenizer_fingerprint=fingerprint_obj(tokenizer_json),
        sources=[{"path": display_name(p), "fingerprint": fingerprint_file(p)} for p in paths]
        if all(Path(os.fspath(p)).exists() for p in paths)
        else [display_name(p) for p in paths],
        documents=corpus.num_documents,
        sentences=n_sentences,
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    for stale in find_litter(out_path.parent):  # scratch folders of killed runs
        if stale.name.startswith(".bert-scratch-"):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(
        prefix=f".bert-scratch-{os.getpid()}-", dir=out_path.parent
    ) as scratch:
        tasks = plan_tasks(corpus, dupe_factor)
        with closing(
            run_tasks(corpus, cfg, tasks, workers=workers, scratch=Path(scratch))
        ) as results:
            bar = progress(results, desc="bert samples", unit="shard", total=len(tasks))
            # the tokenizer also travels inside the file (key "datamill.tokenizer"), atomically
            stats = write_batches(
                bar, out_path, layout=layout, meta=meta, tokenizer_json=tokenizer_json
            )
    with atomic_write(tok_path) as f:  # a convenience copy beside the file
        f.write(tokenizer_json)
    timings.update(stats.timings)
    seconds = time.perf_counter() - start
    return BertSamples(
        path=out_path,
        tokenizer_path=tok_path,
        layout=layout,
        documents=corpus.num_documents,
        sentences=n_sentences,
        samples=stats.samples,
        tokens=stats.tokens,
        seconds=seconds,
        timings=timings,
    )


def _read_and_tokenize(
    paths: Sequence[PathLike], tokenizer: Any, *, vocab_size: int, sentence_split: str
) -> tuple[BertTokenizer, TokenizedDocuments, int, dict[str, float]]:
    """:func:`read_documents` then :func:`tokenize_documents`, the text cut once for both training
    and encoding when the tokenizer has the vectorised path (the same tokenizer and ids)."""
    start = time.perf_counter()
    tok = resolve_tokenizer(tokenizer)
    sentences, sent_doc = split_documents(paths, sentence_split=sentence_split)
    t = time.perf_counter()
    timings = {"read_split": t - start}
    if tok is not None and tok.fast is None:  # a tokenizer without the vectorised path: the library
        corpus = tokenize_documents(sentences, sent_doc, tok)
        timings["tokenize"] = time.perf_counter() - t
        return tok, corpus, len(sentences), timings
    fast = None if tok is None else tok.fast
    text = cut(sentences, lowercase=True if fast is None else bool(fast["lowercase"]))
    t1 = time.perf_counter()
    timings["cut_words"] = t1 - t
    if tok is None:
        merges: dict[str, float] = {}
        tok = train_wordpiece_chunked(text, vocab_size=vocab_size, timings=merges)
        timings["train_tokenizer"] = time.perf_counter() - t1
        timings.update(merges)  # the part of train_tokenizer after the last word was fed
        t1 = time.perf_counter()
    n_sentences = len(sentences)
    corpus = corpus_from_ids(*tok.encode_chunked(text), sent_doc)
    timings["tokenize"] = time.perf_counter() - t1
    return tok, corpus, n_sentences, timings


def _check_outputs(
    out: PathLike, paths: list[PathLike], tokenizer: Any, *, overwrite: bool
) -> tuple[Path, Path]:
    """The Parquet path and its tokenizer copy, refused when they would replace an input or a user's
    file."""
    out_path = Path(out)
    tok_path = out_path.with_suffix(".tokenizer.json")
    inputs = [*paths, *([tokenizer] if isinstance(tokenizer, (str, os.PathLike)) else [])]
    check_output(
        out_path,
        is_own=is_bert_parquet,
        inputs=inputs,
        what="BERT Parquet file",
        overwrite=overwrite,
    )

    def own_tokenizer(p: Path) -> bool:  # the copy an earlier run wrote beside its Parquet file
        try:
            return (
                is_bert_parquet(out_path)
                and read_metadata(out_path).get("tokenizer_file") == p.name
            )
        except DatamillError:
            return False

    check_output(
        tok_path, is_own=own_tokenizer, inputs=inputs, what="tokenizer copy of a BERT Parquet file"
    )
    return out_path, tok_path


def read_metadata(path: PathLike) -> dict[str, Any]:
    """The ``datamill`` JSON stored in a BERT Parquet file's metadata (format, counts, special
    ids...)."""
    from datamill.pretrain.bert._io import read_bert_metadata

    return read_bert_metadata(path)


def load_tokenizer(path: PathLike) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` a BERT Parquet file was built with (stored in its metadata)."""
    from tokenizers import Tokenizer

    from datamill.pretrain.bert._io import read_bert_tokenizer_json

    text = read_bert_tokenizer_json(path)
    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # tokenizers raises a bare Exception for a damaged JSON
        raise DataFileError(
            f"the tokenizer stored in the file cannot be loaded: {' '.join(str(exc).split())}",
            path=os.fspath(path),
            hint="rebuild the file with `datamill bert`",
        ) from exc
