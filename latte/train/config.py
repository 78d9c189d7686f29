"""The run configuration: one validated dataclass per concern.

    RunConfig                 what every run has (the training loop's part)
      task:  str              which Task trains it (latte/train/task.py): "lm", ...
      optim: OptimConfig      AdamW, lr schedule, clipping, accumulation
      train: TrainConfig      steps, batch, eval/save/log cadence, faults,
                              distributed, checkpoints
    LMRunConfig(RunConfig)    language modelling (task "lm") adds
      data:  DataConfig       corpus, split, tokenizer, sequence length, cache
      model: ModelConfig      `LatteConfig` (vocab_size None: the tokenizer's)

A task's config subclasses `RunConfig` with its own sections and gives
`task` its name as default; `build_run_config` (train/task.py, beside the
task registry) reads the `task` key of a YAML mapping (default "lm") and
builds that task's class, so each task's
sections are validated like the rest. Built from YAML plus
``--section.field=value`` overrides with `latte.config_io.build`, which
reports every unknown key, wrong type and out-of-range value at once. The
resolved config is saved in the run folder and in every checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from latte.config_io import ConfigError, ConfigErrors, load_yaml, merge
from latte.models import LatteConfig

# The default job of `latte train` (no --config): the tiny CPU recipe.
# Shipped run configs live in the package (latte/configs/*.yaml), so that an
# installed wheel runs `latte train` from any directory.
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "tiny.yaml"


@dataclass
class DataConfig:
    """source: see `latte.data.load_documents` ("shakespeare", "pydoc", a file
    or folder, "hf:<name>[:split]"). tokenizer: "bpe" trains a byte-level BPE
    of `vocab_size` on the training split; anything else is a path to a
    tokenizer.json / *.tiktoken file (or a folder holding one), and
    `vocab_size` is then ignored. cache_dir holds the packed token files.
    document_boundaries: a document starts at each end-of-document token
    (the separator opens the next document, as a BOS would) and at each
    window's start; the model then sees each document alone (packed
    documents, `cu_seqlens`: no token attends across a boundary) in
    training and validation, and every target is kept."""

    source: str = "shakespeare"
    text_field: str = "text"
    val_fraction: float = 0.1
    split_seed: int = 0
    tokenizer: str = "bpe"
    vocab_size: int = 4096
    seq_len: int = 256
    cache_dir: str = "runs/.cache"
    document_boundaries: bool = False

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        e.check(bool(self.source), "source", self.source, "a non-empty string")
        e.check(0.0 < self.val_fraction < 1.0, "val_fraction", self.val_fraction, "in (0, 1)")
        e.check(bool(self.tokenizer), "tokenizer", self.tokenizer, "'bpe' or a tokenizer path")
        e.check(self.vocab_size >= 257, "vocab_size", self.vocab_size, ">= 257 (256 bytes + eos)")
        e.check(self.seq_len >= 1, "seq_len", self.seq_len, ">= 1")
        e.check(bool(self.cache_dir), "cache_dir", self.cache_dir, "a non-empty path")
        e.raise_if_any()


@dataclass
class ModelConfig(LatteConfig):
    """The model section is `LatteConfig` itself; what the trainer adds is
    vocab_size None (default) = the tokenizer's; given, it may only be larger
    (e.g. padded to a multiple of 64). causal is the task's (True here).
    `LatteConfig.upgrade_keys` maps older keys (`num_latents`)."""

    vocab_size: int | None = None

    def __post_init__(self):
        task = type(self).__dataclass_fields__["causal"].default  # the task's: True for lm
        if self.causal is not task:
            raise ConfigError(type(self).__name__, [("causal", f"got {self.causal!r}, expected {task} (the task's)")])
        given = self.vocab_size
        if given is None:
            self.vocab_size = 257  # LatteConfig's checks need a number; the tokenizer's comes later
        try:
            super().__post_init__()
        finally:
            self.vocab_size = given

    def to_latte_config(self, vocab_size: int) -> LatteConfig:
        """The model architecture for a tokenizer of `vocab_size` ids."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(LatteConfig)}
        return LatteConfig(**{**fields, "vocab_size": self.vocab_size or vocab_size})


