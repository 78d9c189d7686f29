"""Conversion of pretrained Hugging Face decoders into Latte-Macchiato
(docs/conversion.md). Needs `transformers` (the `convert` extra).

    from latte.convert import ConversionConfig, convert
    converted = convert(hf_model, ConversionConfig(window_size=128))
    converted = convert_pretrained(folder, gguf_file=name)   # keeps a reference to the weights
    converted.save_pretrained(out)                            # only the new parameters + the reference
    converted = load_converted(out)                           # or AutoModelForCausalLM after register()
"""

from .cache import MacchiatoCache
from .config import ConversionConfig, ConvertedConfig
from .families import SUPPORTED
from .io import base_reference, resolve_base, save_converted
from .modeling import ConvertedForCausalLM, convert, convert_pretrained, load_converted, register

__all__ = [
    "SUPPORTED",
    "ConversionConfig",
    "ConvertedConfig",
    "ConvertedForCausalLM",
    "MacchiatoCache",
    "base_reference",
    "convert",
    "convert_pretrained",
    "load_converted",
    "register",
    "resolve_base",
    "save_converted",
]
