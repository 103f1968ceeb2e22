"""Unit tests for the kv_sizing filters (kvcache.offload): worked examples checkable by hand."""
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.kvcache.offload.plugins.filter import kv_sizing as k
from ansible_collections.kvcache.offload.plugins.filter.kv_sizing import FilterModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
DATA = os.path.join(ROOT, "docs", "benchmarks", "gpu_prefill_rates.yml")

LLAMA_8B = {
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
    "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
LLAMA_70B = {
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
    "head_dim": 128, "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16",
}
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
        "head_dim": 32, "torch_dtype": "bfloat16"}


def test_llama_8b_bf16_bytes_per_token():
    # 32 layers x 8 KV heads x 128 head_dim (4096 / 32, derived) x 2 (K, V) x 2 bytes
    assert k.kv_bytes_per_token(LLAMA_8B) == 32 * 8 * 128 * 2 * 2 == 131072


def test_llama_70b_bf16_and_fp8():
    assert k.kv_bytes_per_token(LLAMA_70B) == 80 * 8 * 128 * 2 * 2 == 327680
    assert k.kv_bytes_per_token(LLAMA_70B, kv_dtype="fp8") == 163840
    assert k.kv_bytes_per_token(LLAMA_70B, kv_dtype="fp8_e4m3") == 163840
    assert k.kv_bytes_per_token(LLAMA_70B, kv_dtype="auto") == 327680


def test_tiny_lab_model():
    # 2 x 2 x 32 x 2 x 2 = 512 bytes/token; one 256-token chunk = 128 KiB
    assert k.kv_bytes_per_token(TINY) == 512
    assert k.kv_chunk_bytes(TINY, 256) == 131072


def test_no_gqa_means_kv_heads_equal_heads():
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float16"}
    assert k.kv_bytes_per_token(cfg) == 2 * 4 * 16 * 2 * 2


def test_dtype_spellings():
    assert k.dtype_bytes("torch.bfloat16") == 2
    assert k.dtype_bytes("float16") == 2
    assert k.dtype_bytes("FP8") == 1
    assert k.dtype_bytes("float32") == 4
    with pytest.raises(AnsibleFilterError, match="unknown dtype"):
        k.dtype_bytes("int3")
    cfg = dict(LLAMA_8B, torch_dtype="float32")
    assert k.kv_bytes_per_token(cfg) == 262144
    cfg = dict(LLAMA_8B)
    del cfg["torch_dtype"]
    assert k.kv_bytes_per_token(dict(cfg, dtype="float16")) == 131072  # transformers >= 4.56 writes "dtype"
    assert k.kv_bytes_per_token(cfg) == 131072  # no dtype: bfloat16


def test_chunk_bytes_llama_8b():
    # 131072 x 256 = 32 MiB, LMCache's object for one worker
    assert k.kv_chunk_bytes(LLAMA_8B, 256) == 33554432
    assert k.kv_chunk_bytes(LLAMA_8B, "256") == 33554432


def test_tensor_parallel_splits_kv_heads():
    assert k.kv_bytes_per_token(LLAMA_70B, tp_size=4) == 80 * 2 * 128 * 2 * 2
    # 16 ranks > 8 KV heads: vLLM replicates, one head per rank
    assert k.kv_bytes_per_token(LLAMA_70B, tp_size=16) == 80 * 1 * 128 * 2 * 2


def test_text_config_of_multimodal_model():
    cfg = {"torch_dtype": "bfloat16", "text_config": dict(LLAMA_8B, torch_dtype=None)}
    assert k.kv_bytes_per_token(cfg) == 131072


