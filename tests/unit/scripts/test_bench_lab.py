"""Unit tests for scripts/bench_lab.py helpers (no lab needed)."""
import bench_lab


def test_make_words_is_deterministic():
    assert bench_lab.make_words("a", 10) == bench_lab.make_words("a", 10)
    assert bench_lab.make_words("a", 10) != bench_lab.make_words("b", 10)
    assert len(bench_lab.make_words("a", 10).split()) == 10


def test_prompt_target_leaves_room_in_the_context():
    assert bench_lab.prompt_target(2048, 8192) == 2048
    assert bench_lab.prompt_target(8192, 8192) == 8192 - bench_lab.CONTEXT_MARGIN
    assert bench_lab.prompt_target(8192, None) == 8192


def _row(tokens, cold, cross, l2):
    return {"target_tokens": tokens, "cross_over_cold": cross / cold, "cross_lmcache_l2_tokens_median": l2,
            "prompt_tokens_median": tokens, "ttft_cold_median_s": cold, "ttft_same_median_s": 0.01,
            "ttft_cross_median_s": cross, "same_over_cold": 0.01 / cold, "cross_external_tokens_median": l2}


def test_target_needs_the_ratio_and_lmcache_l2_loads():
    assert bench_lab.target_check([_row(2048, 1.0, 0.4, 1792)])["pass"] is True
    assert bench_lab.target_check([_row(2048, 1.0, 0.6, 1792)])["pass"] is False
    # fast, but not through LMCache's L2: not the tier's doing
    assert bench_lab.target_check([_row(2048, 1.0, 0.4, 0)])["pass"] is False
    assert bench_lab.target_check([_row(512, 1.0, 0.4, 256)])["pass"] is None


def test_render_has_one_table_per_tier():
    lab = {"model": "m", "max_model_len": 8192, "connector": "c", "rounds": 1, "lab_tier": "fs", "notes": [],
           "tiers": [{"tier": "fs", "results": [_row(2048, 1.0, 0.4, 1792)],
                      "target": bench_lab.target_check([_row(2048, 1.0, 0.4, 1792)]), "notes": []},
                     {"tier": "s3", "converge_s": 300, "error": "boom", "results": [], "target": {}}]}
    text = "\n".join(bench_lab.render_markdown(lab))
    assert "### fs tier (the lab's own)" in text and "**PASS**" in text
    assert "### s3 tier (converged for the bench, 300 s)" in text and "Not measured: boom" in text
    assert "| 2048 | 2048 | 1000.0 | 10.0 | 400.0 | 0.40 | 0.01 | 1792 | 1792 |" in text
