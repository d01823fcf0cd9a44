"""``datamill preprocess delta://...`` (and iceberg://, lance://): the same reader as the loader, a
pinned version read the same after the table moved on."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamill.cli import main
from datamill.preprocessing.api import preprocess
from tests.tables.formats import build, rows

CONFIG = {
    "input_features": [
        {"name": "x", "type": "number"},
        {"name": "label", "type": "category"},
    ],
    "output_features": [{"name": "uid", "type": "number"}],
    "preprocessing": {"split": {"type": "none"}},
}


@pytest.mark.parametrize("kind", ["delta", "iceberg", "lance"])
def test_preprocess_reads_a_table_url(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMILL_CACHE_DIR", str(tmp_path / "cache"))
    t = build(kind, tmp_path / "table", parts=2)
    src = t.open()
    query = "snapshot_id" if kind == "iceberg" else "version"
    url = f"{kind}://{t.path}?{query}={src.version}"
    out = preprocess(url, CONFIG, output_dir=tmp_path / "out")
    assert out.num_rows == 40 and sorted(out.data["uid"].tolist()) == list(range(40))
    t.write(rows(40, 50))  # the pinned version still reads 40 rows, from the cache
    again = preprocess(url, CONFIG, output_dir=tmp_path / "out")
    assert again.cached and again.num_rows == 40
    latest = preprocess(f"{kind}://{t.path}", CONFIG, output_dir=tmp_path / "latest")
    assert latest.num_rows == 50


def test_the_cli_preprocesses_a_delta_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    monkeypatch.setenv("DATAMILL_CACHE_DIR", str(tmp_path / "cache"))
    t = build("delta", tmp_path / "table", parts=2)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    args = ["preprocess", f"delta://{t.path}", "--config", str(tmp_path / "c.yaml")]
    assert main([*args, "--output-dir", str(tmp_path / "out")]) == 0
    assert "40 rows" in capsys.readouterr().out
    assert (tmp_path / "out" / "delta_t.hdf5").is_file()
    assert (
        main(["preprocess", f"delta://{tmp_path}/nope", "--config", str(tmp_path / "c.yaml")]) == 2
    )
    assert "no Delta table" in capsys.readouterr().err
