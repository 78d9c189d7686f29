"""The authors' causal Latte scan (paper appendix, Listing 1), in torch.

The reference point the paper measured: a loop over time carrying, per head
and latent, an unnormalised value sum `csum`, its normaliser `norm_cumsum` and
the running maximum of the key logits. Written here from the algorithm, step
by step, so the benchmark compares against the same amount of work per token.
The project's own recurrence (docs/math.md §3.1) carries a log-normaliser instead;
both are exact (tests/bench/test_paper_scan.py ties this one to the float64
reference).

Legend: B batch, T time, H heads, L latents per head, D value width per head.
"""

from __future__ import annotations

import torch


def paper_scan(a_BTHL: torch.Tensor, b_BTHL: torch.Tensor, v_BTHD: torch.Tensor) -> torch.Tensor:
    """Causal Latte by the appendix scan: a, b [B, T, H, L] query/key latent
    logits (already projected), v [B, T, H, D]. Returns y [B, T, H, D]."""
    B, T, H, L = a_BTHL.shape
    D = v_BTHD.shape[-1]
    q_BTHL = torch.softmax(a_BTHL, dim=-1)  # p(l|t), computed up front as in the listing
    mx_BTHL = torch.cummax(b_BTHL, dim=1).values  # running max of key logits over time
    csum = v_BTHD.new_zeros(B, H, L, D)  # sum_s exp(b_s - mx_t) v_s
    norm = v_BTHD.new_zeros(B, H, L)  # sum_s exp(b_s - mx_t)
    prev_mx = b_BTHL[:, 0]  # the listing starts the carry's max at K[0]
    ys = []
    for t in range(T):
        c_mx = mx_BTHL[:, t]
        revert = torch.exp(prev_mx - c_mx)  # rescale old sums to the new max (<= 1)
        add = torch.exp(b_BTHL[:, t] - c_mx)  # weight of the new token (<= 1)
        norm = norm * revert + add
        csum = csum * revert.unsqueeze(-1) + add.unsqueeze(-1) * v_BTHD[:, t].unsqueeze(-2)
        # y_t = sum_l p(l|t) csum_l / norm_l
        ys.append(torch.einsum("bhl,bhld->bhd", q_BTHL[:, t] / norm, csum))
        prev_mx = c_mx
    return torch.stack(ys, dim=1)
