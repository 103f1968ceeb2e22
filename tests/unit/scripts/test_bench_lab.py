"""Unit tests for scripts/bench_lab.py helpers (no lab needed)."""
import bench_lab


def test_make_words_is_deterministic():
    assert bench_lab.make_words("a", 10) == bench_lab.make_words("a", 10)
    assert bench_lab.make_words("a", 10) != bench_lab.make_words("b", 10)
    assert len(bench_lab.make_words("a", 10).split()) == 10
