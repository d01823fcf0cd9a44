"""Input forms: zip members, JSONL line numbers, config errors through the CLI."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from datamill.cli import main
from datamill.core.errors import DataFileError
from datamill.preprocessing.api import load, preprocess

CFG = {"input_features": [{"name": "kind", "type": "category"}, {"name": "legs", "type": "number"}]}


def test_zip_member_input(tmp_path: Path) -> None:
    z = tmp_path / "pets.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("inner/pets.csv", "kind,legs\ncat,4\nbird,2\n")
    out = preprocess(f"{z}:inner/pets.csv", CFG)
    assert out.hdf5_path == tmp_path / "pets.hdf5"
    data, meta = load(tmp_path / "pets.hdf5")
    assert meta.decode("kind", data["kind"]).tolist() == ["cat", "bird"]
    assert preprocess(f"{z}:inner/pets.csv", CFG).cached


def test_jsonl_error_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "pets.jsonl"
    p.write_text('{"kind": "cat", "legs": "4"}\n{"kind": "dog", "legs": "four"}\n')
    with pytest.raises(DataFileError) as info:
        preprocess(p, CFG)
    assert (info.value.path, info.value.line, info.value.column) == (str(p), 2, "legs")


def test_cli_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pets.csv"
    p.write_text("kind,legs\ncat,4\n")
    c = tmp_path / "c.yaml"
    c.write_text("input_features:\n  - {name: kind, type: categry}\n")
    assert main(["preprocess", str(p), "--config", str(c)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(c) in err and "input_features[0].type" in err
    assert main(["preprocess", str(p)]) == 2
    assert "--config" in capsys.readouterr().err


def test_quiet_after_the_subcommand() -> None:
    from datamill.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["preprocess", "d.csv", "--quiet"]).quiet is True
    assert parser.parse_args(["-q", "preprocess", "d.csv"]).quiet is True
    assert parser.parse_args(["preprocess", "d.csv"]).quiet is False
