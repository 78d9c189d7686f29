"""The backbone `LatteModel`, what it takes and what it returns.

    x = embed(ids) [+ absolute position]           [B, T, dim]
    for each block:  x = x + mixer(norm(x))         (latte, macchiato, softmax, linear or swa)
                     x = x + mlp(norm(x))          (skipped with mlp "none")
    h = norm(x)                                     [B, T, dim]

Padding: `attention_mask` [B, T] (True / 1 = real token) goes to every mixer,
which excludes padded positions; absolute positions count real tokens only,
so left padding shifts nothing. Outputs at padded positions are unspecified.

In reading order: the validation of input_ids and attention_mask (done once,
at the model boundary), the decoding cache `LatteCache`, then the blocks and
the backbone. The heads (`causal_lm.py`, `classification.py`) build on this.

Validation. Structural checks (type, dtype, shape) read only tensor metadata:
free, and always on. Value checks (ids in range, a mask of 0/1, an all-ones
mask dropped for the unmasked fast path) read the values: each is a
device-to-host synchronisation and, under torch.compile, a graph break. They
run in eager mode by default and are skipped where values cannot be read
(`latte._checks.values_readable`: while torch.compile traces, during CUDA
graph capture, on meta tensors) or when a model's `validate_inputs` is
False, so compiled code has no graph break, a captured graph no copy to the
host and a meta model no `.item()`; eager users keep the clear error.

The cache. One state per layer, as returned by the layer's `forward` (a tuple
of tensors of a size independent of the context for every mixer but
softmax), plus the number of positions fed so far and the number of real
tokens per row (the absolute position of the next token when padding is
involved). A cache is a value: `forward` returns a new one and never changes
the one it was given, so a prefix state can be reused for several
continuations.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .._checks import values_readable
from ..layers import (
    LatteAttention,
    LinearAttention,
    MacchiatoAttention,
    SlidingWindowAttention,
    SoftmaxAttention,
    state_nbytes,
)
from ..layers.documents import document_positions
from ..ops._checks import check_cu_seqlens
from ..ops.backend import saved_backend
from .config import LatteConfig

# ---- input validation ------------------------------------------------------------

INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def value_checks(enabled: bool, *tensors: torch.Tensor) -> bool:
    """Whether value checks (host syncs) run: enabled, and values readable
    (latte._checks.values_readable: not compiling, not capturing a CUDA
    graph, no meta tensor among `tensors`)."""
    return enabled and values_readable(*tensors)


def check_input_ids(input_ids, vocab_size: int, *, values: bool = True) -> tuple[int, int]:
    """input_ids: integer tensor [B, T >= 1] with ids in [0, vocab_size).
    Runs before any compute so a bad id never reaches an embedding lookup."""
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids: expected an integer tensor [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in INT_DTYPES:
        raise ValueError(f"input_ids: expected an integer dtype (torch.long), got {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected shape [B, T >= 1] with B >= 1, got {tuple(input_ids.shape)}")
    if values and input_ids.numel() and values_readable(input_ids):
        lo, hi = torch.aminmax(input_ids)
        lo, hi = int(lo), int(hi)  # one host sync for both
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"input_ids: found id {bad}, but ids must be in [0, {vocab_size - 1}] "
                f"(max id {vocab_size - 1}, vocab_size {vocab_size})"
            )
    return tuple(input_ids.shape)


def check_attention_mask(attention_mask, shape: tuple[int, int], *, values: bool = True) -> torch.Tensor | None:
    """[B, T] bool, or integers 0/1 (1 = real token) -> bool mask; None when
    there is no mask or (with value checks) every token is real, which
    selects the unmasked fast path."""
    if attention_mask is None:
        return None
    m = attention_mask
    if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(shape):
        got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
        raise ValueError(f"attention_mask: expected shape {tuple(shape)} like input_ids, got {got}")
    if m.dtype != torch.bool:
        if m.dtype not in INT_DTYPES:
            raise ValueError(f"attention_mask: expected bool or 0/1 integers (1 = real token), got dtype {m.dtype}")
        if values and values_readable(m):
            bad = m[(m != 0) & (m != 1)]
            if bad.numel():
                raise ValueError(
                    f"attention_mask: expected bool or 0/1 integers (1 = real token), found value {int(bad[0])}"
                )
        m = m != 0
    return None if values and values_readable(m) and bool(m.all()) else m


def check_inputs(
    input_ids, attention_mask, vocab_size: int, *, values: bool = True
) -> tuple[int, int, torch.Tensor | None]:
    """Both checks: (B, T, bool mask or None)."""
    B, T = check_input_ids(input_ids, vocab_size, values=values)
    return B, T, check_attention_mask(attention_mask, (B, T), values=values)


# ---- the decoding cache --------------------------------------------------------


@dataclass
class LatteCache:
    layers: list[Any]  # one layer state per block (None for a layer that keeps none)
    seen_tokens: int  # positions fed so far, padding included
    pos: torch.Tensor  # [B] int64 real tokens fed so far, per row

    @property
    def batch_size(self) -> int:
        return int(self.pos.shape[0])

    def nbytes(self) -> int:
        """Bytes held by all layer states (the `pos` counter excluded)."""
        return sum(state_nbytes(s) for s in self.layers)

    def layer_nbytes(self) -> list[int]:
        return [state_nbytes(s) for s in self.layers]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LatteCache:
        """A new cache with `fn` applied to every tensor whose first dim is the batch."""
        return LatteCache([map_state(fn, s) for s in self.layers], self.seen_tokens, fn(self.pos))

    def select(self, index: torch.Tensor) -> LatteCache:
        """Rows `index` (reorder, drop or repeat rows: beam search, batch pruning)."""
        return self.map(lambda t: t.index_select(0, index.to(t.device)))

    def repeat_interleave(self, repeats: int) -> LatteCache:
        return self.map(lambda t: t.repeat_interleave(repeats, dim=0))


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: Any) -> Any:
    """Applies `fn` to every tensor in a nested state (NamedTuples, tuples,
    lists, dicts, dataclasses), keeping the structure; None stays None."""
    if state is None or isinstance(state, (int, float, bool, str)):
        return state
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # NamedTuple
        return type(state)(*(map_state(fn, s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_state(fn, v) for k, v in state.items()}
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.replace(
            state, **{f.name: map_state(fn, getattr(state, f.name)) for f in dataclasses.fields(state) if f.init}
        )
    raise TypeError(f"cannot map over a state of type {type(state).__name__}")


# ---- the backbone ---------------------------------------------------------------


def layer_backend(config: LatteConfig) -> str | None:
    """The layers' `backend=` for config.backend (None for "auto": the
    process default); a "fla" this machine cannot run is refused here."""
    override = (
        "--set model.backend=auto (the kernels this machine has) or --set model.backend=torch (latte eval, "
        "latte generate), --model.backend=auto (latte train) or LatteConfig(backend='auto')"
    )
    return saved_backend(config.backend, "model.backend", override)


def build_mixer(config: LatteConfig, kind: str) -> nn.Module:
    """The token mixer of one block; `kind` is one of config.mixers."""
    c = config
    if kind == "latte":
        return LatteAttention(
            c.dim,
            c.num_heads,
            c.latents_per_head,
            causal=c.causal,
            backend=layer_backend(c),
            qk_mixer=c.qk_mixer,
            conv_size=c.conv_size,
            chunk_size=c.chunk_size,
            dropout=c.dropout,
        )
    if kind == "macchiato":
        return MacchiatoAttention(
            c.dim,
            c.num_heads,
            c.latents_per_head,
            backend=layer_backend(c),
            window_size=c.window_size,
            num_sinks=c.num_sinks,
            mix=c.mix,
            num_kv_heads=c.num_kv_heads,
            rope_theta=c.rope_theta,
            qk_mixer=c.qk_mixer,
            conv_size=c.conv_size,
            chunk_size=c.chunk_size,
            dropout=c.dropout,
        )
    if kind == "softmax":
        return SoftmaxAttention(
            c.dim, c.num_heads, num_kv_heads=c.num_kv_heads, causal=c.causal, rope_theta=c.rope_theta, dropout=c.dropout
        )
    if kind == "linear":
        return LinearAttention(
            c.dim,
            c.num_heads,
            causal=c.causal,
            chunk_size=c.chunk_size,
            qk_mixer=c.linear_qk_mixer,
            conv_size=c.conv_size,
            dropout=c.dropout,
        )
    if kind == "swa":
        return SlidingWindowAttention(
            c.dim,
            c.num_heads,
            window_size=c.window_size,
            num_kv_heads=c.num_kv_heads,
            rope_theta=c.rope_theta,
            dropout=c.dropout,
        )
    raise AssertionError(f"unvalidated mixer {kind!r}")  # LatteConfig rejects unknown names


def build_norm(config: LatteConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.dim, eps=config.norm_eps)
    return nn.LayerNorm(config.dim, eps=config.norm_eps)


class MLP(nn.Module):
    """SwiGLU (down(silu(gate) * up)) or GELU (down(gelu(up))), then dropout."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        self.kind, F_ = config.mlp, config.ffn_hidden
        self.up = nn.Linear(config.dim, 2 * F_ if self.kind == "swiglu" else F_, bias=False)
        self.down = nn.Linear(F_, config.dim, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)  # [B, T, 2F] -> 2 x [B, T, F]
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.dropout(self.down(h))


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x)).
    With mlp "none" the block is attention only (mlp and mlp_norm are None)."""

    def __init__(self, config: LatteConfig, layer_idx: int):
        super().__init__()
        self.mixer_norm = build_norm(config)
        self.mixer = build_mixer(config, config.mixers[layer_idx])
        if config.memory_slots and isinstance(self.mixer, MacchiatoAttention):  # docs/math.md §4.2
            self.mixer.use_memory(config.memory_slots, config.memory_rule, layer_index=layer_idx)
            self.mixer.memory_positions = config.memory_positions
        has_mlp = config.mlp != "none"
        self.mlp_norm = build_norm(config) if has_mlp else None
        self.mlp = MLP(config) if has_mlp else None

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: Any = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        y, state = self.mixer(self.mixer_norm(x), state=state, mask=mask, positions=positions, **packed)
        x = x + y
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x, state


def sinusoidal(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoids for integer positions pos [B, T] -> [B, T, dim]
    (first half sin, second half cos), computed in float32 on the fly."""
    half = (dim + 1) // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=pos.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32).unsqueeze(-1) * freq  # [B, T, half]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)[..., :dim]


