"""fla-core's kernels behind torch.library custom ops (backend "fla", the
"fused" construction; docs/gpu.md §2.3).

Legend: B batch, T time, H heads, K key width (latents per head), V value
width, N sequences (documents with cu_seqlens, else B).

Five ops, each one dispatcher call with a fake (meta) implementation, so
that torch.compile(fullgraph=True) traces through them without a graph
break and a dispatch mode counts them (and the bytes they read and write)
on `meta` tensors:

  latte::additive_gate(x, z0?, cu_seqlens?, k_dtype, save_z) -> (k, g, zT, z)
      fla.ops.gsa.gate's fused_additive_gate: z_t = logaddexp(z_{t-1}, x_t)
      from z0 (-inf: empty), k_t = exp(x_t - z_t), g_t = z_{t-1} - z_t
      (0 where z_{t-1} = -inf), zT the last z per sequence [N, 1, H, K];
      g and z in float32, k in k_dtype; z (saved for the backward) is
      empty unless save_z.
  latte::additive_gate_bwd(x, z, z0?, cu_seqlens?, dk, dg, dzT) -> (dx, dz0)
  latte::chunk_gla(q, k, v, g, h0?, cu_seqlens?, scale) -> (o, ht, A)
      fla.ops.gla's chunked forward; A (the intra-chunk scores, float32
      [B, T, H, BT]) is kept for the backward, as fla's autograd keeps it.
  latte::chunk_gla_bwd(q, k, v, g, h0?, cu_seqlens?, A, do, dht, scale)
      -> (dq, dk, dv, dg, dh0)
  latte::fused_recurrent_gla(q, k, v, g, h0?, scale) -> (o, ht)
      the decoding step's kernel; its backward (rarely needed) runs
      chunk_gla's forward again for A, then chunk_gla_bwd.

Where a tensor is optional and absent, its gradient comes back empty
(shape [0]). Autograd is registered on the three forward ops.

Implementations: on CUDA tensors fla-core's Triton kernels. On the CPU a
pure-torch stand-in by default (the gate by logcumsumexp and a reverse
loop, GLA by its recurrence, in float32, or float64 for float64 inputs):
the same op names and contracts, so the CPU checks the "fused"
construction's logic against the float64 reference and compiles the fla
path for graph breaks. CPU_IMPL = "triton" runs fla's kernels on CPU
tensors instead (under TRITON_INTERPRET=1: tests/gpu/interpret_fla.py).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

# "reference" (pure torch) or "triton" (fla's kernels, under Triton's interpreter)
CPU_IMPL = "reference"


# chunk_gla's chunk, whatever T (fla's autograd takes min(64, max(16, the
# next power of two of T)); a fixed size keeps A's shape free of T's bits
CHUNK = 64


def _use_triton(x: Tensor) -> bool:
    return x.device.type == "cuda" or CPU_IMPL == "triton"


def _fla(*xs):
    """Tensors as fla's kernels index them: contiguous (a gradient may come
    strided or expanded), None kept."""
    return tuple(None if x is None else x.contiguous() for x in xs)


def _device(x: Tensor):
    """The tensor's CUDA device current while fla launches its kernels."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _empty(x: Tensor) -> Tensor:
    return x.new_empty(0, dtype=torch.float32)


def _n_seqs(x: Tensor, cu: Tensor | None) -> int:
    return x.shape[0] if cu is None else cu.numel() - 1


def _bounds(x: Tensor, cu: Tensor | None) -> list[tuple[int, int, int]]:
    """(row of x, start, end) per sequence."""
    if cu is None:
        return [(n, 0, x.shape[1]) for n in range(x.shape[0])]
    c = cu.tolist()
    return [(0, s, e) for s, e in zip(c[:-1], c[1:])]


