"""The signal processing of Ludwig 0.17's audio features in numpy (its ``utils/audio_utils.py``).

Every step keeps Ludwig's float32 arithmetic where it has one, so the tensors equal its own to
float32 rounding: pre-emphasis ``y[n] = x[n] - 0.97 x[n-1]`` in float64, then float32; frames of
``int(window_length_in_s * sr)`` samples every ``int(window_shift_in_s * sr)``, their count
``ceil((n - w) / s + 1)`` rounded through float32 as torch does, the last frame cut at the end of
the signal and zero-padded; a symmetric window (computed in float64, used in float32); an FFT of
``num_fft_points`` over each frame (all frames of a file at once) keeping ``n_fft // 2 + 1`` bins.
``fbank`` subtracts each frame's mean first and applies Ludwig's triangular mel filters (its
float32 ``linspace`` and ``floor``); ``group_delay`` weighs a second transform by the sample index.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "feature_dim",
    "file_feature",
    "frame_count",
    "mel_filterbank",
    "window",
]

F32 = np.float32


def frame_count(num_samples: int, win: int, shift: int) -> int:
    """Ludwig's ``get_num_output_padded_to_fit_input``: ``ceil`` of a float32 (``torch.tensor``).

    Examples:
        >>> frame_count(16000, 640, 320), frame_count(100, 640, 320)
        (49, 0)
    """
    return max(math.ceil(float(np.float32((num_samples - win) / shift + 1))), 0)


def window(kind: str, length: int) -> NDArray[np.float32]:
    """A symmetric window (torch's ``*_window(periodic=False)`` in float64), as float32."""
    if length == 1:
        return np.ones(1, F32)
    n = np.arange(length, dtype=np.float64)
    m = length - 1
    if kind == "hamming":
        w = 0.54 - 0.46 * np.cos(2 * np.pi * n / m)
    elif kind == "hann":
        w = 0.5 - 0.5 * np.cos(2 * np.pi * n / m)
    elif kind == "blackman":
        w = 0.42 - 0.5 * np.cos(2 * np.pi * n / m) + 0.08 * np.cos(4 * np.pi * n / m)
    else:  # bartlett
        w = 1 - np.abs(2 * n / m - 1)
    return w.astype(F32)


def _frames(
    x: NDArray[np.float32], win: int, shift: int, *, zero_mean: bool
) -> NDArray[np.float32]:
    n = len(x)
    count = frame_count(n, win, shift)
    out = np.zeros((count, win), F32)
    if count == 0:
        return out
    starts = np.arange(count) * shift
    full = starts + win <= n
    idx = starts[full, None] + np.arange(win)
    out[full] = x[idx]
    for j in np.flatnonzero(~full):  # the last frame (at most one or two): cut at the end
        part = x[starts[j] : n][:win]
        out[j, : len(part)] = part
    if zero_mean:
        lengths = np.minimum(n - starts, win).astype(np.int64)
        sums = out.sum(axis=1, dtype=F32)
        means = (sums / lengths.astype(F32)).astype(F32)
        mask = np.arange(win)[None, :] < lengths[:, None]
        out = np.where(mask, out - means[:, None], F32(0)).astype(F32)
    return out


def _stft(
    x: NDArray[np.float32],
    sr: int,
    wl: float,
    ws: float,
    n_fft: int,
    kind: str,
    *,
    group_delay: bool = False,
    zero_mean: bool = False,
) -> NDArray[np.complex64]:
    emph = x.astype(np.float64)
    emph[1:] -= 0.97 * emph[:-1].copy()
    frames = _frames(emph.astype(F32), int(wl * sr), int(ws * sr), zero_mean=zero_mean)
    w = window(kind, frames.shape[1])
    if group_delay:
        w = (w * np.arange(frames.shape[1], dtype=F32)).astype(F32)
    spec = np.fft.fft(frames * w, n=n_fft, axis=1)
    out: NDArray[np.complex64] = spec[:, : n_fft // 2 + 1].astype(np.complex64)
    return out


def _linspace32(start: float, end: float, steps: int) -> NDArray[np.float32]:
    """torch's CPU ``linspace`` in float32 (first half from the start, rest from the end)."""
    step = F32((F32(end) - F32(start)) / F32(steps - 1)) if steps > 1 else F32(0)
    i = np.arange(steps)
    half = steps // 2
    return np.where(
        i < half, F32(start) + step * i.astype(F32), F32(end) - step * (steps - 1 - i).astype(F32)
    ).astype(F32)


def mel_filterbank(bands: int, n_fft: int, sr: int) -> NDArray[np.float32]:
    """Ludwig's triangular mel filters, ``bands × (n_fft // 2 + 1)`` float32."""
    upper_mel = float(F32(2595.0) * np.log10(F32(1 + int(sr / 2) / 700.0)))
    mel = _linspace32(0.0, upper_mel, bands + 2)
    hz = (F32(700.0) * (F32(10.0) ** (mel / F32(2595.0)) - F32(1))).astype(F32)
    bins = np.floor(F32((n_fft + 1) / sr) * hz).astype(F32)
    out = np.zeros((bands, n_fft // 2 + 1), F32)
    for b in range(bands):  # one filter per band (80 by default)
        lo, mid, hi = bins[b], bins[b + 1], bins[b + 2]
        up = np.arange(int(lo), int(mid))
        out[b, up] = (up.astype(F32) - lo) / (mid - lo)
        down = np.arange(int(mid), int(hi))
        out[b, down] = (hi - down.astype(F32)) / (hi - mid)
    return out


def feature_dim(kind: str, sr: int, wl: float, n_fft: int, bands: int) -> int:
    """The width of a file's feature rows (``n_fft`` bins: see the differences page)."""
    if kind == "raw":
        return 1
    if kind == "fbank":
        return bands
    bins = n_fft // 2 + 1
    return 2 * bins if kind == "stft_phase" else bins


def file_feature(
    x: NDArray[np.float32],
    sr: int,
    *,
    kind: str,
    wl: float,
    ws: float,
    n_fft: int | None,
    window_type: str,
    bands: int,
) -> NDArray[np.float32]:
    """One file's ``frames × dim`` feature (``raw``: ``samples × 1``), before norm and padding."""
    if kind == "raw":
        return x[:, None].astype(F32)
    nfft = n_fft or int(wl * sr)
    if kind == "fbank":
        spec = _stft(x, sr, wl, ws, nfft, window_type, zero_mean=True)
        power = (np.abs(spec) ** 2).astype(F32)
        mel = (power @ mel_filterbank(bands, nfft, sr).T).astype(F32)
        logs: NDArray[np.float32] = np.log(mel + F32(1e-10)).astype(F32)
        return logs
    spec = _stft(x, sr, wl, ws, nfft, window_type)
    if kind == "stft":
        return np.abs(spec).astype(F32)
    if kind == "stft_phase":
        return np.concatenate([np.angle(spec), np.abs(spec)], axis=1).astype(F32)
    y = _stft(x, sr, wl, ws, nfft, window_type, group_delay=True)
    num = (spec.real * y.real + spec.imag * y.imag).astype(F32)
    den = (np.abs(spec) ** 2).astype(F32)
    return (num / (den + F32(1e-10))).astype(F32)
