"""image → uint8 ``n × h × w × c`` tensor, decoded and resized with Pillow (Ludwig's image feature).

Values are image file paths, relative to the dataset file's folder (``ctx.base_dir``) unless
absolute. ``height``/``width`` fix the size; when unset and ``infer_image_dimensions`` (default
true) they are inferred as Ludwig does from a sample of the first ``infer_image_sample_size`` (100)
fitted images: the rounded mean height and width, capped at ``infer_image_max_height`` /
``infer_image_max_width`` (256). ``num_channels`` is 1 (grey), 3 (RGB) or 4 (RGBA); unset → 1 or 4
when most sampled images have that many channels, else 3 (Ludwig's rule). ``standardize_image:
imagenet1k`` outputs float32 ``(x / 255 - mean) / std`` with ImageNet's per-channel mean and std
(3 channels), as Ludwig does; the layout stays ``n × h × w × c`` (Ludwig's tensors are
``c × h × w``). ``resize_method``: ``interpolate`` (bilinear resize, default) or
``crop_or_pad`` (centre crop / zero pad). The metadata records ``height``, ``width``,
``num_channels``. Images are decoded on a thread pool (``num_processes`` threads; Pillow releases
the GIL while decoding). A missing or unreadable image is a DataFileError naming the image file
and the dataset's row/line and column.
"""

from __future__ import annotations

