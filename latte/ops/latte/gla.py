"""Causal Latte as a gated linear attention, run by fla-core's kernels
(docs/math.md §3.2; backend "fla", see backend.py).

Legend: B batch, T time, H heads, L latents per head (the GLA key width),
D value width per head, N documents of a packed batch.

With z_t = logaddexp(z_0, logcumsumexp_{s<=t} b_s) per latent (z_0 the
state's log-normaliser, -inf without one):
  query  q_t = softmax(a_t)
  key    k_t = exp(b_t - z_t)           in [0, 1]
  decay  g_t = z_{t-1} - z_t            <= 0 (log space, per key channel)
  scale  1
GLA's state h_t = exp(g_t) h_{t-1} + k_t v_t^T is then Latte's normalised
state S_t = sum_s exp(b_s - z_t) v_s (the decays telescope to exp(z_s - z_t)),
and o_t = q_t h_t is y_t. The state (S, z) of LatteState maps one to one:
S is GLA's h, z is kept beside it.

Three constructions of q, k, g (backend.FLA_CONSTRUCTIONS; "auto", the
default, takes "fused" where fused_wins says so, else "eager"):

"fused" (fused_chunked, fused_step): q = softmax(a) in the kernel's dtype,
then fla's gate fused_additive_gate (custom op latte::additive_gate,
gla_ops.py) makes k, g (float32) and z in one pass over b, from the
state's z, per document with cu_seqlens; one kernel forward, one backward.
Its scan runs each sequence serially, one program per 32 of the H x L
channels: fused_wins keeps "eager" where few programs would scan long
sequences. Guards:
- float32 b is centred on its largest value per latent (as below); a
  bf16 / fp16 b is not (its 8-bit mantissa has lost a large common
  offset's precision before latte sees it), which saves a pass over b.
- masked tokens get b = NEG and v = 0 before the gate: a masked token after
  real ones has k = 0; one before any (left padding) has k = exp(NEG - NEG)
  = 1 against v = 0, so it adds nothing. g is clamped at G_FLOOR after the
  gate where a mask or a state is given (the first real token after left
  padding has g = NEG - b), and a sequence with no real token ends in the
  empty state's z = -inf.
Counted on `meta` tensors at B 16, T 4096, H 16, L 128, bf16 (latte/bench/
op_count.py): 2 ops each way beside chunk_gla's, 2.0 GiB read and written
forward, 2.5 GiB backward (the eager construction: 20 and 70 ops, 14.5 and
50 GiB). Not yet timed on a GPU.

"eager" (gla_inputs; "compiled": the same through torch.compile), two
guards, both exact to far below float32 precision:
- b is centred on its largest value per latent (p(s|l,t) does not change)
  so that z keeps float32 precision when all logits share a large offset.
- g is clamped at G_FLOOR: a jump of z by more than 40 (a logit far above
  everything before it, or the first real token after masked ones, whose
  logits are -1e30) leaves at most exp(-40) = 4e-18 of the old state instead
  of 0, and keeps the kernels' in-chunk cumulative sums of g small, so their
  float32 differences stay precise.
Masked tokens (mask False) get k = 0: they add nothing and leave z as it is.
Gradients flow through this construction by autograd and through the GLA
kernel by its custom op's backward (fla's).
z is formed in two levels (log_normalisers): a logcumsumexp inside chunks
of Z_CHUNK tokens, all chunks at once, then one over the n = T / Z_CHUNK
chunk totals, combined with one logaddexp; no scan runs T steps long, in
the forward or in autograd's backward.

Every construction calls chunk_gla and fused_recurrent_gla through the
custom ops of gla_ops.py (no graph break under torch.compile). The
kernel's output stays in its dtype (bf16 for bf16 inputs): latte_causal
returns it as it is.

fla's kernels run float32 dots in TF32 on Ampere and newer GPUs (relative
errors ~1e-3); TRITON_F32_DEFAULT=ieee in the environment before the first
call makes them exact float32 (docs/gpu.md §4).
"""

from __future__ import annotations

import functools

import torch

from .. import backend as BK
from .._checks import NEG, state_dtype
from ..varlen import pack, unpack
from . import fla_tuning, gla_ops  # noqa: F401 (gla_ops registers the latte:: custom ops)

# Smallest log-decay passed to the kernels (see the module docstring).
G_FLOOR = -40.0

# Tokens per chunk of the two-level log-normaliser (log_normalisers).
Z_CHUNK = 64

_HALF = (torch.bfloat16, torch.float16)

