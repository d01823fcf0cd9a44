"""The import graph of ``src/datamill``, walked with ``ast`` (top-level and function-level imports).

Asserts: no import cycles, ``datamill.core`` imports nothing else from datamill, and no module
imports a private name (a ``_x`` module or a ``_x`` attribute) from another subpackage. Imports
under ``if TYPE_CHECKING:`` are for annotations only and never run, so they are left out of the
graph.

String imports are edges too: every string literal that names a datamill module (a registry's
``name -> "datamill.x"`` entry, an ``importlib.import_module("datamill.x")`` argument, a module-name
constant) is an edge from the module holding it, so a cycle through a string is still a cycle. Such
strings may appear only in the registries (:data:`REGISTRIES`), and ``importlib.import_module`` /
``__import__`` may be called only there (and, for third-party modules, in
:data:`THIRD_PARTY_DYNAMIC`).

Violations that exist today (in modules being restructured elsewhere) are listed in ``KNOWN`` and
checked exactly: a new violation fails, and so does a fixed one until it is removed from ``KNOWN``.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "datamill"

KNOWN: set[str] = set()

REGISTRIES = {
    "datamill.cli": "COMMAND_MODULES",  # CLI commands: module -> its register(subparsers)
    "datamill.demo": "DEMO_MODULES",  # the demo's sections (one per capability, beside its CLI)
    "datamill.engines": "ENGINE_MODULES",  # engine="ray" -> the module that registers its jobs
    # the loader's Source registry: modules that register a source
    "datamill.loader.sources": "PROVIDERS",
    "datamill.preprocessing.features": "FEATURE_TYPES",  # feature type -> its handler module
}
"""Module -> the name of its registry table: the only places a string may name a datamill module."""

THIRD_PARTY_DYNAMIC = {
    "datamill.core.optional": (
        "require(): the optional extras (torch, ray, fastapi...), never a datamill module"
    ),
    "datamill.serve.http.run": "uvloop/httptools when installed",
    "datamill.lineage.cli": "the user's own --filter module:function, named on the command line",
}
"""Modules that call ``import_module``/``__import__`` for third-party modules only, and why."""

_DYNAMIC = ("import_module", "__import__")


@functools.cache
def parse(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per session (every test here walks the whole package:
    about eleven parses of every module otherwise). Callers only read the trees."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {_module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(
    name: str, path: Path, known: dict[str, Path], *, runtime_only: bool = True
) -> list[tuple[str, str | None]]:
    """``(module, attribute or None)`` for every datamill import in the file (``from m import a``
    gives ``(m.a, None)`` when ``m.a`` is a module, else ``(m, "a")``)."""
    tree = parse(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    nodes = _runtime_nodes(tree) if runtime_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            out.extend((a.name, None) for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != ROOT:
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub, None) if sub in known else (mod, a.name))
    return out


def string_imports(path: Path, known: dict[str, Path]) -> tuple[list[str], list[int]]:
    """The datamill modules named by string literals in the file, and the lines calling
    ``import_module``/``__import__``."""
    tree = parse(path)
    run_as_main = {
        id(b)
        for n in ast.walk(tree)
        if isinstance(n, (ast.List, ast.Tuple))  # [..., "-m", "datamill.cli"]
        for a, b in zip(n.elts, n.elts[1:], strict=False)
        if isinstance(a, ast.Constant) and a.value == "-m"
    }
    named = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and "." in n.value
        and n.value in known
        and id(n) not in run_as_main
    ]
    calls = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Attribute) and n.func.attr in _DYNAMIC)
            or (isinstance(n.func, ast.Name) and n.func.id in _DYNAMIC)
        )
    ]
    return named, calls


def string_edges() -> tuple[dict[str, set[str]], list[str]]:
    """Edges made by strings naming datamill modules, and the string imports outside a registry."""
    known = modules()
    edges: dict[str, set[str]] = {}
    problems = []
    for name, path in known.items():
        named, calls = string_imports(path, known)
        if named:
            edges[name] = set(named) - {name}
            if name not in REGISTRIES:
                problems.append(
                    f"string import: {name} names {', '.join(sorted(set(named)))} outside a "
                    "registry"
                )
        if calls and name not in REGISTRIES and name not in THIRD_PARTY_DYNAMIC:
            problems.append(
                f"dynamic import: {name} calls import_module/__import__ (lines {calls}) outside "
                "a registry"
            )
    return edges, problems


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _private(module: str, attr: str | None) -> bool:
    names = module.split(".")[1:] + ([attr] if attr else [])
    return any(n.startswith("_") and not n.startswith("__") for n in names)


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """The module graph (edges to datamill modules only) and the non-cycle violations."""
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    problems: list[str] = []
    for name, path in known.items():
        for mod, attr in imports_of(name, path, known):
            target = mod
            while target not in known and "." in target:  # `import datamill.x.y` names a module
                target = target.rpartition(".")[0]
            if target != name:
                edges[name].add(target)
            if name.startswith(f"{ROOT}.core") and not target.startswith(f"{ROOT}.core"):
                problems.append(f"core: {name} imports {target}")
            if _subpackage(name) != _subpackage(target) and _private(mod, attr):
                problems.append(f"private: {name} imports {mod}{'.' + attr if attr else ''}")
    strings, string_problems = string_edges()
    for name, targets in strings.items():
        edges[name] |= targets
        problems.extend(
            f"core: {name} names {t}"
            for t in targets
            if name.startswith(f"{ROOT}.core") and not t.startswith(f"{ROOT}.core")
        )
    return edges, sorted(set(problems + string_problems))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _cycle_path(comp: list[str], edges: dict[str, set[str]]) -> str:
    """One concrete cycle through the component's first module, for the failure message."""
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return (
                        " -> ".join([start, *reversed(path[:-1]), start])
                        if len(path) > 1
                        else f"{start} -> {start}"
                    )
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return " -> ".join(comp)


