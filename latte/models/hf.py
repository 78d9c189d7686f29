"""Hugging Face `transformers` adapter (optional: `pip install latte[hf]`).

Tested with transformers 5.23.0 and 5.24.0 (torch 2.13.0+cpu).

    from latte.models import hf
    hf.register()                                   # AutoConfig / AutoModelFor*
    model = AutoModelForCausalLM.from_pretrained(folder)   # folder from the native save_pretrained
    model.generate(ids, max_new_tokens=20, do_sample=False)

Formats are shared, not converted: the wrappers own exactly the native module
tree (`model.*`, `lm_head.*` / `head.*`), so the native `model.safetensors`
loads as it is, and `LatteHFConfig` reads the native `config.json` (the
LatteConfig fields, validated by LatteConfig, with `model_type: "latte"`). A
folder written by the HF `save_pretrained` loads back natively too
(`latte.models.from_pretrained`, through `latte.models.pretrained`, without
transformers).

Training: `gradient_checkpointing_enable()` recomputes each block in the
backward (the native switch, with transformers' checkpoint function);
`resize_token_embeddings(n)` resizes the embedding and the tied head and
updates the native config inside, so the new ids are accepted.

Decoding state: transformers builds a DynamicCache (a growing key/value store)
unless a model opts out; these models opt out (`_supports_default_dynamic_cache`
is False, like Mamba) and carry their own `LatteHFCache`, a `Cache` subclass
holding the native `LatteCache`, in `cache` (`past_key_values` before
transformers 5.24; both names are accepted, see `hf_cache`). A plain greedy or
sampled `generate` runs through the native static decoding step
(`hf_generate`); any other request runs transformers' loop, which prefills
with one chunked forward, then feeds one token per step with the full
attention mask, of which the forward keeps the last columns.

With the field map in `latte.models.pretrained` and the cache's name in
`latte.models.hf_cache`, the only module that uses Hugging Face names
(hidden_size, num_hidden_layers, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationMixin,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutput

from .causal_lm import LatteForCausalLM, head_and_loss, next_token_targets
from .classification import LatteForSequenceClassification, check_class_labels, pool
from .config import LatteConfig
from .hf_cache import CACHE_NAME, cache_kwargs, one_cache
from .hf_generate import static_generate
from .modeling import MLP, LatteCache, LatteModel, init_module, value_checks
from .pretrained import DEPRECATED_FIELDS, HF_ATTRIBUTE_MAP, NATIVE_FIELDS


class LatteHFConfig(PreTrainedConfig):
    """The LatteConfig fields as attributes (validated by LatteConfig), plus
    the usual PreTrainedConfig ones. `to_latte_config()` gives the native one."""

    model_type = "latte"
    attribute_map = HF_ATTRIBUTE_MAP

    def __post_init__(self, **kwargs):
        native = {k: kwargs.pop(k) for k in (*NATIVE_FIELDS, *DEPRECATED_FIELDS) if k in kwargs}
        for alias, name in self.attribute_map.items():  # hidden_size=... -> dim=...
            if alias in kwargs:
                native[name] = kwargs.pop(alias)
        if self.id2label is not None:  # a PreTrainedConfig field, set before __post_init__
            native["num_labels"] = len(self.id2label)
        kwargs["num_labels"] = native.get("num_labels", 2)
        kwargs.pop("latte_version", None)
        cfg = LatteConfig.from_dict(native, where="LatteHFConfig")
        self.use_cache = kwargs.pop("use_cache", True)
        super().__post_init__(**kwargs)
        for k, v in cfg.to_dict().items():
            if k != "num_labels":  # a PreTrainedConfig property backed by id2label
                setattr(self, k, v)

    def to_latte_config(self) -> LatteConfig:
        data = {k: getattr(self, k) for k in NATIVE_FIELDS if k != "num_labels"}
        return LatteConfig.from_dict({**data, "num_labels": self.num_labels}, where="LatteHFConfig")

    @classmethod
    def from_latte_config(cls, config: LatteConfig, **kwargs: Any) -> LatteHFConfig:
        return cls(**config.to_dict(), **kwargs)


class LatteHFCache(Cache):
    """`past_key_values` of the Latte models: wraps the native LatteCache
    (`self.latte`), updated in place by each forward."""

    is_compileable = False
    is_croppable = False

    def __init__(self, latte: LatteCache | None = None):
        super().__init__(layers=[])
        self.latte = latte

    def __len__(self) -> int:
        return 0 if self.latte is None else len(self.latte.layers)

    def __repr__(self) -> str:
        nbytes = 0 if self.latte is None else self.latte.nbytes()
        return f"LatteHFCache(seen_tokens={self.get_seq_length()}, nbytes={nbytes})"

    @property
    def batch_size(self) -> int:
        return -1 if self.latte is None else self.latte.batch_size

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.latte is None else self.latte.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def reset(self) -> None:
        self.latte = None

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("LatteHFCache: a recurrent state cannot drop tokens")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.latte is not None:
            self.latte = self.latte.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.latte is not None:
            self.latte = self.latte.repeat_interleave(repeats)


class LatteHFPreTrainedModel(PreTrainedModel):
    config_class = LatteHFConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True  # no assisted generation: a recurrent state cannot roll back
    _no_split_modules = ["Block"]
    supports_gradient_checkpointing = True  # LatteModel.gradient_checkpointing, set by transformers

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the forward creates its own LatteHFCache

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Only reached for tensors missing from a checkpoint (or on direct
        construction): the native init. Children are visited before parents,
        so the MLP and head inits below win over the generic reset."""
        cfg = self.config
        if module is getattr(self, "lm_head", None) or module is getattr(self, "head", None):
            nn.init.normal_(module.weight, 0.0, cfg.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Embedding, MLP, nn.LayerNorm, nn.RMSNorm)):
            init_module(module, cfg.initializer_range, cfg.num_layers)
        elif hasattr(module, "reset_parameters") and module is not self:
            module.reset_parameters()  # inside a mixer: the layer's own init

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed = value

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """transformers' resize, then the native config inside follows, so the
        new ids are accepted and `to_native()` builds the new size."""
        embed = super().resize_token_embeddings(*args, **kwargs)
        vocab = self.model.embed.num_embeddings
        self.config.vocab_size = vocab
        self.model.config = dataclasses.replace(self.model.config, vocab_size=vocab)
        return embed

    def _checked_inputs(self, input_ids, attention_mask) -> torch.Tensor | None:
        """The one validation of input_ids / attention_mask of a forward."""
        if input_ids is None:
            raise ValueError("input_ids: required (inputs_embeds is not supported)")
        return self.model.check_inputs(input_ids, attention_mask)


