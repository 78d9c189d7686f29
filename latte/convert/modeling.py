"""Converted models: `convert(hf_model, ConversionConfig(...))` patches every
attention module of a pretrained decoder into Macchiato in place and wraps
the model as `ConvertedForCausalLM` (a transformers PreTrainedModel with
`generate`, a constant-size `MacchiatoCache` and save/load).

Masks: a converted layer needs only which tokens are padding. The patched
model's config switches to the attention implementation "latte_macchiato",
whose mask function (registered with transformers' AttentionMaskInterface)
hands the 2D padding mask down unchanged, so no [T, T] mask is ever built.
`model.as_original()` switches back to the pretrained attention modules and
implementation (the teacher in distillation, the baseline in evaluation).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, GenerationMixin, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from latte.config_io import merge
from latte.files import sha256_file
from latte.models.causal_lm import check_eos, check_sampling_args, next_token, token_stream
from latte.models.hf_cache import CACHE_NAME, cache_kwargs, one_cache, output_cache
from latte.models.hf_generate import static_generate
from latte.models.modeling import check_input_ids
from latte.models.static_decode import EOS_CHECK_EVERY, check_eos_every, layer_windows, static_tokens
from latte.models.weights import check_state, load_weights, read_weights
from latte.ops.backend import saved_backend

from .attention import ConvertedAttention
from .cache import MacchiatoCache
from .config import PURE_WINDOW_BETA, SINK_POSITIONS, ConversionConfig, ConvertedConfig
from .families import attention_spec, check_supported, decoder_layers, rotary_of
from .io import (
    CONFIG_NAME,
    NAMED_BASES,
    WEIGHTS_NAME,
    IntegrityError,
    base_reference,
    load_base,
    resolve_base,
    save_converted,
)

ATTN_IMPLEMENTATION = "latte_macchiato"


def _mask_passthrough(*args, attention_mask=None, **kwargs):
    """Mask function of "latte_macchiato": the 2D padding mask (or None) as is."""
    return attention_mask


def _no_attention_function(*args, **kwargs):
    raise RuntimeError(
        f"attention implementation {ATTN_IMPLEMENTATION!r} is only used by converted layers "
        "(an unconverted attention module was called)"
    )


def _register_attention() -> None:
    ALL_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, _no_attention_function)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, _mask_passthrough)


@dataclass
class ConvertedOutput(CausalLMOutputWithPast):
    """CausalLMOutputWithPast; `.state` is the cache too (the name latte's
    streaming loop uses)."""

    @property
    def state(self) -> MacchiatoCache | None:
        return output_cache(self)


# What a saved conversion.backend "fla" that this machine cannot run names (latte eval reads a
# converted model's `model.` overrides as its conversion's fields; latte convert its own section).
CONVERTED_BACKEND_OVERRIDE = (
    "--set model.backend=auto (the kernels this machine has) or --set model.backend=torch (latte eval), "
    "--conversion.backend=auto (latte convert)"
)


def patch_attention(model: nn.Module, conversion: ConversionConfig) -> list[ConvertedAttention]:
    """Replace every attention module of a supported model by a
    ConvertedAttention (in place); returns the new modules."""
    check_supported(model)
    config = model.config
    new = []
    for i, layer in enumerate(decoder_layers(model)):
        original = layer.self_attn
        spec = attention_spec(original, config)
        layer.self_attn = ConvertedAttention(
            original,
            spec,
            i,
            dim=config.hidden_size,
            window_size=conversion.window_size,
            num_sinks=conversion.num_sinks,
            sink_positions=conversion.sink_positions,
            rotary=rotary_of(model, i),
            latents_per_head=conversion.latents_per_head,
            qk_mixer=conversion.qk_mixer,
            conv_size=conversion.conv_size,
            mix=conversion.mix,
            beta_init=conversion.beta_init,
            chunk_size=conversion.chunk_size,
            lora_rank=conversion.lora_rank,
            lora_alpha=conversion.lora_alpha,
            backend=saved_backend(conversion.backend, "conversion.backend", CONVERTED_BACKEND_OVERRIDE),
        )
        layer.self_attn.use_memory(conversion.memory_slots, conversion.memory_rule, layer_index=i)
        layer.self_attn.memory_positions = conversion.memory_positions
        new.append(layer.self_attn)
    return new


class ConvertedForCausalLM(PreTrainedModel, GenerationMixin):
    """A pretrained decoder whose attentions are Macchiato (`self.base`, the
    original *ForCausalLM patched in place). forward/generate as in
    transformers; the decoding state is a constant-size MacchiatoCache."""

    config_class = ConvertedConfig
    base_model_prefix = "base"
    main_input_name = "input_ids"
    _is_stateful = True  # no assisted generation: a recurrent state cannot roll back
    _supports_attention_backend = False

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # forward creates its own MacchiatoCache

    def __init__(self, config: ConvertedConfig, base: PreTrainedModel | None = None):
        super().__init__(config)
        if base is None:
            from transformers import AutoModelForCausalLM

            kw = {}
            if config.original_attn_implementation:
                kw["attn_implementation"] = config.original_attn_implementation
            base = AutoModelForCausalLM.from_config(config.text_config, **kw)
        self.base = base
        self.original_attn_implementation = config.original_attn_implementation or base.config._attn_implementation
        self.conversion = ConversionConfig.from_dict(config.conversion)
        self.converted = patch_attention(base, self.conversion)
        _register_attention()
        base.config._attn_implementation = ATTN_IMPLEMENTATION
        self.generation_config = base.generation_config
        self.post_init()

    @property
    def num_layers(self) -> int:
        return len(self.converted)

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    def new_parameters(self) -> dict[str, nn.Parameter]:
        """Full name -> parameter for what conversion added (latent branch,
        beta, LoRA): the trainable part of up-training."""
        out = {}
        for i, attn in enumerate(self.converted):
            prefix = self._attn_prefix(i)
            out.update({f"{prefix}.{n}": p for n, p in attn.new_parameters()})
        return out

    def _attn_prefix(self, i: int) -> str:
        return f"base.model.layers.{i}.self_attn"

    @contextlib.contextmanager
    def as_original(self):
        """Within the block the model computes exactly as the pretrained one
        (original attention modules and implementation)."""
        layers = decoder_layers(self.base)
        for layer, attn in zip(layers, self.converted):
            layer.self_attn = attn.original
        self.base.config._attn_implementation = self.original_attn_implementation
        try:
            yield self.base
        finally:
            for layer, attn in zip(layers, self.converted):
                layer.self_attn = attn
            self.base.config._attn_implementation = ATTN_IMPLEMENTATION

    @contextlib.contextmanager
    def as_sliding_window(self, num_sinks: int | None = None):
        """Within the block the model is the sliding-window version of the
        original (as converted with the default beta_init, before
        up-training): every beta at PURE_WINDOW_BETA (no latent mass) and
        LoRA adapters, if any, switched off. The window keeps the model's
        attention sinks, or the first `num_sinks` tokens when given
        (training-free window + sinks). Restored after."""
        saved = [(attn.beta.detach().clone(), attn.lora, attn.num_sinks) for attn in self.converted]
        try:
            with torch.no_grad():
                for attn in self.converted:
                    attn.beta.fill_(PURE_WINDOW_BETA)
                    attn.lora = None
                    if num_sinks is not None:
                        attn.use_sinks(num_sinks)
            yield self
        finally:
            with torch.no_grad():
                for attn, (beta, lora, sinks) in zip(self.converted, saved):
                    attn.beta.copy_(beta)
                    attn.lora, attn.num_sinks = lora, sinks

    @contextlib.contextmanager
    def with_sinks(self, num_sinks: int | None = None, *, positions: str | None = None):
        """Within the block every converted layer keeps the first `num_sinks`
        tokens visible (0: none) instead of its own number, and/or scores
        them with `positions` ("absolute" or "cache", ConversionConfig's
        sink_positions); None keeps the layer's own. The latents, beta and
        LoRA stay as trained (an ablation of the sinks alone). Restored after."""
        if positions is not None and positions not in SINK_POSITIONS:
            raise ValueError(f"positions: expected one of {SINK_POSITIONS} or None, got {positions!r}")
        saved = [(attn.num_sinks, attn.sink_positions) for attn in self.converted]
        try:
            for attn in self.converted:
                if num_sinks is not None:
                    attn.use_sinks(num_sinks)
                if positions is not None:
                    attn.sink_positions = positions
            yield self
        finally:
            for attn, (sinks, where) in zip(self.converted, saved):
                attn.num_sinks, attn.sink_positions = sinks, where

    def save_pretrained(self, save_directory, *, self_contained: bool | None = None, **kwargs: Any) -> None:
        """See latte.convert.io.save_converted (only the new parameters
        when the model keeps a reference to its base weights)."""
        if kwargs:
            raise ValueError(f"save_pretrained: unsupported argument(s) {sorted(kwargs)} for a converted model")
        save_converted(self, save_directory, self_contained=self_contained)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *args: Any, base_path=None, dtype=None, torch_dtype=None, **kwargs: Any
    ) -> ConvertedForCausalLM:
        """A folder written by save_pretrained (local only; the hub keywords
        AutoModelForCausalLM adds are ignored)."""
        dtype = dtype if dtype is not None else torch_dtype
        if dtype is None or dtype == "auto":
            dtype = torch.float32
        return load_converted(pretrained_model_name_or_path, base_path=base_path, dtype=dtype)

    def stream(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        do_sample: bool | None = None,
        eos_check_every: int = EOS_CHECK_EVERY,
        static: bool = True,
    ) -> Iterator[torch.Tensor]:
        """latte's streaming generation (as `LatteForCausalLM.stream`): the new
        tokens [B], one step at a time, from the constant-size cache. Prompts
        of different lengths are LEFT-padded (attention_mask 0 on the left).
        static, eos_check_every: as `LatteForCausalLM.stream`: the same
        static step, captured in a CUDA graph on CUDA (the step reads no
        value: tests/convert/test_static_step.py compiles it without a
        graph break)."""
        greedy = check_sampling_args(max_new_tokens, temperature, top_k, top_p, do_sample)
        check_eos_every(eos_check_every)
        if attention_mask is not None and not bool(attention_mask[:, -1].all()):
            raise ValueError("attention_mask: stream needs LEFT padding (the last column all ones)")
        eos = check_eos(eos_token_id, self.config.vocab_size, input_ids.device)
        pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)

        def prefill():
            real = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
            pos = (real.cumsum(1) - 1).clamp(min=0)  # RoPE positions count real tokens (as generate does)
            out = self(input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=True, logits_to_keep=1)
            return out.logits[:, -1], (out.state, pos[:, -1:])

        def step(tok, state):
            cache, pos = state[0], state[1] + 1
            return self(tok[:, None], position_ids=pos, state=cache, use_cache=True).logits[:, -1], (cache, pos)

        if not static:
            return token_stream(self, prefill, step, max_new_tokens, eos, pick)
        chooser = functools.partial(next_token, **pick)
        every = dict(generator=generator, eos_check_every=eos_check_every)
        return self._static_stream(input_ids, prefill, step, max_new_tokens, eos, chooser, every)

    def _static_stream(self, input_ids, prefill, step, max_new_tokens, eos, chooser, every):
        """`stream` over the static state (latte/models/static_decode.py):
        the prefill's cache is kept, and each step swaps the static layer
        states in and takes the new ones out."""
        held = []

        def prefill_static():
            logits, (cache, pos) = prefill()
            held.append(cache)
            return logits, cache.states, pos[:, 0]

        def feed(tok, layers, pos):
            cache = held[0]
            cache.states = list(layers)
            logits, _ = step(tok, (cache, pos[:, None]))
            return logits, cache.states, pos + 1

        windows, T = layer_windows(self.converted), input_ids.shape[1]
        return static_tokens(self, prefill_static, feed, windows, T, max_new_tokens, eos, chooser, **every)

    def generate(self, inputs=None, generation_config=None, **kwargs: Any):
        """transformers' generate; a plain greedy or sampled decode runs
        through `stream`'s static decoding step instead (latte/models/hf_generate.py)."""
        return static_generate(self, self.stream, super().generate, inputs, generation_config, **kwargs)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: MacchiatoCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        state: MacchiatoCache | None = None,
        cache: MacchiatoCache | None = None,
        **kwargs: Any,
    ) -> ConvertedOutput:
        """As the original's forward. `cache` (transformers >= 5.24),
        `past_key_values` (before) and `state` (latte's name) are aliases;
        with use_cache a new MacchiatoCache is started when none is given."""
        cache = one_cache("forward", state=state, past_key_values=past_key_values, cache=cache)
        if cache is not None and not isinstance(cache, MacchiatoCache):
            raise ValueError(f"{CACHE_NAME}: expected a MacchiatoCache, got {type(cache).__name__}")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = MacchiatoCache(self.num_layers)
        if kwargs.get("return_dict") is False:
            raise ValueError("return_dict=False is not supported by converted models")
        if input_ids is not None:  # before any compute, as the native model (latte/models/modeling.py check_input_ids)
            check_input_ids(input_ids, self.get_input_embeddings().num_embeddings)
        out = self.base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **cache_kwargs(cache),
            **kwargs,
        )
        if cache is not None:
            T = (input_ids if input_ids is not None else inputs_embeds).shape[1]
            cache.seen_tokens += T
        return ConvertedOutput(loss=out.loss, logits=out.logits, **cache_kwargs(cache if use_cache else None))


