"""Up-training losses of a converted model against its own original
(docs/conversion.md, "Up-training").

  layer-wise   attention transfer (as LoLCATs' stage 1): one pass of the
               original decoder records every attention layer's input and
               output; each converted layer is trained to reproduce its
               original's output from the same input (relative MSE). Layers
               are independent, the pass costs no MLP or head backward.
  end-to-end   KL(original || converted) over next-token distributions, plus
               the LM cross-entropy, through the whole converted model.

`Distiller` packs a converted model and one objective into the module the
trainer optimises (latte/convert/task.py).

Only the parameters conversion added (latent branch, beta, LoRA) train; the
pretrained weights are frozen (`freeze_base`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from latte.layers.macchiato_attention import latent_branch_only
from latte.models import IGNORE_INDEX

from .modeling import ConvertedForCausalLM


class LayerRecord(NamedTuple):
    """One original attention call: input, rotary (cos, sin), output."""

    x: torch.Tensor  # [B, T, F]
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    y: torch.Tensor  # [B, T, F]


def freeze_base(model: ConvertedForCausalLM) -> list[torch.nn.Parameter]:
    """requires_grad only on the new parameters; returns them."""
    new = {id(p) for p in model.new_parameters().values()}
    for p in model.parameters():
        p.requires_grad_(id(p) in new)
    return [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def record_layers(model: ConvertedForCausalLM, input_ids: torch.Tensor) -> list[LayerRecord]:
    """Run the original decoder stack (no LM head) and record every attention
    layer's input and output."""
    records: list[LayerRecord | None] = [None] * model.num_layers

    def hook(i):
        def fn(module, args, kwargs, output):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            records[i] = LayerRecord(x, kwargs["position_embeddings"], output[0])

        return fn

    handles = [attn.original.register_forward_hook(hook(i), with_kwargs=True) for i, attn in enumerate(model.converted)]
    try:
        with model.as_original() as base:
            base.model(input_ids=input_ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return records


def layerwise_loss(model: ConvertedForCausalLM, records: list[LayerRecord]) -> tuple[torch.Tensor, list[float]]:
    """Sum over layers of ||y_converted - y_original||^2 / ||y_original||^2
    (each layer on the original's own input); also the per-layer values."""
    total, per_layer = 0.0, []
    for attn, rec in zip(model.converted, records):
        y, _ = attn(rec.x, position_embeddings=rec.position_embeddings)
        err = (y.float() - rec.y.float()).pow(2).mean() / rec.y.float().pow(2).mean().clamp_min(1e-12)
        per_layer.append(float(err.detach()))
        total = total + err
    return total, per_layer


def next_token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits [B, T, V] for input_ids [B, T]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())


