"""The tokenizer of a tokenize run: a ``tokenizers`` JSON file, or a BPE vocabulary trained on a
deterministic sample of the inputs (the first documents of every input, an equal share of
:data:`SAMPLE_BYTES` each, in input order), saved in the run's work folder so a resumed run uses the
same one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from datamill.core.checks import TOKENIZER_VOCAB
from datamill.core.errors import ConfigError, DataFileError
from datamill.core.storage import filesystem_for, storage_error
from datamill.text.tok_inputs import InputFile, Task
from datamill.text.tok_read import BadRecords, ReadOptions, read_task

__all__ = ["SAMPLE_BYTES", "SPECIALS", "resolve_tokenizer", "sample_texts", "train_bpe"]

SAMPLE_BYTES = 32 << 20
"""Text a vocabulary is trained on (spread over the inputs)."""
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
"""The special tokens of a trained vocabulary (ids 0-3), plus any other ``bos``/``eos`` asked."""


def sample_texts(
    files: Sequence[InputFile],
    tasks: Sequence[Task],
    opts: ReadOptions,
    *,
    budget: int = SAMPLE_BYTES,
) -> list[str]:
    """The training sample: each input's first documents, ``budget / len(files)`` characters."""
    share = max(1, budget // max(1, len(files)))
    out: list[str] = []
    for i, f in enumerate(files):
        got = 0
        for t in (t for t in tasks if t.file == i):
            for batch in read_task(f, t, opts, BadRecords()):
                for text in batch.texts:
                    out.append(text)
                    got += len(text)
                    if got >= share:
                        break
                if got >= share:
                    break
            if got >= share:
                break
    return out


def train_bpe(texts: Sequence[str], *, vocab_size: int, specials: Sequence[str] = SPECIALS) -> str:
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer) trained on ``texts``, as JSON.

    Deterministic: every initial token is a byte of the alphabet, which the trainer sorts, and
    merges of equal count are broken by pair ids (the ``</w>``-suffixed tokens of
    :meth:`datamill.tokenize.HFTokenizer.train` get hash-order ids, huggingface/tokenizers#1794).

    Examples:
        >>> a = train_bpe(["the cat sat on the mat"] * 10, vocab_size=300)
        >>> a == train_bpe(["the cat sat on the mat"] * 10, vocab_size=300)
        True
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    out: str = tok.to_str()
    return out


def _read_json(path: str | os.PathLike[str]) -> str:
    url = os.fspath(path)
    fs, p = filesystem_for(url)
    try:
        with fs.open_input_stream(p) as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise storage_error(exc, url) from exc
    except OSError as exc:
        raise storage_error(exc, url) from exc
    try:
        text = data.decode("utf-8")
        from tokenizers import Tokenizer

        Tokenizer.from_str(text)
    except Exception as exc:  # the library raises plain Exception subclasses
        raise DataFileError(
            f"not a tokenizers JSON file: {exc}",
            path=url,
            hint="pass a file saved by tokenizers.Tokenizer.save (tokenizer.json)",
        ) from exc
    return str(text)


def resolve_tokenizer(
    tokenizer: str | os.PathLike[str] | None,
    *,
    train_vocab: int | None,
    files: Sequence[InputFile],
    tasks: Sequence[Task],
    opts: ReadOptions,
    work: Path,
    specials: tuple[str | None, str | None],
) -> tuple[str, int, tuple[int | None, int | None]]:
    """``(tokenizer JSON, vocabulary size, (bos id, eos id))``.

    Raises:
        ConfigError: neither or both of ``tokenizer`` and ``train_vocab``; a BOS/EOS token missing
            from the vocabulary.
    """
    if (tokenizer is None) == (train_vocab is None):
        raise ConfigError(
            "pass exactly one of tokenizer (a tokenizers JSON) and train_vocab (a vocabulary "
            "size to train)",
            hint="e.g. --tokenizer tokenizer.json, or --train-vocab 32000",
        )
    if tokenizer is not None:
        text = _read_json(tokenizer)
    else:
        assert train_vocab is not None
        TOKENIZER_VOCAB(train_vocab)
        saved = work / "tokenizer.json"
        if saved.is_file():
            text = saved.read_text(encoding="utf-8")
        else:
            extra = [s for s in specials if s is not None and s not in SPECIALS]
            text = train_bpe(
                sample_texts(files, tasks, opts),
                vocab_size=train_vocab,
                specials=[*SPECIALS, *extra],
            )
            tmp = work / f".tokenizer.json.{os.getpid()}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, saved)
    from tokenizers import Tokenizer

    inner = Tokenizer.from_str(text)
    ids: list[int | None] = []
    for name, token in zip(("bos", "eos"), specials, strict=True):
        i = None if token is None else inner.token_to_id(token)
        if token is not None and i is None:
            raise ConfigError(
                f"the {name} token {token!r} is not in the tokenizer's vocabulary",
                column=name,
                hint="name a token of the vocabulary (a trained one has <s> and </s>)",
            )
        ids.append(i)
    return text, int(inner.get_vocab_size(with_added_tokens=True)), (ids[0], ids[1])