def convert(
    model: PreTrainedModel, conversion: ConversionConfig | None = None, *, base_weights: dict | None = None
) -> ConvertedForCausalLM:
    """Convert a pretrained Hugging Face causal LM into Macchiato.

    The model is modified in place (its attention modules are replaced) and
    returned wrapped; `converted.as_original()` runs it unconverted. With the
    default beta_init the result computes exactly the sliding-window version
    of the original. base_weights: where the weights came from (see
    `latte.convert.io.base_reference`), so saving can store only the
    new parameters."""
    conversion = ConversionConfig() if conversion is None else conversion
    if not isinstance(conversion, ConversionConfig):
        raise ValueError(f"conversion: expected a ConversionConfig, got {type(conversion).__name__}")
    check_supported(model)
    # a copy: building the composite config would reset the model's own attention implementation
    config = ConvertedConfig(
        text_config=copy.deepcopy(model.config),
        conversion=conversion.to_dict(),
        base_weights=base_weights,
        original_attn_implementation=model.config._attn_implementation,
    )
    return ConvertedForCausalLM(config, base=model)


def register() -> None:
    """Lets AutoConfig / AutoModelForCausalLM.from_pretrained read converted
    folders (safe to call more than once)."""
    from transformers import AutoModelForCausalLM

    AutoConfig.register(ConvertedConfig.model_type, ConvertedConfig, exist_ok=True)
    AutoModelForCausalLM.register(ConvertedConfig, ConvertedForCausalLM, exist_ok=True)


