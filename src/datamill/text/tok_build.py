"""``datamill.text.tokenize``: many files of documents in, a token shardset dataset out, in
parallel, resumable after a kill, with a finish time you can trust.

The run: expand the inputs, cut them into tasks (:mod:`datamill.text.tok_inputs`), get the tokenizer
(a ``tokenizers`` JSON, or one trained on a deterministic sample), then run the unfinished tasks
largest first (:func:`~datamill.text.tok_inputs.schedule`) in worker processes or on Ray; each task
writes its shard and then its receipt into a hidden work folder beside the output, named by the
run's fingerprint (inputs, options, tokenizer). A re-run with the same arguments finds the finished
tasks there and runs only the others. When every task is done, the shards are written as one
shardset dataset (:class:`~datamill.shards.ShardsetWriter`, ``dataset.json`` last) in a folder
beside the output that replaces it in one switch, the tokenizer is saved inside it as
``tokenizer.json``, and the work folder is removed: until then a previous output stays readable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datamill.core.checks import check_path
from datamill.core.constants import DATASET_MANIFEST
from datamill.core.errors import ConfigError
from datamill.core.fingerprint import fingerprint_bytes, fingerprint_obj
from datamill.core.io import as_output_error, atomic_dir, atomic_write, check_output
from datamill.core.storage import filesystem_for, is_remote, storage_error
from datamill.shards import ShardsetDataset, ShardsetWriter
from datamill.text.tok_inputs import (
    InputFile,
    Task,
    auto_task_bytes,
    expand_inputs,
    plan_tasks,
    schedule,
)
from datamill.text.tok_publish import ShardCopier
from datamill.text.tok_read import MAX_EXAMPLES, ReadOptions
from datamill.text.tok_run import run_local
from datamill.text.tok_task import UID_SHIFT, TaskConfig, done_tasks, token_type
from datamill.text.tok_vocab import resolve_tokenizer

__all__ = ["FORMAT", "Tokenized", "tokenize", "tokenizer_path"]

FORMAT = "datamill.tokenize/1"
"""The ``kind`` in the dataset's metadata (``source_metadata`` of its shardset)."""


def tokenizer_path(out: str | os.PathLike[str]) -> Path:
    """Where the tokenizer of the output ``out`` is saved: beside it, ``NAME.tokenizer.json``.

    Examples:
        >>> tokenizer_path("runs/wiki-tokens/").name
        'wiki-tokens.tokenizer.json'
    """
    p = Path(out)
    return p.with_name(p.name + ".tokenizer.json")


SHARDSET = "tokens"


@dataclass
class Tokenized:
    """What a run made: the dataset, its counts, and how the run went."""

    path: Path
    documents: int
    tokens: int
    tasks: int
    resumed_tasks: int
    """Tasks found finished in the work folder of an interrupted run (not redone)."""
    bad: int
    bad_examples: list[dict[str, Any]]
    seconds: float
    files: list[dict[str, Any]] = field(default_factory=list)

    def dataset(self) -> ShardsetDataset:
        """The output as a :class:`~datamill.shards.ShardsetDataset` (a Loader source)."""
        return ShardsetDataset(self.path)


def _is_own(p: Path) -> bool:
    try:
        manifest = json.loads((p / DATASET_MANIFEST).read_text(encoding="utf-8"))
        meta = json.loads(manifest["shardsets"][0]["source_metadata"])
        return bool(meta.get("kind") == FORMAT)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return False


def _stat(url: str) -> list[Any]:
    """What a resumed run must find unchanged in a file: its URL, size and modification time."""
    fs, path = filesystem_for(url)
    try:
        info = fs.get_file_info(path)
    except OSError as exc:
        raise storage_error(exc, url) from exc
    return [url, info.size, info.mtime_ns]


def _check_out(
    out: str | os.PathLike[str],
    files: Sequence[InputFile],
    tokenizer: str | os.PathLike[str] | None,
    *,
    overwrite: bool,
) -> Path:
    """The output folder, refused when it would replace an input or something not ours."""
    if is_remote(out):
        raise ConfigError(
            "the output of tokenize is a local folder",
            path=os.fspath(out),
            hint="write it locally, then `datamill shards` can copy it",
        )
    check_path(out, name="out")
    if not Path(os.fspath(out)).name or not Path(os.fspath(out)).resolve().name:
        raise ConfigError(
            "the output of tokenize must name a folder of its own (its tokenizer is saved beside "
            "it as NAME.tokenizer.json)",
            path=os.fspath(out),
            hint="pass out='runs/my-tokens' or similar",
        )
    local_inputs = [f.url for f in files if not is_remote(f.url)]
    if tokenizer is not None and not is_remote(tokenizer):
        local_inputs.append(os.fspath(tokenizer))
    out = check_output(
        Path(out), is_own=_is_own, inputs=local_inputs, what="tokenize output", overwrite=overwrite
    )

    def own_tokenizer(p: Path) -> bool:  # the copy an earlier run wrote beside its dataset
        try:
            manifest = json.loads((out / DATASET_MANIFEST).read_text(encoding="utf-8"))
            meta = json.loads(manifest["shardsets"][0]["source_metadata"])
            return _is_own(out) and meta.get("tokenizer_file") == p.name
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return False

    check_output(
        tokenizer_path(out), is_own=own_tokenizer, inputs=local_inputs, what="tokenizer copy"
    )
    return out


