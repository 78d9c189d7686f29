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
        gates = torch.sigmoid(torch.baddbmm(bias, xg, weight)).to(work)  # [G, B * T, 2 W]
        r, i = gates[..., :W], gates[..., W:]
        log_a = r * (-self.c * F.softplus(self.lam.to(work))).view(G, 1, W)  # <= 0
        u = sqrt_bounded_grad(-torch.expm1(2 * log_a)) * (i * xg.to(work))  # sqrt(1 - alpha^2) i x
        if mask is not None:  # identity step at padding: h passes through unchanged
            m = mask.reshape(1, B * T, 1)
            log_a = torch.where(m, log_a, torch.zeros_like(log_a))
            u = torch.where(m, u, torch.zeros_like(u))
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