import builtins
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.errors import ConfigError
from datamill.preprocessing.features._ragged import to_string_array
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    FileFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = ["Handler", "ImageParams", "ImageStats"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


class ImageParams(BaseParams):
    """``preprocessing:`` of an image feature."""

    height: int | None = Field(default=None, ge=1)
    width: int | None = Field(default=None, ge=1)
    num_channels: Literal[1, 3, 4] | None = None
    resize_method: Literal["interpolate", "crop_or_pad"] = "interpolate"
    infer_image_dimensions: bool = True
    infer_image_max_height: int = Field(default=256, ge=1)
    infer_image_max_width: int = Field(default=256, ge=1)
    num_processes: int = Field(default=0, ge=0)  # 0 → min(8, cpu count)
    infer_image_sample_size: int = Field(default=100, ge=1)
    standardize_image: Literal["imagenet1k"] | None = None


#: ImageNet's per-channel mean and std (of pixel values scaled to [0, 1]), as Ludwig's imagenet1k
IMAGENET1K_MEAN = (0.485, 0.456, 0.406)
IMAGENET1K_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageStats:
    """Mergeable statistics: (height, width, channels) of the first ``limit`` images seen, in
    order."""

    sample: tuple[tuple[int, int, int], ...]
    limit: int = 100

    def merge(self, other: ImageStats) -> ImageStats:
        """The first ``limit`` images of this block, then of the next."""
        return ImageStats((self.sample + other.sample)[: self.limit], self.limit)


def _resolve(value: str, ctx: FeatureContext) -> Path:
    p = Path(value)
    return p if p.is_absolute() or ctx.base_dir is None else ctx.base_dir / p


def _open(path: Path, index: int, ctx: FeatureContext) -> PILImage:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:  # leaving the block closes the file, the loaded pixels stay
            img.load()
    except FileNotFoundError as exc:
        raise ctx.error(
            f"image file not found: {path}",
            index=index,
            hint="image paths are relative to the dataset file",
        ) from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ctx.error(
            f"image {path} is too large to decode safely: {exc}",
            index=index,
            hint="if the image is genuine, raise the limit: `datamill preprocess "
            "--max-image-pixels N` "
            "(in Python: PIL.Image.MAX_IMAGE_PIXELS = N)",
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ctx.error(
            f"cannot decode image {path}: {exc}",
            index=index,
            hint="replace or remove the corrupt image",
        ) from exc
    return img


def _channels(img: PILImage) -> int:
    return {"1": 1, "L": 1, "P": 3, "RGB": 3, "RGBA": 4, "LA": 4, "CMYK": 3}.get(img.mode, 3)


def _load(
    path: Path, index: int, ctx: FeatureContext, h: int, w: int, c: int, method: str
) -> NDArray[np.uint8]:
    from PIL import Image

    img = _open(path, index, ctx)
    if img.mode != _MODES[c]:
        img = img.convert(_MODES[c])
    if img.size != (w, h):
        if method == "interpolate":
            img = img.resize((w, h), Image.Resampling.BILINEAR)
        else:
            iw, ih = img.size
            left, top = (iw - w) // 2, (ih - h) // 2
            img = img.crop((left, top, left + w, top + h))  # pads with zeros where out of bounds
    arr = np.asarray(img, dtype=np.uint8)
    return arr.reshape(h, w, c)


def _usual_channels(sample: NDArray[np.int64]) -> int:
    """The channels most of the sampled images have: 1 or 4 when more than half do, else 3."""
    counts = {k: int((sample[:, 2] == k).sum()) for k in (1, 4)}
    return next((k for k, v in counts.items() if v > len(sample) / 2), 3)


class Handler(FileFeatureHandler):
    """Image feature handler.

    Examples:
        >>> import tempfile, pathlib, pyarrow as pa
        >>> from PIL import Image
        >>> from datamill.preprocessing.features import FeatureContext
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> Image.new("RGB", (4, 2), (255, 0, 0)).save(d / "red.png")
        >>> h, ctx = Handler(), FeatureContext("img", "img", str(d / "data.csv"), d)
        >>> p = h.Params(num_channels=1)
        >>> meta = h.finalize(h.fit(pa.array(["red.png"]), p, ctx), p, ctx)
        >>> meta
        {'height': 2, 'width': 4, 'num_channels': 1}
        >>> h.transform(pa.array(["red.png"]), meta, p, ctx)["img"].shape
        (1, 2, 4, 1)
    """

    type_name: ClassVar[str] = "image"
    Params: ClassVar[builtins.type[ImageParams]] = ImageParams
    input_type: ClassVar[str] = "string"
    defaults_key: ClassVar[str] = "image"

    def fit(self, column: pa.Array, params: ImageParams, ctx: FeatureContext) -> ImageStats:
        n = params.infer_image_sample_size
        if (
            params.height is not None
            and params.width is not None
            and params.num_channels is not None
        ):
            return ImageStats((), n)  # nothing to infer
        sample = []
        values = to_string_array(column).to_pylist()
        for i in [i for i, v in enumerate(values) if v and v.strip()][
            :n
        ]:  # no image left after the fill: skipped
            img = _open(_resolve(values[i], ctx), i, ctx)
            sample.append((img.height, img.width, _channels(img)))
        return ImageStats(tuple(sample), n)

    def merge(self, a: ImageStats, b: ImageStats) -> ImageStats:
        return a.merge(b)

    def finalize(
        self, stats: ImageStats, params: ImageParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        sample = np.array(stats.sample, np.int64).reshape(-1, 3)
        if (
            params.height is None or params.width is None or params.num_channels is None
        ) and not len(sample):
            raise ConfigError(
                f"feature {ctx.name!r}: no image to infer the size from; set height, width "
                "and num_channels"
            )
        if (params.height is None or params.width is None) and not params.infer_image_dimensions:
            raise ConfigError(
                f"feature {ctx.name!r}: set height and width, or infer_image_dimensions: true"
            )
        h = params.height or min(round(float(sample[:, 0].mean())), params.infer_image_max_height)
        w = params.width or min(round(float(sample[:, 1].mean())), params.infer_image_max_width)
        c = params.num_channels if params.num_channels is not None else _usual_channels(sample)
        if params.standardize_image is not None and c != 3:
            raise ConfigError(
                f"feature {ctx.name!r}: standardize_image {params.standardize_image} needs 3 "
                f"channels, the images have {c}",
                hint="set num_channels: 3",
            )
        return {"height": int(h), "width": int(w), "num_channels": int(c)}

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: ImageParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        h, w, c = int(meta["height"]), int(meta["width"]), int(meta["num_channels"])
        paths = to_string_array(column).to_pylist()
        out = np.empty((len(paths), h, w, c), np.uint8)

        def work(i: int) -> None:
            if (
                not paths[i] or not paths[i].strip()
            ):  # no image left after the missing-value strategy: black
                out[i] = 0
                return
            out[i] = _load(_resolve(paths[i], ctx), i, ctx, h, w, c, params.resize_method)

        threads = params.num_processes or min(8, os.cpu_count() or 1)
        if threads <= 1 or len(paths) < 16:
            for i in range(len(paths)):
                work(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                for fut in [pool.submit(work, i) for i in range(len(paths))]:
                    fut.result()  # first error (in row order) propagates
        if params.standardize_image == "imagenet1k":
            mean = np.array(IMAGENET1K_MEAN, np.float32) * 255
            std = np.array(IMAGENET1K_STD, np.float32) * 255
            return {ctx.name: (out.astype(np.float32) - mean) / std}
        return {ctx.name: out}
