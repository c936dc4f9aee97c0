"""The bench's per-run memory figures (specrepro.measure.memory)."""

import math
import sys

import pytest

from specrepro.measure.memory import peak_rss_mb, reset_peak, rss_split_mb

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


@linux
def test_peak_follows_an_allocation_and_resets():
    import mmap

    # An anonymous mapping of its own, every page written: 64 MiB of pages that cannot have been resident before
    # (an allocator may hand a long-lived process's freed, still-resident heap back, which would move no peak).
    size = 64 * 2**20
    reset_peak()
    before = peak_rss_mb()
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    during = peak_rss_mb()
    assert during - before > 50
    block.close()
    assert reset_peak()
    assert peak_rss_mb() < during - 50  # the high-water mark came down to what is resident now


@linux
def test_split_adds_up():
    s = rss_split_mb()
    assert all(math.isfinite(v) and v >= 0 for v in s.values())
    assert s["anon"] + s["file"] + s["shmem"] == pytest.approx(s["rss"], abs=1.0)


@linux
def test_release_pages_drops_a_file_backed_tensor_from_the_resident_set_and_keeps_its_values(tmp_path):
    """Weights memory-mapped from a checkpoint (what transformers' safetensors loading gives) leave the resident set
    when released, and read back unchanged; anonymous memory (no swap) is left as it is."""
    import torch
    from safetensors.torch import load_file, save_file

    from specrepro.models import release_pages

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.arange(32 * 2**20 // 4, dtype=torch.float32)}, str(path))  # 32 MiB
    w = load_file(str(path))["w"]  # memory-mapped
    total = float(w.sum())  # every page resident
    before = rss_split_mb()["file"]
    if not release_pages(w):
        pytest.skip("madvise(MADV_PAGEOUT) is not available on this kernel")
    after = rss_split_mb()["file"]
    if before - after < 16:
        pytest.skip("safetensors gave an anonymous copy here, not a file mapping")
    assert float(w.sum()) == total  # read back from the file
    anon = torch.ones(2**20)
    assert release_pages(anon) in (True, False) and float(anon.sum()) == 2**20
