"""qk mixers: give the latent logits a sense of order (docs/math.md §5).

Legend: B batch, T time, F feature width (the layer's dim), K conv kernel,
G gate blocks (one per head), W width of a block (F / G).

Latent logits a = W_a u, b = W_b u carry no position by themselves; the mixer
turns the layer input x into u (values keep using the raw x):
  none        u = x
  conv        u = depthwise conv1d over time (causal: kernel sees t-K+1..t)
  rglru       u = RG-LRU(x)
  conv_rglru  u = RG-LRU(conv(x))       (the default for causal LMs)

Padding: the mixer input is zeroed at padded positions and the RG-LRU takes an
identity step there (decay 1, input 0). With a zero initial state a conv then
sees exactly what the unpadded sequence sees for left padding (zeros before the
first real token) and right padding (nothing after the last one matters);
the RG-LRU is exact for any padding pattern.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from latte._checks import check_positive_int
from latte.ops import linear_recurrence
from latte.ops._checks import state_dtype  # float32 states, float64 kept for the references

from ._checks import check_choice, check_divides

QK_MIXERS = ("none", "conv", "rglru", "conv_rglru")
MAX_SQRT_GRAD = 1000.0  # cap of d sqrt(x) / dx, as in Griffin / recurrentgemma


class _SqrtBoundedGrad(torch.autograd.Function):
    """sqrt(x) whose derivative 1 / (2 sqrt(x)) is capped at MAX_SQRT_GRAD.

    sqrt(1 - alpha^2) has an infinite derivative at alpha = 1, which bf16
    rounding reaches easily (and float32 reaches when softplus(lam) underflows);
    inf * 0 then turns every upstream gradient into NaN."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sqrt(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad / torch.sqrt((4 * x).clamp(min=1.0 / MAX_SQRT_GRAD**2))


def sqrt_bounded_grad(x: torch.Tensor) -> torch.Tensor:
    return _SqrtBoundedGrad.apply(x)


class _RGLRUGates(torch.autograd.Function):
    """The RG-LRU's element-wise part, with an analytic backward (one
    autograd node instead of ~12 at the research-sweep size, where their
    per-op overhead and passes over memory dominated):

      r, i = sigmoid(pre)              pre [G, N, 2W]: r's columns, then i's
      log_a = r * ncs                  ncs [G, 1, W] = -c softplus(lam)
      u = sqrt(1 - exp(2 log_a)) * i * x
      log_a, u = 0 at padding (mask [1, N, 1]): an identity step

    The derivative of the square root is capped as in sqrt_bounded_grad.
    Float32 inside for lower-precision inputs (float64 kept)."""

    @staticmethod
    def forward(ctx, pre, x, ncs, mask):
        work = state_dtype(pre.dtype)
        W = x.shape[-1]
        gates = torch.sigmoid(pre.to(work))
        r, i = gates[..., :W], gates[..., W:]
        log_a = r * ncs.to(work)
        s = torch.mul(log_a, 2.0).expm1_().neg_().sqrt_()  # sqrt(1 - alpha^2)
        u = i * x.to(work)
        u.mul_(s)
        if mask is not None:
            log_a.masked_fill_(~mask, 0.0)
            u.masked_fill_(~mask, 0.0)
        ctx.save_for_backward(gates, x, ncs, s, mask)
        ctx.dtypes = pre.dtype, x.dtype, ncs.dtype
        return log_a, u

    @staticmethod
    def backward(ctx, g_log_a, g_u):
        gates, x, ncs, s, mask = ctx.saved_tensors
        work, W = gates.dtype, x.shape[-1]
        r, i = gates[..., :W], gates[..., W:]
        xw, ncs_w = x.to(work), ncs.to(work)
        if mask is not None:  # the outputs are constants at padding
            g_log_a, g_u = g_log_a * mask, g_u * mask
        g_s = i * xw
        g_s.mul_(g_u)  # d/ds of s * i * x
        g_x = g_u * s  # d/d(i x), then split between i and x
        # ds/dlog_a = -2 alpha^2 * d sqrt(y)/dy at y = 1 - alpha^2, capped: 1 / max(2 s, 1 / MAX)
        a2 = torch.mul(r, ncs_w).mul_(2.0).exp_()
        den = torch.mul(s, 2.0).clamp_(min=1.0 / MAX_SQRT_GRAD)
        g_log_a = torch.addcdiv(g_log_a, g_s.mul_(a2), den, value=-2.0)
        g_gates = torch.cat([g_log_a * ncs_w, g_x * xw], -1)  # (no strided out=: torch.compile)
        g_ncs = (g_log_a * r).sum(1, keepdim=True)
        g_pre = torch.ops.aten.sigmoid_backward(g_gates, gates)
        g_x.mul_(i)
        dt_pre, dt_x, dt_ncs = ctx.dtypes
        return g_pre.to(dt_pre), g_x.to(dt_x), g_ncs.to(dt_ncs), None


