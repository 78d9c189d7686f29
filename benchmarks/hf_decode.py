"""`python -m benchmarks.hf_decode`: the Hugging Face adapters' greedy
`generate` through latte's static decoding step (latte/models/hf_generate.py)
beside transformers' own loop (`GenerationMixin.generate`), ms per new token
on the CPU.

Models, random weights, float32: the native adapter (`LatteHFForCausalLM`)
for latte, macchiato (4 sinks) and softmax at a small size (4 layers, width
256, 4 heads, window 64), and a converted random Llama of the same size
(`ConvertedForCausalLM`, window 64, 4 sinks). For each model one prompt of
P tokens is decoded greedily for N and for 1 new token by both paths, the
four calls interleaved round by round; ms/token = (median(N) -
median(1)) / (N - 1), the prefill cancelled out. The run also checks that
both paths give the same tokens. The static step runs eagerly on the CPU
(it is captured in a CUDA graph only on CUDA).

    python -m benchmarks.hf_decode [--quick] [--threads 1] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import GenerationMixin, LlamaConfig, LlamaForCausalLM

from benchmarks import RESULTS
from latte import bench as common
from latte import reporting
from latte.bench import LatteHFConfig, LatteHFForCausalLM
from latte.convert import ConversionConfig, convert
from latte.models import LatteConfig

FULL = dict(dim=256, layers=4, heads=4, window=64, prompt=128, new=32, vocab=512)
QUICK = dict(dim=32, layers=2, heads=2, window=8, prompt=12, new=6, vocab=64)
MODELS = ("latte", "macchiato", "softmax", "converted-llama")
PATHS = ("static", "transformers")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.hf_decode", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    args = p.parse_args(argv)
    args.shape = QUICK if args.quick else FULL
    args.dtype = "float32"
    return args


def _native(mixer: str, s: dict) -> LatteHFForCausalLM:
    extra = {"num_sinks": 4} if mixer == "macchiato" else {}
    cfg = LatteConfig.tiny(
        mixer=mixer,
        dim=s["dim"],
        num_layers=s["layers"],
        num_heads=s["heads"],
        window_size=s["window"],
        vocab_size=s["vocab"],
        max_position_embeddings=2 * (s["prompt"] + s["new"]),
        **extra,
    )
    torch.manual_seed(0)
    return LatteHFForCausalLM(LatteHFConfig.from_latte_config(cfg)).eval()


def _converted(s: dict):
    torch.manual_seed(0)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=s["vocab"],
            hidden_size=s["dim"],
            intermediate_size=2 * s["dim"],
            num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"],
            num_key_value_heads=s["heads"],
            max_position_embeddings=2 * (s["prompt"] + s["new"]),
        )
    )
    return convert(base, ConversionConfig(window_size=s["window"], num_sinks=4)).eval()


def model_of(name: str, s: dict):
    return _converted(s) if name == "converted-llama" else _native(name, s)


def _calls(model, x: torch.Tensor, new: int) -> dict:
    """(path, new tokens) -> a zero-argument greedy generate."""
    kw = dict(attention_mask=torch.ones_like(x), do_sample=False, pad_token_id=0)
    calls = {}
    for n in (new, 1):
        calls[("static", n)] = lambda n=n: model.generate(x, max_new_tokens=n, **kw)
        calls[("transformers", n)] = lambda n=n: GenerationMixin.generate(model, x, max_new_tokens=n, **kw)
    return calls


def bench_model(name: str, args) -> list[dict]:
    s = args.shape
    model = model_of(name, s)
    x = torch.randint(0, s["vocab"], (1, s["prompt"]), generator=torch.Generator().manual_seed(1))
    calls = _calls(model, x, s["new"])
    with torch.no_grad():
        same = torch.equal(calls[("static", s["new"])](), calls[("transformers", s["new"])]())
        keyed = {f"{p}/{n}": fn for (p, n), fn in calls.items()}
        times = common.time_interleaved(keyed, repeats=args.repeats, warmup=args.warmup)
    rows = []
    for path in PATHS:
        long, short = times[f"{path}/{s['new']}"], times[f"{path}/1"]
        per = (long["median_ms"] - short["median_ms"]) / (s["new"] - 1)
        rows.append({"model": name, "path": path, "ms_per_token": per, "generate_ms": long, "one_token_ms": short})
    ratio = rows[0]["ms_per_token"] / rows[1]["ms_per_token"]
    rows.append({"model": name, "static_over_transformers": ratio, "same_tokens": same})
    print(f"  {name:16s} static {rows[0]['ms_per_token']:8.3f} ms/token, transformers "
          f"{rows[1]['ms_per_token']:8.3f}, ratio {ratio:.2f}, same tokens {same}", flush=True)  # fmt: skip
    return rows


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    rows = [r for name in MODELS for r in bench_model(name, args)]
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    config = {"device": "cpu", "dtype": args.dtype, "threads": args.threads, "quick": args.quick, **args.shape}
    config.update(models=list(MODELS), repeats=args.repeats, warmup=args.warmup)
    return {"benchmark": "hf_decode", "machine": info, "config": config, "results": rows}


def markdown(res: dict) -> str:
    m, c = res["machine"], res["config"]
    cell = {(r["model"], r.get("path")): r for r in res["results"]}
    out = [
        f"# latte bench hf_decode (cpu{', quick' if c['quick'] else ''})",
        "",
        f"{m['cpu_model']}, {m['threads']} threads, torch {m['torch']}, {c['dtype']}; width {c['dim']}, "
        f"{c['layers']} layers, {c['heads']} heads, window {c['window']}; greedy, batch 1, prompt {c['prompt']}, "
        f"{c['new']} new tokens; ms/token = (median generate of {c['new']} - of 1) / {c['new'] - 1}, "
        f"median of {c['repeats']} rounds, the four calls interleaved per model; load avg "
        f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}. The static step runs eagerly on the CPU.",
        "",
    ]
    hdr = ["model", "static ms/token", "transformers' loop ms/token", "static / transformers", "same tokens"]
    rows = []
    for name in c["models"]:
        st, tf, both = cell[(name, "static")], cell[(name, "transformers")], cell[(name, None)]
        rows.append(
            [name, f"{st['ms_per_token']:.3f}", f"{tf['ms_per_token']:.3f}", f"{both['static_over_transformers']:.2f}"]
            + ["yes" if both["same_tokens"] else "NO"]
        )
    return "\n".join(out + [reporting.md_table(hdr, rows)]) + "\n"


def plot(res: dict, path) -> bool:
    """ms/token of both paths per model (x: the models' order, 1..n)."""
    c = res["config"]
    xs = list(range(1, len(c["models"]) + 1))
    cell = {(r["model"], r.get("path")): r for r in res["results"]}
    panels = {"ms per new token": {p: (xs, [cell[(name, p)]["ms_per_token"] for name in c["models"]]) for p in PATHS}}
    names = ", ".join(f"{i} {n}" for i, n in zip(xs, c["models"]))
    return common.plot_loglog(path, panels, xlabel=f"model ({names})", ylabel="ms", title="hf_decode")


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.claim_outputs(args, "hf_decode", "hf_decode")  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, "hf_decode", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.hf_decode", main, sys.argv[1:]))
