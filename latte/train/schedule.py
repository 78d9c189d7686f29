"""Learning-rate schedule as a pure function of the step.

No scheduler object with state to save: resuming at step N gives exactly the
learning rate of an uninterrupted run (docs/reliability.md, "Exact resume").

    step:  0 .. W-1          W .. T                      T ..
    lr:    base*(s+1)/W      decay base -> min_lr_ratio*base   min_lr_ratio*base

Warm-up starts at base/W rather than 0 so that no step is wasted with a zero
learning rate; it reaches `base_lr` at step W-1, and step W (the start of the
decay) is `base_lr` too. "constant" keeps `base_lr` after warm-up forever.
"""

from __future__ import annotations

import math

from latte._checks import is_int, is_real

DECAYS = ("linear", "cosine", "constant")


def _check_args(step, base_lr, warmup_steps, total_steps, decay, min_lr_ratio) -> None:
    problems = []

    if not is_int(step) or step < 0:
        problems.append(f"step: got {step!r}, expected an int >= 0")
    if not (is_real(base_lr) and math.isfinite(base_lr) and base_lr >= 0):
        problems.append(f"base_lr: got {base_lr!r}, expected a finite number >= 0")
    if not is_int(total_steps) or total_steps < 1:
        problems.append(f"total_steps: got {total_steps!r}, expected an int >= 1")
    if not is_int(warmup_steps) or warmup_steps < 0:
        problems.append(f"warmup_steps: got {warmup_steps!r}, expected an int >= 0")
    elif is_int(total_steps) and warmup_steps > total_steps:
        problems.append(f"warmup_steps: got {warmup_steps}, expected <= total_steps ({total_steps})")
    if decay not in DECAYS:
        problems.append(f"decay: got {decay!r}, expected one of {', '.join(map(repr, DECAYS))}")
    if not (is_real(min_lr_ratio) and 0 <= min_lr_ratio <= 1):
        problems.append(f"min_lr_ratio: got {min_lr_ratio!r}, expected a number in [0, 1]")
    if problems:
        raise ValueError("lr_at: " + "; ".join(problems))


def lr_at(
    step: int, *, base_lr: float, warmup_steps: int, total_steps: int, decay: str = "linear", min_lr_ratio: float = 0.0
) -> float:
    """Learning rate for optimizer step `step` (0-based); see the module docstring."""
    _check_args(step, base_lr, warmup_steps, total_steps, decay, min_lr_ratio)
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if decay == "constant":
        return float(base_lr)
    min_lr = min_lr_ratio * base_lr
    if step >= total_steps:
        return float(min_lr)
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # in [0, 1)
    if decay == "linear":
        return base_lr + (min_lr - base_lr) * progress
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