def _work(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# ---- the gate -----------------------------------------------------------------


def _gate_ref(x, z0, cu, k_dtype, save_z):
    """The gate in torch: logcumsumexp per sequence (the work dtype)."""
    w = _work(x)
    xs = x.to(w)
    z = torch.empty_like(xs)
    zprev = torch.empty_like(xs)
    zT = xs.new_empty(_n_seqs(x, cu), 1, *x.shape[2:])
    for n, (row, s, e) in enumerate(_bounds(x, cu)):
        init = xs.new_full(x.shape[2:], float("-inf")) if z0 is None else z0[n, 0].to(w)
        zz = torch.logaddexp(torch.logcumsumexp(xs[row, s:e], 0), init)
        z[row, s:e] = zz
        zprev[row, s:e] = torch.cat([init[None], zz[:-1]])
        zT[n, 0] = zz[-1] if e > s else init
    k = torch.exp(xs - z).to(k_dtype)
    g = torch.where(zprev == float("-inf"), 0.0, zprev - z).to(torch.float32 if w == torch.float32 else w)
    return k, g, zT, (z if save_z else _empty(x))


def _gate_bwd_ref(x, z, z0, cu, dk, dg, dzT):
    """The gate's backward in torch, from the last token back: D_t (the
    gradient of z_t) = c_t + exp(z_t - z_{t+1}) D_{t+1}, where c_t is what
    k_t, g_t, g_{t+1} and zT contribute directly; dx_t = k_t (dk_t + D_t);
    dz0 = exp(z0 - z_first) D_first + dg_first (where z0 is finite)."""
    w = z.dtype
    xs, dk, dg = x.to(w), dk.to(w), dg.to(w)
    k = torch.exp(xs - z)
    dx = torch.zeros_like(xs)
    dz0 = None if z0 is None else torch.zeros_like(z0, dtype=w)
    for n, (row, s, e) in enumerate(_bounds(x, cu)):
        init = xs.new_full(x.shape[2:], float("-inf")) if z0 is None else z0[n, 0].to(w)
        D = dzT[n, 0].to(w)
        for t in range(e - 1, s - 1, -1):
            own_g = torch.where(init > float("-inf"), dg[row, t], 0.0) if t == s else dg[row, t]
            c = -dk[row, t] * k[row, t] - own_g
            if t + 1 < e:
                c = c + dg[row, t + 1]
                D = D * torch.exp(z[row, t] - z[row, t + 1])
            D = c + D
            dx[row, t] = k[row, t] * (dk[row, t] + D)
        if dz0 is not None:
            finite = init > float("-inf")
            back = torch.where(finite, torch.exp(init - z[row, s]) * D + dg[row, s], 0.0) if e > s else D
            dz0[n, 0] = back
    return dx.to(x.dtype), (_empty(x) if dz0 is None else dz0.to(z0.dtype))


def _gate_fla(x, z0, cu, k_dtype, save_z):
    from fla.ops.gsa.gate import fused_additive_gate_fwd

    x, z0 = _fla(x, z0)
    with _device(x):
        k, g, zT, z = fused_additive_gate_fwd(x, z0, cu, save_z, output_dtype=k_dtype, gate_dtype=torch.float32)
    return k, g, zT, (z if save_z else _empty(x))


@torch.library.custom_op("latte::additive_gate", mutates_args=())
def additive_gate(
    x: Tensor, z0: Tensor | None, cu_seqlens: Tensor | None, k_dtype: torch.dtype, save_z: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    N = _n_seqs(x, cu_seqlens)
    if cu_seqlens is not None and x.shape[0] != 1:
        raise ValueError(f"latte::additive_gate: x with cu_seqlens must have batch 1, got shape {tuple(x.shape)}")
    if z0 is not None and tuple(z0.shape) != (N, 1, *x.shape[2:]):
        raise ValueError(f"latte::additive_gate: z0 must have shape {(N, 1, *x.shape[2:])}, got {tuple(z0.shape)}")
    if _use_triton(x):
        return _gate_fla(x, z0, cu_seqlens, k_dtype, save_z)
    return _gate_ref(x, z0, cu_seqlens, k_dtype, save_z)


@additive_gate.register_fake
def _(x, z0, cu_seqlens, k_dtype, save_z):
    w = torch.float64 if x.dtype == torch.float64 else torch.float32
    N = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    z = x.new_empty(x.shape, dtype=w) if save_z else x.new_empty(0, dtype=torch.float32)
    return (
        x.new_empty(x.shape, dtype=k_dtype),
        x.new_empty(x.shape, dtype=w),
        x.new_empty(N, 1, *x.shape[2:], dtype=w),
        z,
    )


@torch.library.custom_op("latte::additive_gate_bwd", mutates_args=())
def additive_gate_bwd(
    x: Tensor,
    z: Tensor,
    z0: Tensor | None,
    cu_seqlens: Tensor | None,
    dk: Tensor | None,
    dg: Tensor | None,
    dzT: Tensor | None,
) -> tuple[Tensor, Tensor]:
    if _use_triton(x):
        from fla.ops.gsa.gate import fused_additive_gate_bwd

        with _device(x):
            dx, dz0 = fused_additive_gate_bwd(*_fla(x, z, z0), cu_seqlens, *_fla(dk, dg, dzT))
        return dx, (_empty(x) if dz0 is None else dz0)
    zeros = torch.zeros_like(z)
    dk = zeros if dk is None else dk
    dg = zeros if dg is None else dg
    dzT = z.new_zeros(_n_seqs(x, cu_seqlens), 1, *x.shape[2:]) if dzT is None else dzT
    return _gate_bwd_ref(x, z, z0, cu_seqlens, dk, dg, dzT)


@additive_gate_bwd.register_fake
def _(x, z, z0, cu_seqlens, dk, dg, dzT):
    return torch.empty_like(x), (x.new_empty(0, dtype=torch.float32) if z0 is None else torch.empty_like(z0))


def _gate_setup(ctx, inputs, output):
    x, z0, cu_seqlens, _, _ = inputs
    ctx.save_for_backward(x, output[3], z0, cu_seqlens)
    ctx.mark_non_differentiable(output[3])
    ctx.set_materialize_grads(False)


def _gate_backward(ctx, dk, dg, dzT, _dz):
    x, z, z0, cu_seqlens = ctx.saved_tensors
    if z.numel() == 0 and x.numel() > 0:
        raise RuntimeError("latte::additive_gate: backward needs save_z=True in the forward")
    dx, dz0 = torch.ops.latte.additive_gate_bwd(x, z, z0, cu_seqlens, dk, dg, dzT)
    return dx, (None if z0 is None else dz0), None, None, None


torch.library.register_autograd("latte::additive_gate", _gate_backward, setup_context=_gate_setup)


# ---- gated linear attention -------------------------------------------------


def _gla_ref(q, k, v, g, h0, cu, scale):
    """GLA by its recurrence h_t = exp(g_t) h_{t-1} + k_t v_t^T, o_t = scale
    q_t h_t, per sequence; also every h_t (for the backward)."""
    w = _work(v)
    q, k, v, g = (x.to(w) for x in (q, k, v, g))
    B, T, H, K = q.shape
    o = v.new_empty(B, T, H, v.shape[-1])
    hs = v.new_empty(B, T, H, K, v.shape[-1])
    ht = v.new_empty(_n_seqs(q, cu), H, K, v.shape[-1])
    for n, (row, s, e) in enumerate(_bounds(q, cu)):
        h = v.new_zeros(H, K, v.shape[-1]) if h0 is None else h0[n].to(w)
        for t in range(s, e):
            h = g[row, t].exp().unsqueeze(-1) * h + k[row, t].unsqueeze(-1) * v[row, t].unsqueeze(-2)
            hs[row, t] = h
            o[row, t] = scale * torch.einsum("hk,hkv->hv", q[row, t], h)
        ht[n] = h
    return o, hs, ht


def _gla_bwd_ref(q, k, v, g, h0, cu, do, dht, scale):
    """GLA's gradients from the last token back: dH_t = scale q_t do_t^T +
    exp(g_{t+1}) dH_{t+1} (dht at the end)."""
    w = _work(v)
    _, hs, _ = _gla_ref(q, k, v, g, h0, cu, scale)
    qw, kw, vw, gw, do = (x.to(w) for x in (q, k, v, g, do))
    dq, dk, dv, dg = (torch.zeros_like(x) for x in (qw, kw, vw, gw))
    dh0 = None if h0 is None else torch.zeros_like(h0, dtype=w)
    for n, (row, s, e) in enumerate(_bounds(q, cu)):
        dH = dht[n].to(w) if dht is not None else vw.new_zeros(hs.shape[2:])
        for t in range(e - 1, s - 1, -1):
            if t + 1 < e:
                dH = gw[row, t + 1].exp().unsqueeze(-1) * dH
            dH = dH + scale * qw[row, t].unsqueeze(-1) * do[row, t].unsqueeze(-2)
            h_prev = hs[row, t - 1] if t > s else (vw.new_zeros(hs.shape[2:]) if h0 is None else h0[n].to(w))
            dq[row, t] = scale * torch.einsum("hv,hkv->hk", do[row, t], hs[row, t])
            dk[row, t] = torch.einsum("hkv,hv->hk", dH, vw[row, t])
            dv[row, t] = torch.einsum("hkv,hk->hv", dH, kw[row, t])
            dg[row, t] = gw[row, t].exp() * (dH * h_prev).sum(-1)
        if dh0 is not None:
            dh0[n] = (gw[row, s].exp().unsqueeze(-1) * dH) if e > s else dH
    dh0 = _empty(q) if dh0 is None else dh0.to(h0.dtype)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), dh0


def _fla_indices(T, cu):
    from fla.ops.utils import prepare_chunk_indices

    return CHUNK, (None if cu is None else prepare_chunk_indices(cu, CHUNK))


@torch.library.custom_op("latte::chunk_gla", mutates_args=())
def chunk_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, h0: Tensor | None, cu_seqlens: Tensor | None, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    B, T, H, _ = q.shape
    if _use_triton(q):
        from fla.ops.gla.chunk import chunk_gla_fwd

        BT, ci = _fla_indices(T, cu_seqlens)
        q, k, v, g, h0 = _fla(q, k, v, g, h0)
        with _device(q):
            _, A, _, ht, o = chunk_gla_fwd(
                q, k, v, g, None, scale, h0, True, cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=ci
            )
        return o, ht, A
    o, _, ht = _gla_ref(q, k, v, g, h0, cu_seqlens, scale)
    return o.to(v.dtype), ht, q.new_zeros(B, T, H, CHUNK, dtype=torch.float32)


@chunk_gla.register_fake
def _(q, k, v, g, h0, cu_seqlens, scale):
    B, T, H, K = q.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    w = torch.float64 if v.dtype == torch.float64 else torch.float32
    ht = v.new_empty(N, H, K, v.shape[-1], dtype=w)
    return torch.empty_like(v), ht, q.new_empty(B, T, H, CHUNK, dtype=torch.float32)


@torch.library.custom_op("latte::chunk_gla_bwd", mutates_args=())
def chunk_gla_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    h0: Tensor | None,
    cu_seqlens: Tensor | None,
    A: Tensor,
    do: Tensor,
    dht: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    if _use_triton(q):
        from fla.ops.gla.chunk import chunk_gla_bwd as fla_bwd

        BT, ci = _fla_indices(q.shape[1], cu_seqlens)
        q, k, v, g, h0, A, do, dht = _fla(q, k, v, g, h0, A, do, dht)
        with _device(q):
            dq, dk, dv, dg, dh0 = fla_bwd(
                q, k, v, g, None, scale, h0, None, A, do, dht, cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=ci
            )
        dh0 = _empty(q) if dh0 is None else dh0
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), dh0
    return _gla_bwd_ref(q, k, v, g, h0, cu_seqlens, do, dht, scale)


