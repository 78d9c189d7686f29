"""A folder that transformers opens as it opens any causal LM:

    from latte.models import hf; hf.register()
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pipeline("text-generation", model=model, tokenizer=tokenizer)

Written by `latte export RUN_DIR OUT_DIR`:
  config.json             the native config + bos/eos/pad token ids
  model.safetensors       latte.models.weights (tied weights once, mode 0644)
  generation_config.json  eos = the end-of-document token, so generate and the
                          pipeline stop at a document's end
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                          a PreTrainedTokenizerFast with the end-of-document
                          token as eos, bos and pad (GPT-2's convention), and
                          left padding (batched generation pads on the left)

Needs transformers (the `hf` extra) for the tokenizer files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from torch import nn

GENERATION_CONFIG_NAME = "generation_config.json"


def _import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("exporting for transformers needs it: pip install 'latte[hf]'") from e
    return transformers


def transformers_tokenizer(tokenizer):
    """A `PreTrainedTokenizerFast` for a latte.data Tokenizer (tokenizer.json
    kind) with the end-of-document token as eos, bos and pad."""
    transformers = _import_transformers()
    if tokenizer.kind != "hf":
        raise ValueError(
            f"tokenizer: export supports tokenizer.json tokenizers, got a {tokenizer.kind} one "
            "(a tiktoken rank file has no transformers tokenizer to write)"
        )
    eos = tokenizer.decode([tokenizer.eos_id])
    with tempfile.TemporaryDirectory() as tmp:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer.save(tmp)),
            eos_token=eos,
            bos_token=eos,
            pad_token=eos,
            padding_side="left",
            clean_up_tokenization_spaces=False,
        )
    fast.model_max_length = int(1e30)  # no length limit (transformers' own "unset" value)
    return fast


def export_for_transformers(model: nn.Module, tokenizer, directory: str | os.PathLike) -> Path:
    """Writes `model` (a LatteForCausalLM) and `tokenizer` (latte.data
    Tokenizer) into `directory` as transformers expects them; returns it."""
    transformers = _import_transformers()
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer: {tokenizer.vocab_size} tokens, but the model's vocab_size is {model.config.vocab_size}"
        )
    d = Path(directory)
    fast = transformers_tokenizer(tokenizer)  # before writing anything: fails on a tiktoken run
    eos = tokenizer.eos_id
    ids = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    model.save_pretrained(d, extra_config=ids)
    transformers.GenerationConfig(**ids).save_pretrained(d)
    fast.save_pretrained(d)
    return d