@dataclass
class OptimConfig:
    """AdamW (no weight decay on norms, biases, embeddings); lr = `lr_at(step)`:
    warm-up then linear/cosine decay to min_lr_ratio * lr. grad_clip 0 = off.
    grad_accum micro-batches per optimizer step (per rank). fused: AdamW's
    fused kernels (one launch for all parameters); None (default) = on
    CUDA only, true / false = always / never."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 30
    decay: Literal["linear", "cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    grad_accum: int = 1
    fused: bool | None = None

    def __post_init__(self):
        self.betas = tuple(self.betas)
        e = ConfigErrors(type(self).__name__)
        e.check(self.lr > 0, "lr", self.lr, "> 0")
        e.check(all(0.0 <= b < 1.0 for b in self.betas), "betas", self.betas, "two numbers in [0, 1)")
        e.check(self.eps > 0, "eps", self.eps, "> 0")
        e.check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
        e.check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, ">= 0")
        e.check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        e.check(self.grad_clip >= 0, "grad_clip", self.grad_clip, ">= 0 (0 = no clipping)")
        e.check(self.grad_accum >= 1, "grad_accum", self.grad_accum, ">= 1")
        e.raise_if_any()


@dataclass
class TrainConfig:
    """steps: optimizer steps in total (skipped ones included).
    global_batch_size: samples per optimizer step over all ranks and
    micro-batches. eval_every / save_every / sample_every: in steps, 0 = only
    at the end. eval_batches: global batches per periodic validation (0 = the
    whole validation split, which the final validation always uses).
    eval_whole_at: steps with an extra validation on the whole split, on or
    off the eval_every grid (a learning curve at a few exact points without
    paying for the whole split at every eval_every).
    resume: "auto" (the newest verified checkpoint in run_dir; refuses a
    run_dir whose step folders all fail verification), "never" (start over:
    earlier step folders and logs are moved aside to run_dir/abandoned/) or a
    checkpoint/run path (later steps of run_dir are moved aside: a branch).
    init_from: a new run's starting weights (latte/train/init_from.py): a
    step folder, a run folder (its newest verified step) or an exported
    model folder, loaded strictly into the model this config builds, with
    a fresh optimizer, schedule and data position; its weight files are
    recorded inputs of the run (None = the task's own initialisation).
    Read at a fresh start only: resuming never loads it again.
    checkpoint_format: "full" (one safetensors file, written by rank 0),
    "sharded" (torch.distributed.checkpoint, one file per rank; FSDP2 only) or
    "auto" (sharded under FSDP2, full otherwise).
    sample_*: the periodic and final samples of tasks that generate text.
    num_threads: torch intra-op threads (None: torch's default, divided
    among the local ranks under torchrun). time_budget_minutes: a bound on
    the whole job; training stops early (checkpoint, then the final
    validation) when only the time for those is left (None = no limit).
    verify_inputs: on resume, compare the sha256 of every recorded input
    (latte/train/inputs.py), not only those whose size or mtime changed.
    accept_changed_inputs: resume on inputs that changed since the run
    recorded them, recording their new values and the change (else such a
    resume is refused). Both are flags of this start only (`latte train
    --verify-inputs`, `--accept-changed-inputs`), never compared on resume.
    precision "bf16": the forward under bf16 autocast (weights, gradients
    and optimizer state stay float32). compile: the training forward and
    backward through torch.compile(model) with compile_backend ("inductor",
    or "aot_eager" to check graphs without generating kernels); validation
    and samples run the model uncompiled. Checkpoints are the same either way."""

    steps: int = 300
    global_batch_size: int = 16
    eval_every: int = 100
    eval_batches: int = 8
    eval_whole_at: list[int] = field(default_factory=list)
    save_every: int = 100
    keep: int = 2
    seed: int = 0
    precision: Literal["fp32", "bf16"] = "fp32"
    on_nonfinite: Literal["skip", "raise"] = "skip"
    max_consecutive_skips: int = 10
    run_dir: str = "runs/tiny"
    resume: str = "auto"
    init_from: str | None = None
    log_every: int = 10
    sample_every: int = 0
    sample_tokens: int = 80
    sample_prompt: str = "\n"
    sample_temperature: float = 0.8
    sample_top_k: int = 50
    tensorboard: bool = True
    distributed: Literal["ddp", "fsdp2"] = "ddp"
    checkpoint_format: Literal["auto", "full", "sharded"] = "auto"
    num_threads: int | None = None
    time_budget_minutes: float | None = None
    verify_inputs: bool = False
    accept_changed_inputs: bool = False
    compile: bool = False
    compile_backend: Literal["inductor", "aot_eager"] = "inductor"

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        e.check(self.steps >= 1, "steps", self.steps, ">= 1")
        e.check(self.global_batch_size >= 1, "global_batch_size", self.global_batch_size, ">= 1")
        for name in ("eval_every", "eval_batches", "save_every", "sample_every", "sample_tokens"):
            e.check(getattr(self, name) >= 0, name, getattr(self, name), ">= 0")
        e.check(all(s >= 1 for s in self.eval_whole_at), "eval_whole_at", self.eval_whole_at, "steps >= 1")
        e.check(self.keep >= 2, "keep", self.keep, ">= 2 (a crash while saving must leave one good checkpoint)")
        e.check(self.max_consecutive_skips >= 1, "max_consecutive_skips", self.max_consecutive_skips, ">= 1")
        e.check(bool(self.run_dir), "run_dir", self.run_dir, "a non-empty path")
        e.check(bool(self.resume), "resume", self.resume, "'auto', 'never' or a checkpoint path")
        e.check(
            self.init_from is None or (isinstance(self.init_from, str) and bool(self.init_from)),
            "init_from",
            self.init_from,
            "null or a step, run or exported model folder",
        )
        e.check(self.log_every >= 1, "log_every", self.log_every, ">= 1")
        e.check(self.sample_temperature >= 0, "sample_temperature", self.sample_temperature, ">= 0 (0 = greedy)")
        e.check(self.sample_top_k >= 0, "sample_top_k", self.sample_top_k, ">= 0 (0 = no top-k)")
        e.check(
            self.checkpoint_format != "sharded" or self.distributed == "fsdp2",
            "checkpoint_format",
            self.checkpoint_format,
            "'auto' or 'full' unless distributed is 'fsdp2'",
        )
        if self.num_threads is not None:
            e.check(self.num_threads >= 1, "num_threads", self.num_threads, ">= 1 or null")
        if self.time_budget_minutes is not None:
            e.check(self.time_budget_minutes > 0, "time_budget_minutes", self.time_budget_minutes, "> 0 or null")
        e.raise_if_any()


@dataclass
class RunConfig:
    """What every run has, whatever its task. Tasks subclass it, adding their
    sections and giving `task` their name as default (see `LMRunConfig`)."""

    task: str = "lm"
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        o, t = self.optim, self.train
        e.check(o.warmup_steps <= t.steps, "optim.warmup_steps", o.warmup_steps, f"<= train.steps ({t.steps})")
        e.check(
            t.global_batch_size % o.grad_accum == 0,
            "train.global_batch_size",
            t.global_batch_size,
            f"a multiple of optim.grad_accum ({o.grad_accum})",
        )
        e.raise_if_any()


@dataclass
class LMRunConfig(RunConfig):
    """Language modelling on a text corpus (task "lm", the default)."""

    task: str = "lm"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)


# Fields that change what the LM's weights mean or their shapes: they must
# match when resuming (everything else may change, with a warning). Not among
# them: dropout (training only), chunk_size (the kernel's block size: the same
# function to float32 rounding, a speed knob) and initializer_range (used only
# before step 0).
RESUMABLE_MODEL_FIELDS = (
    "dropout",
    "chunk_size",
    "backend",
    "initializer_range",
    "memory_slots",
    "memory_rule",
    "memory_positions",
)
ARCHITECTURE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in RESUMABLE_MODEL_FIELDS)


def shipped_configs() -> list[str]:
    """Names of the configs shipped with the package ("tiny", "mixers/latte", ...)."""
    return sorted(p.relative_to(CONFIG_DIR).with_suffix("").as_posix() for p in CONFIG_DIR.rglob("*.yaml"))


def resolve_config(config: str | Path | None) -> Path:
    """A YAML path, or the name of a shipped config ("tiny", "mixers/latte");
    None is the default job (tiny)."""
    if config is None:
        return DEFAULT_CONFIG
    path = Path(config)
    if path.is_file():
        return path
    name = path.as_posix().removesuffix(".yaml")
    if (CONFIG_DIR / f"{name}.yaml").is_file():
        return CONFIG_DIR / f"{name}.yaml"
    raise ValueError(
        f"--config {config}: no such file, and not a shipped config name; shipped: {', '.join(shipped_configs())}"
    )


def load_config_file(path: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    """The fields of a config file: its own on top of those of the config its
    `extends:` names (a shipped config name, or a YAML path relative to the
    file), so that a variant states only what it changes (latte/configs/mixers/)."""
    path = Path(path)
    data = load_yaml(path)
    if "extends" not in data:
        return data
    base = data.pop("extends")
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path}: extends: got {base!r}, expected a shipped config name or a YAML path")
    near = path.parent / base
    base_path = near if near.is_file() else resolve_config(base)
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        raise ValueError(f"{path}: extends: {base} comes back to a config it extends")
    return merge(load_config_file(base_path, (*seen, path.resolve())), data)


def check_world_size(cfg: RunConfig, world_size: int) -> None:
    """The batch must split evenly over ranks and micro-batches."""
    per = world_size * cfg.optim.grad_accum
    if cfg.train.global_batch_size % per:
        raise ConfigError(
            "RunConfig",
            [
                (
                    "train.global_batch_size",
                    f"got {cfg.train.global_batch_size}, expected a multiple of world_size "
                    f"({world_size}) x optim.grad_accum ({cfg.optim.grad_accum}) = {per}",
                )
            ],
        )