def _work_folder(out: Path, fp: str) -> Path:
    """The hidden work folder of this run beside ``out``; another run's work folders go."""
    for old in out.parent.glob(f".{out.name}.tokenize-*"):
        if old.name != f".{out.name}.tokenize-{fp}":
            shutil.rmtree(old, ignore_errors=True)
    work = out.parent / f".{out.name}.tokenize-{fp}"
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or immutable folder: an OutputError naming the output
        raise (as_output_error(exc, out) or exc) from exc
    return work


def _metadata(
    cfg: TaskConfig,
    receipts: dict[int, dict[str, Any]],
    tasks: Sequence[Task],
    extra: dict[str, Any],
) -> dict[str, Any]:
    per_file: list[dict[str, Any]] = [
        {"path": f.url, "documents": 0, "tokens": 0, "bytes": f.size, "bad": 0} for f in cfg.files
    ]
    examples: list[dict[str, Any]] = []
    for t in tasks:
        r = receipts[t.index]
        for key in ("documents", "tokens", "bad"):
            per_file[t.file][key] += int(r[key])
        examples += r["bad_examples"]
    return {
        "kind": FORMAT,
        "documents": sum(f["documents"] for f in per_file),
        "tokens": sum(f["tokens"] for f in per_file),
        "files": per_file,
        "bad": {"count": sum(f["bad"] for f in per_file), "examples": examples[:MAX_EXAMPLES]},
        "tokenizer_fingerprint": fingerprint_bytes(cfg.tokenizer_json.encode("utf-8")),
        "vocab_size": cfg.vocab_size,
        "token_type": str(token_type(cfg.vocab_size)),
        "bos": cfg.bos,
        "eos": cfg.eos,
        "text_field": cfg.read.text_field,
        "text_unit": cfg.read.text_unit,
        "keep": list(cfg.read.keep),
        "uid": f"input index << {UID_SHIFT} | byte offset of the document (Parquet: row)",
        **extra,
    }


def _run_and_publish(
    out: Path,
    work: Path,
    cfg: TaskConfig,
    tasks: list[Task],
    receipts: dict[int, dict[str, Any]],
    workers: int | None,
    engine: str,
    address: str | None,
) -> dict[str, Any]:
    """Run the unfinished tasks, their shards copied into a new dataset beside ``out`` as they end;
    then shard 0 with the counts, the commit (``dataset.json`` last), the tokenizer beside ``out``,
    and the switch. Returns the metadata."""
    todo = schedule([t for t in tasks if t.index not in receipts])
    with (
        atomic_dir(out) as tmp,
        ShardsetWriter(tmp, uid="uid", shardset=SHARDSET, name=out.name) as writer,
    ):
        copier = ShardCopier(writer, work, cfg)
        try:
            for r in list(receipts.values()):
                copier.done(r)
            new = _run(
                cfg, todo, tasks, receipts, copier, workers=workers, engine=engine, address=address
            )
        except BaseException:
            copier.close(check=False)
            raise
        copier.close()
        receipts.update(new)
        meta = _metadata(cfg, receipts, tasks, {"tokenizer_file": tokenizer_path(out).name})
        copier.copy(0, tasks[0].file, json.dumps(meta, sort_keys=True).encode("utf-8"))
        writer.commit()
        with atomic_write(tokenizer_path(out)) as f:  # then the dataset is switched in
            f.write(cfg.tokenizer_json)
    return meta


