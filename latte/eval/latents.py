"""Latent utilisation (docs/evaluation.md section 6): are the latents used, or
has a layer collapsed onto a few of them?

Legend: B batch, T time, H heads, L latents per head.

For every Latte / Macchiato layer and head, over the evaluated tokens t:
  p(l|t) = softmax_l(a_t)                 the query's distribution over latents
  pbar_l = mean_t p(l|t)                  how much each latent is used overall
  entropy = -sum_l pbar_l log pbar_l      (nats; log L when all are used alike)
  effective latents = exp(entropy)        in [1, L]
  used fraction = #{l : pbar_l > 1 / (10 L)} / L
For Macchiato, p(l|t) is the distribution inside the latent branch, and the
window's share p(window|t) = p(l=0|t) = sigmoid(m_t) (docs/math.md section 4;
"joint": m_t = lse_window_t - logsumexp_l(a_t) - beta) is reported as its
mean, quantiles, a histogram and its mean by position in the window.

The quantities are recomputed from each layer's own input (captured with a
forward pre-hook) and its own projections, so they are exactly those of the
forward pass.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from latte.data import TokenWindows, iter_eval_batches
from latte.layers import LatteAttention, MacchiatoAttention
from latte.layers.llama_projections import project_qkv
from latte.layers.rope import real_positions
from latte.ops import sliding_window_attention_lse
from latte.reporting import pyplot, save_figure

HIST_BINS = 20


def utilisation(pbar: torch.Tensor) -> dict:
    """Metrics of one average distribution pbar [L] (non-negative, sums to 1)."""
    p = pbar.double()
    if p.dim() != 1 or p.numel() == 0 or bool((p < 0).any()) or not math.isclose(float(p.sum()), 1.0, abs_tol=1e-6):
        raise ValueError(f"pbar: expected a probability vector [L], got shape {tuple(p.shape)}, sum {float(p.sum())}")
    L = p.numel()
    entropy = float(-(p[p > 0] * p[p > 0].log()).sum())
    return {
        "latents_per_head": L,
        "entropy": entropy,
        "max_entropy": math.log(L),
        "effective_latents": math.exp(entropy),
        "used_fraction": float((p > 1.0 / (10 * L)).double().mean()),
        "top_latent_mass": float(p.max()),
    }


@torch.no_grad()
def layer_probs(layer: nn.Module, x: torch.Tensor, positions: torch.Tensor | None = None):
    """(p(l|t) [B, T, H, L] float32, p(window|t) [B, T, H] or None) of one
    layer for its input x [B, T, dim] (no padding) at RoPE positions [B, T]
    (default 0 .. T-1)."""
    B, T, _ = x.shape
    H, L = layer.num_heads, layer.latents_per_head
    u, _, _ = layer.mixer(x)
    a = layer.a_proj(u).view(B, T, H, L).float()
    p = torch.softmax(a, -1)
    if not isinstance(layer, MacchiatoAttention):
        return p, None
    pos = real_positions(None, None, B, T, x.device)[0] if positions is None else positions
    q, k, v = project_qkv(layer, x, pos)
    _, lse_win, _ = sliding_window_attention_lse(q, k, v, window_size=layer.window_size)
    lat = torch.logsumexp(a, -1) + layer.beta.float()
    m = (lse_win if layer.mix == "joint" else layer.gate_proj(x).float()) - lat
    return p, torch.sigmoid(m)


def latent_layers(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(block index, mixer) of every Latte / Macchiato layer of a LatteForCausalLM."""
    found = [
        (i, b.mixer)
        for i, b in enumerate(model.model.blocks)
        if isinstance(b.mixer, (LatteAttention, MacchiatoAttention))
    ]
    if not found:
        mixers = sorted({type(b.mixer).__name__ for b in model.model.blocks})
        raise ValueError(
            f"model has no latent layers (its mixers: {', '.join(mixers)}): "
            "latent utilisation needs mixer latte or macchiato"
        )
    return found


class _Totals:
    """Running sums of one layer: p(l|t) [H, L], p(window|t) by position [T, H]
    and every p(window|t) value [N, H] (for quantiles and the histogram)."""

    def __init__(self):
        self.p_HL, self.window_TH, self.window_values = 0.0, 0.0, []

    def add(self, p_BTHL: torch.Tensor, pw_BTH: torch.Tensor | None) -> None:
        self.p_HL = self.p_HL + p_BTHL.double().sum((0, 1))
        if pw_BTH is not None:
            self.window_TH = self.window_TH + pw_BTH.double().sum(0)
            self.window_values.append(pw_BTH.flatten(0, 1).double().cpu())


@torch.no_grad()
def latent_utilisation(
    model: nn.Module, windows: TokenWindows, *, batch_size: int = 8, device: torch.device | str = "cpu"
) -> dict:
    """Per layer and head: the metrics of `utilisation` on pbar, pbar itself,
    and for Macchiato p(window|t) (mean, quantiles, histogram, by position).

    Returns {"seq_len", "tokens", "layers": [{"layer", "kind", "heads": [...]}]}."""
    layers = latent_layers(model)
    inputs: dict[int, tuple] = {}  # layer -> (x, positions) of its last call
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: inputs.__setitem__(i, (args[0], kwargs.get("positions"))), with_kwargs=True
        )
        for i, m in layers
    ]
    totals = {i: _Totals() for i, _ in layers}
    windows_seen = 0
    was = model.training
    model.eval()
    try:
        for x, _ in iter_eval_batches(windows, batch_size):
            model(x.to(device))
            for i, layer in layers:
                totals[i].add(*layer_probs(layer, *inputs[i]))
            windows_seen += x.shape[0]
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    T = windows.seq_len
    return {
        "seq_len": T,
        "tokens": windows_seen * T,
        "layers": [_layer_report(i, layer, totals[i], windows_seen) for i, layer in layers],
    }