def convert_pretrained(path: str | os.PathLike, conversion=None, *, gguf_file: str | None = None, dtype=torch.float32):
    """Load a pretrained causal LM from a local folder (or GGUF file in it)
    and convert it, keeping a reference to its weights (so saving stores
    only the new parameters)."""
    source = str(path) if str(path) in NAMED_BASES else None
    folder, gguf_file = resolve_base(str(path), gguf_file)
    ref = base_reference(folder, gguf_file, source=source)
    return convert(load_base(ref, dtype=dtype, verify=False), conversion, base_weights=ref)


def load_converted(
    directory: str | os.PathLike,
    *,
    base_path: str | os.PathLike | None = None,
    dtype=torch.float32,
    overrides: dict | None = None,
):
    """The converted model saved in `directory` (either layout); overrides:
    ConversionConfig fields replacing the saved ones (e.g. {"memory_slots":
    64}, `latte eval --set model.memory_slots=64`), checked as the saved
    ones are; the weights must still fit the model they build."""
    d = Path(directory)
    if not (d / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{d / CONFIG_NAME}: no such file (expected a folder written by save_converted)")
    config = ConvertedConfig.from_pretrained(str(d))
    if overrides:
        where = f"{d / CONFIG_NAME} conversion + overrides {sorted(overrides)}"
        config.conversion = ConversionConfig.from_dict(merge(config.conversion, overrides), where=where).to_dict()
    digest = getattr(config, "weights_sha256", None)
    if digest is not None and (got := sha256_file(d / WEIGHTS_NAME)) != digest:
        raise IntegrityError(
            f"{d / WEIGHTS_NAME}: sha256 {got} differs from the {digest} recorded in {d / CONFIG_NAME} when it "
            "was saved: the file is damaged or was replaced"
        )
    base = None
    if config.base_weights is not None:
        base = load_base(config.base_weights, path=base_path, dtype=dtype, converted_dir=d)
        base.config._attn_implementation = config.original_attn_implementation or base.config._attn_implementation
    model = ConvertedForCausalLM(config, base=base).to(dtype)
    if config.base_weights is None:
        load_weights(model, d / WEIGHTS_NAME)
    else:  # only what conversion added
        expected, tensors = model.new_parameters(), read_weights(d / WEIGHTS_NAME)
        check_state(expected, tensors, where=str(d / WEIGHTS_NAME), into=type(model).__name__)
        with torch.no_grad():
            for name, t in expected.items():
                t.copy_(tensors[name])
    return model.eval()