class LatteModel(nn.Module):
    """Embeddings, `num_layers` blocks and the final norm: ids -> hidden states.

    validate_inputs: run the value checks of input_ids / attention_mask (each
    a host sync; see "Validation" above). gradient_checkpointing: recompute
    each block in the backward instead of keeping its activations (set by
    `gradient_checkpointing_enable()` on the model, or by transformers)."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        self.config = config
        self.validate_inputs = True
        self.gradient_checkpointing = False
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.pos_embed = (
            nn.Embedding(config.max_position_embeddings, config.dim) if config.position_embedding == "learned" else None
        )
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = build_norm(config)

    def check_inputs(self, input_ids, attention_mask) -> torch.Tensor | None:
        """Validates input_ids and attention_mask once for a whole forward
        (ids are checked against the embedding's size, so a resized embedding
        is honoured); returns the bool mask, or None for no padding."""
        vocab = self.embed.num_embeddings
        return check_inputs(input_ids, attention_mask, vocab, values=value_checks(self.validate_inputs, input_ids))[2]

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        state: LatteCache | None = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = False,
        inputs_checked: bool = False,
        decoding_step: bool = False,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LatteCache | None]:
        """input_ids [B, T] -> (hidden [B, T, dim], LatteCache or None).

        inputs_checked: the caller already ran `check_inputs` and passes its
        result as attention_mask (what the heads do, so nothing is checked
        twice). decoding_step: a step of a continuation the caller checked
        whole before the first token (generate, stream): no value is read.
        The cache is returned when use_cache is set or a state was given; it
        continues exactly with the next tokens.

        cu_seqlens: int [N+1], the boundaries of N documents packed in one
        row (B == 1; 0, end of the first, ..., T): no token sees another
        document, positions restart at 0 in each (layers/documents.py). No
        padding mask, state or cache with it."""
        cfg = self.config
        mask = attention_mask if inputs_checked else self.check_inputs(input_ids, attention_mask)
        B, T = input_ids.shape
        self._check_state(state, B, use_cache)
        pos0 = state.pos if state is not None else torch.zeros(B, dtype=torch.long, device=input_ids.device)
        m = torch.ones(B, T, dtype=torch.long, device=input_ids.device) if mask is None else mask.long()
        pos = pos0[:, None] + m.cumsum(1) - m  # [B, T] real tokens before each one: every layer's positions
        if cu_seqlens is not None:
            _check_packed(cu_seqlens, input_ids, mask, state, use_cache)
            pos = document_positions(cu_seqlens, T)
        if not decoding_step:
            self._check_positions(pos)

        if input_ids.dtype not in (torch.int64, torch.int32):
            input_ids = input_ids.long()  # the embedding takes int32/int64 only
        x = self.embed(input_ids)  # [B, T, dim]
        if cfg.position_embedding == "learned":
            x = x + self.pos_embed(pos)
        elif cfg.position_embedding == "sinusoidal":
            x = x + sinusoidal(pos, cfg.dim).to(x.dtype)
        x = self.dropout(x)
        states = []
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            kwargs = dict(state=None if state is None else state.layers[i], mask=mask, positions=pos)
            if cu_seqlens is not None:
                kwargs["cu_seqlens"] = cu_seqlens
            x, s = self._checkpoint(block, x, **kwargs) if recompute else block(x, **kwargs)
            states.append(s)
        x = self.norm(x)

        if not (use_cache or state is not None):
            return x, None
        seen = T + (0 if state is None else state.seen_tokens)
        return x, LatteCache(states, seen, pos0 + m.sum(1))

    def _check_positions(self, pos: torch.Tensor) -> None:
        """Absolute positions pos [B, T] within max_position_embeddings (a
        value check: skipped where values cannot be read)."""
        cfg = self.config
        if cfg.position_embedding != "none" and value_checks(self.validate_inputs, pos):
            n = int(pos.max()) + 1
            if n > cfg.max_position_embeddings:
                raise ValueError(
                    f"sequence of {n} positions exceeds max_position_embeddings="
                    f"{cfg.max_position_embeddings} (position_embedding={cfg.position_embedding!r}); "
                    "shorten the input or build the model with a larger limit"
                )

    def _checkpoint(self, block: nn.Module, x: torch.Tensor, **kwargs):
        # transformers sets _gradient_checkpointing_func (its own options);
        # natively: torch's non-reentrant checkpoint (keyword arguments allowed).
        fn = getattr(self, "_gradient_checkpointing_func", None) or functools.partial(checkpoint, use_reentrant=False)
        return fn(block.__call__, x, **kwargs)

    def _check_state(self, state, B: int, use_cache: bool) -> None:
        if not self.config.causal and (state is not None or use_cache):
            raise ValueError("state/use_cache: a bidirectional model (causal=False) keeps no decoding state")
        if state is None:
            return
        if not isinstance(state, LatteCache):
            raise ValueError(f"state: expected a LatteCache from a previous forward, got {type(state).__name__}")
        if len(state.layers) != len(self.blocks) or state.batch_size != B:
            raise ValueError(
                f"state: holds {len(state.layers)} layers x batch {state.batch_size}, "
                f"expected {len(self.blocks)} layers x batch {B}"
            )

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 style init of the modules this package owns (embeddings, MLPs,
        norms); each mixer keeps the init its layer chose. The MLP output is
        scaled by 1/sqrt(2 num_layers) so the residual stream does not grow
        with depth."""
        inside_mixers = {id(m) for block in self.blocks for m in block.mixer.modules()}
        for module in self.modules():
            if id(module) not in inside_mixers:
                init_module(module, self.config.initializer_range, self.config.num_layers)


def _check_packed(cu_seqlens, input_ids, mask, state, use_cache) -> None:
    """A packed forward: cu_seqlens valid for input_ids [1, T]; no padding
    mask (an all-ones one was dropped already), state or cache."""
    check_cu_seqlens(cu_seqlens, *input_ids.shape)
    if mask is not None:
        raise ValueError("attention_mask: a packed forward (cu_seqlens) takes no padding; pass all ones or None")
    if state is not None or use_cache:
        raise ValueError("state/use_cache: a packed forward (cu_seqlens) keeps no decoding state")


def init_module(module: nn.Module, std: float, num_layers: int) -> None:
    """Init of one module owned by latte.models (nothing inside a mixer)."""
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, std)
    elif isinstance(module, MLP):
        nn.init.normal_(module.up.weight, 0.0, std)
        nn.init.normal_(module.down.weight, 0.0, std / math.sqrt(2 * num_layers))
    elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
