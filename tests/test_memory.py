"""The bench's per-run memory figures (specrepro.measure.memory)."""

import math
import sys

import pytest

from specrepro.measure.memory import peak_rss_mb, reset_peak, rss_split_mb

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


@linux
def test_peak_follows_an_allocation_and_resets():
    import numpy as np

    reset_peak()
    before = peak_rss_mb()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    during = peak_rss_mb()
    assert during - before > 50
    del block
    assert reset_peak()
    assert peak_rss_mb() < during - 50  # the high-water mark came down to what is resident now


@linux
def test_split_adds_up():
    s = rss_split_mb()
    assert all(math.isfinite(v) and v >= 0 for v in s.values())
    assert s["anon"] + s["file"] + s["shmem"] == pytest.approx(s["rss"], abs=1.0)
