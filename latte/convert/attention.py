"""ConvertedAttention: a pretrained attention module turned into Macchiato
(docs/math.md §4, docs/conversion.md).

Legend: B batch, T time, H query heads, K key/value heads, L latents per
head, E head width, F model width (hidden_size).

  window branch: q, k, v = the original q_proj, k_proj, v_proj (+ q/k norms),
                 RoPE from the model's own (cos, sin), the original score
                 scale and soft-cap, restricted to the last window_size tokens
                 and the first num_sinks (attention sinks, docs/math.md §4.1)
  latent branch: u = qk_mixer(x); a = u W_a, b = u W_b [B, T, H, L] (new)
  mixing:        latte.ops.macchiato ("joint": one normaliser; beta [H] new)
                 (both are MacchiatoCore's, shared with the native layer)
  output:        the original o_proj

With beta very negative the latents carry no mass and the layer is exactly
the original attention restricted to the window and the sinks (a
sliding-window version of the pretrained model). Optional LoRA adapters (rank r) add (x A^T) B^T to
q/k/v/o; B starts at zero, so they change nothing until trained.

The module keeps the original's q_proj, k_proj, v_proj, o_proj (and q_norm,
k_norm) under their own names, so a converted model's state dict holds the
pretrained weights under the pretrained names. The original module itself is
kept outside the module tree (`self.original`) to run the model unconverted.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import nn

from latte.layers._checks import check_backend
from latte.layers.macchiato_attention import MacchiatoCore
from latte.models.hf_cache import CACHE_NAME, one_cache
from latte.ops import MacchiatoState, sliding_window_attention_lse
from latte.ops.window.sinks import check_num_sinks, window_sinks_lse

from .cache import MacchiatoCache
from .families import AttentionSpec

_ORIGINAL_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")


class ConvertedLayerState(NamedTuple):
    """Decoding state of one converted layer: constant in the context."""

    attn: MacchiatoState  # latent (S, z) + ring buffer of window_size - 1 keys/values + the sinks
    conv: torch.Tensor | None  # qk-mixer conv state [B, conv_size - 1, F] or None
    h: torch.Tensor | None  # qk-mixer RG-LRU state [B, F] or None


class LogMasses(NamedTuple):
    """[B, T, H] float32 logs, beta excluded. joint: p(latents) =
    sigmoid(latent + beta - window); gate: sigmoid(latent + beta - gate)."""

    window: torch.Tensor  # log sum of exp(scores) over the window and the sinks
    full: torch.Tensor  # the same over every key the original sees
    latent: torch.Tensor  # logsumexp of the latent logits a
    gate: torch.Tensor | None  # the gate logit (mix="gate")


class LoRA(nn.Module):
    """x -> (x A^T) B^T * alpha / r; B starts at zero (no change until trained)."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.A.t()) @ self.B.t() * self.scale


def padding_mask(attention_mask, B: int, T: int) -> torch.Tensor | None:
    """[B, T] bool (False = padding) from the 2D mask the model passes down
    (generate passes the mask of the whole sequence: its last T columns are
    the current tokens); None when every token is real."""
    if attention_mask is None:
        return None
    if (
        not isinstance(attention_mask, torch.Tensor)
        or attention_mask.dim() != 2
        or attention_mask.shape[0] != B
        or attention_mask.shape[1] < T
    ):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(
            f"attention_mask: a converted model takes a 2D padding mask [batch, tokens] "
            f"(1 = real token, 0 = padding), got {got}; 4D/custom masks are not supported"
        )
    mask = attention_mask[:, -T:].bool()
    return None if bool(mask.all()) else mask