class LatteHFForCausalLM(LatteHFPreTrainedModel, GenerationMixin):
    """`LatteForCausalLM` behind the transformers API (forward, generate)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed.weight"}

    def __init__(self, config: LatteHFConfig):
        super().__init__(config)
        native = config.to_latte_config()
        if not native.causal:
            raise ValueError("causal: LatteHFForCausalLM needs causal=True")
        self.model = LatteModel(native)
        self.lm_head = nn.Linear(native.dim, native.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: LatteHFCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        cache: LatteHFCache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        past_key_values = one_cache("forward", past_key_values=past_key_values, cache=cache)  # aliases (hf_cache.py)
        if past_key_values is not None and not isinstance(past_key_values, LatteHFCache):
            raise ValueError(f"{CACHE_NAME}: expected a LatteHFCache, got {type(past_key_values).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if (
            input_ids is not None
            and isinstance(attention_mask, torch.Tensor)
            and attention_mask.dim() == 2
            and attention_mask.shape[1] > input_ids.shape[1]
        ):
            attention_mask = attention_mask[:, -input_ids.shape[1] :]  # generate passes the whole sequence's mask
        mask = self._checked_inputs(input_ids, attention_mask)
        state = None if past_key_values is None else past_key_values.latte
        cu_seqlens = packed_documents(kwargs.get("position_ids"), input_ids, mask, state)
        use_cache = use_cache and cu_seqlens is None  # a packed row keeps no decoding state
        hidden, state = self.model(
            input_ids,
            state=state,
            attention_mask=mask,
            use_cache=use_cache,
            inputs_checked=True,
            cu_seqlens=cu_seqlens,
        )
        shift_labels = kwargs.get("shift_labels")
        loss = None
        if labels is None and shift_labels is None:
            logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        else:  # the native model's loss: fused head + cross-entropy when training
            targets = next_token_targets(
                labels,
                shift_labels,
                mask,
                tuple(input_ids.shape),
                self.model.embed.num_embeddings,
                values=value_checks(self.model.validate_inputs, input_ids),
                cu_seqlens=cu_seqlens,
            )
            logits, loss = head_and_loss(hidden, self.lm_head, targets, None, self.training)
        cache = None
        if use_cache:
            cache = past_key_values if past_key_values is not None else LatteHFCache()
            cache.latte = state
        if return_dict is False:
            return tuple(v for v in (loss, logits, cache) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **cache_kwargs(cache))

    def generate(self, inputs=None, generation_config=None, **kwargs: Any):
        """transformers' generate; a plain greedy or sampled decode runs
        through latte's static decoding step instead (hf_generate.py)."""
        return static_generate(self, self._stream, super().generate, inputs, generation_config, **kwargs)

    def _stream(self, *args: Any, **kwargs: Any):
        """The native `stream` on this model's own modules (no copy of the weights)."""
        native = LatteForCausalLM.__new__(LatteForCausalLM)
        nn.Module.__init__(native)
        native.config, native.model, native.lm_head = self.config.to_latte_config(), self.model, self.lm_head
        return native.stream(*args, **kwargs)

    def to_native(self) -> LatteForCausalLM:
        """A native LatteForCausalLM with the same weights."""
        native = LatteForCausalLM(self.config.to_latte_config())
        native.load_state_dict(self.state_dict())
        return native


