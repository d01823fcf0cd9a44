"""Generated calls of the public Python API: every constructor and function in ``datamill.__all__``
and the subpackages' ``__all__``, with hostile arguments drawn per parameter from its signature.

Each call must return, or raise a :class:`~datamill.core.errors.DatamillError` (or ``TypeError`` for
an argument of the wrong type), and nothing else; a returned generator is advanced twice under the
same rule; nothing it did not name may change in the workspace (see tests/fuzz/runner.py).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import math
import os
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datamill.core.errors import DatamillError
from tests.fuzz.runner import (
    COUNTS,
    TIME_LIMIT_S,
    WALL_LIMIT_S,
    CommandTimeout,
    Outcome,
    _restore,
    snapshot,
    time_limit,
)
from tests.fuzz.workspace import STRINGS, Workspace, table_for

pytestmark = pytest.mark.fuzz

LONG = os.environ.get("DATAMILL_FUZZ") == "long"
API_MODULES = (
    "datamill",
    "datamill.loader",
    "datamill.preprocessing",
    "datamill.pretrain.bert",
    "datamill.pretrain.word2vec",
    "datamill.shards",
    "datamill.text",
    "datamill.sources",
    "datamill.vocab",
    "datamill.tokenize",
)
"""The public modules fuzzed (``datamill.serve`` is being rewritten by another change;
``datamill.ray`` starts a cluster)."""

SKIP = {
    "Executor",
    "Sink",
    "Source",
    "Tokenizer",
    "PROVIDERS",
    "TOKENIZERS",
    "MANIFEST",
    "BERT_SPECIALS",
    "__version__",
}
"""Protocols, registries and constants (not callables one constructs with arguments)."""


def public_callables() -> dict[str, Callable[..., Any]]:
    """``"module.name" -> object`` for every callable in the fuzzed modules' ``__all__`` (errors
    excluded)."""
    out: dict[str, Callable[..., Any]] = {}
    seen: set[int] = set()
    for mod_name in API_MODULES:
        mod = importlib.import_module(mod_name)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if name in SKIP or not callable(obj) or id(obj) in seen:
                continue
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            if isinstance(obj, type) and getattr(obj, "_is_protocol", False):
                continue
            seen.add(id(obj))
            out[f"{mod_name}.{name}"] = obj
    return out


CALLABLES = public_callables()
TOTAL_CALLS = int(os.environ.get("DATAMILL_FUZZ_API_CALLS", "14000" if LONG else "1400"))
PER_CALLABLE = max(5, -(-TOTAL_CALLS // max(1, len(CALLABLES))))
FUZZ = settings(
    max_examples=PER_CALLABLE,
    deadline=None,
    derandomize=not LONG,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)


def _values(ws: Workspace) -> list[Any]:
    from datamill.core.source import TableSource

    paths = [p for p in ws.path_menu() if p not in STRINGS]
    return [
        0,
        -1,
        1,
        2,
        3,
        10**18,
        2**63,
        -(2**63) - 1,
        math.nan,
        math.inf,
        -math.inf,
        0.5,
        -0.0,
        1e-300,
        True,
        False,
        None,
        "",
        " ",
        "x" * 10_000,
        "a\x00b",
        "\u00fcn\u00efc\u00f6d\u00e9 \U0001f389",
        b"bytes",
        [],
        [1, 2],
        [[1, 2], ["a"]],
        ["a", "b"],
        (),
        {},
        {"a": 1},
        {"input_features": [{"name": "x"}]},
        object(),
        np.array([1.0, np.nan]),
        np.zeros((0,)),
        np.int64(-5),
        pa.table({"x": [1, 2]}),
        pa.array(["a", None]),
        table_for(5),
        TableSource(table_for(7), shard_size=3),
        len,
        Path("."),
        *paths,
        *(Path(p) for p in paths[::5]),
    ]


def _args(
    fn: Callable[..., Any], ws: Workspace
) -> st.SearchStrategy[tuple[list[Any], dict[str, Any]]]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    menu = st.sampled_from(_values(ws))

    @st.composite
    def build(draw: st.DrawFn) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if sig is None:
            return [draw(menu) for _ in range(draw(st.integers(0, 3)))], {}
        for p in sig.parameters.values():
            if p.name in ("self", "cls"):
                continue
            if p.kind is p.VAR_POSITIONAL:
                args += [draw(menu) for _ in range(draw(st.integers(0, 2)))]
            elif p.kind is p.VAR_KEYWORD:
                if draw(st.integers(0, 4)) == 0:
                    kwargs[draw(st.sampled_from(["bogus", "x", "seed"]))] = draw(menu)
            elif p.default is p.empty or draw(st.integers(0, 2)) == 0:
                if p.kind is p.KEYWORD_ONLY or (
                    p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty
                ):
                    kwargs[p.name] = draw(menu)
                else:
                    args.append(draw(menu))
        return args, kwargs

    return build()


def _call(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> BaseException | None:
    """Call and advance a returned generator; return the unexpected exception, if any."""
    try:
        result = fn(*args, **kwargs)
        if isinstance(result, types.GeneratorType):
            for _ in range(2):
                next(result, None)
            result.close()
    except (DatamillError, TypeError):
        return None
    except CommandTimeout:
        raise
    except Exception as exc:  # noqa: BLE001 - the finding
        return exc
    return None


def _shown(v: Any) -> str:
    r = repr(v)
    return r if len(r) < 120 else r[:60] + f"...<{len(r)} chars>"


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_fuzz_api(name: str, fuzz_ws: tuple[Workspace, Path]) -> None:
    ws, pristine = fuzz_ws
    fn = CALLABLES[name]

    @FUZZ
    @given(call=_args(fn, ws))
    def run(call: tuple[list[Any], dict[str, Any]]) -> None:
        args, kwargs = call
        before = snapshot(ws.root)
        cwd = os.getcwd()
        os.chdir(ws.cwd)
        shown_args = [*map(_shown, args), *(f"{k}={_shown(v)}" for k, v in kwargs.items())]
        shown = f"{name}({', '.join(shown_args)})"
        argv = [
            os.fspath(v)
            for v in [*args, *kwargs.values()]
            if isinstance(v, (str, Path)) and "\x00" not in str(v)
        ]
        o = Outcome(argv, 0, "", "", 0.0)
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
                time_limit(TIME_LIMIT_S),
            ):
                warnings.simplefilter("ignore")
                exc = _call(fn, args, kwargs)
            if exc is not None:
                o.problems.append(f"raised {type(exc).__name__}: {exc}"[:1500])
        except CommandTimeout:
            o.problems.append(
                f"did not finish within {TIME_LIMIT_S:g} s of CPU time or {WALL_LIMIT_S:g} s of "
                "wall time"
            )
        finally:
            os.chdir(cwd)
        _restore(ws, before, pristine, o)
        COUNTS["api calls"] += 1
        COUNTS["api " + name] += 1
        if o.problems:
            COUNTS["failures"] += 1
            pytest.fail(f"{shown}\n  -> " + "\n  -> ".join(o.problems), pytrace=False)

    run()


def test_api_fuzz_covers_every_public_module() -> None:
    """The fuzzed callables come from ``__all__``: a new public function is fuzzed without listing
    it."""
    modules = {name.rsplit(".", 1)[0] for name in CALLABLES}
    assert set(API_MODULES) - {"datamill.pretrain"} <= modules | {"datamill"}
    assert {
        "datamill.Loader",
        "datamill.preprocess",
        "datamill.loader.Mix",
        "datamill.shards.ShardsetDataset",
    } & set(CALLABLES)
