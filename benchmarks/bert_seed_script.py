"""The seed's BERT pretraining-data script as a whole process (the reference ``bench_bert.py``
runs).

    python benchmarks/bert_seed_script.py RAW --dupe-factor 5 --max-seq-length 512
        [--hf OUT.parquet]

What the seed does, in pure Python with ``random.Random`` (nothing from datamill is imported):

1. trains a WordPiece tokenizer on the raw file with ``tokenizers``' ``Tokenizer.train(files=...)``
   (Rust, parallel; BERT normaliser and pre-tokeniser, ``[PAD] [CLS] [SEP] [MASK] [UNK]``);
2. reads the file line by line: a blank line or a ``=`` title line ends a document, every other
   line is a sentence, encoded on its own with ``tokenizer.encode``;
3. for every pass (``dupe_factor``) and document, the seed article's pair loop (chunks scanned from
   ``end = 1``; B random when the chunk left none or with probability 0.5; a non-random pair
   consumes ``chunks[:end]``, a random one ``chunks[:sep]``), ``truncate_seq_pair``, and Google's
   ``create_masked_lm_predictions`` (15%, at most 20, 80/10/10), padded to ``max_seq_length``;
4. without ``--hf``: counts the samples and writes nothing (the seed's pure-Python script);
   with ``--hf OUT``: feeds the same generator to ``datasets.Dataset.from_generator`` and writes
   ``to_parquet(OUT)`` (the seed's Hugging Face path).

Two simplifications favour the seed: documents and samples are not shuffled (the seed's two
``rng.shuffle`` calls; shuffling the samples would hold them all in memory), and a random B takes at
least one sentence (datamill's documented fix; the article's scan can leave B empty), so both sides
produce the same kind and number of samples. The last line printed is a JSON object with the
sample count and the seconds of each stage inside the process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


def train_tokenizer(raw: str, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS, show_progress=False
    )
    tok.train([raw], trainer=trainer)
    return tok


def read_documents(raw: str, tok: Any) -> list[list[list[int]]]:
    docs: list[list[list[int]]] = [[]]
    with open(raw, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("="):
                if docs[-1]:
                    docs.append([])
                continue
            ids = tok.encode(line, add_special_tokens=False).ids
            if ids:
                docs[-1].append(ids)
    return [d for d in docs if d]


def seed_pairs(
    documents: list[list[list[int]]],
    doc_idx: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[tuple[list[int], list[int], bool]]:
    """The seed article's sentence-pair loop for one document."""
    max_tokens = max_seq_length - 3
    target_length = max_tokens
    if rng.random() < short_seq_prob:
        target_length = rng.randint(2, max_tokens)
    chunks = list(documents[doc_idx])
    samples = []
    while len(chunks) > 0:
        running_length = 0
        end = 1
        while end < len(chunks) and running_length < target_length:
            running_length += len(chunks[end - 1])
            end += 1
        sep = rng.randint(1, end - 1) if end > 1 else 1
        sentence_a = [tok for chunk in chunks[:sep] for tok in chunk]
        sentence_b = [tok for chunk in chunks[sep:end] for tok in chunk]
        if not sentence_b or rng.random() < 0.5:
            b_idx = rng.randint(0, len(documents) - 2)
            if b_idx >= doc_idx:
                b_idx += 1
            sentence_b = []
            running_length = len(sentence_a)
            i = rng.randint(0, len(documents[b_idx]) - 1)
            first = True  # at least one sentence in B (see the module docstring)
            while i < len(documents[b_idx]) and (first or running_length < target_length):
                first = False
                sentence_b.extend(documents[b_idx][i])
                running_length += len(documents[b_idx][i])
                i += 1
            is_random_next = True
            chunks = chunks[sep:]
        else:
            is_random_next = False
            chunks = chunks[end:]
        samples.append((sentence_a, sentence_b, is_random_next))
    return samples


def truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> None:
    while True:
        if len(tokens_a) + len(tokens_b) <= max_num_tokens:
            break
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def create_masked_lm_predictions(
    tokens: list[int],
    n_content: int,
    specials: set[int],
    mask_id: int,
    masked_lm_prob: float,
    max_predictions: int,
    vocab_words: list[int],
    rng: random.Random,
) -> tuple[list[int], list[int], list[int]]:
    cand = [i for i, t in enumerate(tokens) if t not in specials]
    rng.shuffle(cand)
    output = list(tokens)
    num_to_predict = min(max_predictions, max(1, int(round(n_content * masked_lm_prob))))  # noqa: RUF046 - verbatim
    masked: list[tuple[int, int]] = []
    for index in cand:
        if len(masked) >= num_to_predict:
            break
        if rng.random() < 0.8:
            new = mask_id
        elif rng.random() < 0.5:
            new = tokens[index]
        else:
            new = vocab_words[rng.randint(0, len(vocab_words) - 1)]
        output[index] = new
        masked.append((index, tokens[index]))
    masked.sort()
    return output, [p for p, _ in masked], [lab for _, lab in masked]


def samples(
    docs: list[list[list[int]]], tok: Any, *, dupe_factor: int, max_seq_length: int, seed: int
) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    sp = {t: tok.token_to_id(t) for t in SPECIALS}
    specials = set(sp.values())
    vocab_words = [i for i in range(tok.get_vocab_size()) if i not in specials]
    pad, cls, sep, mask = sp["[PAD]"], sp["[CLS]"], sp["[SEP]"], sp["[MASK]"]
    max_num_tokens = max_seq_length - 3
    for _ in range(dupe_factor):
        for d in range(len(docs)):
            for tokens_a, tokens_b, is_random_next in seed_pairs(docs, d, max_seq_length, 0.1, rng):
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                tokens = [cls, *tokens_a, sep, *tokens_b, sep]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, positions, labels = create_masked_lm_predictions(
                    tokens,
                    len(tokens_a) + len(tokens_b),
                    specials,
                    mask,
                    0.15,
                    20,
                    vocab_words,
                    rng,
                )
                n_pad = max_seq_length - len(tokens)  # the seed's writer pads to max_seq_length
                yield {
                    "tokens": tokens + [pad] * n_pad,
                    "segment_ids": segment_ids + [-1] * n_pad,
                    "is_random_next": is_random_next,
                    "masked_positions": positions,
                    "masked_labels": labels,
                }


def hf_samples(raw: str, tokenizer: str, **kw: Any) -> Iterator[dict[str, Any]]:
    """The generator handed to ``Dataset.from_generator``: read, tokenise, sample."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    yield from samples(read_documents(raw, tok), tok, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--dupe-factor", type=int, default=5)
    ap.add_argument("--max-seq-length", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument(
        "--hf", help="write the samples with datasets.Dataset.from_generator + to_parquet here"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    tok = train_tokenizer(args.raw, args.vocab_size)
    t1 = time.perf_counter()
    kw = {"dupe_factor": args.dupe_factor, "max_seq_length": args.max_seq_length, "seed": args.seed}
    if args.hf is None:
        docs = read_documents(args.raw, tok)
        t2 = time.perf_counter()
        n = sum(1 for _ in samples(docs, tok, **kw))
    else:
        # the generator reads and tokenises itself: its arguments stay small (datasets hashes them)
        import tempfile

        import datasets

        datasets.disable_progress_bars()
        features = datasets.Features(
            {
                "tokens": datasets.Sequence(datasets.Value("int32")),
                "segment_ids": datasets.Sequence(datasets.Value("int8")),
                "is_random_next": datasets.Value("bool"),
                "masked_positions": datasets.Sequence(datasets.Value("int32")),
                "masked_labels": datasets.Sequence(datasets.Value("int32")),
            }
        )
        with tempfile.TemporaryDirectory(prefix="hf-cache-") as cache:
            tok_path = f"{cache}/tokenizer.json"
            tok.save(tok_path)
            t2 = time.perf_counter()
            ds = datasets.Dataset.from_generator(
                hf_samples,
                gen_kwargs={"raw": args.raw, "tokenizer": tok_path, **kw},
                features=features,
                cache_dir=cache,
            )
            ds.to_parquet(args.hf)
            n = ds.num_rows
    t3 = time.perf_counter()
    print(
        json.dumps(
            {
                "samples": n,
                "vocab_size": tok.get_vocab_size(),
                "train_tokenizer": t1 - t0,
                "read_tokenize": t2 - t1,
                "samples_write": t3 - t2,
            }
        )
    )  # HF: read inside
    sys.stdout.flush()


if __name__ == "__main__":
    main()