def tokenize(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    /,
    *,
    out: str | os.PathLike[str],
    tokenizer: str | os.PathLike[str] | None = None,
    train_vocab: int | None = None,
    read: ReadOptions | None = None,
    bos: str | None = None,
    eos: str | None = None,
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    task_bytes: int | None = None,
    overwrite: bool = False,
) -> Tokenized:
    """Tokenize files of documents into a token shardset dataset (``uid``, ``tokens``, ``length``).

    Args:
        inputs: files, folders or globs (local or ``s3://``): JSONL (``.jsonl``/``.json``/
            ``.ndjson``), Parquet (``.parquet``), anything else plain text; ``.gz``/``.zst``
            compressed too.
        out: the output dataset folder (local). An earlier tokenize output there is replaced when
            the new one is complete; anything else is refused (``overwrite`` replaces another kind
            of datamill output).
        tokenizer: a Hugging Face ``tokenizers`` JSON file. Defaults to ``None`` (needs
            ``train_vocab``).
        train_vocab: train a BPE vocabulary of this size on a deterministic sample of the inputs.
            Defaults to ``None``.
        read: how documents are read (:class:`~datamill.text.tok_read.ReadOptions`):
            ``text_field`` (the JSONL field / Parquet column of the text, ``"text"``), ``keep``
            (other fields kept as metadata columns, strings), ``text_unit`` (plain text:
            ``"block"``, a document per blank-line-separated block, or ``"file"``) and
            ``skip_bad`` (skip and count bad records instead of failing). Defaults to
            ``ReadOptions()``.
        bos: a token put before every document (it must be in the vocabulary). Defaults to ``None``.
        eos: a token put after every document. Defaults to ``None``.
        workers: worker processes. Defaults to ``None`` (the cores).
        engine: ``"local"`` or ``"ray"`` (same bytes). Defaults to ``"local"``.
        address: the Ray cluster (``engine="ray"``). Defaults to ``None`` (a local instance).
        task_bytes: stored bytes per task (= shard). Defaults to ``None`` (1/256 of the input,
            within [256 KiB, 64 MiB]).
        overwrite: also replace another kind of datamill output at ``out``. Defaults to ``False``.

    Returns:
        the counts and the output path (:meth:`Tokenized.dataset` opens it).

    Raises:
        ConfigError: bad options. DataFileError: a bad record (file, line, field) without
            ``ReadOptions(skip_bad=True)``, an output that is not ours. DataFileNotFoundError:
            missing inputs.

    Examples:
        >>> import tempfile, pathlib, json
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> lines = [json.dumps({"text": f"the cat sat {i}"}) for i in range(50)]
        >>> _ = (d / "docs.jsonl").write_text("\\n".join(lines))
        >>> res = tokenize(d / "docs.jsonl", out=d / "tok", train_vocab=60, eos="</s>", workers=1)
        >>> res.documents, len(res.dataset())
        (50, 50)
    """
    start = time.perf_counter()
    out = _check_out(out, files := expand_inputs(inputs), tokenizer, overwrite=overwrite)
    opts = _read_options(read)
    tasks = plan_tasks(
        files,
        task_bytes=task_bytes or auto_task_bytes(sum(f.size for f in files)),
        whole_files=opts.text_unit == "file",
    )
    run_key = [opts.__dict__, [(t.file, t.start, t.end) for t in tasks], bos, eos, train_vocab]
    tok_stat = None if tokenizer is None else _stat(os.fspath(tokenizer))
    work = _work_folder(
        out, fingerprint_obj([FORMAT, [_stat(f.url) for f in files], run_key, tok_stat])[:16]
    )
    tok_json, vocab_size, ids = resolve_tokenizer(
        tokenizer,
        train_vocab=train_vocab,
        files=files,
        tasks=tasks,
        opts=opts,
        work=work,
        specials=(bos, eos),
    )
    cfg = TaskConfig(tuple(files), opts, tok_json, ids[0], ids[1], vocab_size, os.fspath(work))
    receipts = done_tasks(work)
    resumed = len(receipts)
    meta = _run_and_publish(out, work, cfg, tasks, receipts, workers, engine, address)
    shutil.rmtree(work, ignore_errors=True)
    return Tokenized(
        out,
        meta["documents"],
        meta["tokens"],
        len(tasks),
        resumed,
        meta["bad"]["count"],
        meta["bad"]["examples"],
        time.perf_counter() - start,
        meta["files"],
    )


def _read_options(read: ReadOptions | None) -> ReadOptions:
    """``read`` checked (``ReadOptions()`` for ``None``), a lone ``keep`` field as a tuple."""
    opts = ReadOptions() if read is None else read
    if not isinstance(opts, ReadOptions):
        raise ConfigError(
            f"read must be a ReadOptions, got {type(opts).__name__}",
            hint="from datamill.text import ReadOptions",
        )
    if opts.text_unit not in ("block", "file"):
        raise ConfigError(f"text_unit must be 'block' or 'file', got {opts.text_unit!r}")
    keep = opts.keep
    return dataclasses.replace(opts, keep=(keep,) if isinstance(keep, str) else tuple(keep))


def _run(
    cfg: TaskConfig,
    todo: list[Task],
    tasks: list[Task],
    receipts: dict[int, dict[str, Any]],
    copier: ShardCopier,
    *,
    workers: int | None,
    engine: str,
    address: str | None,
) -> dict[int, dict[str, Any]]:
    """Run ``todo`` on the engine (each receipt to ``copier`` as it comes); returns the new
    receipts."""
    from datamill.engines import LOCAL, check_engine, engine_job

    check_engine(engine)
    total = sum(t.weight for t in tasks)
    done = sum(t.weight for t in tasks if t.index in receipts)
    if engine == LOCAL:
        return run_local(
            cfg,
            todo,
            workers=workers or os.cpu_count() or 1,
            total=total,
            done=done,
            on_done=copier.done,
        )
    job = engine_job(engine, "tokenize")
    out: dict[int, dict[str, Any]] = job(
        cfg, todo, address=address, total=total, done=done, on_done=copier.done
    )
    return out