@chunk_gla_bwd.register_fake
def _(q, k, v, g, h0, cu_seqlens, A, do, dht, scale):
    dh0 = q.new_empty(0, dtype=torch.float32) if h0 is None else torch.empty_like(h0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(g), dh0


def _gla_setup(ctx, inputs, output):
    q, k, v, g, h0, cu_seqlens, scale = inputs
    ctx.save_for_backward(q, k, v, g, h0, cu_seqlens, output[2])
    ctx.scale = scale
    ctx.mark_non_differentiable(output[2])
    ctx.set_materialize_grads(False)


def _gla_backward(ctx, do, dht, _dA):
    q, k, v, g, h0, cu_seqlens, A = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(v)
    dq, dk, dv, dg, dh0 = torch.ops.latte.chunk_gla_bwd(q, k, v, g, h0, cu_seqlens, A, do, dht, ctx.scale)
    return dq, dk, dv, dg, (None if h0 is None else dh0), None, None


torch.library.register_autograd("latte::chunk_gla", _gla_backward, setup_context=_gla_setup)


@torch.library.custom_op("latte::fused_recurrent_gla", mutates_args=())
def fused_recurrent_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, h0: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    if _use_triton(q):
        from fla.ops.gla import fused_recurrent_gla as fla_recurrent

        q, k, v, g, h0 = _fla(q, k, v, g, h0)
        with _device(q):
            return fla_recurrent(q, k, v, gk=g, scale=scale, initial_state=h0, output_final_state=True)
    o, _, ht = _gla_ref(q, k, v, g, h0, None, scale)
    return o.to(v.dtype), ht


@fused_recurrent_gla.register_fake
def _(q, k, v, g, h0, scale):
    B, T, H, K = q.shape
    w = torch.float64 if v.dtype == torch.float64 else torch.float32
    return torch.empty_like(v), v.new_empty(B, H, K, v.shape[-1], dtype=w)


def _recurrent_setup(ctx, inputs, output):
    q, k, v, g, h0, scale = inputs
    ctx.save_for_backward(q, k, v, g, h0)
    ctx.scale = scale
    ctx.set_materialize_grads(False)


def _recurrent_backward(ctx, do, dht):
    """The step's gradients through chunk_gla's backward (A from its forward, run again)."""
    q, k, v, g, h0 = ctx.saved_tensors
    A = torch.ops.latte.chunk_gla(q, k, v, g, h0, None, ctx.scale)[2]
    do = torch.zeros_like(v) if do is None else do
    dq, dk, dv, dg, dh0 = torch.ops.latte.chunk_gla_bwd(q, k, v, g, h0, None, A, do, dht, ctx.scale)
    return dq, dk, dv, dg, (None if h0 is None else dh0), None


torch.library.register_autograd("latte::fused_recurrent_gla", _recurrent_backward, setup_context=_recurrent_setup)
