"""Tables of `latte bench ops --device cuda`, regenerable without a GPU from
their JSON (docs/evaluation.md §1.2): `markdown_ops`/`plot_ops`/`ops_ratios`.
The GPU suite's targets of issue 26 are experiments/gpu_suite/targets.py.
"""

from __future__ import annotations

from latte import reporting

from . import common

MODE_NAME = {"fwd": "forward", "fwdbwd": "forward+backward"}
RATIOS = (  # name -> (numerator, denominator): > 1 means the denominator is faster
    ("sdpa/latte-fla", "sdpa", "latte-fla"),
    ("latte-fla/fla-gla", "latte-fla", "fla-gla"),
    ("latte/latte-fla", "latte", "latte-fla"),
    ("sdpa/latte-fla-compiled", "sdpa", "latte-fla-compiled"),
    ("latte-fla-compiled/fla-gla", "latte-fla-compiled", "fla-gla"),
    ("latte-fla/latte-fla-compiled", "latte-fla", "latte-fla-compiled"),
    ("sdpa/latte-fla-fused", "sdpa", "latte-fla-fused"),
    ("latte-fla-fused/fla-gla", "latte-fla-fused", "fla-gla"),
    ("latte-fla/latte-fla-fused", "latte-fla", "latte-fla-fused"),
    ("fla-gate/fla-gla", "fla-gate", "fla-gla"),
    ("sdpa/macchiato-fla", "sdpa", "macchiato-fla"),
    ("macchiato-fla/latte-fla", "macchiato-fla", "latte-fla"),
    ("macchiato-fla-window-mix/sdpa", "macchiato-fla-window-mix", "sdpa"),
    ("macchiato-window-mix/sdpa", "macchiato-window-mix", "sdpa"),
)


# ---- latte bench ops --device cuda ------------------------------------------------


def _ok(res: dict) -> dict:
    return {(r["provider"], r["T"], r["mode"]): r for r in res["results"] if not r.get("skipped")}


def ops_ratios(res: dict) -> dict:
    """{mode: {T: {ratio name: value}}} for the pairs measured at the same (T, mode)."""
    ok, out = _ok(res), {}
    for (p, T, mode), r in ok.items():
        for name, num, den in RATIOS:
            if p == num and (den, T, mode) in ok:
                out.setdefault(mode, {}).setdefault(str(T), {})[name] = r["median_ms"] / ok[(den, T, mode)]["median_ms"]
    return out


def _device_line(m: dict) -> str:
    return (
        f"{m.get('gpu') or m.get('cpu_model')}, CUDA {m.get('cuda')}, torch {m.get('torch')}, "
        f"fla-core {m.get('fla_core')}, triton {m.get('triton')}, TRITON_F32_DEFAULT={m.get('TRITON_F32_DEFAULT')}"
    )


def markdown_ops(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    provs, s = cfg["providers"], cfg["shapes"]
    batch = {r["T"]: r.get("B") for r in res["results"]}

    def val(p, T, mode, key):
        r = cell.get((p, T, mode))
        return "-" if r is None else r["reason"].split(":")[0] if r.get("skipped") else r[key]

    out = [
        f"# latte bench ops --device cuda ({cfg['dtype']}{', quick' if cfg['quick'] else ''})",
        "",
        f"{_device_line(m)}. Batch x T = {cfg['tokens']:,} tokens at every T, H={s['H']} Lh={s['Lh']} "
        f"Dv={s['Dv']} W={s['window_size']} chunk {s['chunk_size']}; SDPA: {cfg['sdpa']}. Median of "
        f"{cfg['repeats']} synchronised calls, providers interleaved. Ratios > 1: the second is faster.",
    ]
    ratios = res.get("ratios") or ops_ratios(res)
    for mode in ("fwd", "fwdbwd"):
        names = [n for n, *_ in RATIOS if any(n in row for row in ratios.get(mode, {}).values())]
        rows = [
            [str(T), str(batch.get(T, "-"))]
            + [val(p, T, mode, "median_ms") for p in provs]
            + [ratios.get(mode, {}).get(str(T), {}).get(n, "-") for n in names]
            for T in cfg["T"]
        ]
        out += ["", f"## {MODE_NAME[mode]}: median ms", "", reporting.md_table(["T", "B", *provs, *names], rows)]
        rows = [[str(T), str(batch.get(T, "-"))] + [val(p, T, mode, "peak_mb") for p in provs] for T in cfg["T"]]
        out += ["", f"## {MODE_NAME[mode]}: peak extra MiB", "", reporting.md_table(["T", "B", *provs], rows)]
    first = {}
    for r in res["results"]:
        if r.get("skipped"):
            first.setdefault((r["provider"], r["mode"], r["reason"]), r["T"])
    if first:
        out += ["", "Skipped (from the first T named; every later one alike):"]
        out += [f"- {p} {mode} from T={T}: {reason}" for (p, mode, reason), T in first.items()]
    return "\n".join(out) + "\n"


def plot_ops(res: dict, path) -> bool:
    ok = [r for r in res["results"] if not r.get("skipped")]
    panels = {}
    for mode in ("fwd", "fwdbwd"):
        panels[MODE_NAME[mode] + ": ms"] = {
            p: ([r["T"] for r in ok if (r["provider"], r["mode"]) == (p, mode)],
                [r["median_ms"] for r in ok if (r["provider"], r["mode"]) == (p, mode)])
            for p in res["config"]["providers"]
        }  # fmt: skip
    panels["forward+backward: peak MiB"] = {
        p: ([r["T"] for r in ok if (r["provider"], r["mode"]) == (p, "fwdbwd") and r.get("peak_mb")],
            [r["peak_mb"] for r in ok if (r["provider"], r["mode"]) == (p, "fwdbwd") and r.get("peak_mb")])
        for p in res["config"]["providers"]
    }  # fmt: skip
    cfg = res["config"]
    return common.plot_loglog(
        path,
        panels,
        xlabel=f"T (batch x T = {cfg['tokens']:,})",
        ylabel="median ms / peak MiB",
        title=f"latte bench ops --device cuda ({cfg['dtype']}): {res['machine'].get('gpu')}",
    )
