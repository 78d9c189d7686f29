"""Models built from the attention layers: config, causal LM, sequence
classifier, decoding cache, and save/load (config.json + model.safetensors).

Modules, bottom to top: config (+ hf_names, the transformers spelling of its
fields), weights (the safetensors format), inputs (validation at the model
boundary), lm_loss, sampling, cache, modeling (the backbone), pretrained
(config.json + weights, the mixin), causal_lm and classification, auto
(the class named in config.json), export (a folder transformers loads).

The optional Hugging Face adapter lives in `latte.models.hf` (imports
transformers; not imported here).
"""

from .auto import from_pretrained
from .cache import LatteCache, map_state
from .causal_lm import CausalLMOutput, LatteForCausalLM
from .classification import LatteForPairClassification, LatteForSequenceClassification, SequenceClassifierOutput
from .config import MIXERS, LatteConfig
from .lm_loss import IGNORE_INDEX, causal_lm_loss
from .modeling import Block, LatteModel
from .pretrained import load_config, num_parameters, save_pretrained
from .weights import load_weights, read_weights, save_weights

__all__ = [
    "IGNORE_INDEX",
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
    "load_config",
    "load_weights",
    "map_state",
    "num_parameters",
    "read_weights",
    "save_pretrained",
    "save_weights",
]
