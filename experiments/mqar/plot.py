"""The accuracy-vs-state plot of `python -m experiments.mqar` (Zoology's figure)."""

from __future__ import annotations

from pathlib import Path

from latte.reporting import pyplot, save_figure


def _bytes(n: int) -> str:
    return f"{n / 1000:,.1f}K" if n < 10**6 else f"{n / 1e6:,.2f}M"


def _byte_ticks(ax) -> None:
    """Label a log axis of byte counts at 1K, 2K, 4K, ... inside its current
    limits (matplotlib's default minor labels, "2x10^3 3x10^3 ...", overlap
    on a narrow panel)."""
    from matplotlib.ticker import NullFormatter

    lo, hi = ax.get_xlim()
    ticks = [1000 * 2**k for k in range(24) if lo <= 1000 * 2**k <= hi]
    if ticks:
        ax.set_xticks(ticks, [_bytes(t).replace(".0K", "K") for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)


def plot(best: list[dict], path: Path) -> bool:
    """Accuracy vs state bytes per layer, one panel per (T, pairs), one line
    per model family and width (Zoology's figure)."""
    plt = pyplot()
    if plt is None:
        return False
    settings = sorted({(r["seq_len"], r["num_kv_pairs"]) for r in best})
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings) + 1.5, 4.5), squeeze=False)
    models = sorted({r["model"] for r in best})
    color = {m: f"C{i % 10}" for i, m in enumerate(models)}
    for ax, (T, P) in zip(axes[0], settings):
        for m in models:
            for dim, marker in ((64, "o"), (128, "s"), (16, "^")):
                pts = sorted(
                    (r["state_bytes"], r["accuracy"])
                    for r in best
                    if r["model"] == m and r["dim"] == dim and (r["seq_len"], r["num_kv_pairs"]) == (T, P)
                )
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker=marker,
                        ms=5,
                        color=color[m],
                        lw=1,
                        label=m if dim == min(r["dim"] for r in best) else None,
                    )
        ax.set_xscale("log")
        _byte_ticks(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"MQAR T={T}, {P} key-value pairs")
        ax.set_xlabel("state bytes per layer (float32)")
        ax.set_ylabel("test accuracy (best lr)")
        ax.grid(alpha=0.3)
    # outside the panels: inside, it hid the points in its corner (dim 128's near 0.25 at T=64)
    seen = {}
    for ax in axes[0]:  # every family, whichever panels it ran in
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    names = sorted(seen)
    axes[0][-1].legend([seen[n] for n in names], names, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("circles: dim 64, squares: dim 128; latte lines: num_latents = dim/4, dim, 4 dim", fontsize=9)
    save_figure(plt, fig, path, dpi=110)
    return True
