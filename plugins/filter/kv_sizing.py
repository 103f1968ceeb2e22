# -*- coding: utf-8 -*-
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

"""kv_sizing: KV-cache sizing and load-versus-recompute break-even math.

Filters (model_config is a model's Hugging Face config.json as a dict):

kv_bytes_per_token(model_config, kv_dtype=None, tp_size=1) -> int
    layers x KV heads x head_dim x 2 (K and V) x bytes of the KV dtype. head_dim defaults to
    hidden_size / num_attention_heads, num_key_value_heads (GQA) to num_attention_heads; the dtype
    is kv_dtype, else the config's torch_dtype/dtype, else bfloat16 (fp8 -> 1 byte). With
    tp_size > 1 the result is per tensor-parallel worker (vLLM gives each rank
    max(1, kv_heads // tp_size) KV heads): what one LMCache worker stores.
    Llama-3.1-8B bf16: 32 x 8 x 128 x 2 x 2 = 131072 bytes.
kv_chunk_bytes(model_config, chunk_size=256, kv_dtype=None, tp_size=1) -> int
    One LMCache chunk object: bytes per token (per worker) x chunk_size.
kv_chunk_size(model_config, tier, kv_dtype=None, tp_size=1, min_object_bytes=None) -> int
    The default LMCache chunk size for a tier: the smallest of 256, 512, 1024 and 2048 tokens whose
    object (one worker's KV for the chunk) is at least the tier's smallest object on the
    throughput plateau of the storage bench (KV_MIN_OBJECT_BYTES: fs 32 MiB, s3 8 MiB;
    docs/benchmarks.md, "Chunk size"), else 2048. Llama-3.1-8B bf16 at TP 1: 256 on both tiers.
kv_tier_size(model_config, size_gb=None, tokens=None, chunk_size=256, kv_dtype=None, tp_size=1) -> dict
    Sizes a tier per worker either way: whole chunks/tokens that fit in size_gb GiB (LMCache's
    max_local_cpu_size / max_local_disk_size are GiB per worker), or the GiB that tokens need.
kv_prefill_rate(model_config, peak_tflops, context_tokens=0, mfu=0.5, num_gpus=1) -> float
    Estimated prefill tokens/s from FLOPs (an estimate, not a measurement).
kv_break_even(bytes_per_token_or_config, context_tokens, bandwidth, prefill_rate, latency=0, ...) -> dict
    Whether loading a prefix's KV cache from a tier beats recomputing it, and by how much.

Also used outside Ansible by scripts/bench.py (errors are ValueError there).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - used outside Ansible (scripts/bench.py)
    AnsibleFilterError = ValueError

GIB = 1024 ** 3

# Bytes per element of a KV-cache dtype. "auto" follows the model's dtype.
DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8": 1, "int8": 1, "uint8": 1,
}

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")


def _err(name, message):
    return AnsibleFilterError("%s: %s" % (name, message))


def _positive_int(name, what, value):
    """value as a positive int: ints, integral floats and digit strings (Jinja may pass "256")."""
    number = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or number <= 0:
        raise _err(name, "%s must be a positive integer, got %r" % (what, value))
    return number


def _positive_float(name, what, value, allow_zero=False):
    if isinstance(value, bool):
        raise _err(name, "%s must be a number, got %r" % (what, value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _err(name, "%s must be a number, got %r" % (what, value))
    if math.isnan(number) or math.isinf(number) or number < 0 or (number == 0 and not allow_zero):
        raise _err(name, "%s must be a %s number, got %r" % (what, "non-negative" if allow_zero else "positive", value))
    return number


def _first(config, keys):
    for key in keys:
        if config.get(key) is not None:
            return config.get(key)
    return None


def _text_config(name, config):
    if not isinstance(config, dict):
        raise _err(name, "the model config must be a dict (the model's config.json), got %s" % type(config).__name__)
    # Multimodal configs keep the language model under text_config.
    if _first(config, _LAYER_KEYS) is None and isinstance(config.get("text_config"), dict):
        merged = dict(config["text_config"])
        for key in ("torch_dtype", "dtype"):
            if merged.get(key) is None and config.get(key) is not None:
                merged[key] = config[key]
        return merged
    return config


def dtype_bytes(dtype, name="kv_dtype_bytes"):
    """Bytes per element of a dtype name (bfloat16 -> 2, fp8 -> 1); accepts torch.bfloat16 spellings."""
    if dtype is None:
        return 2
    text = str(dtype).strip().lower()
    if text.startswith("torch."):
        text = text[len("torch."):]
    if text in DTYPE_BYTES:
        return DTYPE_BYTES[text]
    raise _err(name, "unknown dtype %r (known: %s)" % (dtype, ", ".join(sorted(DTYPE_BYTES))))


def kv_geometry(model_config, kv_dtype=None, tp_size=1, name="kv_geometry"):
    """The numbers the KV size is made of: layers, kv_heads (per worker), head_dim, dtype, dtype_bytes."""
    config = _text_config(name, model_config)
    layers = _first(config, _LAYER_KEYS)
    heads = _first(config, _HEAD_KEYS)
    if layers is None:
        raise _err(name, "the model config has no num_hidden_layers")
    layers = _positive_int(name, "num_hidden_layers", layers)
    kv_heads = _first(config, _KV_HEAD_KEYS)
    if kv_heads is None:
        if heads is None:
            raise _err(name, "the model config has neither num_key_value_heads nor num_attention_heads")
        kv_heads = heads
    kv_heads = _positive_int(name, "num_key_value_heads", kv_heads)
    head_dim = config.get("head_dim")
    if head_dim is None:
        hidden = _first(config, _HIDDEN_KEYS)
        if hidden is None or heads is None:
            raise _err(name, "the model config has no head_dim and no hidden_size/num_attention_heads to derive it")
        hidden = _positive_int(name, "hidden_size", hidden)
        heads = _positive_int(name, "num_attention_heads", heads)
        if hidden % heads:
            raise _err(name, "hidden_size %d is not a multiple of num_attention_heads %d; set head_dim" % (hidden, heads))
        head_dim = hidden // heads
    head_dim = _positive_int(name, "head_dim", head_dim)
    tp = _positive_int(name, "tp_size", tp_size)
    if kv_dtype is None or str(kv_dtype).strip().lower() == "auto":
        dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    else:
        dtype = kv_dtype
    size = dtype_bytes(dtype, name)
    # vLLM splits KV heads across TP ranks; with more ranks than KV heads each rank keeps one.
    heads_per_worker = max(1, kv_heads // tp) if tp > 1 else kv_heads
    return {
        "layers": layers,
        "kv_heads": kv_heads,
        "kv_heads_per_worker": heads_per_worker,
        "head_dim": head_dim,
        "dtype": str(dtype),
        "dtype_bytes": size,
        "tp_size": tp,
    }


def kv_bytes_per_token(model_config, kv_dtype=None, tp_size=1):
    """layers x KV heads x head_dim x 2 (K and V) x dtype bytes; per worker when tp_size > 1."""
    geo = kv_geometry(model_config, kv_dtype, tp_size, name="kv_bytes_per_token")
    return geo["layers"] * geo["kv_heads_per_worker"] * geo["head_dim"] * 2 * geo["dtype_bytes"]


def kv_chunk_bytes(model_config, chunk_size=256, kv_dtype=None, tp_size=1):
    """Bytes of one LMCache chunk object (one worker's KV for chunk_size tokens)."""
    chunk = _positive_int("kv_chunk_bytes", "chunk_size", chunk_size)
    return kv_bytes_per_token(model_config, kv_dtype, tp_size) * chunk


# The smallest object (bytes) on each tier's throughput plateau, from make bench's chunk-size
# sweep through LMCache's connector (docs/benchmarks.md, "Chunk size: the rule and its data"):
# below it the per-operation cost (a file create/open, an S3 request) dominates. The fs tier kept
# gaining until 32 MiB (GET 0.3 -> 11 GB/s from 0.13 to 34 MB objects, flat from 34 to 268 MB); S3
# reached its plateau between 0.5 and 8 MB. The GDS tier moves the same files as fs.
KV_MIN_OBJECT_BYTES = {"fs": 32 * 1024 ** 2, "gds": 32 * 1024 ** 2, "s3": 8 * 1024 ** 2}
# LMCache's default chunk is the smallest; larger than 2048 leaves every prompt's last partial
# chunk (up to 2047 tokens) uncached and short prompts not cached at all.
KV_CHUNK_SIZES = (256, 512, 1024, 2048)


def kv_chunk_size(model_config, tier, kv_dtype=None, tp_size=1, min_object_bytes=None):
    """The smallest chunk size of KV_CHUNK_SIZES whose object reaches the tier's plateau, else the largest."""
    name = "kv_chunk_size"
    if min_object_bytes is None:
        if tier not in KV_MIN_OBJECT_BYTES:
            raise _err(name, "unknown tier %r (known: %s)" % (tier, ", ".join(sorted(KV_MIN_OBJECT_BYTES))))
        target = KV_MIN_OBJECT_BYTES[tier]
    else:
        target = _positive_int(name, "min_object_bytes", min_object_bytes)
    per_token = kv_bytes_per_token(model_config, kv_dtype, tp_size)
    for chunk in KV_CHUNK_SIZES:
        if chunk * per_token >= target:
            return chunk
    return KV_CHUNK_SIZES[-1]


def kv_tier_size(model_config, size_gb=None, tokens=None, chunk_size=256, kv_dtype=None, tp_size=1):
    """Size a KV tier per worker: tokens (whole chunks) that fit in size_gb GiB, or GiB for tokens.

    Exactly one of size_gb / tokens. GiB as LMCache counts them (max_local_cpu_size x 1024**3).
    """
    name = "kv_tier_size"
    if (size_gb is None) == (tokens is None):
        raise _err(name, "give exactly one of size_gb (GiB per worker) or tokens")
    per_token = kv_bytes_per_token(model_config, kv_dtype, tp_size)
    chunk = _positive_int(name, "chunk_size", chunk_size)
    chunk_bytes = per_token * chunk
    out = {"bytes_per_token": per_token, "chunk_size": chunk, "chunk_bytes": chunk_bytes,
           "tp_size": _positive_int(name, "tp_size", tp_size)}
    if size_gb is not None:
        size_bytes = int(_positive_float(name, "size_gb", size_gb, allow_zero=True) * GIB)
        chunks = size_bytes // chunk_bytes
        out.update(size_gb=float(size_gb), size_bytes=size_bytes, chunks=chunks, tokens=chunks * chunk)
    else:
        count = _positive_int(name, "tokens", tokens)
        chunks = -(-count // chunk)
        size_bytes = chunks * chunk_bytes
        out.update(tokens=count, chunks=chunks, size_bytes=size_bytes, size_gb=size_bytes / float(GIB))
    return out


def model_params(model_config, name="kv_model_params"):
    """(total, non_embedding) parameter counts: from num_parameters / num_parameters_non_embedding
    when the config carries them, else computed for a Llama/Qwen-style decoder (q/k/v/o + gated MLP)."""
    config = _text_config(name, model_config)
    total = config.get("num_parameters")
    non_emb = config.get("num_parameters_non_embedding")
    if total is not None and non_emb is not None:
        return float(total), float(non_emb)
    geo = kv_geometry(config, name=name)
    hidden = _first(config, _HIDDEN_KEYS)
    heads = _first(config, _HEAD_KEYS)
    inter = config.get("intermediate_size")
    vocab = config.get("vocab_size")
    if hidden is None or heads is None or inter is None or vocab is None:
        raise _err(name, "the model config needs num_parameters and num_parameters_non_embedding, or "
                         "hidden_size, num_attention_heads, intermediate_size and vocab_size to count parameters")
    hidden, heads, inter, vocab = (int(hidden), int(heads), int(inter), int(vocab))
    q_dim = heads * geo["head_dim"]
    kv_dim = geo["kv_heads"] * geo["head_dim"]
    per_layer = hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden + 3 * hidden * inter + 2 * hidden
    computed_non_emb = geo["layers"] * per_layer + hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    if non_emb is None:
        non_emb = computed_non_emb
    if total is None:
        total = computed_non_emb + embeddings
    return float(total), float(non_emb)


def kv_prefill_flops_per_token(model_config, context_tokens=0):
    """Average prefill FLOPs per token over a causal prefix of context_tokens tokens:
    2 x non-embedding params (the matmuls) + 2 x layers x context x (heads x head_dim) (QK^T and AV,
    averaged over the causal triangle). The LM head runs for the last token only and is left out."""
    name = "kv_prefill_flops_per_token"
    config = _text_config(name, model_config)
    _total, non_emb = model_params(config, name)
    geo = kv_geometry(config, name=name)
    heads = _first(config, _HEAD_KEYS)
    q_dim = int(heads if heads is not None else geo["kv_heads"]) * geo["head_dim"]
    context = _positive_float(name, "context_tokens", context_tokens, allow_zero=True)
    return 2.0 * non_emb + 2.0 * geo["layers"] * context * q_dim


def kv_prefill_rate(model_config, peak_tflops, context_tokens=0, mfu=0.5, num_gpus=1):
    """Estimated prefill tokens/s of one instance: mfu x peak_tflops x 1e12 x num_gpus / FLOPs per token.

    An estimate from FLOPs, not a measurement: prefer a measured rate when there is one."""
    name = "kv_prefill_rate"
    peak = _positive_float(name, "peak_tflops", peak_tflops)
    util = _positive_float(name, "mfu", mfu)
    if util > 1:
        raise _err(name, "mfu is a fraction of peak (0-1], got %r" % (mfu,))
    gpus = _positive_int(name, "num_gpus", num_gpus)
    return util * peak * 1e12 * gpus / kv_prefill_flops_per_token(model_config, context_tokens)


def kv_break_even(bytes_per_token, context_tokens, bandwidth, prefill_rate, latency=0.0, kv_dtype=None, tp_size=1):
    """Load a prefix's KV cache from a tier, or recompute it?

    bytes_per_token: a number, or a model config (then kv_bytes_per_token(config, kv_dtype, tp_size)).
    bandwidth: tier read bandwidth in bytes/s for this load (per worker when bytes are per worker).
    prefill_rate: prefill tokens/s of the instance. latency: fixed seconds added to every load.
    load_seconds = latency + tokens x bytes_per_token / bandwidth; recompute_seconds = tokens / prefill_rate.
    Loading wins when load_seconds < recompute_seconds; speedup = recompute / load.
    break_even_bandwidth = bytes_per_token x prefill_rate (the slowest tier that still breaks even,
    ignoring latency); break_even_tokens = the prefix length below which recomputing wins
    because of the latency (0 with no latency; None when loading never wins).
    """
    name = "kv_break_even"
    if isinstance(bytes_per_token, dict):
        per_token = kv_bytes_per_token(bytes_per_token, kv_dtype, tp_size)
    else:
        per_token = _positive_float(name, "bytes_per_token", bytes_per_token)
    tokens = _positive_float(name, "context_tokens", context_tokens)
    bw = _positive_float(name, "bandwidth", bandwidth)
    rate = _positive_float(name, "prefill_rate", prefill_rate)
    lat = _positive_float(name, "latency", latency, allow_zero=True)
    kv_bytes = per_token * tokens
    load = lat + kv_bytes / bw
    recompute = tokens / rate
    # Per token: recompute costs 1/rate s, loading per_token/bw s; loading wins past lat / (1/rate - per_token/bw).
    margin = 1.0 / rate - per_token / bw
    if margin <= 0:
        break_even_tokens = None
    else:
        break_even_tokens = lat / margin
    return {
        "bytes_per_token": per_token,
        "context_tokens": tokens,
        "kv_bytes": kv_bytes,
        "bandwidth": bw,
        "prefill_rate": rate,
        "latency": lat,
        "load_seconds": load,
        "recompute_seconds": recompute,
        "load_wins": load < recompute,
        "speedup": recompute / load if load > 0 else None,
        "saved_seconds": recompute - load,
        "break_even_bandwidth": per_token * rate,
        "break_even_tokens": break_even_tokens,
    }


class FilterModule(object):
    """kvcache.offload KV sizing filters."""

    def filters(self):
        return {
            "kv_bytes_per_token": kv_bytes_per_token,
            "kv_chunk_bytes": kv_chunk_bytes,
            "kv_chunk_size": kv_chunk_size,
            "kv_tier_size": kv_tier_size,
            "kv_prefill_rate": kv_prefill_rate,
            "kv_break_even": kv_break_even,
            "kv_dtype_bytes": dtype_bytes,
        }
