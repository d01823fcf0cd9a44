"""image handler (direct) and image/set/sequence/text/timeseries features end to end through
preprocess()."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from PIL import Image

from datamill.core.errors import ConfigError, DataFileError
from datamill.preprocessing.api import load, preprocess
from datamill.preprocessing.features import CSR, FeatureContext, get_handler
from datamill.vocab import Vocab


def run_image(paths: list[str], base: Path, **params: Any) -> tuple[dict[str, Any], np.ndarray]:
    h = get_handler("image")
    p = h.Params(**params)
    ctx = FeatureContext(
        name="img", column="image_path", path=str(base / "labels.csv"), base_dir=base, line_offset=2
    )
    col = pa.array(paths)
    block2 = dataclasses.replace(ctx, row_offset=1)  # the second block starts at row 1
    meta = h.finalize(h.merge(h.fit(col[:1], p, ctx), h.fit(col[1:], p, block2)), p, ctx)
    out = h.transform(col, meta, p, ctx)["img"]
    assert isinstance(out, np.ndarray)
    return meta, out


def test_image_inferred_size_matches_pillow(data_dir: Path) -> None:
    base = data_dir / "cifar10_tiny"
    paths = pacsv.read_csv(base / "labels.csv")["image_path"].to_pylist()[
        :20
    ]  # >= 16 rows: thread pool
    meta, out = run_image(paths, base)
    assert meta == {"height": 32, "width": 32, "num_channels": 3}
    assert out.shape == (20, 32, 32, 3) and out.dtype == np.uint8
    for i in (0, 7, 19):
        np.testing.assert_array_equal(
            out[i], np.asarray(Image.open(base / paths[i]).convert("RGB"))
        )


def test_image_resize_channels_and_crop(data_dir: Path) -> None:
    base = data_dir / "cifar10_tiny"
    meta, out = run_image(
        ["images/1.png", "images/3.png"], base, height=8, width=12, num_channels=1
    )
    assert meta == {"height": 8, "width": 12, "num_channels": 1} and out.shape == (2, 8, 12, 1)
    ref = np.asarray(
        Image.open(base / "images/3.png").convert("L").resize((12, 8), Image.Resampling.BILINEAR)
    )
    np.testing.assert_array_equal(out[1, :, :, 0], ref)
    _, out = run_image(
        ["images/1.png"], base, height=40, width=16, num_channels=4, resize_method="crop_or_pad"
    )
    rgba = np.asarray(Image.open(base / "images/1.png").convert("RGBA"))
    assert out.shape == (1, 40, 16, 4)
    np.testing.assert_array_equal(out[0, 4:36], rgba[:, 8:24])  # centre crop across, zero pad down
    assert not out[0, :4].any() and not out[0, 36:].any()
    _, out = run_image(["images/1.png"], base, infer_image_max_height=10, infer_image_max_width=20)
    assert out.shape == (1, 10, 20, 3)
    with pytest.raises(ConfigError, match="height and width"):
        run_image(["images/1.png"], base, infer_image_dimensions=False)


def test_image_missing_and_corrupt_files_name_file_line_column(
    tmp_path: Path, data_dir: Path
) -> None:
    base = tmp_path
    Image.open(data_dir / "cifar10_tiny/images/1.png").save(base / "ok.png")
    (base / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(DataFileError, match="nope.png") as info:
        run_image(["ok.png", "ok.png", "nope.png"], base)
    assert (info.value.line, info.value.column) == (
        4,
        "image_path",
    )  # row 2 of the transformed column
    with pytest.raises(DataFileError, match="bad.png") as info:
        run_image(["ok.png", "bad.png"], base)
    assert info.value.column == "image_path" and info.value.path == str(base / "labels.csv")


# -- end to end ---------------------------------------------------------------------------------
def test_cifar10_tiny_end_to_end(data_copy: Any) -> None:
    folder = data_copy("cifar10_tiny")
    cfg = {
        "input_features": [
            {"name": "image_path", "type": "image", "preprocessing": {"num_channels": 1}}
        ],
        "output_features": [{"name": "label", "type": "category"}],
    }
    out = preprocess(folder / "labels.csv", cfg)
    img = out.data["image_path"]
    assert isinstance(img, np.ndarray) and img.shape == (100, 32, 32, 1) and img.dtype == np.uint8
    assert (folder / "labels.hdf5").exists() and (folder / "labels.meta.json").exists()
    data, meta = load(folder / "labels.hdf5")
    np.testing.assert_array_equal(data["image_path"], img)
    assert {k: meta["image_path"][k] for k in ("height", "width", "num_channels")} == {
        "height": 32,
        "width": 32,
        "num_channels": 1,
    }
    ref = np.asarray(Image.open(folder / "images/5.png").convert("L"))
    np.testing.assert_array_equal(data["image_path"][4, :, :, 0], ref)
    (folder / "images/5.png").unlink()
    with pytest.raises(DataFileError, match="5.png") as info:
        preprocess(folder / "labels.csv", {**cfg, "preprocessing": {"seed": 1}})
    assert (info.value.line, info.value.column) == (6, "image_path")


def test_ragged_types_end_to_end(tmp_path: Path) -> None:
    table = pa.table(
        {
            "tags": ["a b", "b", None, "c a a"],
            "words": ["x y z", "y", "", "z z"],
            "review": ["Good film.", "bad", "the end", None],
            "series": ["1 2 3", "4", "5 6", "7"],
        }
    )
    pacsv.write_csv(table, tmp_path / "d.csv")
    cfg = {
        "input_features": [
            {"name": "tags", "type": "set"},
            {
                "name": "bag_tags",
                "column": "tags",
                "type": "bag",
                "preprocessing": {"max_dense_bytes": 0},
            },
            {"name": "words", "type": "sequence", "preprocessing": {"padding": "left"}},
            {"name": "review", "type": "text"},
            {"name": "series", "type": "timeseries"},
        ],
        "preprocessing": {"split": {"type": "none"}},
    }
    out = preprocess(tmp_path / "d.csv", cfg)
    data, meta = load(out.hdf5_path)
    assert data["tags"].dtype == np.int8 and data["tags"].shape[0] == 4
    bag = data["bag_tags"]
    assert isinstance(bag, CSR) and bag.values is not None
    assert (
        data["words"].shape == (4, 3) and data["words"].dtype == np.int8
    )  # smallest dtype for the vocabulary (Ludwig int_type)
    assert set(data) >= {"review_char", "review_word", "series"}
    assert data["series"].tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0], [7, 0, 0]]
    v = meta.vocab("tags")
    assert v == Vocab.from_dict(out.metadata["tags"]) and out.metadata["tags"]["max_set_size"] == 3
    assert np.flatnonzero(data["tags"][3]).tolist() == sorted([v["a"], v["c"]])
    assert np.flatnonzero(data["tags"][2]).tolist() == [1]  # missing set -> default fill <UNK>
    assert meta.decode("review_word", data["review_word"][0]).tolist() == ["good", "film", "."]
    assert "".join(meta.decode("review_char", data["review_char"][1][:3])) == "bad"
    # unseen data with the saved metadata: nothing refitted, unknown tokens -> <UNK> (1)
    pacsv.write_csv(
        pa.table({"tags": ["q"], "words": ["x q"], "review": ["zzz"], "series": ["1 2 3 4 5"]}),
        tmp_path / "new.csv",
    )
    again = preprocess(tmp_path / "new.csv", metadata=out.meta_path)
    assert again.data["words"].tolist() == [[0, data["words"][0, 0], 1]]
    assert again.data["tags"][0].tolist().index(1) == 1
    assert again.data["series"].shape == (1, 3)


def test_all_empty_ragged_columns_are_one_wide_not_zero_wide(tmp_path: Path) -> None:
    """Regression: an all-empty sequence/text/timeseries column gave a zero-width tensor HDF5 cannot
    chunk."""
    table = pa.table({"s": pa.array(["", ""], pa.string()), "t": pa.array(["", ""], pa.string())})
    pq_path = tmp_path / "e.parquet"
    import pyarrow.parquet as pq

    pq.write_table(table, pq_path)
    cfg = {
        "input_features": [
            {"name": "s", "type": "sequence"},
            {"name": "t", "type": "text"},
            {"name": "ts", "column": "s", "type": "timeseries"},
        ]
    }
    out = preprocess(pq_path, cfg)
    data, _ = load(out.hdf5_path)
    for key in ("s", "t_char", "t_word", "ts"):
        assert data[key].shape == (2, 1) and not data[key].any()
