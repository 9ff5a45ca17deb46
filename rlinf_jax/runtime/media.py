"""Pictures of episodes for people: an image strip (episodes as rows, steps as columns)
written as PNG with the standard library alone (zlib + struct), so no imaging package is
needed to look at what a VLA policy does."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from rlinf_jax.errors import BadInput


def image_strip(frames: np.ndarray, gap: int = 1) -> np.ndarray:
    """Frames ``[T, B, H, W, 3]`` (uint8) -> one image ``[B*H + (B-1)*gap, T*W + (T-1)*gap, 3]``,
    episode ``b`` on row ``b``, step ``t`` in column ``t``, white gaps between."""
    frames = np.asarray(frames)
    if frames.ndim != 5 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [steps, episodes, H, W, 3], got {frames.shape}")
    T, B, H, W, _ = frames.shape
    out = np.full((B * H + (B - 1) * gap, T * W + (T - 1) * gap, 3), 255, np.uint8)
    for b in range(B):
        for t in range(T):
            y, x = b * (H + gap), t * (W + gap)
            out[y : y + H, x : x + W] = frames[t, b]
    return out


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> Path:
    """Writes ``rgb [H, W, 3]`` uint8 as an 8-bit RGB PNG; refuses to overwrite a file."""
    path = Path(path)
    if path.exists():
        raise BadInput(f"{path} exists; choose a new file name for the image strip")
    rgb = np.ascontiguousarray(np.asarray(rgb, np.uint8))
    h, w, _ = rgb.shape
    # Each scanline starts with filter type 0 (none).
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(png)
    os.replace(tmp, path)
    return path