def end_to_end_loss(
    model: ConvertedForCausalLM,
    input_ids: torch.Tensor,
    *,
    kl_weight: float = 1.0,
    lm_weight: float = 1.0,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """kl_weight * KL(original || converted) + lm_weight * cross-entropy,
    means over the predicted tokens."""
    student = model(input_ids, use_cache=False).logits.float()
    loss, parts = student.new_zeros(()), {}
    if kl_weight:
        with torch.no_grad(), model.as_original() as base:
            teacher = base(input_ids=input_ids, use_cache=False).logits.float()
        log_p = F.log_softmax(teacher / temperature, -1)
        log_q = F.log_softmax(student / temperature, -1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean() * temperature**2
        loss, parts["kl"] = loss + kl_weight * kl, float(kl.detach())
    lm = next_token_nll(student, input_ids)
    parts["lm"] = float(lm.detach())
    if lm_weight:
        loss = loss + lm_weight * lm
    return loss, parts


@torch.no_grad()
def calibrate_beta(model: ConvertedForCausalLM, records: list[LayerRecord], latent_mass: float | None = None) -> None:
    """Set each head's beta from the original's attention on recorded inputs.

    latent_mass None: the latents start with the attention mass the window
    lost, Z_out = sum of exp(score) over keys before the window, so the
    joint normaliser equals the original's: beta = median over tokens of
    log Z_out - logsumexp(a) (tokens past the window only).
    latent_mass = m: the latents start with a fraction m of the mass
    (median over tokens): beta = logit(m) + median(lse_window - logsumexp(a)).

    Either way training starts from a beta where gradients flow: at the
    conversion's beta = -30 every gradient to the latent branch is exactly 0
    in float32 (the mixing sigmoid saturates)."""
    if latent_mass is not None and not 0.0 < latent_mass < 1.0:
        raise ValueError(f"latent_mass: expected None or a fraction in (0, 1), got {latent_mass!r}")
    for attn, rec in zip(model.converted, records):
        m = attn.log_masses(rec.x, rec.position_embeddings)  # [B, T, H] each
        rival = m.window if m.gate is None else m.gate  # what the latents compete with in the mix
        if latent_mass is None:
            W = attn.window_size + attn.num_sinks  # from token W on, a key is outside window and sinks
            if rec.x.shape[1] <= W:
                raise ValueError(
                    f"calibrate_beta: recorded sequences of {rec.x.shape[1]} tokens do not exceed the "
                    f"window and sinks ({W}); nothing is lost to calibrate against"
                )
            share = (m.window - m.full)[:, W:].clamp(max=-1e-6)  # log of the window's share of the original's mass
            odds = torch.log1p(-share.exp()) - share  # log(Z_out / Z_window): latents vs window
            target = odds + rival[:, W:] - m.latent[:, W:]
        else:
            target = rival - m.latent + math.log(latent_mass / (1 - latent_mass))
        attn.beta.copy_(target.flatten(0, 1).median(0).values)


OBJECTIVES = ("end_to_end", "layerwise")


class Distiller(nn.Module):
    """A converted model with its up-training objective, as one module the
    trainer (and DDP) calls once per micro-batch.

    forward(input_ids) -> the converted model's output (validation, samples);
    forward(input_ids, labels) -> output whose `.loss` is the objective SUMMED
    over the target tokens (labels != -100; labels[:, t] is the token after
    input_ids[:, t]): end_to_end = kl_weight * KL + lm_weight * CE per token;
    layerwise = the sum over layers of the relative MSE, per token.

    latent_aux_weight w > 0 adds w times the same objective scored on the
    latent branch's own prediction: the student run again with every
    Macchiato layer's output taken from its latents alone (no window or sink
    key, `latent_branch_only`), against the same teacher targets, computed
    once. It costs one more student forward and backward per micro-batch;
    w = 0 computes exactly what the objective alone computes."""

    def __init__(
        self,
        model: ConvertedForCausalLM,
        objective: str = "end_to_end",
        *,
        kl_weight: float = 1.0,
        lm_weight: float = 1.0,
        temperature: float = 1.0,
        latent_aux_weight: float = 0.0,
    ):
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {OBJECTIVES}, got {objective!r}")
        if not (math.isfinite(latent_aux_weight) and latent_aux_weight >= 0):
            raise ValueError(f"latent_aux_weight: expected a finite number >= 0, got {latent_aux_weight!r}")
        self.model, self.objective = model, objective
        self.kl_weight, self.lm_weight, self.temperature = kl_weight, lm_weight, temperature
        self.latent_aux_weight = float(latent_aux_weight)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        if labels is None:
            return self.model(input_ids, use_cache=False)
        targets = self.targets(input_ids, labels)
        loss = self.student_loss(input_ids, labels, targets)
        if self.latent_aux_weight:
            loss = loss + self.latent_aux_weight * self.latent_loss(input_ids, labels, targets)
        return DistillOutput(loss)

    def latent_loss(self, input_ids: torch.Tensor, labels: torch.Tensor, targets) -> torch.Tensor:
        """The objective of the latent branch's own prediction (summed as forward's)."""
        with latent_branch_only(self.model):
            return self.student_loss(input_ids, labels, targets)

    def _dense(self) -> bool:
        """Whether the head trains (then the full logits, else the chunked head)."""
        return self.model.get_output_embeddings().weight.requires_grad

    @torch.no_grad()
    def targets(self, input_ids: torch.Tensor, labels: torch.Tensor):
        """What the original gives for this batch, once: its layer records
        (layerwise), else its logits (dense) or final hidden states at the
        target tokens (None without a KL term)."""
        if self.objective == "layerwise":
            return record_layers(self.model, input_ids)
        if not self.kl_weight:
            return None
        keep = labels != IGNORE_INDEX
        with self.model.as_original() as base:
            if self._dense():
                return _at_least_float32(base(input_ids=input_ids, use_cache=False).logits)[keep]
            return base.model(input_ids=input_ids, use_cache=False).last_hidden_state[keep]

    def student_loss(self, input_ids: torch.Tensor, labels: torch.Tensor, targets) -> torch.Tensor:
        """The objective of the converted model as it is now (summed over the
        target tokens), against `targets` (Distiller.targets)."""
        if self.objective == "layerwise":
            loss, _ = layerwise_loss(self.model, targets)
            return loss * (labels != IGNORE_INDEX).sum().clamp(min=1)
        keep = labels != IGNORE_INDEX
        kw = dict(lm_weight=self.lm_weight, kl_weight=self.kl_weight, temperature=self.temperature)
        if self._dense():
            student = _at_least_float32(self.model(input_ids, use_cache=False).logits)[keep]
            return full_logits_objective(student, targets, labels[keep], **kw)
        student = self.model.base.model(input_ids=input_ids, use_cache=False).last_hidden_state[keep]
        return chunked_objective(self.model.base, student, targets, labels[keep], **kw)

    def dense_objective(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The end-to-end objective from the full [B, T, vocab] logits of both
        models: the reference `chunked_objective` is tested against, and the
        path taken when the head itself trains."""
        keep = labels != IGNORE_INDEX
        student = _at_least_float32(self.model(input_ids, use_cache=False).logits)[keep]
        teacher = None
        if self.kl_weight:
            with torch.no_grad(), self.model.as_original() as base:
                teacher = _at_least_float32(base(input_ids=input_ids, use_cache=False).logits)[keep]
        return full_logits_objective(
            student,
            teacher,
            labels[keep],
            lm_weight=self.lm_weight,
            kl_weight=self.kl_weight,
            temperature=self.temperature,
        )


def full_logits_objective(
    student: torch.Tensor,
    teacher: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    lm_weight: float = 1.0,
    kl_weight: float = 1.0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The sum `chunked_objective` computes, from whole logits [N, vocab]
    (student differentiable, teacher None: no KL term), by autograd."""
    total = student.new_zeros(())
    if lm_weight:
        total = total + lm_weight * F.cross_entropy(student, labels, reduction="sum")
    if kl_weight and teacher is not None:
        tau = temperature
        log_p = F.log_softmax(teacher / tau, -1)
        log_q = F.log_softmax(student / tau, -1)
        total = total + kl_weight * (log_p.exp() * (log_p - log_q)).sum() * tau**2
    return total


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def head_logits(causal_lm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of a Hugging Face causal LM from its final hidden states
    [..., F] (float32, or float64 from float64 states): the LM head, then the
    final soft-cap where the model has one (Gemma 2: c * tanh(z / c))."""
    logits = _at_least_float32(causal_lm.get_output_embeddings()(hidden))
    cap = getattr(causal_lm.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def chunked_objective(
    causal_lm: nn.Module,
    student: torch.Tensor,
    teacher: torch.Tensor | None,
    labels: torch.Tensor,
    *,
    lm_weight: float = 1.0,
    kl_weight: float = 1.0,
    temperature: float = 1.0,
    chunk: int = 256,
) -> torch.Tensor:
    """Sum over N target rows of lm_weight * CE(student logits, labels) +
    kl_weight * tau^2 * KL(softmax(teacher / tau) || softmax(student / tau)),
    from the final hidden states student [N, F] (differentiable) and teacher
    [N, F] (None: no KL term), the head applied `chunk` rows at a time.

    The head's weight must be frozen (conversion freezes it): the gradient
    with respect to the student's hidden states is then computed in the
    forward pass, chunk by chunk (d/ds of CE is softmax(s) - onehot, of the
    KL term tau * (q - p), times the soft-cap's 1 - (s / c)^2), so no
    [N, vocab] tensor outlives its chunk and no head product is recomputed
    in the backward pass. With Gemma's 262K vocabulary the full logits of both
    models cost about 1 GB per tensor per 1,024 tokens."""
    if teacher is None or not kl_weight:
        teacher, kl_weight = None, 0.0
    if teacher is None and not lm_weight:
        raise ValueError("chunked_objective: nothing to compute (no teacher and lm_weight 0)")
    if chunk < 1:
        raise ValueError(f"chunked_objective: chunk must be >= 1, got {chunk}")
    weights = (float(lm_weight), float(kl_weight), float(temperature))
    return _ChunkedObjective.apply(student, teacher, labels, causal_lm, weights, chunk)


class _ChunkedObjective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student, teacher, labels, causal_lm, weights, chunk):
        lm_weight, kl_weight, tau = weights
        cap = getattr(causal_lm.config, "final_logit_softcapping", None)
        weight = causal_lm.get_output_embeddings().weight
        total = torch.zeros((), dtype=torch.float64, device=student.device)
        grad = torch.empty_like(student)
        rows = torch.arange(min(chunk, student.shape[0]), device=student.device)
        with torch.no_grad():
            for i in range(0, student.shape[0], chunk):
                s = head_logits(causal_lm, student[i : i + chunk])  # [n, V]
                n = s.shape[0]
                g = torch.zeros_like(s)  # d(total) / d(s)
                if lm_weight:
                    y = labels[i : i + chunk]
                    total += lm_weight * (torch.logsumexp(s, -1) - s[rows[:n], y]).sum().double()
                    g += lm_weight * torch.softmax(s, -1)
                    g[rows[:n], y] -= lm_weight
                if teacher is not None:
                    log_p = torch.log_softmax(head_logits(causal_lm, teacher[i : i + chunk]) / tau, -1)
                    log_q = torch.log_softmax(s / tau, -1)
                    p = log_p.exp()
                    total += kl_weight * tau**2 * (p * (log_p - log_q)).sum().double()
                    g += kl_weight * tau * (log_q.exp() - p)
                if cap is not None:
                    g *= 1 - (s / cap) ** 2
                grad[i : i + chunk] = (g.to(weight.dtype) @ weight).to(student.dtype)
        ctx.save_for_backward(grad)
        return total.to(student.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None, None, None, None


class DistillOutput(NamedTuple):
    loss: torch.Tensor  # summed over the target tokens