def test_tier_size_both_ways():
    # 40 GiB per worker, Llama-3.1-8B TP 2: 65536 B/token per worker, 16 MiB chunks -> 2560 chunks
    got = k.kv_tier_size(LLAMA_8B, size_gb=40, tp_size=2)
    assert got["bytes_per_token"] == 65536
    assert got["chunk_bytes"] == 16 * 1024 * 1024
    assert got["chunks"] == 2560
    assert got["tokens"] == 2560 * 256
    # 100000 tokens -> 391 chunks (rounded up) of 32 MiB = 12.22 GiB
    got = k.kv_tier_size(LLAMA_8B, tokens=100000)
    assert got["chunks"] == 391
    assert got["size_bytes"] == 391 * 33554432
    assert got["size_gb"] == pytest.approx(12.21875)
    with pytest.raises(AnsibleFilterError, match="exactly one"):
        k.kv_tier_size(LLAMA_8B)
    with pytest.raises(AnsibleFilterError, match="exactly one"):
        k.kv_tier_size(LLAMA_8B, size_gb=1, tokens=1)


def test_params_and_prefill_rate():
    total, non_emb = k.model_params(LLAMA_8B)
    assert total == pytest.approx(8.03e9, rel=0.001)
    # embeddings + LM head: 2 x 128256 x 4096
    assert total - non_emb == 2 * 128256 * 4096
    # no context: 0.5 x 989.4e12 / (2 x 6.9796e9) = 35439 tokens/s
    assert k.kv_prefill_rate(LLAMA_8B, 989.4, 0, 0.5) == pytest.approx(35439, rel=1e-4)
    # attention term grows with context: 2 x 32 x 4096 x 4096 FLOPs more per token
    flops = k.kv_prefill_flops_per_token(LLAMA_8B, 4096)
    assert flops == pytest.approx(2 * non_emb + 2 * 32 * 4096 * 4096)
    assert k.kv_prefill_rate(LLAMA_8B, 989.4, 4096, 0.5, num_gpus=2) == pytest.approx(2 * 0.5 * 989.4e12 / flops)
    with pytest.raises(AnsibleFilterError, match="mfu"):
        k.kv_prefill_rate(LLAMA_8B, 989.4, 0, 1.5)


def test_break_even_worked_example():
    # Llama-3.1-8B, 32768 tokens = 4 GiB of KV. At 2 GB/s: 2.147 s; recompute at 20000 tokens/s: 1.638 s
    got = k.kv_break_even(LLAMA_8B, 32768, 2e9, 20000)
    assert got["kv_bytes"] == 32768 * 131072
    assert got["load_seconds"] == pytest.approx(2.147483648)
    assert got["recompute_seconds"] == pytest.approx(1.6384)
    assert got["load_wins"] is False
    # break-even bandwidth = 131072 B x 20000 /s = 2.62 GB/s
    assert got["break_even_bandwidth"] == pytest.approx(2.62144e9)
    assert got["break_even_tokens"] is None
    # At 10 GB/s loading wins 3.8x
    got = k.kv_break_even(131072, 32768, 10e9, 20000)
    assert got["load_wins"] is True
    assert got["speedup"] == pytest.approx(1.6384 / 0.4294967296)
    assert got["saved_seconds"] == pytest.approx(1.6384 - 0.4294967296)


def test_break_even_latency_sets_a_minimum_prefix():
    # 10 ms per load; per token recompute 50 us vs load 13.1 us -> loading wins past ~271 tokens
    got = k.kv_break_even(131072, 100, 10e9, 20000, latency=0.01)
    assert got["load_wins"] is False
    assert got["break_even_tokens"] == pytest.approx(0.01 / (1 / 20000.0 - 131072 / 10e9))


@pytest.mark.parametrize("bad", [None, "x", 0, -1, True])
def test_bad_numbers_are_errors(bad):
    with pytest.raises(AnsibleFilterError):
        k.kv_break_even(131072, 1000, bad, 20000)


def test_bad_configs_name_the_field():
    with pytest.raises(AnsibleFilterError, match="dict"):
        k.kv_bytes_per_token("llama")
    with pytest.raises(AnsibleFilterError, match="num_hidden_layers"):
        k.kv_bytes_per_token({"num_attention_heads": 4})
    with pytest.raises(AnsibleFilterError, match="head_dim"):
        k.kv_bytes_per_token({"num_hidden_layers": 2, "num_key_value_heads": 2})
    with pytest.raises(AnsibleFilterError, match="not a multiple"):
        k.kv_bytes_per_token({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 64})
    with pytest.raises(AnsibleFilterError, match="chunk_size"):
        k.kv_chunk_bytes(LLAMA_8B, 0)


