"""Tiny random Qwen2/Qwen3 models and a byte-level tokenizer, built in-process, for tests and smoke runs.

The byte tokenizer has Qwen's three chat tokens; embeddings are padded past it, as Qwen's are. Weights are drawn
wider than transformers' default so greedy continuations vary; :func:`noisy_copy` makes a draft that often agrees
with its target. The ``tiny:target`` and ``tiny:draft`` specs are such a pair, written once by :func:`tiny_dir`.
"""

from __future__ import annotations

import copy
import os
import shutil
import zlib
from pathlib import Path

import torch

from .cache import cache_dir

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(swap: tuple[int, int] | None = None):
    """A byte-level tokenizer (256 bytes + 3 specials). ``swap=(i, j)`` exchanges two ids (for mismatch tests)."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(ByteLevel.alphabet())
    if swap:
        i, j = swap
        symbols[i], symbols[j] = symbols[j], symbols[i]
    tok = Tokenizer(BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(arch: str = "qwen2", *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               vocab_size: int = 272, seed: int = 0, init_std: float = 0.25, dtype=torch.float32, tied: bool = False):
    """A randomly initialised Qwen2 or Qwen3 causal LM in eval mode; its head is untied unless ``tied`` (as
    Qwen3-0.6B's is tied to the input embedding)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                  tie_word_embeddings=tied, initializer_range=init_std, bos_token_id=None,
                  eos_token_id=258 if vocab_size > 258 else None, pad_token_id=256 if vocab_size > 256 else None)
    if arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        config, cls = Qwen3Config(head_dim=hidden // heads, **common), Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown tiny architecture {arch!r} (qwen2 or qwen3)")
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():  # post_init's normal draws use initializer_range; norms stay at 1
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, init_std, generator=torch.Generator().manual_seed(seed * 1000 + zlib.crc32(name.encode()) % 997))
    model.generation_config.eos_token_id = config.eos_token_id  # None below the byte vocabulary (sampling tests)
    return model.to(dtype).eval()


def noisy_copy(model, scale: float = 0.05, seed: int = 1):
    """A copy of ``model`` with Gaussian noise (std ``scale`` times each tensor's std) on every weight."""
    twin = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in twin.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * p.std() * scale)
    return twin


def save_tiny(model, tokenizer, path: str | Path) -> Path:
    """Write a tiny model and tokenizer as a Hugging Face folder (for local-folder spec tests)."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_dir(name: str) -> Path:
    """The folder of the ``tiny:<name>`` model, written once (milliseconds)."""
    path = cache_dir() / "tiny" / name
    if not (path / "config.json").is_file():
        target = tiny_model(seed=0)
        model = target if name == "target" else noisy_copy(target, 0.02)
        tmp = path.with_name(f".{name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        save_tiny(model, tiny_tokenizer(), tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    return path
