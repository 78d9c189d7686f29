"""The plans of `python -m experiments.lm_variants --plan NAME`: which variants,
seeds, config overrides, evaluation lengths and output folders one command
runs, so the command that made a result folder is short and exact.

  table1            the paper's Table 1 at CPU scale: 7 variants x 3 seeds of
                    the shipped mixers/* recipe (300 steps, 1.2M tokens);
                    results/lm_variants/ (+ extrapolation/, latents/)
  long              ten times the tokens (3,000 steps, 12.3M tokens), one seed:
                    does Latte close its gap to softmax with training? The
                    whole validation split at steps 300, 1,000, 2,000 and 3,000
                    (train.eval_whole_at), and latte with 256 latents beside the
                    recipe's 64; results/lm_variants_long/ (+ extrapolation/,
                    latents/)
  macchiato-vs-swa  training length 1,024 with window 64 (a window 1/16 of the
                    training length, where table1's is 1/4), batch 4 x 1,024 so
                    the tokens per step and the 3,000 steps (12.3M tokens) are
                    those of `long`; perplexity by position up to 8K tokens on
                    the whole held-out split; results/macchiato_vs_swa/

Every field can still be changed by the command's own options (--variants,
--seeds, --set, ...); the plan gives the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# variant -> (shipped config, mixer, qk_mixer)
VARIANTS = {
    "softmax": ("mixers/softmax", "softmax", None),
    "linear": ("mixers/linear", "linear", None),
    "swa": ("mixers/swa", "swa", None),
    "latte-none": ("mixers/latte-none", "latte", "none"),
    "latte-conv": ("mixers/latte-conv", "latte", "conv"),
    "latte-conv_rglru": ("mixers/latte", "latte", "conv_rglru"),
    "latte-conv_rglru-L256": ("mixers/latte", "latte", "conv_rglru"),
    "macchiato": ("mixers/macchiato", "macchiato", "conv_rglru"),
}
# What a variant changes in its shipped config besides the plan's overrides.
# (L256: 256 latents in all, 64 per head x the config's 4 heads)
VARIANT_SETS = {"latte-conv_rglru-L256": ("model.latents_per_head=64",)}

# Whole-split validations of the long runs; the final one (step 3,000) is always whole.
LONG_EVALS = ("train.steps=3000", "train.eval_whole_at=[300,1000,2000]")


@dataclass(frozen=True)
class Plan:
    variants: tuple[str, ...]
    seeds: str
    sets: tuple[str, ...]
    lengths: str
    eval_tokens: int  # validation tokens per `latte eval` (0: the whole split)
    runs: str
    name: str  # results/NAME/, its later stages results/NAME/STAGE/ (stage_outputs)
    curve_steps: tuple[int, ...] = ()  # () = every evaluation in val.csv


PLANS = {
    "table1": Plan(
        variants=tuple(v for v in VARIANTS if v not in VARIANT_SETS),
        seeds="0,1,2",
        sets=(),
        lengths="1,2,4,8,16",
        eval_tokens=65536,
        runs="runs/lm_variants",
        name="lm_variants",
    ),
    "long": Plan(
        variants=("softmax", "swa", "macchiato", "latte-conv_rglru", "latte-none", "linear", "latte-conv_rglru-L256"),
        seeds="0",
        sets=LONG_EVALS,
        lengths="1,2,4,8,16",
        eval_tokens=65536,
        runs="runs/lm_variants_long",
        name="lm_variants_long",
        curve_steps=(300, 1000, 2000, 3000),
    ),
    "macchiato-vs-swa": Plan(
        variants=("macchiato", "swa"),
        seeds="0",
        sets=("data.seq_len=1024", "train.global_batch_size=4", *LONG_EVALS),
        lengths="1,2,4,8",
        eval_tokens=0,
        runs="runs/macchiato_vs_swa",
        name="macchiato_vs_swa",
        curve_steps=(300, 1000, 2000, 3000),
    ),
}


def stage_outputs(results: Path, name: str) -> dict[str, tuple[Path, str]]:
    """stage -> (result folder, README section name): the plan's folder
    results/NAME, its later stages inside it as results/NAME/STAGE, section
    NAME-STAGE (the layout tools/readme_tables.py indexes)."""
    return {
        "train": (results / name, name),
        "extrapolation": (results / name / "extrapolation", f"{name}-extrapolation"),
        "latents": (results / name / "latents", f"{name}-latents"),
    }
