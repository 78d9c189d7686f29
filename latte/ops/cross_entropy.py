"""Fused language-model head + cross-entropy, chunked over tokens.

Legend: N tokens, D hidden width, V vocabulary, R rows per chunk.

  loss = sum_{n: target_n != ignore} [logsumexp_v (h_n . W_v) - h_n . W_{target_n}]

The plain form materialises logits [N, V] (4096 tokens x 50257 words is
800 MB in float32), then log_softmax, its gradient and the copies between
them: on the 2-core CPU that is more time than the head's three matmuls.
Here the rows are processed R at a time and, because the loss is a scalar,
each chunk's gradients are formed at once in the forward,
  G = softmax(logits) - onehot(target)   (zero rows for ignored targets)
  dh = G W,   dW += G^T h,
so the backward only scales them by the incoming gradient. No [N, V] tensor
exists at any point; the matmul count is that of the plain form (one forward,
two for the gradients) and no logits are recomputed. When no gradient is
needed the gradient matmuls are skipped.

Under autocast the matmuls run in the autocast dtype (as nn.Linear would)
and the softmax in float32; the weight gradient is accumulated in float32.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._checks import check_rank, values_readable
from ._exp import exp_floor
from .layout import no_autocast

# Rows per chunk are chosen so one chunk's logits hold about this many floats
# (32 MB): large matmuls, small enough to stay out of the page-fault path.
_CHUNK_ELEMS = 1 << 23


def _chunk_rows(V: int, rows: int | None) -> int:
    return max(1, _CHUNK_ELEMS // V) if rows is None else rows


def _chunk(h, W, tgt, ignore_index, need_grad):
    """(loss sum, gradient w.r.t. the chunk's logits or None) for rows h [R, D]."""
    logits = (h @ W.t()).float()  # [R, V]
    valid = tgt != ignore_index
    safe = torch.where(valid, tgt, 0)
    picked = logits.gather(1, safe[:, None]).squeeze(1)
    m = logits.amax(1, keepdim=True)
    # in place (logits are not needed any more); the floor keeps exp off its slow lanes (_exp.py)
    p = logits.sub_(m).clamp_(min=exp_floor(logits.dtype)).exp_()
    s = p.sum(1, keepdim=True)
    lse = (m + s.log()).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    if not need_grad:
        return loss, None
    p.div_(s)
    p[torch.arange(p.shape[0], device=p.device), safe] -= 1.0
    p.mul_(valid[:, None])
    return loss, p


class LinearCrossEntropy(torch.autograd.Function):
    """(h [N, D], W [V, D], targets [N], ignore_index, rows, needs) -> summed loss."""

    @staticmethod
    def forward(ctx, h, W, tgt, ignore_index, rows, needs):
        need_h, need_W = needs
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        dh = torch.empty_like(h) if need_h else None
        dW = torch.zeros(W.shape, dtype=torch.float32, device=W.device) if need_W else None
        for r0 in range(0, h.shape[0], rows):
            hc = h[r0 : r0 + rows]
            loss, G = _chunk(hc, W, tgt[r0 : r0 + rows], ignore_index, need_h or need_W)
            total += loss
            if G is None:
                continue
            G = G.to(h.dtype)
            if need_h:
                torch.mm(G, W, out=dh[r0 : r0 + rows])
            if need_W:
                dW.addmm_(G.t().to(dW.dtype), hc.to(dW.dtype))
        ctx.save_for_backward(dh, None if dW is None else dW.to(W.dtype))
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        dh, dW = ctx.saved_tensors
        return (
            None if dh is None else dh * grad.to(dh.dtype),
            None if dW is None else dW * grad.to(dW.dtype),
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of the logits hidden @ weight.T, never formed whole.

    Args:
        hidden: [N, D] floating; weight: [V, D] (an LM head's nn.Linear weight).
        targets: [N] integer classes in [0, V), or ignore_index (skipped).
        chunk_rows: rows per chunk (default: about 32 MB of logits per chunk).
    Returns:
        a float32 scalar: the sum over non-ignored rows (divide by their count
        for the mean). Differentiable w.r.t. hidden and weight.
    """
    check_rank("hidden", hidden, 2, "[N, D]")
    check_rank("weight", weight, 2, "[V, D]")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden, weight: widths must match ([N, D] and [V, D]), got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if (
        not isinstance(targets, torch.Tensor)
        or targets.dtype not in (torch.int64, torch.int32)
        or tuple(targets.shape) != (hidden.shape[0],)
    ):
        got = f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ValueError(f"targets: expected an integer tensor [N] = ({hidden.shape[0]},), got {got}")
    V = weight.shape[0]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= V))
    # a value check reads back to the host: where values_readable allows (the
    # models check their labels before this)
    if values_readable(targets) and bool(bad.any()):
        raise ValueError(
            f"targets: found {int(targets[bad][0])}; targets must be in [0, {V - 1}] or ignore_index ({ignore_index})"
        )
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"chunk_rows: expected an integer >= 1 or None, got {chunk_rows!r}")
    device = hidden.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):  # what nn.Linear would compute in
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif hidden.dtype != weight.dtype:
        raise ValueError(f"hidden, weight: dtypes must match outside autocast, got {hidden.dtype} and {weight.dtype}")
    grad = torch.is_grad_enabled()
    needs = (grad and hidden.requires_grad, grad and weight.requires_grad)
    with no_autocast(device):
        return LinearCrossEntropy.apply(
            hidden.contiguous(), weight, targets.long(), ignore_index, _chunk_rows(V, chunk_rows), needs
        )
