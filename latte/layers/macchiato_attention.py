"""MacchiatoAttention: sliding-window softmax + global latents (docs/math.md §4).

Legend: B batch, T time, H query heads, K key/value heads, L latents per head
(latents_per_head), E head width (head_dim, for q, k and v).

  window branch: q = RoPE(x W_q) [B,T,H,E], k = RoPE(x W_k) [B,T,K,E]; it
                 sees the last window_size tokens plus the first num_sinks
                 (attention sinks, docs/math.md §4.1)
  values:        v = x W_v [B,T,K,E], shared by both branches
  latent branch: u = qk_mixer(x); a = u W_a, b = u W_b [B,T,H,L]
  mixing:        "joint" (one normaliser over window scores and latent
                 logits + beta) or "gate" (g = x W_g [B,T,H] competes with a)
                 (these two are MacchiatoCore, which the converted attention
                 of latte/convert/attention.py shares)
  y = (Macchiato(...) merged over heads) W_o, then dropout

Parameter names follow Llama (q_proj, k_proj, v_proj, o_proj) so a pretrained
decoder's attention maps onto the window branch as it is.

beta [H] (init 0) is added to every latent logit's mass. Converting a
pretrained model: set it very negative, e.g. `layer.beta.data.fill_(-30.0)`;
then p(window) = sigmoid(lse_window - logsumexp(a) - beta) ~ 1 and the layer
starts as pure sliding-window attention, the latents fading in as beta is
trained up.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch import nn

from latte._checks import check_positive_int
from latte.ops import MacchiatoState, WindowSpec, latte_causal, macchiato, macchiato_step
from latte.ops.macchiato import MIXES
from latte.ops.window.memory import Memory, check_memory, layer_seed
from latte.ops.window.sinks import check_num_sinks

from ._checks import (
    check_backend,
    check_choice,
    check_divides,
    check_dropout,
    check_input,
    check_positive_ints,
    check_rope_theta,
    check_state,
)
from .documents import check_packed, document_positions, packed_qk_mixer
from .llama_projections import add_qkvo, project_qkv
from .mixers import QKMixer
from .rope import layer_positions


class MacchiatoLayerState(NamedTuple):
    """Decoding state of MacchiatoAttention: constant in T."""

    attn: MacchiatoState  # latte (S, z) + window buffer of min(window_size - 1, positions) keys/values (+ sinks)
    conv: torch.Tensor | None  # [B, conv_size - 1, dim] (float32), None without conv
    h: torch.Tensor | None  # [B, dim] RG-LRU state (float32), None without RG-LRU
    pos: torch.Tensor | None  # [B] int64 real tokens seen so far; None inside a model (its cache counts)


class MacchiatoCore(nn.Module):
    """The latent branch and the mix of Macchiato (docs/math.md §4), written
    once for MacchiatoAttention below and for the converted attention
    (latte/convert/attention.py), which differ only in their window branch.

      latent branch: u = qk_mixer(x); a = u W_a, b = u W_b [B, T, H, L]
      mixing:        latte.ops.macchiato over the layer's window q, k, v and
                     a, b ("joint" or "gate", g = x W_g [B, T, H]; beta [H])

    A base class rather than a submodule, so its parameters (mixer.*,
    a_proj, b_proj, gate_proj, beta) keep their names at the top of the
    layer: state dicts, checkpoints and converted folders are unchanged. A
    subclass sets window_size, num_sinks and chunk_size, calls
    add_latent_branch() in its __init__, and in its forward hands its window
    q, k, v and its window_spec() to latent_mix().

    latent_only (False; switched by `latent_branch_only`): the layer's
    output is its latent branch alone, the attention it would compute with
    no window or sink key: under either mix the window's mass is then 0 and
    y_t = Latte_t, beta and the gate cancelling (docs/math.md §4). Used to
    score the latents' own prediction (docs/conversion.md §12); a
    full-sequence forward only (no decoding state).
    """

    latent_only = False
    memory = None  # Memory(slots, rule, seed') or None: the memory slots (use_memory)
    memory_mark = None  # [B, T] bool: the tokens rule "oracle" keeps, for a full-sequence forward
    memory_positions = "absolute"  # "cache": the slots at fixed positions after the sinks (docs/math.md §4.2)

    def use_memory(self, slots: int, rule: str = "recall", *, layer_index: int = 0, seed: int = 0) -> None:
        """Keep up to `slots` exact tokens beyond the window per KV head, chosen
        by `rule` (docs/math.md §4.2); 0 = none, the layer as before, bit for
        bit. The rule's seed is hash(seed) + layer_index (rule "random")."""
        memory = Memory(slots, rule, layer_seed(seed, layer_index))
        check_memory(memory)
        self.memory = memory if slots else None

    def window_spec(self, *, scale=None, softcap=None, rotary=None) -> WindowSpec:
        """The layer's local branch as the op takes it: its window_size,
        num_sinks and memory, the window scores' scale (None: 1/sqrt(E)) and
        softcap; rotary (memory_positions "cache"): the rotary tables that
        put memory slot i at position num_sinks + i (Memory.rotary)."""
        memory = self.memory
        if memory is not None and rotary is not None:
            memory = memory._replace(rotary=rotary)
        return WindowSpec(self.window_size, self.num_sinks, scale, softcap, memory)

    def add_latent_branch(
        self,
        dim: int,
        num_heads: int,
        latents_per_head: int,
        *,
        qk_mixer: str,
        conv_size: int,
        mix: str,
        bias: bool = False,
        gate_bias: bool = False,
        beta_init: float = 0.0,
    ) -> None:
        """Creates mixer, a_proj, b_proj (biases if `bias`), gate_proj (mix
        "gate"; bias if `gate_bias`) and beta (filled with beta_init), in
        this order (the random initialisation depends on it)."""
        H, L = num_heads, latents_per_head
        self.mix = mix
        self.mixer = QKMixer(dim, H, qk_mixer, conv_size=conv_size, causal=True)
        self.a_proj = nn.Linear(dim, H * L, bias=bias)
        self.b_proj = nn.Linear(dim, H * L, bias=bias)
        self.gate_proj = nn.Linear(dim, H, bias=gate_bias) if mix == "gate" else None
        self.beta = nn.Parameter(torch.full((H,), float(beta_init)))

    def latents(self, x: torch.Tensor, *, mask: torch.Tensor | None = None, state=None, cu_seqlens=None):
        """x [B, T, F] -> (a, b [B, T, H, L], gate [B, T, H] or None, conv, h):
        the latent logits and the qk-mixer's state after the last token;
        `state`: the layer's state so far (its .conv and .h) or None;
        cu_seqlens: packed documents (the mixer restarts at each; no state)."""
        B, T, _ = x.shape
        H = self.beta.shape[0]
        conv_state, h = (None, None) if state is None else (state.conv, state.h)
        if cu_seqlens is not None:
            u, conv, h = packed_qk_mixer(self.mixer, x, cu_seqlens), None, None
        else:
            u, conv, h = self.mixer(x, mask=mask, conv_state=conv_state, h=h)
        a = self.a_proj(u).view(B, T, H, -1)
        b = self.b_proj(u).view(B, T, H, -1)
        gate = None if self.gate_proj is None else self.gate_proj(x)
        return a, b, gate, conv, h

    def latent_mix(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None,
        state=None,
        keep_state: bool = True,
        sink_q: torch.Tensor | None = None,
        memory_q: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        window: WindowSpec,
        backend: str | None = None,
    ) -> tuple[torch.Tensor, MacchiatoState | None, torch.Tensor | None, torch.Tensor | None]:
        """x [B, T, F] the layer input; q [B, T, H, E], k, v [B, T, K, E] the
        window's (RoPE applied); mask [B, T] bool (False = padding) or None;
        state: the layer's state so far (.attn, .conv, .h) or None;
        keep_state: return the Macchiato state (a single token is then one
        constant-time decoding step); sink_q, memory_q, backend: macchiato's;
        window: the layer's window_spec(), handed to the op unchanged;
        cu_seqlens: the documents of a packed row (B == 1, no state kept).
        -> (y [B, T, H, E], MacchiatoState or None, conv, h)."""
        a, b, gate, conv, h = self.latents(x, mask=mask, state=state, cu_seqlens=cu_seqlens)
        if self.latent_only:
            y = self.latents_alone(a, b, v, mask=mask, state=state, backend=backend, cu_seqlens=cu_seqlens)
            return y, None, conv, h
        keep_state = keep_state and cu_seqlens is None  # a packed row keeps no state
        prev = None if state is None else state.attn
        mark = self._oracle_mark(window, a.shape[:2])
        settings = dict(window=window, mix=self.mix, beta=self.beta, backend=backend)
        if x.shape[1] == 1 and keep_state:  # decoding: one constant-time step
            y, attn = _one_step(a, b, v, q, k, gate, mask, sink_q, memory_q, prev, settings)
            return y, attn, conv, h
        y, attn = macchiato(
            a,
            b,
            v,
            q,
            k,
            gate=gate,
            mask=mask,
            chunk_size=self.chunk_size,
            initial_state=prev,
            output_final_state=keep_state,
            cu_seqlens=cu_seqlens,
            sink_q=sink_q,
            memory_mark=mark,
            memory_q=memory_q,
            **settings,
        )
        return y, attn, conv, h

    def _oracle_mark(self, window: WindowSpec, shape) -> torch.Tensor | None:
        """The marks memory rule "oracle" keeps for a call of `shape` [B, T]
        (memory_mark, when it has that shape), else None."""
        if window.memory is None or window.memory.rule != "oracle":
            return None
        mark = self.memory_mark
        return mark if mark is not None and tuple(mark.shape) == tuple(shape) else None

    def latents_alone(self, a, b, v, *, mask, state=None, backend=None, cu_seqlens=None) -> torch.Tensor:
        """The latent branch's output alone, y [B, T, H, E]: causal Latte over
        a, b [B, T, H, L] and the window's values v [B, T, K, E] (KV heads
        repeated), as the mix would give it with no window key."""
        if state is not None:
            raise ValueError("latent_only: a full-sequence forward without a decoding state (got a state)")
        H = a.shape[2]
        v = v if v.shape[2] == H else v.repeat_interleave(H // v.shape[2], dim=2)
        y, _ = latte_causal(a, b, v, chunk_size=self.chunk_size, mask=mask, cu_seqlens=cu_seqlens, backend=backend)
        return y


def _one_step(a, b, v, q, k, gate, mask, sink_q, memory_q, state, settings: dict):
    """macchiato_step on the one token of [B, 1, ...] inputs (None stays
    None) -> (y [B, 1, H, E], MacchiatoState); settings: its keywords."""

    def first(t):
        return None if t is None else t[:, 0]

    y, attn = macchiato_step(
        *map(first, (a, b, v, q, k)),
        gate_t=first(gate),
        mask_t=first(mask),
        state=state,
        sink_q_t=first(sink_q),
        memory_q_t=first(memory_q),
        **settings,
    )
    return y.unsqueeze(1), attn


@contextlib.contextmanager
def _every_layer(model: nn.Module, name: str, value):
    """Inside the block, attribute `name` of every MacchiatoCore of `model`
    is `value`; each layer's own value is restored after, also on an error."""
    layers = [m for m in model.modules() if isinstance(m, MacchiatoCore)]
    saved = [getattr(m, name) for m in layers]
    try:
        for m in layers:
            setattr(m, name, value)
        yield
    finally:
        for m, s in zip(layers, saved):
            setattr(m, name, s)


@contextlib.contextmanager
def latent_branch_only(model: nn.Module):
    """Inside the block, every Macchiato layer of `model` (MacchiatoCore:
    the native layer and the converted attention) outputs its latent branch
    alone (MacchiatoCore.latent_only); restored after, also on an error."""
    with _every_layer(model, "latent_only", True):
        yield model


@contextlib.contextmanager
def memory_marks(model: nn.Module, mark: torch.Tensor | None):
    """Inside the block, every Macchiato layer of `model` with memory rule
    "oracle" keeps the tokens where mark [B, T] is True (a full-sequence or
    prefill call of that shape; docs/math.md §4.2, for diagnosis: e.g. a
    retrieval prompt's needle); restored after, also on an error."""
    with _every_layer(model, "memory_mark", mark):
        yield model


class MacchiatoAttention(MacchiatoCore):
    """Latte-Macchiato layer: forward(x, *, state=None, mask=None) -> (y, state).

    Args:
        dim, num_heads, latents_per_head: as LatteAttention (L per head).
        window_size: tokens each query sees in the window branch (itself included).
        num_sinks: the first tokens every query also sees there (attention
            sinks, kept once in the decoding state); 0 = none.
        mix: "joint" or "gate" (adds gate_proj: dim -> num_heads).
        num_kv_heads: key/value heads, divides num_heads (default num_heads).
        head_dim: q/k/v head width (default dim / num_heads).
        rope_theta: RoPE base of the window branch (None: no RoPE).
        qk_mixer, conv_size, chunk_size: the latent branch, as LatteAttention.
        dropout: applied to the layer output in training.
        bias: biases in the projections.
        backend: kernels of the op, "torch" | "fla" | "auto" | None (the
            process default); see latte.ops.backend.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        latents_per_head: int,
        *,
        window_size: int = 128,
        num_sinks: int = 0,
        mix: str = "joint",
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        rope_theta: float | None = 10000.0,
        qk_mixer: str = "conv_rglru",
        conv_size: int = 3,
        chunk_size: int = 64,
        dropout: float = 0.0,
        bias: bool = False,
        backend: str | None = None,
    ):
        super().__init__()
        check_backend(backend)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_ints(
            dim=dim,
            num_heads=num_heads,
            latents_per_head=latents_per_head,
            window_size=window_size,
            num_kv_heads=num_kv_heads,
            chunk_size=chunk_size,
        )
        if head_dim is None:
            check_divides("num_heads", num_heads, "dim", dim)
            head_dim = dim // num_heads
        check_positive_int("head_dim", head_dim)
        check_num_sinks(num_sinks)
        check_divides("num_kv_heads", num_kv_heads, "num_heads", num_heads)
        check_choice("mix", mix, MIXES)
        check_rope_theta(rope_theta)
        check_dropout(dropout)
        self.dim, self.num_heads, self.latents_per_head = dim, num_heads, latents_per_head
        self.num_kv_heads, self.head_dim, self.window_size = num_kv_heads, head_dim, window_size
        self.mix, self.chunk_size, self.qk_mixer = mix, chunk_size, qk_mixer
        self.num_sinks = num_sinks
        self.backend = backend
        add_qkvo(self, dim, num_heads, num_kv_heads, head_dim, rope_theta, bias)
        self.add_latent_branch(
            dim,
            num_heads,
            latents_per_head,
            qk_mixer=qk_mixer,
            conv_size=conv_size,
            mix=mix,
            bias=bias,
            gate_bias=bias,
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: MacchiatoLayerState | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, MacchiatoLayerState | None]:
        """x [B, T, dim], mask [B, T] bool (False = padding), positions [B, T]
        (RoPE positions of the window branch; default: real tokens counted
        from state.pos) -> (y [B, T, dim], MacchiatoLayerState after the last token).
        cu_seqlens: the documents of a packed row (B == 1; layers/documents.py):
        positions default to each document's own, the state returned is None."""
        B, T = check_input(x, self.dim, mask, positions)
        if cu_seqlens is not None:
            return self._packed(x, cu_seqlens, positions, state, mask)
        state = check_state(state, MacchiatoLayerState, B)
        pos_BT, pos = layer_positions(positions, state, mask, B, T, x.device)
        q, k, v = project_qkv(self, x, pos_BT)
        window, memory_q = self._window_inputs(q, pos_BT)
        y, attn, conv, h = self.latent_mix(
            x, q, k, v, mask=mask, state=state, memory_q=memory_q, window=window, backend=self.backend
        )
        y = self.dropout(self.o_proj(y.flatten(2)))  # [B, T, H, E] -> [B, T, dim]
        return y, MacchiatoLayerState(attn, conv, h, pos)

    def _packed(self, x, cu_seqlens, positions, state, mask) -> tuple[torch.Tensor, None]:
        """Packed documents: the op with cu_seqlens (window, sinks, memory
        slots and latents per document), the qk mixer per document."""
        check_packed(x, cu_seqlens, state=state, mask=mask)
        pos_BT = document_positions(cu_seqlens, x.shape[1]) if positions is None else positions
        q, k, v = project_qkv(self, x, pos_BT)
        window, memory_q = self._window_inputs(q, pos_BT)
        y, _, _, _ = self.latent_mix(
            x, q, k, v, mask=None, memory_q=memory_q, cu_seqlens=cu_seqlens, window=window, backend=self.backend
        )
        return self.dropout(self.o_proj(y.flatten(2))), None

    def _window_inputs(self, q: torch.Tensor, pos_BT: torch.Tensor) -> tuple[WindowSpec, torch.Tensor | None]:
        """(window_spec(), memory_q): with memory_positions "cache", the
        spec's memory puts slot i at position num_sinks + i and memory_q is
        q [B, T, H, E] turned from its position to num_sinks + M +
        window_size - 1 (docs/math.md §4.2); else the slots keep their own
        positions and memory_q is None (the queries)."""
        if self.memory is None or self.memory_positions != "cache":
            return self.window_spec(), None
        if self.rope is None:
            raise ValueError('memory_positions="cache" needs RoPE on the window branch (rope_theta is None)')
        at = self.num_sinks + self.memory.slots + self.window_size - 1
        return self.window_spec(rotary=self.rope.tables), self.rope(q, at - pos_BT)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, latents_per_head={self.latents_per_head}, window_size={self.window_size}, "
            f"num_sinks={self.num_sinks}, "
            f"mix={self.mix!r}, qk_mixer={self.qk_mixer!r}, chunk_size={self.chunk_size}"
        )
