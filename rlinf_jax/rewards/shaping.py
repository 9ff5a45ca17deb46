"""Reward shaping on response lengths (host-side numpy, like the rest of the reward)."""

from __future__ import annotations

import numpy as np


def overlong_penalty(lengths, max_len: int, cache_len: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13) for response lengths ``[N]``.

    0 for L <= max_len - cache_len; (max_len - cache_len - L) / cache_len for
    max_len - cache_len < L <= max_len (linear from 0 down to -1); -1 for L > max_len.
    """
    L = np.asarray(lengths, np.float32)
    start = max_len - cache_len
    ramp = (start - L) / max(cache_len, 1)
    return np.where(L <= start, 0.0, np.where(L <= max_len, ramp, -1.0)).astype(np.float32)
