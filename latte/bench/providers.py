"""The attention providers compared by `latte bench ops`: inputs, one call, FLOPs.

Legend: B batch, T time, H heads, L latents per head (Lh), E query/key width,
D value width per head (dv), C chunk size, W window.

Every provider gets fresh random fp32 inputs of the docs/evaluation.md §1 shapes
(B=1, model width 512, H=8, Lh=32, dv=64). Softmax-style providers use
q, k, v with E = D = 64; the Latte providers use latent logits a, b [.., Lh]
and values v [.., dv]. The layer's own projections are not part of any
provider; `proj` measures them separately (x [B, T, 512] -> a, b [T, 256],
v [T, 512], three bias-free nn.Linear-style matmuls, weight gradients
included) so the core can be compared with them.

FLOPs are estimates of the work each implementation performs (matmul-like
multiply-adds counted as 2; exp/softmax not counted); forward+backward is
counted as 3x forward. They give achieved GFLOP/s, not a ranking.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from latte.ops import distributions as dists
from latte.ops import latte_causal, latte_causal_step, linear_attention, macchiato
from latte.ops.macchiato import WindowSpec, _kernels, _mix, _window_phase

from .paper_scan import paper_scan

MODEL_DIM, HEADS, LATENTS, DV = 512, 8, 256, 64  # Lh = LATENTS // HEADS = 32
CHUNK, WINDOW = 64, 128

MODES = ("fwd", "fwdbwd")
MODE_NAME = {"fwd": "forward", "fwdbwd": "forward+backward"}
PROVIDERS = (
    "latte",
    "latte-recurrent",
    "macchiato",
    "macchiato-window-mix",
    "sdpa",
    "naive-softmax",
    "linear",
    "paper-scan",
    "proj",
)
SLOW = ("latte-recurrent", "paper-scan")  # Python loops over time: time-capped
QUADRATIC = ("sdpa", "naive-softmax")


def flops_forward(provider: str, T: int, B: int = 1) -> float:
    H, L, D, E, C, W = HEADS, LATENTS // HEADS, DV, DV, CHUNK, WINDOW
    latte = 2 * T * C * (L + D) + 4 * T * L * D  # intra C x C blocks + state in/out
    per_head = {
        "latte": latte,
        "latte-recurrent": 5 * T * L * D,  # rescale, outer-product add, read-out
        "paper-scan": 5 * T * L * D,
        "macchiato": latte + 4 * T * (2 * W - 1) * E,  # blocked window: W queries x (2W-1) keys
        "macchiato-window-mix": 4 * T * (2 * W - 1) * E,  # the window alone (the mix is elementwise)
        "sdpa": 2 * T * T * E,  # causal half of QK^T and PV (the kernel skips masked blocks)
        "naive-softmax": 4 * T * T * E,  # the full T x T matrix is built
        "linear": 2 * T * C * (E + D) + 4 * T * E * D,  # chunked form
    }
    if provider == "proj":
        return 2 * B * T * MODEL_DIM * (2 * LATENTS + MODEL_DIM)
    return B * H * per_head[provider]


FLOPS_NOTE = {
    "latte": "H*(2TC(L+D) + 4TLD), C=64",
    "latte-recurrent": "H*5TLD",
    "paper-scan": "H*5TLD",
    "macchiato": "latte + H*4T(2W-1)E, W=128",
    "macchiato-window-mix": "H*4T(2W-1)E, W=128",
    "sdpa": "H*2T^2E (causal half)",
    "naive-softmax": "H*4T^2E (full matrix)",
    "linear": "H*(2TC(E+D) + 4TED), C=64",
    "proj": "2T*512*(256+256+512)",
}


def macchiato_window_mix(a, v, q, k, y_lat, *, window: int = WINDOW, chunk: int = CHUNK, backend=None):
    """Macchiato's window phase and mix phase (latte/ops/macchiato.py) on the
    latent phase's output y_lat [B, T, H, D]: what a Macchiato layer adds to
    latte's latent phase (provider "latte"). a [B, T, H, L]; q, k, v [B, T,
    H, D]; the joint mix, no sinks; backend as macchiato's (its window
    kernel: the tiles, or flex_attention under "fla")."""
    spec = WindowSpec(window, scale=q.shape[-1] ** -0.5)
    kernel = _kernels(backend, q, chunk, None)[0]
    y_win, lse, *_ = _window_phase(kernel, spec, chunk, q, k, v, None, None, None, None, None)
    return _mix(y_win, lse, y_lat.to(y_win.dtype), a.to(y_win.dtype), None, None, "joint").to(v.dtype)


def naive_bytes(T: int, mode: str, B: int = 1) -> int:
    """Rough peak of the materialised T x T softmax: scores, masked scores and
    probabilities forward; about twice that with the backward pass."""
    return B * HEADS * T * T * 4 * (3 if mode == "fwd" else 6)


def _recurrent(a, b, v):
    state, ys = None, []
    for t in range(a.shape[1]):
        y, state = latte_causal_step(a[:, t], b[:, t], v[:, t], state)
        ys.append(y)
    return torch.stack(ys, 1)


def _naive(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, T, T]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def make_inputs(
    provider: str,
    T: int,
    B: int = 1,
    seed: int = 0,
    dist: str = "std1",
    heads: int = HEADS,
    latents: int = LATENTS // HEADS,
    dv: int = DV,
) -> tuple[list[torch.Tensor], callable]:
    """(inputs, fn) with fn(*inputs) -> output tensor. `dist` (latte.ops.distributions)
    shapes the key-side logits: b for the Latte providers, k for the softmax
    and linear ones (Macchiato: both); the rest stays standard normal.
    heads / latents (per head) / dv override the docs/evaluation.md §1 shape."""

    g = torch.Generator().manual_seed(seed)
    H, L, D = heads, latents, dv

    def r(*shape):
        return torch.randn(*shape, generator=g)

    def key(*shape):
        return dists.logits(r(*shape), dist)

    if provider in ("latte", "latte-recurrent", "paper-scan"):
        fn = {
            "latte": lambda a, b, v: latte_causal(a, b, v, chunk_size=CHUNK)[0],
            "latte-recurrent": _recurrent,
            "paper-scan": paper_scan,
        }[provider]
        return [r(B, T, H, L), key(B, T, H, L), r(B, T, H, D)], fn
    if provider == "macchiato":

        def fn(a, b, v, q, k):
            return macchiato(a, b, v, q, k, window_size=WINDOW, chunk_size=CHUNK)[0]

        return [r(B, T, H, L), key(B, T, H, L), r(B, T, H, D), r(B, T, H, D), key(B, T, H, D)], fn
    if provider == "macchiato-window-mix":  # a, v, q, k and the latent phase's output
        return [r(B, T, H, L), r(B, T, H, D), r(B, T, H, D), key(B, T, H, D), r(B, T, H, D)], macchiato_window_mix
    if provider in ("sdpa", "naive-softmax"):
        fn = (
            _naive
            if provider == "naive-softmax"
            else (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        )
        return [r(B, H, T, D), key(B, H, T, D), r(B, H, T, D)], fn  # [B, H, T, E]
    if provider == "linear":

        def fn(q, k, v):  # elu + 1 feature map (Katharopoulos et al.), part of the cost
            return linear_attention(F.elu(q) + 1, F.elu(k) + 1, v, chunk_size=CHUNK)[0]

        return [r(B, T, H, D), key(B, T, H, D), r(B, T, H, D)], fn
    if provider == "proj":  # three nn.Linear-style projections, weights as inputs
        ws = [r(n, MODEL_DIM) / math.sqrt(MODEL_DIM) for n in (LATENTS, LATENTS, MODEL_DIM)]
        return [r(B, T, MODEL_DIM), *ws], lambda x, wa, wb, wv: (F.linear(x, wa), F.linear(x, wb), F.linear(x, wv))
    raise ValueError(f"provider: expected one of {PROVIDERS}, got {provider!r}")


def build(provider: str, T: int, mode: str, B: int = 1, dist: str = "std1", **shape):
    """Zero-argument callable running one forward ("fwd", no autograd) or one
    forward+backward ("fwdbwd", gradients of every input and parameter)."""
    args, fn = make_inputs(provider, T, B, dist=dist, **shape)
    return as_call(fn, args, mode)


def as_call(fn, args: list[torch.Tensor], mode: str):
    """fn(*args) as a zero-argument forward or forward+backward call."""
    if mode == "fwd":

        def call():
            with torch.no_grad():
                return fn(*args)

        return call
    if mode != "fwdbwd":
        raise ValueError(f"mode: expected 'fwd' or 'fwdbwd', got {mode!r}")
    leaves = [x.requires_grad_(True) for x in args if x.is_floating_point()]
    grad_out = []  # made on the first (warm-up) call, from the output's shape

    def call_bwd():
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        if not grad_out:
            grad_out.extend(torch.randn_like(o) for o in outs)
        return torch.autograd.grad(outs, leaves, grad_out, allow_unused=True)

    return call_bwd