class DepthwiseConv(nn.Module):
    """Per-channel conv over time: x [B, T, F] -> [B, T, F].

    causal=True: output t sees inputs t-K+1..t; the K-1 inputs before the
    chunk come from the state [B, K-1, F] (zeros at the sequence start), and
    the last K-1 inputs are returned as the new state (float32).
    causal=False ("same" conv, for encoders): t sees t-(K-1)//2 .. t+K//2,
    zeros beyond either end; no state.
    """

    def __init__(self, dim: int, kernel_size: int, *, causal: bool = True):
        super().__init__()
        self.kernel_size, self.causal = kernel_size, causal
        self.weight = nn.Parameter(torch.empty(dim, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.kernel_size)  # torch's Conv1d default for fan_in = K
        self.weight.uniform_(-bound, bound)
        self.bias.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, kernel_size={self.kernel_size}, causal={self.causal}"

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, Fw = x.shape
        K = self.kernel_size
        if not self.causal:
            xx = F.pad(x.transpose(1, 2), ((K - 1) // 2, K // 2))  # [B, F, T + K - 1]
            return F.conv1d(xx, self.weight, self.bias, groups=Fw).transpose(1, 2), None
        if state is None:
            state = x.new_zeros(B, K - 1, Fw)
        xx = torch.cat([state.to(x.dtype), x], 1)  # [B, K - 1 + T, F]
        new_state = xx[:, T:].to(state_dtype(x.dtype))  # [B, K - 1, F]: the last K - 1 inputs
        y = F.conv1d(xx.transpose(1, 2), self.weight, self.bias, groups=Fw)  # [B, F, T]
        return y.transpose(1, 2), new_state


class RGLRU(nn.Module):
    """Real-Gated Linear Recurrent Unit (Griffin, De et al. 2024), docs/math.md §5:

      r_t = sigmoid(W_r x_t + c_r),  i_t = sigmoid(W_i x_t + c_i)
      log alpha_t = -c r_t softplus(lam)          (c = 8)
      h_t = alpha_t h_{t-1} + sqrt(1 - alpha_t^2) (i_t x_t)

    W_r, W_i are block-diagonal (one W x W block per head). lam is initialised
    so that alpha = exp(-softplus(lam)) lies in [0.9, 0.999] with alpha^2
    uniform (recurrentgemma's rnn_param_init). The recurrence runs in float32
    with `latte.ops.linear_recurrence`; the state h is float32 [B, F].
    """

    def __init__(self, dim: int, num_blocks: int, *, c: float = 8.0, min_rad: float = 0.9, max_rad: float = 0.999):
        super().__init__()
        check_divides("num_heads", num_blocks, "dim", dim)
        self.num_blocks, self.c = num_blocks, c
        self.min_rad, self.max_rad = min_rad, max_rad
        W = dim // num_blocks
        self.w_r = nn.Parameter(torch.empty(num_blocks, W, W))
        self.c_r = nn.Parameter(torch.empty(dim))
        self.w_i = nn.Parameter(torch.empty(num_blocks, W, W))
        self.c_i = nn.Parameter(torch.empty(dim))
        self.lam = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        W = self.w_r.shape[-1]
        for w in (self.w_r, self.w_i):
            w.normal_(0.0, W**-0.5)
        self.c_r.zero_()
        self.c_i.zero_()
        alpha = torch.empty_like(self.lam).uniform_(self.min_rad**2, self.max_rad**2).sqrt()
        self.lam.copy_(torch.log(1.0 / alpha - 1.0))  # softplus(lam) = -log(alpha)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, F], h [B, F] float32 or None (zeros), mask [B, T] bool.
        Returns (y [B, T, F] in x's dtype, h after the last token [B, F] float32).

        Block-major inside ([G, B * T, W]): both gates come from one batched
        matmul over the blocks, and the recurrence runs on [G * B, T, W]."""
        B, T, Fw = x.shape
        G = self.num_blocks
        W = Fw // G
        work = state_dtype(x.dtype)
        xg = x.reshape(B * T, G, W).transpose(0, 1)  # [G, B * T, W] (a view)
        weight = torch.cat([self.w_r, self.w_i], -1)  # [G, W, 2 W]: r's columns, then i's
        bias = torch.cat([self.c_r.view(G, 1, W), self.c_i.view(G, 1, W)], -1)
        ncs = (-self.c * F.softplus(self.lam.to(work))).view(G, 1, W)  # log alpha = ncs * r <= 0
        m = None if mask is None else mask.reshape(1, B * T, 1)  # identity step at padding
        log_a, u = _RGLRUGates.apply(torch.baddbmm(bias, xg, weight), xg, ncs, m)  # [G, B * T, W]
        h0 = x.new_zeros(G * B, W, dtype=work) if h is None else h.to(work).view(B, G, W).transpose(0, 1).reshape(-1, W)
        if T == 1:  # decoding step
            hg = torch.exp(log_a.view(G * B, W)) * h0 + u.view(G * B, W)
            y = hg
        else:
            y, hg = linear_recurrence(
                u.reshape(G * B, T, W), log_a.reshape(G * B, T, W), initial_state=h0, output_final_state=True
            )
        y = y.reshape(G, B, T, W).permute(1, 2, 0, 3).reshape(B, T, Fw)
        return y.to(x.dtype), hg.view(G, B, W).transpose(0, 1).reshape(B, Fw)

    def extra_repr(self) -> str:
        return f"num_blocks={self.num_blocks}, c={self.c}, alpha_init=[{self.min_rad}, {self.max_rad}]"


class QKMixer(nn.Module):
    """The qk mixer of a Latte / Macchiato layer: x [B, T, F] -> u [B, T, F].

    forward(x, mask=None, conv_state=None, h=None) -> (u, conv_state, h); the
    states are None for parts the mixer does not have. causal=False allows
    "none" and "conv" (a centred conv); the RG-LRU is causal only.
    """

    def __init__(self, dim: int, num_heads: int, kind: str = "conv_rglru", *, conv_size: int = 3, causal: bool = True):
        super().__init__()
        check_choice("qk_mixer", kind, QK_MIXERS)
        check_positive_int("conv_size", conv_size)
        if not causal and "rglru" in kind:
            raise ValueError(
                f"qk_mixer: {kind!r} is causal-only (the RG-LRU scans left to right); "
                "with causal=False use 'none' or 'conv' (a centred conv)"
            )
        self.kind = kind
        self.conv = DepthwiseConv(dim, conv_size, causal=causal) if "conv" in kind else None
        self.rglru = RGLRU(dim, num_heads) if "rglru" in kind else None

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        conv_state: torch.Tensor | None = None,
        h: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        if self.kind == "none":
            return x, None, None
        if mask is not None:  # padding carries nothing into the mixer
            x = x * mask.unsqueeze(-1).to(x.dtype)
        if self.conv is not None:
            x, conv_state = self.conv(x, conv_state)
        if self.rglru is not None:
            x, h = self.rglru(x, h, mask)
        return x, conv_state, h
