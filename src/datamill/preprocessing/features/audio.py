"""audio → float32 ``n × frames × bins``: Ludwig 0.17's audio feature, read with ``soundfile``.

Values are paths of audio files (WAV, FLAC, OGG and the other formats libsndfile reads), relative
to the dataset file's folder unless absolute, or the files' bytes (a binary column: Parquet, Arrow,
a DataFrame of ``bytes``). Ludwig 0.17's ``preprocessing:`` keys and defaults:
``type`` (``fbank``; or ``raw``, ``stft``, ``stft_phase``, ``group_delay``), ``window_length_in_s``
(0.04), ``window_shift_in_s`` (0.02), ``num_fft_points`` (the window length in samples),
``window_type`` (``hamming``; ``hann``, ``blackman``, ``bartlett``), ``num_filter_bands`` (80),
``audio_file_length_limit_in_s`` (7.5: longer files are cut, shorter ones padded with
``padding_value``, 0.0), ``norm`` (``per_file``: each file's feature z-normalised over its frames
before the cut), ``missing_value_strategy`` (``bfill``); ``in_memory``, ``mode``,
``prefetch_size`` and ``lazy_cache_dir`` (how Ludwig holds the data while training) are accepted
and change nothing. The signal processing is :mod:`._audio_dsp` (Ludwig's, in numpy). Like Ludwig,
only the first channel is used, nothing is resampled (each file's own sample rate sets its window
lengths in samples), and the sample rate of the first fitted file sets ``max_length``
(``audio_file_length_limit_in_s`` × rate samples for ``raw``, else the frames of that many
samples).

The metadata holds Ludwig's ``feature_dim``, ``sampling_rate_in_hz``, ``max_length`` and
``reshape``. Each file's duration and sample rate are read from its header (``soundfile.info``)
before its samples; a file longer than ``max_audio_file_length_in_s`` (one hour by default) or with
an implausible rate is refused, and only the samples the output needs are decoded (the whole file
with ``norm: per_file``). Files are decoded on a thread pool (``num_processes`` threads). A missing,
unreadable or corrupt file is a DataFileError naming the file, the dataset's row/line and column.
"""

from __future__ import annotations

import builtins
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import Field

from datamill.core.errors import ConfigError, DataFileError
from datamill.core.progress import progress
from datamill.preprocessing.features._audio_dsp import feature_dim, file_feature, frame_count
from datamill.preprocessing.features._ragged import to_string_array
from datamill.preprocessing.features.base import (
    CSR,
    FeatureContext,
    FileFeatureHandler,
)
from datamill.preprocessing.features.base import Params as BaseParams

__all__ = ["AudioParams", "Handler"]

#: sample rates outside this range are refused before any sample is read
MIN_RATE, MAX_RATE = 1, 768_000


class AudioParams(BaseParams):
    """``preprocessing:`` of an audio feature (Ludwig 0.17's keys and defaults)."""

    audio_file_length_limit_in_s: float = Field(default=7.5, ge=0)
    padding_value: float = 0.0
    norm: Literal["per_file"] | None = None
    type: Literal["fbank", "group_delay", "raw", "stft", "stft_phase"] = "fbank"
    window_length_in_s: float = Field(default=0.04, gt=0)
    window_shift_in_s: float = Field(default=0.02, gt=0)
    num_fft_points: int | None = Field(default=None, ge=1)
    window_type: Literal["bartlett", "blackman", "hamming", "hann"] = "hamming"
    num_filter_bands: int = Field(default=80, ge=1)
    in_memory: bool = True
    mode: Literal["eager", "lazy", "lazy_cached"] = "lazy"
    prefetch_size: int | None = Field(default=None, ge=0)
    lazy_cache_dir: str | None = None
    #: datamill: decoding threads (0: min(8, cpu count))
    num_processes: int = Field(default=0, ge=0)
    #: datamill: longer files are refused before they are decoded
    max_audio_file_length_in_s: float = Field(default=3600.0, gt=0)


def _resolve(value: str | bytes, ctx: FeatureContext) -> Path | bytes:
    """A path relative to the dataset's folder, or the file's bytes as they are."""
    if isinstance(value, bytes):
        return value
    p = Path(value)
    return p if p.is_absolute() or ctx.base_dir is None else ctx.base_dir / p