def violations() -> tuple[set[str], dict[str, str]]:
    """Every violation as a stable string, and a readable cycle path per cycle violation."""
    edges, problems = graph()
    found = set(problems)
    paths = {}
    for comp in cycles(edges):
        key = "cycle: " + ", ".join(comp)
        found.add(key)
        paths[key] = _cycle_path(comp, edges)
    return found, paths


def test_import_graph_has_no_new_violations_and_known_ones_are_current() -> None:
    found, paths = violations()
    new = sorted(found - KNOWN)
    fixed = sorted(KNOWN - found)
    detail = [f"{v}  ({paths[v]})" if v in paths else v for v in new]
    assert not new, "new import-graph violations:\n  " + "\n  ".join(detail)
    assert not fixed, "fixed violations still listed in KNOWN (remove them):\n  " + "\n  ".join(
        fixed
    )


def _package(module: str) -> str | None:
    """The subpackage a module belongs to (``datamill.lineage.trace`` -> ``datamill.loader``), or
    ``None`` for the root's own modules (the façade ``datamill``, the CLI, the registries
    ``engines``/``sources``...: they sit above the ladder and dispatch into it)."""
    parts = module.split(".")
    if len(parts) < 2 or not (SRC / ROOT / parts[1]).is_dir():
        return None
    return ".".join(parts[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between subpackages: an edge wherever a module of one imports (or names, in a
    registry) a module of another; ``TYPE_CHECKING`` imports are already left out of ``edges``."""
    out: dict[str, set[str]] = {}
    for name, targets in edges.items():
        a = _package(name)
        if a is None:
            continue
        out.setdefault(a, set())
        for t in targets:
            b = _package(t)
            if b is not None and b != a:
                out[a].add(b)
                out.setdefault(b, set())
    return out


def test_packages_form_a_ladder() -> None:
    """No cycle between subpackages (string imports counted, ``TYPE_CHECKING`` left out)."""
    edges, _ = graph()
    packages = package_graph(edges)
    assert {"datamill.core", "datamill.loader", "datamill.lineage"} <= set(packages)
    found = cycles(packages)
    detail = []
    for comp in found:
        members = set(comp)
        links = sorted(
            f"{m} -> {t}"
            for m, ts in edges.items()
            for t in ts
            if _package(m) in members and _package(t) in members and _package(m) != _package(t)
        )
        detail.append(_cycle_path(comp, packages) + "\n    " + "\n    ".join(links))
    assert not found, "cycles between packages:\n  " + "\n  ".join(detail)


def test_package_graph_sees_cycles_through_strings() -> None:
    edges = {
        "datamill.core.a": set(),
        "datamill.loader.sources": {"datamill.shards.dataset"},  # a registry's string
        "datamill.shards.dataset": {"datamill.core.a"},
        "datamill.shards.cli": {"datamill.loader.cli"},
        "datamill.loader.cli": set(),
        "datamill.engines": {"datamill.loader.cli"},
    }
    packages = package_graph(edges)
    assert packages["datamill.loader"] == {"datamill.shards"}
    assert cycles(packages) == [["datamill.loader", "datamill.shards"]]


def test_walker_sees_lazy_imports_and_skips_type_checking_blocks(tmp_path: Path) -> None:
    code = (
        "from typing import TYPE_CHECKING\nimport datamill.core.errors\n"
        "if TYPE_CHECKING:\n    from datamill.loader.torch import TorchLoaderDataset\n"
        "def f():\n    from datamill.core import _hidden\n    from datamill.loader.order import "
        "_x\n"
    )
    path = tmp_path / "m.py"
    path.write_text(code)
    known = {"datamill.core.errors": path, "datamill.loader.order": path}
    runtime = imports_of("datamill.pretrain.m", path, known)
    assert sorted(runtime, key=str) == sorted(
        [
            ("datamill.core.errors", None),
            ("datamill.core", "_hidden"),
            ("datamill.loader.order", "_x"),
        ],
        key=str,
    )
    assert [_private(m, a) for m, a in sorted(runtime, key=str)] == [True, False, True]
    everything = imports_of("datamill.pretrain.m", path, known, runtime_only=False)
    assert ("datamill.loader.torch", "TorchLoaderDataset") in everything
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert _cycle_path(["a", "b", "c"], edges) == "a -> b -> c -> a"


def test_loader_module_never_imports_the_torch_adapter() -> None:
    """loader.py may not import loader/torch.py at all: not lazily, not even for type checking."""
    known = modules()
    name = "datamill.loader.loader"
    got = imports_of(name, known[name], known, runtime_only=False)
    assert got and not [m for m, _ in got if m.startswith("datamill.loader.torch")]


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's length without its signature and docstring (``ruff format`` puts one parameter
    on a line, so a signature's length says nothing about the function's)."""
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    assert node.end_lineno is not None
    return node.end_lineno - body[0].lineno + 1


def test_the_entry_points_stay_thin() -> None:
    """preprocess() and Loader.iter_batches delegate to the pipeline / the batch service (< 60 lines
    of code each)."""
    lengths = {}
    for rel, name in (
        ("datamill/preprocessing/api.py", "preprocess"),
        ("datamill/loader/loader.py", "iter_batches"),
    ):
        tree = ast.parse((SRC / rel).read_text(encoding="utf-8"))
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
        lengths[name] = _code_lines(node)
    assert all(n < 60 for n in lengths.values()), lengths


def test_string_imports_are_edges_and_live_only_in_the_registries() -> None:
    """Every registry entry is counted as an edge, and the registries are the only string
    imports."""
    edges, problems = string_edges()
    assert not problems, "\n  ".join(problems)
    assert set(edges) <= set(REGISTRIES), sorted(set(edges) - set(REGISTRIES))
    counted = sum(len(v) for v in edges.values())
    from datamill.cli import COMMAND_MODULES
    from datamill.engines import ENGINE_MODULES
    from datamill.loader.sources import PROVIDERS

    listed = set(COMMAND_MODULES) | set(ENGINE_MODULES.values()) | set(PROVIDERS)
    assert listed <= {t for v in edges.values() for t in v}, (
        "a registry entry is not followed as an edge"
    )
    assert counted >= len(listed)


def test_string_import_walker_sees_names_constants_and_calls(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        'import importlib\n_W = "datamill.x"\ndef f():\n    return importlib.import_module(_W)\n'
        'TABLE = {"a": "datamill.y", "b": "not.datamill"}\n'
    )
    known = {"datamill.x": path, "datamill.y": path}
    named, calls = string_imports(path, known)
    assert sorted(named) == ["datamill.x", "datamill.y"] and calls == [4]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


def test_producers_never_import_the_consumers() -> None:
    """Builders (preprocessing, pretrain, text, shards) reach the loader, the server and the engines
    only through registries; their ``cli`` modules (the command line) may call them."""
    known = modules()
    producers = ("datamill.preprocessing", "datamill.pretrain", "datamill.text", "datamill.shards")
    consumers = ("datamill.loader", "datamill.serve", "datamill.client", "datamill.ray")
    bad = []
    for name, path in known.items():
        if not name.startswith(producers) or name.rpartition(".")[2] == "cli":
            continue
        bad += [
            f"{name} -> {m}"
            for m, _ in imports_of(name, path, known, runtime_only=False)
            if m.startswith(consumers)
        ]
    assert not bad, bad


def test_the_client_never_imports_the_server() -> None:
    """``datamill.client`` (Client, RemoteLoader, the torch adapter) imports no module of
    ``datamill.serve`` (the server's protocol, journal, routes...): the two share only
    ``core.wire`` and ``loader.runs``."""
    known = modules()
    bad = [
        f"{name} -> {m}"
        for name, path in known.items()
        if name.startswith("datamill.client")
        for m, _ in imports_of(name, path, known, runtime_only=False)
        if m.startswith("datamill.serve")
    ]
    assert not bad, bad
    assert {"datamill.client", "datamill.client.loader"} <= set(known)


LONG_KNOWN: set[str] = set()
"""Long functions without the comment yet (none: each is split or says why above it)."""


def _long_comment(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """The line number (1-based) of the ``# long (`` comment right above ``node`` (it may run over
    several comment lines), or ``None``."""
    first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    above = first - 2  # the comment may run over several lines
    while (
        above > 0
        and lines[above - 1].strip().startswith("#")
        and not lines[above].strip().startswith("# long (")
    ):
        above -= 1
    return above + 1 if lines[above].strip().startswith("# long (") else None


def test_long_functions_say_why() -> None:
    """A function over 60 lines of code (signature and docstring not counted) carries a ``# long
    (N lines, ...): why`` comment right above it, whose N is that count; and no such comment stays
    above a function that is no longer long, or above none (as ruff's RUF100 for ``noqa``)."""
    bare, wrong = [], []
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        placed = set()
        for node in ast.walk(parse(path)):
            if (
                not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                or node.end_lineno is None
            ):
                continue
            at, n = _long_comment(lines, node), _code_lines(node)
            if at is not None:
                placed.add(at)
                said = re.match(r"# long \((\d+) lines", lines[at - 1].strip())
                if n <= 60 or said is None or int(said[1]) != n:
                    says = said[1] if said else "?"
                    short = " (not long)" if n <= 60 else ""
                    wrong.append(
                        f"{name}.{node.name}: {n} lines of code, the comment says {says}{short}"
                    )
            elif n > 60:
                bare.append(f"{name}.{node.name}")
        orphans = [
            f"{name}:{i}"
            for i, line in enumerate(lines, 1)
            if line.strip().startswith("# long (") and i not in placed
        ]
        wrong += [f"{o}: a '# long (' comment above no function" for o in orphans]
    assert set(bare) >= LONG_KNOWN, (
        f"fixed, remove from LONG_KNOWN: {sorted(LONG_KNOWN - set(bare))}"
    )
    bare = [b for b in bare if b not in LONG_KNOWN]
    assert not bare, "split these or say why above them (# long (N lines): why):\n  " + "\n  ".join(
        bare
    )
    assert not wrong, "correct or remove these '# long' comments:\n  " + "\n  ".join(wrong)


SLEEP_KNOWN: set[tuple[str, str]] = set()
"""Sleeps that are not polls (none: a test waits for an observable state, with a deadline)."""


def test_tests_never_sleep_a_fixed_time() -> None:
    """Every ``sleep`` in the tests is inside a loop polling for something, with a deadline."""
    tests = SRC.parent / "tests"
    fixed = []
    for path in sorted(tests.rglob("*.py")):
        tree = parse(path)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "sleep"
            ):
                continue
            up: ast.AST = node
            while up in parents and not isinstance(
                up, (ast.While, ast.For, ast.FunctionDef, ast.Lambda)
            ):
                up = parents[up]
            if not isinstance(up, (ast.While, ast.For)):
                fixed.append((str(path.relative_to(tests.parent)), ast.unparse(node)))
    assert set(fixed) == SLEEP_KNOWN, sorted(set(fixed) ^ SLEEP_KNOWN)


MAX_PARAMETERS = 12
"""Most parameters of a public callable (issue #38): more options travel as option objects."""


def _parameter_count(args: ast.arguments) -> int:
    """Parameters but ``self``/``cls``; ``*args`` and ``**kwargs`` count one each."""
    named = [
        a for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")
    ]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def wide_callables(root: Path) -> dict[str, int]:
    """``module:qualname`` -> parameter count of every public function, method and ``__init__``
    over :data:`MAX_PARAMETERS` under ``root`` (public: no ``_`` in the name or in an enclosing
    class's name; nested functions are not API)."""
    wide: dict[str, int] = {}

    def visit(body: list[ast.stmt], prefix: str, module: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.", module)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                n = _parameter_count(node.args)
                if n > MAX_PARAMETERS:
                    wide[f"{module}:{prefix}{node.name}"] = n

    for path in sorted(root.rglob("*.py")):
        tree = parse(path)
        visit(tree.body, "", _module_name(path) if root == SRC else path.stem)
    return wide


def test_no_public_callable_takes_more_than_12_parameters() -> None:
    """Issue #38: options pass whole (``Batching``, ``Workers``, ``Packing``...), so no public
    function, method or class takes more than 12 parameters. No exceptions are listed: the
    client's ``RemoteLoader``/``Client.iteration`` and ``client.cli.run_iterate`` (which calls
    ``RemoteLoader``) are being narrowed with the client package's move (datamill.client)."""
    wide = wide_callables(SRC)
    client = [
        k for k in wide if "RemoteLoader" in k or "Client.iteration" in k or "run_iterate" in k
    ]
    assert not wide, (
        f"over {MAX_PARAMETERS} parameters (pass an option object instead): "
        + ", ".join(f"{k} ({v})" for k, v in sorted(wide.items()))
        + (
            f" [{len(client)} of them: the client's, narrowed with datamill.client]"
            if client
            else ""
        )
    )


def test_parameter_count_sees_methods_inits_and_star_args(tmp_path: Path) -> None:
    many = ", ".join(f"a{i}" for i in range(11))
    (tmp_path / "m.py").write_text(
        f"def ok(self, {many}, *, b=1): ...\n"
        f"def wide({many}, *args, **kw): ...\n"
        f"def _private({many}, b, c, d): ...\n"
        f"class C:\n    def __init__(self, {many}, b, c): ...\n"
        f"    def _helper(self, {many}, b, c): ...\n"
        f"class _Hidden:\n    def run(self, {many}, b, c): ...\n",
        encoding="utf-8",
    )
    assert wide_callables(tmp_path) == {"m:wide": 13, "m:C.__init__": 13}


SERVE_MAX_LINES = 9_000
"""Issue #37's bound on the server package: ``serve/`` in at most this many lines of Python."""


def test_the_server_package_stays_within_its_line_budget() -> None:
    files = sorted((SRC / ROOT / "serve").rglob("*.py"))
    lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
    assert len(files) > 20 and lines > 5_000  # the package itself, not an empty glob
    assert lines <= SERVE_MAX_LINES, (
        f"serve/ has {lines:,} lines of Python (budget {SERVE_MAX_LINES:,}): move what is not the "
        "server's own (options, planning, storage) to its package, or shorten"
    )
