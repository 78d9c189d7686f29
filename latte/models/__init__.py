"""Models built from the attention layers: config, causal LM, sequence
classifier, decoding cache, and save/load (config.json + model.safetensors).

Modules, bottom to top: config (LatteConfig), weights (the safetensors
format), modeling (input validation at the model boundary, the decoding
cache, the backbone), pretrained (model folders: config.json + weights, the
transformers spelling of the fields, the mixin, the folder `latte export`
writes), causal_lm (loss, sampling, the LM) and classification. A causal LM's
forward and generate read in config, modeling and causal_lm.

The optional Hugging Face adapter lives in `latte.models.hf` (imports
transformers; not imported here).
"""

from .causal_lm import IGNORE_INDEX, CausalLMOutput, LatteForCausalLM, causal_lm_loss
from .classification import LatteForPairClassification, LatteForSequenceClassification, SequenceClassifierOutput
from .config import MIXERS, LatteConfig
from .modeling import Block, LatteCache, LatteModel, map_state
from .pretrained import from_pretrained, load_config, num_parameters, save_pretrained, transformers_tokenizer
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
    "transformers_tokenizer",
]
