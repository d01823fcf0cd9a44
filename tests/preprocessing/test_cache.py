"""Cache: reuse without recompute, content (not mtime) fingerprint, invalidation, crash safety."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from datamill.core.errors import DataFileError, OutputError
from datamill.preprocessing import api, hdf5, pipeline, sinks
from datamill.preprocessing.features import handler_class

CFG = {
    "input_features": [
        {"name": "MSZoning", "type": "category"},
        {"name": "LotArea", "type": "number"},
        {"name": "CentralAir", "type": "binary"},
    ]
}


def _boom(*args: object, **kwargs: object) -> None:
    raise AssertionError("recomputed")


@pytest.fixture()
def house(data_copy) -> Path:  # type: ignore[no-untyped-def]
    path: Path = data_copy("house_prices_train.csv")
    return path


def test_rerun_reuses_without_recompute_even_after_touch(
    house: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = api.preprocess(house, CFG)
    assert not first.cached
    os.utime(house, (1, 1))  # touching must not invalidate
    monkeypatch.setattr(handler_class("category"), "fit", _boom)
    monkeypatch.setattr(handler_class("category"), "transform", _boom)
    monkeypatch.setattr(pipeline, "read_dataset", _boom)
    again = api.preprocess(house, CFG)
    assert again.cached and again.metadata.to_dict() == first.metadata.to_dict()
    assert (again.data["MSZoning"] == first.data["MSZoning"]).all()


def test_changed_input_or_config_recomputes(house: Path) -> None:
    first = api.preprocess(house, CFG)
    cfg2 = {
        **CFG,
        "input_features": [*CFG["input_features"], {"name": "Alley", "type": "category"}],
    }
    second = api.preprocess(house, cfg2)
    assert not second.cached and "Alley" in second.data
    text = house.read_text()
    house.write_text(text.replace(",RL,", ",RM,", 1))
    third = api.preprocess(house, cfg2)
    assert not third.cached
    assert (
        third.metadata["MSZoning"]["str2freq"]["RM"]
        == first.metadata["MSZoning"]["str2freq"]["RM"] + 1
    )
    assert third.metadata.header["input_fingerprint"] != first.metadata.header["input_fingerprint"]


def test_crash_mid_write_keeps_the_previous_pair(
    house: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = api.preprocess(house, CFG)
    cfg2 = {
        **CFG,
        "input_features": [
            {"name": "MSZoning", "type": "category", "preprocessing": {"most_common": 2}}
        ],
    }
    real_write = hdf5.H5Writer.write

    def crash(self: hdf5.H5Writer, key: str, value: object) -> None:
        real_write(self, key, value)  # type: ignore[arg-type]
        raise KeyboardInterrupt("simulated crash after the first dataset")

    monkeypatch.setattr(hdf5.H5Writer, "write", crash)
    with pytest.raises(KeyboardInterrupt):
        api.preprocess(house, cfg2)
    monkeypatch.undo()
    assert not [p for p in house.parent.iterdir() if ".tmp-" in p.name]  # temp file removed
    # the previous pair is untouched and still trusted; the new config recomputes
    _, meta = api.load(good.hdf5_path)  # type: ignore[arg-type]
    assert meta.header["fingerprint"] == good.metadata.header["fingerprint"]
    assert api.preprocess(house, CFG).cached
    assert not api.preprocess(house, cfg2).cached
    assert api.preprocess(house, cfg2).cached


def test_failure_writing_meta_keeps_the_previous_pair(
    house: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.preprocess(house, CFG)
    real = sinks.fingerprint_file

    def crash(*a: object, **k: object) -> str:
        real(*a, **k)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sinks, "fingerprint_file", crash)
    cfg2 = {**CFG, "input_features": CFG["input_features"][:1]}
    with pytest.raises(OutputError) as info:
        api.preprocess(house, cfg2)
    monkeypatch.undo()
    assert info.value.path == os.fspath(house.parent / "house_prices_train.hdf5")
    assert api.preprocess(house, CFG).cached  # the previous pair is intact


def test_corrupted_hdf5_of_same_size_and_mtime_is_not_trusted(house: Path) -> None:
    out = api.preprocess(house, CFG)
    assert out.hdf5_path is not None
    st = out.hdf5_path.stat()
    raw = bytearray(out.hdf5_path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    out.hdf5_path.write_bytes(bytes(raw))
    os.utime(out.hdf5_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not api.preprocess(house, CFG).cached


def test_output_guard_refuses_a_users_file_and_the_input(house: Path) -> None:
    (house.parent / "house_prices_train.hdf5").write_text("my notes")
    with pytest.raises(DataFileError) as info:
        api.preprocess(house, CFG)
    assert info.value.path == os.fspath(house.parent / "house_prices_train.hdf5")
    assert (house.parent / "house_prices_train.hdf5").read_text() == "my notes"


def test_replaced_hdf5_is_not_trusted(house: Path) -> None:
    out = api.preprocess(house, CFG)
    assert out.hdf5_path is not None
    out.hdf5_path.write_bytes(out.hdf5_path.read_bytes() + b"\0")
    assert not api.preprocess(house, CFG).cached


def test_skip_save_writes_nothing(house: Path) -> None:
    out = api.preprocess(house, CFG, skip_save=True)
    assert out.hdf5_path is None and len(out.data["LotArea"]) == 1460
    assert sorted(p.name for p in house.parent.iterdir()) == ["house_prices_train.csv"]


def test_new_datamill_version_recomputes(house: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not api.preprocess(house, CFG).cached
    monkeypatch.setattr(pipeline, "_version", lambda: "99.0")
    out = api.preprocess(house, CFG)
    assert not out.cached and out.metadata.header["version"] == "99.0"
    assert api.preprocess(house, CFG).cached