def test_filters_are_registered():
    names = FilterModule().filters()
    for name in ("kv_bytes_per_token", "kv_chunk_bytes", "kv_tier_size", "kv_prefill_rate", "kv_break_even"):
        assert callable(names[name])


def test_reference_data_rates_match_the_formula():
    """The prefill table in docs/benchmarks must be what the documented formula gives."""
    with open(DATA) as handle:
        data = yaml.safe_load(handle)
    mfu = data["assumptions"]["mfu"]
    ctx = data["assumptions"]["reference_context_tokens"]
    assert data["prefill_rates"]
    for row in data["prefill_rates"]:
        gpu = data["gpus"][row["gpu"]]
        model = data["models"][row["model"]]
        assert gpu["source"] and model["source"]
        want = k.kv_prefill_rate(model["config"], gpu["dense_bf16_tflops"], ctx, mfu, row["tp"])
        assert row["tokens_per_s"] == pytest.approx(want, abs=1), row
    # the model configs in the data file give the hand-computed sizes
    assert k.kv_bytes_per_token(data["models"]["Llama-3.1-8B"]["config"]) == 131072
    assert k.kv_bytes_per_token(data["models"]["Llama-3.1-70B"]["config"]) == 327680
    assert k.kv_bytes_per_token(data["models"]["Qwen2.5-32B"]["config"]) == 64 * 8 * 128 * 2 * 2
    assert k.kv_bytes_per_token(data["models"]["tiny-qwen2"]["config"]) == 512


# --- kv_chunk_size: the default chunk size of a tier (issue #21 item 4) -----------------------

@pytest.mark.parametrize("config,tier,dtype,tp,expected", [
    # Llama-3.1-8B bf16: 128 KiB per token at TP 1 (32 MiB per 256 tokens: on both plateaus)
    (LLAMA_8B, "fs", None, 1, 256),
    (LLAMA_8B, "s3", None, 1, 256),
    # TP 2: 4 KV heads per worker, 16 MiB at 256 tokens: fs wants 512, s3 is on its plateau
    (LLAMA_8B, "fs", None, 2, 512),
    (LLAMA_8B, "s3", None, 2, 256),
    # TP 8: 1 KV head per worker, 4 MiB at 256 tokens
    (LLAMA_8B, "fs", None, 8, 2048),
    (LLAMA_8B, "s3", None, 8, 512),
    # fp8 halves the object
    (LLAMA_8B, "fs", "fp8", 1, 512),
    (LLAMA_8B, "gds", None, 1, 256),
    # 70B at TP 8: 80 layers x 1 head x 128 x 2 x 2 = 40 KiB per token -> 10 MiB at 256
    (LLAMA_70B, "fs", None, 8, 1024),
    (LLAMA_70B, "s3", None, 8, 256),
    # the lab's tiny model (512 bytes per token) never reaches a plateau: the largest chunk
    (TINY, "fs", None, 1, 2048),
    (TINY, "s3", None, 1, 2048),
])
def test_chunk_size_lands_each_object_on_the_tiers_plateau(config, tier, dtype, tp, expected):
    chunk = k.kv_chunk_size(config, tier, dtype, tp)
    assert chunk == expected
    per_token = k.kv_bytes_per_token(config, dtype, tp)
    if chunk < k.KV_CHUNK_SIZES[-1]:  # the smallest chunk that reaches the plateau
        assert chunk * per_token >= k.KV_MIN_OBJECT_BYTES[tier] > chunk // 2 * per_token or chunk == 256


def test_chunk_size_filter_refuses_an_unknown_tier_and_takes_a_measured_minimum():
    with pytest.raises(AnsibleFilterError, match="unknown tier 'nfs'"):
        k.kv_chunk_size(LLAMA_8B, "nfs")
    assert k.kv_chunk_size(LLAMA_8B, "fs", min_object_bytes=64 * 1024 ** 2) == 512
    assert FilterModule().filters()["kv_chunk_size"] is k.kv_chunk_size