def _values(column: pa.Array) -> list[Any]:
    """Each row's path (str) or bytes; empty or missing: ``""``."""
    if pa.types.is_binary(column.type):
        return [v or b"" for v in column.to_pylist()]
    return list(to_string_array(column).to_pylist())


def _opened(src: Path | bytes) -> Any:
    return io.BytesIO(src) if isinstance(src, bytes) else str(src)


def _label(src: Path | bytes) -> str:
    return f"<{len(src)} bytes>" if isinstance(src, bytes) else str(src)


def _error(msg: str, ctx: FeatureContext, index: int, hint: str) -> DataFileError:
    return DataFileError(msg, path=ctx.path, column=ctx.column, hint=hint, **ctx.location(index))


def _info(
    src: Path | bytes, index: int, ctx: FeatureContext, params: AudioParams
) -> tuple[int, int]:
    """(frames, sample rate) from the file's header, checked before any sample is read."""
    import soundfile as sf

    path = _label(src)
    if not isinstance(src, bytes) and not src.is_file():
        raise _error(
            f"audio file not found: {path}", ctx, index, "audio paths are relative to the dataset"
        )
    try:
        info = sf.info(_opened(src))
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        raise _error(
            f"cannot read audio file {path}: {exc}", ctx, index, "replace or remove the file"
        ) from exc
    rate, frames = int(info.samplerate), int(info.frames)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _error(f"audio file {path}: sample rate {rate} Hz", ctx, index, "re-encode the file")
    if frames / rate > params.max_audio_file_length_in_s:
        raise _error(
            f"audio file {path} lasts {frames / rate:.0f} s, longer than "
            f"max_audio_file_length_in_s ({params.max_audio_file_length_in_s:g} s)",
            ctx,
            index,
            "cut the file, or raise max_audio_file_length_in_s if it is genuine",
        )
    return frames, rate


