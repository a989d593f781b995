"""Tiny random Qwen2 models, built in seconds, for tests that need a real vLLM engine.

The tokenizer is a byte-level BPE trained here on a small arithmetic corpus, with
a Qwen-style chat template, so chat formatting, stop strings and token ids all
behave as with a real model. The weights are random (seeded): the text is
nonsense, but deterministic under greedy decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% if not (loop.last and continue_final_message is defined and continue_final_message) %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May?",
    "Step 1: 48 / 2 = 24. Step 2: 48 + 24 = 72. The answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Let me check: 12 / 60 = 0.2 per minute, 0.2 * 50 = 10. So the answer is \\boxed{10}.",
    "Wait, alternatively we can compute the total first. Score: 0 1 2 3 4 5 6 7 8 9",
    "def solve():\n    return sum(range(10))\n\n",
]


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 128,
    num_layers: int = 2,
    weight_std: float | None = 0.05,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write a random Qwen2ForCausalLM with a trained tokenizer to ``out_dir``.

    Models built with the same ``vocab_size`` share the tokenizer (trained
    deterministically), so two seeds make a draft/target pair.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    # Small random weights give a nearly input-independent, repetitive greedy
    # structure for n-gram speculation to find matches.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config.eos_token_id, "do_sample": False})
    )
    return out
