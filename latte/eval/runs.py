"""Open a finished (or running) training run for evaluation and generation:
the newest verified checkpoint, its config and its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from latte.config_io import build
from latte.data import Tokenizer, load_tokenizer
from latte.models import LatteForCausalLM
from latte.train.checkpoint import MANIFEST, check_state_against, find_latest_checkpoint, load_checkpoint
from latte.train.config import RunConfig
from latte.train.setup import TOKENIZER_FILES


@dataclass
class TrainedRun:
    model: LatteForCausalLM  # eval mode
    tokenizer: Tokenizer
    config: RunConfig
    checkpoint: Path
    step: int


def load_trained(path: str | Path, *, device: str | torch.device = "cpu") -> TrainedRun:
    """`path` is a run folder (its newest verified checkpoint is used) or one
    `step-N` checkpoint folder. Every file is verified against the manifest."""
    path = Path(path).expanduser()
    if (path / MANIFEST).is_file():
        step_dir = path
    elif path.is_dir():
        step_dir = find_latest_checkpoint(path)
        if step_dir is None:
            raise ValueError(f"{path}: no verified checkpoint (step-*/{MANIFEST}) in this run folder")
    else:
        raise ValueError(f"{path}: no such run or checkpoint folder")
    ckpt = load_checkpoint(step_dir, map_location=device)
    cfg = build(RunConfig, ckpt.config, where=str(step_dir / "config.yaml"))
    found = [step_dir / n for n in TOKENIZER_FILES if (step_dir / n).is_file()]
    if not found:
        raise ValueError(f"{step_dir}: no tokenizer file ({' or '.join(TOKENIZER_FILES)})")
    tokenizer = load_tokenizer(found[0])
    model = LatteForCausalLM(cfg.model.to_latte_config(tokenizer.vocab_size)).to(device)
    check_state_against(model.state_dict(), ckpt.model_state, where=str(step_dir / "model.safetensors"))
    model.load_state_dict(ckpt.model_state)
    model.eval()
    return TrainedRun(model, tokenizer, cfg, step_dir, ckpt.step)