def packed_documents(position_ids, input_ids, mask, state) -> torch.Tensor | None:
    """cu_seqlens of a packed row, read from position_ids as transformers'
    flash-attention path reads them: one row (B == 1) of T > 1 tokens with
    no padding whose position_ids are not one increasing run; each position
    equal to the row's smallest starts a document (index 0 must be one).
    None otherwise (then position_ids are not used: positions are counted
    from the tokens), also while values cannot be read (torch.compile)."""
    if position_ids is None:
        return None
    if not isinstance(position_ids, torch.Tensor) or tuple(position_ids.shape) != tuple(input_ids.shape):
        got = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids: expected shape {tuple(input_ids.shape)} like input_ids, got {got}")
    B, T = input_ids.shape
    if B != 1 or T == 1 or mask is not None or not value_checks(True, position_ids):
        return None
    first = position_ids.min()
    if bool((position_ids[0] == first + torch.arange(T, device=position_ids.device)).all()):
        return None  # one document
    if state is not None:
        raise ValueError("position_ids: restart at 0 (packed documents), which a forward with a cache cannot take")
    if bool(position_ids[0, 0] != first):
        raise ValueError(
            f"position_ids: restart at {int(first)} (packed documents), so the row must start with one, "
            f"got {int(position_ids[0, 0])} at index 0"
        )
    starts = (position_ids[0] == first).nonzero().view(-1)
    return torch.cat([starts, starts.new_tensor([T])])


class LatteHFForSequenceClassification(LatteHFPreTrainedModel):
    """`LatteForSequenceClassification` behind the transformers API."""

    def __init__(self, config: LatteHFConfig):
        super().__init__(config)
        native = config.to_latte_config()
        if native.causal:
            raise ValueError("causal: LatteHFForSequenceClassification needs causal=False (an encoder)")
        self.model = LatteModel(native)
        self.head = nn.Linear(native.dim, native.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput | tuple:
        mask = self._checked_inputs(input_ids, attention_mask)
        values = value_checks(self.model.validate_inputs, input_ids)
        hidden, _ = self.model(input_ids, attention_mask=mask, inputs_checked=True)
        logits = self.head(pool(hidden, mask, self.config.pooling, values=values))
        loss = None
        if labels is not None:
            check_class_labels(labels, logits.shape[0], self.config.num_labels, values=values)
            loss = nn.functional.cross_entropy(logits.float(), labels.long())
        if return_dict is False:
            return tuple(v for v in (loss, logits) if v is not None)
        return SequenceClassifierOutput(loss=loss, logits=logits)

    def to_native(self) -> LatteForSequenceClassification:
        native = LatteForSequenceClassification(self.config.to_latte_config())
        native.load_state_dict(self.state_dict())
        return native


def register() -> None:
    """Registers the classes with AutoConfig, AutoModelForCausalLM and
    AutoModelForSequenceClassification (safe to call more than once)."""
    AutoConfig.register("latte", LatteHFConfig, exist_ok=True)
    AutoModelForCausalLM.register(LatteHFConfig, LatteHFForCausalLM, exist_ok=True)
    AutoModelForSequenceClassification.register(LatteHFConfig, LatteHFForSequenceClassification, exist_ok=True)
