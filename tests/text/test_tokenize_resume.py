"""``datamill tokenize`` killed with SIGKILL mid-run: the previous output stays readable, and a
re-run with the same arguments redoes only the unfinished tasks and ends byte-identical to an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datamill.shards import ShardsetDataset
from datamill.text import tokenize
from datamill.text.tok_vocab import train_bpe
from tests.text.test_tokenize_files import DOCS, bytes_of

pytestmark = pytest.mark.faults

RUN = """
import sys
from datamill.core.progress import set_quiet
from datamill.text import tokenize
set_quiet(True)
docs, out, tok, task = sys.argv[1:5]
tokenize(docs, out=out, tokenizer=tok, task_bytes=int(task), workers=2)
"""


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs.jsonl"
    with docs.open("w", encoding="utf-8") as f:
        for i in range(6000):
            f.write(json.dumps({"text": f"{i} " + DOCS[i % len(DOCS)]}) + "\n")
    tok = tmp_path / "tokenizer.json"
    tok.write_text(train_bpe(DOCS, vocab_size=400), encoding="utf-8")
    return docs, tok


def _kill_after_some_tasks(args: list[str], work_glob: tuple[Path, str]) -> int:
    """Start the run, SIGKILL it once 3 tasks are committed in its work folder; its receipts."""
    proc = subprocess.Popen([sys.executable, "-c", RUN, *args], env=dict(os.environ))
    parent, pattern = work_glob
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            done = list(parent.glob(pattern + "/task-*.json"))
            if len(done) >= 3:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        assert proc.wait(timeout=30) == -signal.SIGKILL, "the run ended before it could be killed"
    finally:
        if proc.poll() is None:
            proc.kill()
    return len(list(parent.glob(pattern + "/task-*.json")))


def test_resume_after_kill_9_is_byte_identical(tmp_path: Path) -> None:
    docs, tok = _inputs(tmp_path)
    task = 16 << 10
    ref = tokenize(docs, out=tmp_path / "ref" / "tok", tokenizer=tok, task_bytes=task, workers=2)
    assert ref.tasks > 20
    out = tmp_path / "run" / "tok"
    old = tokenize(docs, out=out, tokenizer=tok, eos="</s>", workers=1)  # a previous output
    before = bytes_of(out)
    done = _kill_after_some_tasks(
        [str(docs), str(out), str(tok), str(task)], (out.parent, ".tok.tokenize-*")
    )
    assert 3 <= done < ref.tasks
    assert bytes_of(out) == before and len(ShardsetDataset(out)) == old.documents
    res = tokenize(docs, out=out, tokenizer=tok, task_bytes=task, workers=2)
    assert res.resumed_tasks >= done and res.resumed_tasks < res.tasks
    assert bytes_of(out) == bytes_of(ref.path)
    assert not list(out.parent.glob(".tok.tokenize-*"))  # the work folder goes once published


def test_changed_input_starts_over(tmp_path: Path) -> None:
    docs, tok = _inputs(tmp_path)
    out = tmp_path / "run" / "tok"
    done = _kill_after_some_tasks(
        [str(docs), str(out), str(tok), str(16 << 10)], (out.parent, ".tok.tokenize-*")
    )
    assert done >= 3
    with docs.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    res = tokenize(docs, out=out, tokenizer=tok, task_bytes=16 << 10, workers=2)
    assert res.resumed_tasks == 0 and res.documents == 6001