def _read(
    src: Path | bytes, index: int, ctx: FeatureContext, params: AudioParams, limit_s: float | None
) -> tuple[NDArray[np.float32], int]:
    """The first channel (float32 in [-1, 1], as torchaudio) and the rate; ``limit_s``: enough
    samples for that many seconds of output (None: all)."""
    import soundfile as sf

    frames, rate = _info(src, index, ctx, params)
    path = _label(src)
    want = frames
    if limit_s is not None:  # the samples of the kept frames, plus margin
        want = min(frames, int(limit_s * rate) + 2 * int(params.window_length_in_s * rate) + 2)
    try:
        data, rate = sf.read(_opened(src), frames=want, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        raise _error(
            f"cannot decode audio file {path}: {exc}", ctx, index, "replace or remove the file"
        ) from exc
    if len(data) < want:
        raise _error(
            f"audio file {path} is truncated: {len(data)} of {want} samples",
            ctx,
            index,
            "replace or remove the file",
        )
    return np.ascontiguousarray(data[:, 0]), int(rate)


def max_length(params: AudioParams, rate: int) -> int:
    """Ludwig's ``max_length``: the limit in samples (``raw``) or frames."""
    samples = params.audio_file_length_limit_in_s * rate
    if not float(samples).is_integer():
        raise ConfigError(
            f"audio_file_length_limit_in_s ({params.audio_file_length_limit_in_s}) × the sample "
            f"rate ({rate} Hz) is not a whole number of samples",
            hint="choose a limit that is, as Ludwig requires",
        )
    if params.type == "raw":
        return int(samples)
    win, shift = int(params.window_length_in_s * rate), int(params.window_shift_in_s * rate)
    return frame_count(int(samples), win, shift)


def _per_file(feat: NDArray[np.float32]) -> NDArray[np.float32]:
    """Ludwig's ``norm: per_file``: ``(x - mean) / (std + 1e-10)`` over the frames (std with
    ddof 1), with the statistics in float64 so that a constant band is exactly 0 (in float32 the
    mean's rounding error divided by 1e-10 gives values up to 1e4, as Ludwig's do)."""
    x = feat.astype(np.float64)
    std = x.std(axis=0, ddof=1) if len(x) > 1 else np.full(x.shape[1], np.nan)
    out: NDArray[np.float32] = ((x - x.mean(axis=0)) / (std + 1e-10)).astype(np.float32)
    return out


class Handler(FileFeatureHandler):
    """Audio feature handler.

    Examples:
        >>> import tempfile, pathlib, numpy as np, soundfile as sf, pyarrow as pa
        >>> from datamill.preprocessing.features import FeatureContext
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> t = np.arange(8000) / 8000
        >>> sf.write(d / "a.wav", 0.5 * np.sin(2 * np.pi * 1000 * t), 8000)
        >>> h, ctx = Handler(), FeatureContext("a", "a", str(d / "x.csv"), d)
        >>> p = h.Params(type="stft", audio_file_length_limit_in_s=0.5)
        >>> meta = h.finalize(h.fit(pa.array(["a.wav"]), p, ctx), p, ctx)
        >>> meta["max_length"], meta["feature_dim"]
        (24, 161)
        >>> x = h.transform(pa.array(["a.wav"]), meta, p, ctx)["a"]
        >>> x.shape, int(x[0, 5].argmax())  # 1000 Hz is bin 1000 / (8000 / 320) = 40
        ((1, 24, 161), 40)
    """

    type_name: ClassVar[str] = "audio"
    Params: ClassVar[builtins.type[AudioParams]] = AudioParams
    input_type: ClassVar[str] = "binary"  # paths, or the files' bytes (a binary column)
    defaults_key: ClassVar[str] = "audio"

    def fit(self, column: pa.Array, params: AudioParams, ctx: FeatureContext) -> int | None:
        """The sample rate of the block's first file (Ludwig's comes from the first file)."""
        values = _values(column)
        for i, v in enumerate(values):
            if v and v.strip():
                return _info(_resolve(v, ctx), i, ctx, params)[1]
        return None

    def merge(self, a: int | None, b: int | None) -> int | None:
        return a if a is not None else b

    def finalize(
        self, stats: int | None, params: AudioParams, ctx: FeatureContext
    ) -> dict[str, Any]:
        if stats is None:
            raise ConfigError(f"feature {ctx.name!r}: no audio file to take the sample rate from")
        rate = stats
        win = int(params.window_length_in_s * rate)
        nfft = params.num_fft_points or win
        if params.type != "raw" and nfft < win:
            raise ConfigError(
                f"feature {ctx.name!r}: num_fft_points {nfft} < the window length in samples "
                f"({win} at {rate} Hz)",
                hint="raise num_fft_points or shorten window_length_in_s",
            )
        dim = feature_dim(
            params.type, rate, params.window_length_in_s, nfft, params.num_filter_bands
        )
        length = max_length(params, rate)
        return {
            "feature_dim": dim,
            "sampling_rate_in_hz": rate,
            "max_length": length,
            "reshape": [length, dim],
        }

    def transform(
        self, column: pa.Array, meta: dict[str, Any], params: AudioParams, ctx: FeatureContext
    ) -> dict[str, NDArray[Any] | CSR]:
        length, dim = int(meta["max_length"]), int(meta["feature_dim"])
        paths = _values(column)
        out = np.full((len(paths), length, dim), params.padding_value, np.float32)
        limit = None if params.norm else params.audio_file_length_limit_in_s

        def work(i: int) -> None:
            if not paths[i] or not paths[i].strip():  # nothing left after the missing strategy
                return
            x, rate = _read(_resolve(paths[i], ctx), i, ctx, params, limit)
            feat = file_feature(
                x,
                rate,
                kind=params.type,
                wl=params.window_length_in_s,
                ws=params.window_shift_in_s,
                n_fft=params.num_fft_points,
                window_type=params.window_type,
                bands=params.num_filter_bands,
            )
            if feat.shape[1] != dim:
                raise _error(
                    f"audio file {_label(_resolve(paths[i], ctx))} at {rate} Hz gives "
                    f"{feat.shape[1]} values a frame, the feature has {dim} (sample rate "
                    f"{meta['sampling_rate_in_hz']} Hz)",
                    ctx,
                    i,
                    "resample the files to one rate",
                )
            if params.norm == "per_file" and len(feat):
                feat = _per_file(feat)
            n = min(len(feat), length)
            out[i, :n] = feat[:n]

        threads = params.num_processes or min(8, os.cpu_count() or 1)
        bar = progress(total=len(paths), desc=f"audio {ctx.name}", unit="file")
        with bar, ThreadPoolExecutor(max(threads, 1)) as pool:
            for fut in [pool.submit(work, i) for i in range(len(paths))]:
                fut.result()  # first error (in row order) propagates
                bar.update(1)
        return {ctx.name: out}
