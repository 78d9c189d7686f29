"""Text sampled from the base model itself, for sequence-level distillation
(docs/conversion.md §9): each sample starts from a short prompt cut from a
training document and continues at temperature 1 with no top-k / top-p, so
the continuation follows exactly the original's distribution. Written to a
JSONL file one batch at a time (fsync'd), so a killed run continues where it
stopped and reproduces the same samples (batch b is seeded by (seed, b)).

    python -m experiments.data.generate --out runs/convert-data/generated.jsonl --samples 256
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from latte.data import load_documents, split_documents


def prompts(tokenizer, sources: str, count: int, prompt_tokens: int, seed: int) -> list[list[int]]:
    """`count` prompts of `prompt_tokens` ids, each cut at a seeded random
    place of a seeded random training document of `sources` (the held-out
    documents of the same split are never used)."""
    train, _ = split_documents(load_documents(sources), val_fraction=0.1, seed=0)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        doc = train[int(torch.randint(len(train), (1,), generator=g))]
        ids = tokenizer(doc.text[:20000]).input_ids
        start = int(torch.randint(max(1, len(ids) - prompt_tokens), (1,), generator=g))
        out.append(ids[start : start + prompt_tokens])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.data.generate", description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--base", default="smollm2")
    p.add_argument("--sources", default="shakespeare+essays+bible-web", help="where the prompts are cut from")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=240)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from latte.convert import resolve_base  # optional dependency: transformers

    folder, gguf = resolve_base(a.base)
    kw = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(str(folder), **kw)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, **kw).eval()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = sum(1 for line in out.open() if line.strip()) if out.is_file() else 0
    all_prompts = prompts(tok, a.sources, a.samples, a.prompt_tokens, a.seed)
    for b in range(done // a.batch, -(-a.samples // a.batch)):
        t0 = time.perf_counter()
        batch = all_prompts[b * a.batch : (b + 1) * a.batch]
        torch.manual_seed(a.seed * 1_000_003 + b)
        with torch.no_grad():
            ids = model.generate(
                torch.tensor(batch),
                attention_mask=torch.ones(len(batch), a.prompt_tokens, dtype=torch.long),
                max_new_tokens=a.new_tokens,
                min_new_tokens=a.new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=tok.eos_token_id,
            )
        dt = time.perf_counter() - t0
        with out.open("a") as f:
            for row in ids.tolist():
                text = tok.decode(row, skip_special_tokens=True)
                rec = {"text": text, "batch": b, "tokens": len(row), "seed": a.seed, "base": a.base}
                f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        rate = len(batch) * a.new_tokens / dt
        print(
            f"batch {b}: {len(batch)} x {a.new_tokens} new tokens in {dt:.1f} s ({rate:.1f} tok/s, "
            f"{a.threads} thread(s), load {os.getloadavg()[0]:.2f})",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m experiments.data.generate", main, sys.argv[1:]))