class ConvertedAttention(MacchiatoCore):
    """Drop-in for a Hugging Face attention module: forward(hidden_states,
    position_embeddings, attention_mask, cache (or past_key_values), **kw) -> (y, None).
    The decoding state lives in a `MacchiatoCache`."""

    memory_positions = "absolute"  # "cache": memory slots at fixed positions after the sinks (_window_inputs)

    def __init__(
        self,
        original: nn.Module,
        spec: AttentionSpec,
        layer_idx: int,
        *,
        dim: int,
        window_size: int,
        latents_per_head: int,
        num_sinks: int = 0,
        sink_positions: str = "absolute",
        rotary: tuple[nn.Module, str | None] | None = None,
        qk_mixer: str,
        conv_size: int,
        mix: str,
        beta_init: float,
        chunk_size: int,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        backend: str | None = None,
    ):
        super().__init__()
        check_backend(backend)
        self.backend = backend  # the op's kernels (None: the process default, latte.ops.backend)
        self.__dict__["original"] = original  # kept outside the module tree (no duplicate parameters)
        for name in _ORIGINAL_PARTS:
            if getattr(original, name, None) is not None:
                setattr(self, name, getattr(original, name))
        self.spec, self.layer_idx, self.mix, self.chunk_size = spec, layer_idx, mix, chunk_size
        # the original's own local window (sliding layers) caps the converted one
        self.window_size = window_size if spec.window is None else min(window_size, spec.window)
        self.use_sinks(num_sinks)
        # "cache": the sinks scored at a fixed distance (_sink_queries); the
        # model's rotary module and this layer's type, kept outside the module tree
        self.sink_positions = sink_positions
        self.__dict__["rotary"] = rotary
        self.latents_per_head = latents_per_head
        self.add_latent_branch(
            dim,
            spec.num_heads,
            latents_per_head,
            qk_mixer=qk_mixer,
            conv_size=conv_size,
            mix=mix,
            gate_bias=True,
            beta_init=beta_init,
        )
        self.lora = None
        if lora_rank:
            self.lora = nn.ModuleDict(
                {
                    name: LoRA(getattr(self, name).in_features, getattr(self, name).out_features, lora_rank, lora_alpha)
                    for name in ("q_proj", "k_proj", "v_proj", "o_proj")
                }
            )
        ref = self.q_proj.weight
        self.to(device=ref.device, dtype=ref.dtype)

    def use_sinks(self, num_sinks: int) -> None:
        """See the first num_sinks tokens next to the window from now on. Only
        where conversion shortened what the layer saw: a native local layer
        kept at its own window stays the original exactly (docs/conversion.md §1)."""
        check_num_sinks(num_sinks)
        shortened = self.spec.window is None or self.window_size < self.spec.window
        self.num_sinks = num_sinks if shortened else 0

    def new_parameters(self):
        """(name, parameter) of what conversion added: latent branch, beta, LoRA."""
        for name, p in self.named_parameters():
            if name.split(".")[0] not in _ORIGINAL_PARTS:
                yield name, p

    def _project(self, name: str, x: torch.Tensor) -> torch.Tensor:
        y = getattr(self, name)(x)
        return y if self.lora is None else y + self.lora[name](x)

    def _unrotated_qkv(self, x: torch.Tensor):
        """The original's q, k, v ([B, T, H|K, E]) with its norms, before RoPE."""
        B, T, _ = x.shape
        E = self.spec.head_dim
        q = self._project("q_proj", x).view(B, T, -1, E)
        k = self._project("k_proj", x).view(B, T, -1, E)
        v = self._project("v_proj", x).view(B, T, -1, E)
        if getattr(self, "q_norm", None) is not None:  # per-head norms (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _rope(self, q, k, position_embeddings):
        cos, sin = position_embeddings
        q, k = self.spec.apply_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, H|K, T, E]
        return q.transpose(1, 2), k.transpose(1, 2)

    def _qkv(self, x: torch.Tensor, position_embeddings):
        """The original's q, k, v ([B, T, H|K, E]) with its norms and RoPE."""
        q, k, v = self._unrotated_qkv(x)
        return (*self._rope(q, k, position_embeddings), v)

    def _sink_queries(self, q: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
        """With sink_positions "cache": the queries q [B, T, H, E] (before
        RoPE) rotated to position P = window_size + num_sinks - 1, the
        newest slot of a StreamingLLM cache holding the sinks at 0..S-1 and
        the window after them: sink s is then scored at offset P - s
        whatever the context (with memory slots at fixed positions between
        the sinks and the window, P grows by their number: docs/math.md
        §4.2). None otherwise (the sinks use the queries)."""
        if not self.num_sinks or self.sink_positions != "cache":
            return None
        return self._queries_at(q, like, self.window_size + self.num_sinks - 1 + self._fixed_slots())

    def _fixed_slots(self) -> int:
        """The memory slots that sit at fixed positions after the sinks (0 if none)."""
        return self.memory.slots if self.memory is not None and self.memory_positions == "cache" else 0

    def _rotary_at(self, like: torch.Tensor, pos: torch.Tensor):
        """(cos, sin) [N, E] of the model's rotary embedding at positions pos [N]."""
        if self.rotary is None:
            raise ValueError('sink_positions and memory_positions "cache" need the model\'s rotary embedding')
        module, layer_type = self.rotary
        at = pos.to(like.device)[None]
        cos, sin = module(like, at) if layer_type is None else module(like, at, layer_type)
        return cos[0], sin[0]

    def _queries_at(self, q: torch.Tensor, like: torch.Tensor, at: int) -> torch.Tensor:
        """The queries q [B, T, H, E] (before RoPE) rotated to one position."""
        # made on the device (no host-to-device copy: a captured decoding step replays it)
        cos, sin = self._rotary_at(like, torch.full((1,), at, dtype=torch.long, device=like.device))
        B, T = q.shape[:2]
        return self._rope(q, q[:, :, :1], (cos.expand(B, T, -1), sin.expand(B, T, -1)))[0]

    def _window_inputs(self, q: torch.Tensor, like: torch.Tensor):
        """(window_spec(), memory_q) with the original's scale and softcap:
        with memory_positions "cache", the spec's memory puts slot i at
        position num_sinks + i and memory_q holds the queries q (before
        RoPE) at num_sinks + M + window_size - 1 (docs/math.md §4.2); else
        the slots keep their own positions and memory_q is None."""
        scores = dict(scale=self.spec.scale, softcap=self.spec.softcap)
        if not self._fixed_slots():
            return self.window_spec(**scores), None
        rotary = functools.partial(self._rotary_at, like)
        at = self.num_sinks + self.memory.slots + self.window_size - 1
        return self.window_spec(rotary=rotary, **scores), self._queries_at(q, like, at)

    @torch.no_grad()
    def log_masses(self, x: torch.Tensor, position_embeddings) -> LogMasses:
        """Log-masses of the mixture's parts on input x (see LogMasses)."""
        T = x.shape[1]
        q0, k0, v = self._unrotated_qkv(x)
        q, k = self._rope(q0, k0, position_embeddings)
        kw = dict(scale=self.spec.scale, softcap=self.spec.softcap)
        _, window = window_sinks_lse(
            q, k, v, window_size=self.window_size, num_sinks=self.num_sinks, sink_q=self._sink_queries(q0, x), **kw
        )
        _, full, _ = sliding_window_attention_lse(q, k, v, window_size=self.spec.window or T, **kw)
        a, _, gate, _, _ = self.latents(x)
        return LogMasses(window, full, torch.logsumexp(a.float(), -1), None if gate is None else gate.float())

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings=None,
        attention_mask=None,
        past_key_values=None,
        cache=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """hidden_states [B, T, F] -> (y [B, T, F], None); the layer's state
        goes to the cache, when the model passes one."""
        x = hidden_states
        B, T, _ = x.shape
        mask = padding_mask(attention_mask, B, T)
        cache = self._cache(past_key_values, cache)
        prev = None if cache is None else cache.states[self.layer_idx]
        q0, k0, v = self._unrotated_qkv(x)
        q, k = self._rope(q0, k0, position_embeddings)
        window, memory_q = self._window_inputs(q0, x)
        y, attn, conv, h = self.latent_mix(
            x,
            q,
            k,
            v,
            mask=mask,
            state=prev,
            keep_state=cache is not None,
            sink_q=self._sink_queries(q0, x),
            memory_q=memory_q,
            window=window,
            backend=self.backend,
        )
        if cache is not None:
            cache.states[self.layer_idx] = ConvertedLayerState(attn, conv, h)
        return self._project("o_proj", y.flatten(2)), None  # [B, T, H, E] -> [B, T, F]

    @staticmethod
    def _cache(past_key_values, cache) -> MacchiatoCache | None:
        """The MacchiatoCache the model passes down, under either name, or None."""
        given = one_cache("ConvertedAttention", past_key_values=past_key_values, cache=cache)
        if given is not None and not isinstance(given, MacchiatoCache):
            raise ValueError(f"{CACHE_NAME}: a converted model keeps a MacchiatoCache, got {type(given).__name__}")
        return given

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"heads={s.num_heads}, kv_heads={s.num_kv_heads}, head_dim={s.head_dim}, "
            f"window_size={self.window_size}, num_sinks={self.num_sinks}, sink_positions={self.sink_positions}, "
            f"latents_per_head={self.latents_per_head}, mix={self.mix!r}, "
            f"scale={s.scale:.4g}, softcap={s.softcap}"
        )
