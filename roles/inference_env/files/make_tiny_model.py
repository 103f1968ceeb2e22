"""Make a tiny random-weights Qwen2 model in a directory, with no network access.

LAB SUBSTITUTE for a real model: 2 layers, hidden size 128, 4 attention heads, 2 KV
heads (head_dim 32), a byte-level BPE tokenizer trained here on generated text, and a
ChatML chat template. Output is gibberish, but the KV cache it produces is real, which
is all the lab needs. Deterministic: the same arguments give the same files.

Usage: python make_tiny_model.py DIR [--max-model-len N] [--vocab-size N]
"""
import argparse
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(seed, lines=4000):
    """Generated English-like text: enough for a small BPE vocabulary."""
    rng = random.Random(seed)
    words = (
        "the of and to in is that for it as with was on be by this are or from at which "
        "cache memory storage tier prefix token model server request instance router node "
        "volume bucket object chunk layer head value key tensor compute offload shared "
        "system document context question answer policy contract clause section page"
    ).split()
    for dummy in range(lines):
        yield " ".join(rng.choice(words) for dummy in range(rng.randint(5, 20))) + "."


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    os.makedirs(args.directory, exist_ok=True)

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(args.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None, model_max_length=args.max_model_len,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(args.directory)

    config = Qwen2Config(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=args.max_model_len, tie_word_embeddings=True,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.directory, safe_serialization=True)
    with open(os.path.join(args.directory, "generation_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}, handle)
    with open(os.path.join(args.directory, "KVCACHE_LAB_SUBSTITUTE"), "w", encoding="utf-8") as handle:
        handle.write("Tiny random-weights model made by kvcache.offload for the lab; not a real model.\n")
    # Readable by the service user whatever umask the libraries wrote with.
    os.chmod(args.directory, 0o755)
    for name in os.listdir(args.directory):
        os.chmod(os.path.join(args.directory, name), 0o644)
    print(json.dumps({"directory": args.directory, "vocab_size": len(fast), "layers": 2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
