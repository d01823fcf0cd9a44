"""A ratchet on complexity and repetition in ``src/``: the counts may only fall.

Two counts, measured here with the standard library only and held against
``tests/ratchet_baseline.json``:

* **complex functions**: functions (methods included) of cyclomatic complexity over
  :data:`MAX_COMPLEXITY`, McCabe-style: 1, plus 1 per ``if``/``elif``, ``for``, ``while``,
  conditional expression, ``except`` clause, ``match`` case and comprehension ``for``/``if``, plus
  the extra operands of every ``and``/``or``. A nested function or class is measured on its own.
* **duplicate pairs**: pairs of files (a file with itself counts) that share a run of
  :data:`WINDOW` lines of the same shape. A line's shape is its tokens with strings and numbers
  folded to one symbol and names numbered in order of appearance within the run (so a run copied
  with other names, strings or numbers still matches, and one that merely has the same punctuation
  does not). Blank lines, comments, imports, lone punctuation, lone strings (docstrings) and lines
  that only forward one argument (``name,``, ``name=name,``: a call formatted one argument per
  line) are passed over; a run found in more than :data:`MOST_PLACES` places is a pattern, not a
  copy, and is not counted. The ``duplicates`` command on the development machine measures the
  same idea (it counts forwarding lines too, so its numbers are higher).

When a count rises the test fails and names what is new; when it falls the test passes and prints
the lower count to write into the baseline (then it can never rise back).
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import keyword
import tokenize
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "datamill"
BASELINE = Path(__file__).with_name("ratchet_baseline.json")
MAX_COMPLEXITY = 15
WINDOW = 6
MOST_PLACES = 8

_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler, ast.match_case)
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """McCabe complexity of one function, its nested functions and classes left out."""
    n = 1
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, _OWN_SCOPE):
            continue
        if isinstance(node, _BRANCHES):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        stack.extend(ast.iter_child_nodes(node))
    return n


def complex_functions(root: Path = SRC) -> list[str]:
    """``path:line name (complexity)`` of every function over :data:`MAX_COMPLEXITY`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                cc = complexity(node)
                if cc > MAX_COMPLEXITY:
                    rel = path.relative_to(root.parent)
                    out.append(f"{rel}:{node.lineno} {node.name} ({cc})")
    return out


_PASSED_OVER = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}
_STRINGS = {tokenize.STRING} | {
    getattr(tokenize, n)
    for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
    if hasattr(tokenize, n)
}


def line_shapes(text: str) -> list[tuple[int, list[str]]]:
    """``(line number, tokens)`` of the lines that count; names as ``$name``, strings ``S``,
    numbers ``N``."""
    lines: dict[int, list[str]] = defaultdict(list)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _PASSED_OVER:
            continue
        if tok.type == tokenize.NAME:
            word = tok.string
            shape = word if keyword.iskeyword(word) or keyword.issoftkeyword(word) else "$" + word
        elif tok.type == tokenize.NUMBER:
            shape = "N"
        elif tok.type in _STRINGS:
            shape = "S"
        else:
            shape = tok.string
        row = lines[tok.start[0]]
        if not (shape == "S" and row and row[-1] == "S"):  # adjacent pieces are one string
            row.append(shape)
    out = []
    for number in sorted(lines):
        row = lines[number]
        if row[0] in ("import", "from") and "import" in row:
            continue
        if not any(t.startswith("$") or t == "N" for t in row):  # punctuation, lone strings
            continue
        if _thin(row):  # a lone name or a forwarded keyword (`x=x,`): one argument per line
            continue
        out.append((number, row))
    return out


def _thin(row: list[str]) -> bool:
    """``name`` / ``name,`` / ``name=name,``: a line that only forwards one argument."""
    body = row[:-1] if row[-1] == "," else row
    return (len(body) == 1 and body[0].startswith("$")) or (
        len(body) == 3 and body[1] == "=" and body[0] == body[2] and body[0].startswith("$")
    )


def _run_key(rows: list[list[str]]) -> tuple[str, ...]:
    names: dict[str, int] = {}
    return tuple(
        " ".join(f"${names.setdefault(t, len(names))}" if t.startswith("$") else t for t in row)
        for row in rows
    )


def duplicate_pairs(root: Path = SRC) -> set[tuple[str, str]]:
    """The pairs of files sharing a run of :data:`WINDOW` lines of the same shape."""
    places: dict[tuple[str, ...], list[tuple[str, int, int]]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        shapes = line_shapes(path.read_text(encoding="utf-8"))
        for i in range(len(shapes) - WINDOW + 1):
            run = shapes[i : i + WINDOW]
            places[_run_key([r for _, r in run])].append((rel, run[0][0], run[-1][0]))
    pairs = set()
    for found in places.values():
        if not 2 <= len(found) <= MOST_PLACES:
            continue
        for a, b in itertools.combinations(found, 2):
            if a[0] == b[0] and a[1] <= b[2] and b[1] <= a[2]:  # overlapping runs of one file
                continue
            pairs.add((min(a[0], b[0]), max(a[0], b[0])))
    return pairs


def test_complexity_and_duplication_only_fall() -> None:
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    functions = complex_functions()
    pairs = duplicate_pairs()
    counts = {"complex_functions": len(functions), "duplicate_pairs": len(pairs)}
    risen = {k: (baseline[k], v) for k, v in counts.items() if v > baseline[k]}
    assert not risen, (
        f"the ratchet rose (baseline, now): {risen}; functions over complexity "
        f"{MAX_COMPLEXITY}:\n  " + "\n  ".join(functions)
    )
    fallen = {k: v for k, v in counts.items() if v < baseline[k]}
    if fallen:
        print(f"the ratchet fell: write {json.dumps(counts)} into {BASELINE.name}")


def test_the_measures_see_what_they_claim() -> None:
    tree = ast.parse(
        "def f(x):\n    if x and x > 1 or not x:\n        return [y for y in x if y]\n"
        "    def g():\n        if x: pass\n    return 1 if x else 2\n"
    )
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert complexity(fn) == 1 + 1 + 2 + 2 + 1  # if, and/or, comprehension for+if, ternary
    block = (
        "def {f}(a, b):\n    c = a + {n}\n    d = b * c\n    e = c - d\n    g = [a, b]\n"
        "    h = g.pop()\n    return h\n"
    )
    one = line_shapes(block.format(f="f", n=1))
    other = line_shapes(block.format(f="k", n=7).replace("a", "q"))
    assert _run_key([r for _, r in one[:WINDOW]]) == _run_key([r for _, r in other[:WINDOW]])
    swapped = line_shapes(block.format(f="f", n=1).replace("d = b * c", "d = c * b"))
    assert _run_key([r for _, r in one[:WINDOW]]) != _run_key([r for _, r in swapped[:WINDOW]])
    assert line_shapes('"""doc"""\nimport os\nx = (\n    "s",\n    1,\n)  # c\n') == [
        (3, ["$x", "=", "("]),
        (5, ["N", ","]),
    ]