def _layer_report(i: int, layer: nn.Module, tot: _Totals, windows_seen: int) -> dict:
    pbar_HL = tot.p_HL / tot.p_HL.sum(-1, keepdim=True)
    values_NH = torch.cat(tot.window_values) if tot.window_values else None
    heads = []
    for h in range(pbar_HL.shape[0]):
        head = {"head": h, **utilisation(pbar_HL[h]), "pbar": pbar_HL[h].tolist()}
        if values_NH is not None:
            v = values_NH[:, h]
            q10, q50, q90 = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9], dtype=v.dtype)).tolist()
            hist = torch.histc(v, bins=HIST_BINS, min=0.0, max=1.0)
            head.update(
                p_window_mean=float(v.mean()),
                p_window_p10=q10,
                p_window_median=q50,
                p_window_p90=q90,
                p_window_by_position=(tot.window_TH[:, h] / windows_seen).tolist(),
                p_window_hist=(hist / hist.sum()).tolist(),
            )
        heads.append(head)
    return {"layer": i, "kind": "macchiato" if isinstance(layer, MacchiatoAttention) else "latte", "heads": heads}


def latents_table(report: dict) -> str:
    """A markdown table: one row per layer and head."""
    mac = any(layer["kind"] == "macchiato" for layer in report["layers"])
    head = (
        "| layer | head | latents | entropy (nats) / log L | effective latents | used fraction | top latent mass |"
        + (" p(window) mean | p(window) p10 / median / p90 |" if mac else "")
    )
    lines = [head, "|" + "---|" * (7 + 2 * mac)]
    for layer in report["layers"]:
        for h in layer["heads"]:
            row = (
                f"| {layer['layer']} | {h['head']} | {per_head(h)} | {h['entropy']:.2f} / {h['max_entropy']:.2f} "
                f"| {h['effective_latents']:.1f} | {h['used_fraction']:.2f} | {h['top_latent_mass']:.3f} |"
            )
            if "p_window_mean" in h:
                row += (
                    f" {h['p_window_mean']:.3f} | {h['p_window_p10']:.3f} / {h['p_window_median']:.3f} / "
                    f"{h['p_window_p90']:.3f} |"
                )
            elif mac:
                row += " | |"
            lines.append(row)
    return "\n".join(lines)


def plot_latents(report: dict, path, title: str = "") -> bool:
    """Heat map of pbar x L (1 = uniform use) per layer and head; for
    Macchiato also p(window|t) by position. False when matplotlib is missing."""
    plt = pyplot(note=None)
    if plt is None:
        return False
    rows = [(f"layer {lay['layer']} head {h['head']}", h) for lay in report["layers"] for h in lay["heads"]]
    mac = [r for r in rows if "p_window_by_position" in r[1]]
    fig, axes = plt.subplots(1, 2 if mac else 1, figsize=(13 if mac else 7, 0.45 * len(rows) + 2), squeeze=False)
    ax = axes[0][0]
    grid = torch.tensor([h["pbar"] for _, h in rows]) * len(rows[0][1]["pbar"])
    im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", vmin=0)
    ax.set_yticks(range(len(rows)), [f"{name} (eff {h['effective_latents']:.1f})" for name, h in rows], fontsize=7)
    ax.set_xlabel("latent index")
    ax.set_title("average p(l|t) x L (1 = uniform use)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    if mac:
        ax = axes[0][1]
        for name, h in mac:
            ax.plot(range(1, len(h["p_window_by_position"]) + 1), h["p_window_by_position"], lw=1, label=name)
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("position in the window")
        ax.set_ylabel("mean p(window | t)")
        ax.set_title("Macchiato: the window's share of the attention", fontsize=9)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(plt, fig, path, dpi=100)
    return True


def per_head(head: dict) -> int:
    """The latents of one head's record (utilisation's), also from a record
    written before the key was named latents_per_head (then num_latents)."""
    return head["latents_per_head"] if "latents_per_head" in head else head["num_latents"]


def latents_summary(groups) -> tuple[list[dict], str]:
    """(records, markdown) of `latte eval`'s latents cells (field "report":
    latent_utilisation's): one flat record per (model, layer, head), one
    table per model. `groups`: per model, (the fields naming it in records,
    its label, its cells)."""
    records, tables = [], []
    for fields, name, cells in groups:
        report = cells[0]["report"]
        tables.append(f"{name} ({report['tokens']:,} tokens):\n\n{latents_table(report)}")
        for layer in report["layers"]:
            for h in layer["heads"]:
                flat = {k: v for k, v in h.items() if not isinstance(v, list) and k != "num_latents"}
                records.append({**fields, "layer": layer["layer"], **flat, "latents_per_head": per_head(h)})
    return records, "\n\n".join(tables)