# The size rule of the "auto" construction (fused_wins): fla's gate runs one
# program per GATE_CHANNELS of the H * L channels of a sequence, each
# scanning the sequence serially. Guesses, not yet timed on a GPU
# (docs/gpu.md §2.3): about one program per SM of an H100 / H200, and the
# length where chunk_gla's own time stops hiding a serial scan.
GATE_CHANNELS = 32
GATE_MIN_PROGRAMS = 128
GATE_MAX_SERIAL_T = 8192


def _kernels():
    """(chunk_gla, fused_recurrent_gla) with fla-core's signatures, through
    the custom ops of gla_ops.py (fla's Triton kernels on CUDA, one op each
    way, no graph break under torch.compile), their autotuners pinned to one
    configuration each on the first call (fla_tuning.py); the tests swap in
    pure-torch stand-ins with the same signatures."""
    if torch.cuda.is_available():  # not under Triton's CPU interpreter
        fla_tuning.pin_for_device(torch.cuda.current_device())
    return _op_chunk_gla, _op_fused_recurrent_gla


def _op_chunk_gla(q, k, v, g, scale=1.0, initial_state=None, output_final_state=True, cu_seqlens=None):
    o, ht, _ = torch.ops.latte.chunk_gla(q, k, v, g, initial_state, cu_seqlens, scale)
    return o, ht


def _op_fused_recurrent_gla(q, k, v, g, scale=1.0, initial_state=None, output_final_state=True):
    return torch.ops.latte.fused_recurrent_gla(q, k, v, g, initial_state, scale)


def _pin(x):
    """fla's autotuners pinned before its kernels first run on CUDA (the
    custom ops of gla_ops.py call them; on the CPU their stand-ins run)."""
    if x.device.type == "cuda":
        fla_tuning.pin_for_device(x.device.index if x.device.index is not None else torch.cuda.current_device())


def _masked(b, mask):
    """Key logits of padding (mask False) become NEG, as in causal.mask_keys."""
    return b if mask is None else b.masked_fill(~mask.view(*mask.shape, *([1] * (b.dim() - mask.dim()))), NEG)


