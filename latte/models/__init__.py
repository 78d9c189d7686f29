"""Models built from the attention layers: config, causal LM, sequence
classifier, decoding cache, and save/load (config.json + model.safetensors).

The optional Hugging Face adapter lives in `latte.models.hf` (imports
transformers; not imported here).
"""

from .cache import LatteCache, map_state
from .causal_lm import CausalLMOutput, LatteForCausalLM, causal_lm_loss, num_parameters
from .classification import LatteForPairClassification, LatteForSequenceClassification, SequenceClassifierOutput
from .config import MIXERS, LatteConfig
from .io import from_pretrained, load_weights, save_pretrained
from .modeling import Block, LatteModel

__all__ = [
    "MIXERS",
    "Block",
    "CausalLMOutput",
    "LatteCache",
    "LatteConfig",
    "LatteForCausalLM",
    "LatteForPairClassification",
    "LatteForSequenceClassification",
    "LatteModel",
    "SequenceClassifierOutput",
    "causal_lm_loss",
    "from_pretrained",
    "load_weights",
    "map_state",
    "num_parameters",
    "save_pretrained",
]
