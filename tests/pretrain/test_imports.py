"""Producers never import consumers: no pretrain/text module imports the loader, not even lazily."""

from __future__ import annotations

import ast
from pathlib import Path

import datamill

SRC = Path(datamill.__file__).resolve().parent
CONSUMERS = ("datamill.loader", "datamill.serve")


def _imports(path: Path) -> list[str]:
    """Every module an ``import`` / ``from ... import`` statement names, at any depth (lazy ones
    too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_pretrain_and_text_have_no_import_edge_to_the_loader() -> None:
    files = sorted((SRC / "pretrain").rglob("*.py")) + sorted((SRC / "text").rglob("*.py"))
    assert len(files) > 15
    bad = {
        str(f.relative_to(SRC)): n for f in files for n in _imports(f) if n.startswith(CONSUMERS)
    }
    assert bad == {}


def test_no_private_module_of_another_subpackage_is_imported() -> None:
    """pretrain.* imports pretrain.bert._x only from inside pretrain.bert (and likewise for
    word2vec)."""
    for f in sorted((SRC / "pretrain").rglob("*.py")):
        here = ".".join(("datamill", *f.relative_to(SRC).with_suffix("").parts))
        for name in _imports(f):
            parts = name.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")),
                None,
            )
            if private is None or not name.startswith("datamill."):
                continue
            owner = ".".join(parts[:private])  # the package that holds the private module
            assert here.startswith(owner + ".") or here == owner, (here, name)