def log_normalisers(bc, z_before, chunk=Z_CHUNK):
    """z_t = logaddexp(z_before, logcumsumexp_{s<=t} bc_s) for bc [B, T, H, L]
    (finite) and z_before [B, 1, H, L] (-inf: nothing before), in two levels:
    inside chunks of `chunk` tokens, then over the chunk totals. Everything
    stays finite (-inf becomes NEG, which adds exactly nothing): logcumsumexp's
    backward gives NaN at a -inf entry."""
    B, T, H, L = bc.shape
    n = -(-T // chunk)
    x = torch.nn.functional.pad(bc, (0, 0, 0, 0, 0, n * chunk - T), value=NEG).view(B, n, chunk, H, L)
    within = torch.logcumsumexp(x, dim=2)  # [B, n, chunk, H, L]
    totals = torch.cat([z_before.clamp(min=NEG), within[:, :, -1]], 1)  # [B, n + 1, H, L]: before, each chunk's
    before = torch.logcumsumexp(totals, dim=1)[:, :-1]  # z before each chunk
    return torch.logaddexp(within, before.unsqueeze(2)).flatten(1, 2)[:, :T]


def gla_inputs(a, b, *, mask=None, z0=None):
    """a, b [B, T, H, L], mask [B, T] bool, z0 [B, H, L] (None: no earlier
    tokens) -> q, k, g [B, T, H, L] in the work dtype (float32, float64 for
    float64 inputs) and z after the last token [B, H, L]."""
    work = state_dtype(a.dtype)
    q = torch.softmax(a.to(work), dim=-1)
    b = _masked(b.to(work), mask)
    c = b.amax(1) if z0 is None else torch.maximum(b.amax(1), z0.to(work))
    c = c.detach()  # [B, H, L]: a shift that cancels in k and g (precision only)
    bc = b - c.unsqueeze(1)
    if z0 is None:
        z_before = torch.full_like(bc[:, :1], float("-inf"))
    else:
        z_before = (z0.to(work) - c).unsqueeze(1)
    z = log_normalisers(bc, z_before)  # [B, T, H, L]
    k = torch.exp(bc - z)
    if mask is not None:
        k = k.masked_fill(~mask[:, :, None, None], 0.0)
    g = (torch.cat([z_before, z[:, :-1]], 1) - z).clamp(G_FLOOR, 0.0)
    return q, k, g, z[:, -1] + c


def kernel_inputs(a, b, io_dtype, mask=None, z0=None):
    """gla_inputs with q and k cast to the kernel's input dtype: everything
    backend "fla" computes before the kernel, in one function that
    torch.compile can fuse whole (the "compiled" construction)."""
    q, k, g, z = gla_inputs(a, b, mask=mask, z0=z0)
    return q.to(io_dtype), k.to(io_dtype), g, z


@functools.cache
def _compiled_inputs():
    """kernel_inputs through torch.compile, built on first use: dynamic
    shapes (one compile serves every length and batch, bar torch's size-1
    specialisation), one graph (a break would be a bug, not a slow path)."""
    return torch.compile(kernel_inputs, dynamic=True, fullgraph=True)


def fused_wins(n_seqs: int, T: int, H: int, L: int) -> bool:
    """The size rule of construction "auto": the fused gate, unless it would
    run fewer than GATE_MIN_PROGRAMS programs, each scanning more than
    GATE_MAX_SERIAL_T tokens (then the two-level construction, "eager")."""
    programs = n_seqs * -(-(H * L) // GATE_CHANNELS)
    return programs >= GATE_MIN_PROGRAMS or T <= GATE_MAX_SERIAL_T


def construction(n_seqs: int, T: int, H: int, L: int) -> str:
    """The construction that runs: the one in force, "auto" resolved by fused_wins."""
    name = BK.get_fla_construction()
    if name == "auto":
        return "fused" if fused_wins(n_seqs, T, H, L) else "eager"
    return name


def _inputs(a, b, io_dtype, mask=None, z0=None):
    """q, k (io_dtype), g, z by the construction in force (backend.get_fla_construction);
    inside a caller that torch.compile traces, traced with it."""
    if BK.get_fla_construction() == "compiled" and not torch.compiler.is_compiling():
        return _compiled_inputs()(a, b, io_dtype, mask=mask, z0=z0)
    return kernel_inputs(a, b, io_dtype, mask=mask, z0=z0)


def _io_dtype(v):
    """q, k, v go to the kernels in v's dtype when it is half precision,
    float32 otherwise; g and the state are float32. (float64 passes through
    for the tests' stand-in kernels; backend.py never sends it to fla.)"""
    return v.dtype if v.dtype in _HALF else state_dtype(v.dtype)


def _call(kernel, q, k, v, g, S0, **kw):
    io, work = _io_dtype(v), state_dtype(v.dtype)
    S0 = None if S0 is None else S0.to(work).contiguous()
    # q, k from _inputs are in io already (.to is then a no-op); gla_step's are cast here
    return kernel(q.to(io), k.to(io), v.to(io), g.to(work), scale=1.0, initial_state=S0, output_final_state=True, **kw)


def _bcast(mask, x):
    """mask [B, T] (or [B]) shaped to broadcast over x's trailing dims."""
    return mask.view(*mask.shape, *([1] * (x.dim() - mask.dim())))


def _fused_keys(b, mask, z0, packed):
    """The gate's input: b with masked keys at NEG, centred on its largest
    value per latent when b is float32 (a half-precision b has lost a large
    common offset's precision already: bf16 keeps 8 bits), and the centred
    initial z [N, 1, H, L] (None: no state). Packed (cu_seqlens, B = 1): one
    shift for all documents. Returns (x, z0, c [B, H, L] or None)."""
    x = b if mask is None else b.masked_fill(~_bcast(mask, b), NEG)
    c = None
    if b.dtype not in _HALF:
        c = x.amax(1)
        if z0 is not None:
            c = torch.maximum(c, z0.to(x.dtype).amax(0, keepdim=True) if packed else z0.to(x.dtype))
        c = torch.where(c > NEG / 2, c, 0.0).detach()  # [B, H, L]; all masked: 0
        x = x - c.unsqueeze(1)
    if z0 is not None:
        z0 = (z0.to(state_dtype(b.dtype)) - (0.0 if c is None else c)).unsqueeze(1).contiguous()
    return x, z0, c


def fused_chunked(a, b, v, S0=None, z0=None, mask=None, cu_seqlens=None):
    """gla_chunked by the "fused" construction: q = softmax(a) in the io
    dtype, k, g, z by fla's gate (latte::additive_gate, one kernel each way,
    packed documents through cu_seqlens), then chunk_gla. Masked tokens:
    b = NEG and v = 0 before the gate (a leading one then has k = 1 and adds
    0), g clamped at G_FLOOR after it (the first real token after leading
    padding meets z = NEG); a sequence with no real token ends in the empty
    state's z = -inf."""
    io = _io_dtype(v)
    q = torch.softmax(a.to(io), dim=-1)
    x, z0g, c = _fused_keys(b, mask, z0, cu_seqlens is not None)
    if mask is not None:
        v = v.masked_fill(~_bcast(mask, v), 0.0)
    save_z = torch.is_grad_enabled() and (b.requires_grad or (z0 is not None and z0.requires_grad))
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
    k, g, zT, _ = torch.ops.latte.additive_gate(x, z0g, cu, io, save_z)
    if mask is not None or z0 is not None:  # a jump from NEG (padding, an empty state's z)
        g = g.clamp(min=G_FLOOR)
    work = state_dtype(v.dtype)
    S0 = None if S0 is None else S0.to(work).contiguous()
    y, S, _ = torch.ops.latte.chunk_gla(q, k, v.to(io), g, S0, cu, 1.0)
    z = zT.squeeze(1) if c is None else zT.squeeze(1) + c  # c: [1, H, L] when packed
    if mask is not None:
        z = torch.where(z > NEG / 2, z, float("-inf"))
    return y, S, z


def fused_step(a_t, b_t, v_t, S, z, mask_t=None):
    """gla_step by the "fused" construction: the gate on one token from z
    (-inf: empty), then fused_recurrent_gla. A masked token (b = NEG, v = 0)
    keeps z as it was."""
    work, io = S.dtype, _io_dtype(v_t)
    x = b_t.to(work).unsqueeze(1)  # [B, 1, H, L]
    v = v_t.unsqueeze(1)
    if mask_t is not None:
        x = x.masked_fill(~_bcast(mask_t, x), NEG)
        v = v.masked_fill(~_bcast(mask_t, v), 0.0)
    save_z = torch.is_grad_enabled() and (b_t.requires_grad or z.requires_grad)
    k, g, zT, _ = torch.ops.latte.additive_gate(x, z.unsqueeze(1).contiguous(), None, io, save_z)
    q = torch.softmax(a_t.to(io), -1).unsqueeze(1)
    y, S_new = torch.ops.latte.fused_recurrent_gla(q, k, v.to(io), g.clamp(min=G_FLOOR), S.contiguous(), 1.0)
    z_new = zT.squeeze(1) if mask_t is None else torch.where(_bcast(mask_t, z), zT.squeeze(1), z)
    return y[:, 0], S_new, z_new


def gla_chunked(a, b, v, S0=None, z0=None, mask=None, cu_seqlens=None):
    """Causal Latte on chunk_gla (inputs checked by the caller): a, b [B, T,
    H, L], v [B, T, H, D], the state (S0 [N, H, L, D], z0 [N, H, L]) or None.
    Returns y [B, T, H, D] as the kernel gives it (v's dtype when half, else
    the work dtype), S, z after the last token (per document with
    cu_seqlens, B == 1: the eager constructions run per document on a
    padded copy, as z restarts at each start, the fused one on the packed
    tensors, as the kernel does). The construction: construction()'s,
    "auto" resolved by the size rule fused_wins."""
    io = _io_dtype(v)
    B, T, H, L = a.shape
    n_seqs = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if construction(n_seqs, T, H, L) == "fused":
        _pin(a)
        return fused_chunked(a, b, v, S0, z0, mask, cu_seqlens)
    if cu_seqlens is None:
        q, k, g, z = _inputs(a, b, io, mask=mask, z0=z0)
        y, S = _call(_kernels()[0], q, k, v, g, S0)
        return y, S, z

    (a_pad, doc), (b_pad, _) = unpack(a, cu_seqlens), unpack(b, cu_seqlens)
    run_mask = doc if mask is None else doc & unpack(mask.unsqueeze(-1), cu_seqlens)[0].squeeze(-1)
    q, k, g, z = _inputs(a_pad, b_pad, io, mask=run_mask, z0=z0)
    q, k, g = (pack(x, doc) for x in (q, k, g))  # [1, T, H, L]
    y, S = _call(_kernels()[0], q, k, v, g, S0, cu_seqlens=cu_seqlens.long())
    return y, S, z


def gla_step(a_t, b_t, v_t, S, z, mask_t=None):
    """One decoding step on fused_recurrent_gla: a_t, b_t [B, H, L], v_t
    [B, H, D], the state S [B, H, L, D], z [B, H, L] (z = -inf: empty) in the
    work dtype -> (y_t [B, H, D], S, z after the token)."""
    if construction(a_t.shape[0], 1, a_t.shape[1], a_t.shape[2]) == "fused":
        _pin(a_t)
        return fused_step(a_t, b_t, v_t, S, z, mask_t)
    work = S.dtype
    b = _masked(b_t.to(work), mask_t)
    z_new = torch.logaddexp(z, b)
    k = torch.exp(b - z_new)
    if mask_t is not None:
        k = k.masked_fill(~mask_t[:, None, None], 0.0)
    g = (z - z_new).clamp(G_FLOOR, 0.0)  # -inf (empty state) -> G_FLOOR: the state is 0 anyway
    q = torch.softmax(a_t.to(work), -1)
    y, S_new = _call(_kernels()[1], q.unsqueeze(1), k.unsqueeze(1), v_t.unsqueeze(1), g.unsqueeze(1), S)
    return y[:, 0], S_new, z_new
