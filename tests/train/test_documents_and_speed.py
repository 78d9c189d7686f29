"""`latte train`'s packed documents (data.document_boundaries), fused AdamW
(optim.fused) and compiled training steps (train.compile): what the CPU can
check of the GPU training path (docs/gpu.md §5, docs/design.md)."""

from __future__ import annotations

import math

import pytest
import torch

from latte.config_io import ConfigError
from latte.models import LatteConfig, LatteForCausalLM
from latte.train.lm import summed_loss
from latte.train.loop import train
from latte.train.setup import fused_adamw
from latte.train.validation import packed_rows, token_nll
from tests.train.runs import losses

EOS = 0


def windows_with_documents(B=3, T=24, seed=0):
    """Token windows [B, T] (ids 1..63) with eos (0) at a few places, and their labels."""
    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(1, 64, (B * T + 1,), generator=g)
    stream[[5, 6, 20, 31, 47, 60]] = EOS  # two eos in a row, one at a window's start (24), one at its end
    stream[24] = EOS
    return stream[:-1].view(B, T), stream[1:].view(B, T)


def documents_of(x, y):
    """(inputs, shifted labels) of every document alone: a document starts at
    each row's start and at each eos token."""
    out = []
    for row, lab in zip(x, y):
        starts = [0, *[t for t in range(1, len(row)) if row[t] == EOS], len(row)]
        out += [(row[a:b], lab[a:b]) for a, b in zip(starts[:-1], starts[1:])]
    return out


def test_packed_rows_start_documents_at_each_window_and_each_eos():
    x = torch.tensor([[3, 0, 4, 5], [0, 0, 7, 8], [9, 9, 9, 0]])
    ids, cu = packed_rows(x, EOS)
    assert ids.tolist() == [x.flatten().tolist()]
    assert cu.tolist() == [0, 1, 4, 5, 8, 11, 12]


@pytest.mark.parametrize("mixer", ["macchiato", "softmax"])
def test_loss_with_boundaries_is_the_sum_of_the_documents_losses(mixer):
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer, num_sinks=1 if mixer == "macchiato" else 0)).double()
    x, y = windows_with_documents()
    docs = documents_of(x, y)
    assert len(docs) == 3 + 7 - 1  # three windows, seven eos of which one opens a window
    model.train()
    packed = summed_loss(model, x, y, eos_id=EOS)
    alone = sum(summed_loss(model, d[None], lab[None]) for d, lab in docs)
    torch.testing.assert_close(packed, alone, rtol=1e-6, atol=0)  # the fused loss is float32
    assert abs(float(summed_loss(model, x, y).detach()) - float(alone.detach())) > 1e-3  # without boundaries it differs

    model.eval()
    nll = token_nll(model, x, y, eos_id=EOS)
    for (d, lab), got in zip(docs, torch.cat([n for n in nll]).split([len(d) for d, _ in docs])):
        torch.testing.assert_close(got, token_nll(model, d[None], lab[None])[0], rtol=1e-6, atol=1e-6)


def test_trainer_with_document_boundaries_trains_and_validates_per_document(make_config, tmp_path):
    cfg = make_config(
        **{"train.steps": 2, "data.document_boundaries": True, "train.sample_tokens": 0, "model.num_layers": 1}
    )
    summary = train(cfg)
    plain = train(
        make_config(run_dir=tmp_path / "plain", **{"train.steps": 2, "train.sample_tokens": 0, "model.num_layers": 1})
    )
    assert math.isfinite(summary["val_ppl"]) and summary["val_tokens"] == plain["val_tokens"]
    first, first_plain = losses(tmp_path / "run")[0][1], losses(tmp_path / "plain")[0][1]
    assert first != first_plain  # the same batch, seen as documents


def test_fused_adamw_is_chosen_on_cuda_only_unless_set():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (fused_adamw(None, cpu), fused_adamw(None, cuda)) == (False, True)
    assert (fused_adamw(True, cpu), fused_adamw(False, cuda)) == (True, False)


@pytest.mark.parametrize("fused", [None, True])
def test_trainer_builds_adamw_as_optim_fused_says(make_config, fused, monkeypatch):
    from latte.train import setup as S

    seen = {}
    build = S._build

    def spy(cfg, env, *args):
        run = build(cfg, env, *args)
        seen["fused"] = [g["fused"] for g in run.weights.optimizer.param_groups]
        return run

    monkeypatch.setattr(S, "_build", spy)
    train(
        make_config(**{"train.steps": 2, "train.sample_tokens": 0, "optim.fused": "null" if fused is None else "true"})
    )
    assert seen["fused"] == [fused, fused]  # None = AdamW's default (foreach) on the CPU


def test_compiled_training_steps_match_eager_ones(make_config, tmp_path):
    common = {"train.steps": 2, "train.sample_tokens": 0, "model.mixer": "softmax", "model.num_layers": 1}
    train(make_config(run_dir=tmp_path / "eager", **common))
    train(
        make_config(
            run_dir=tmp_path / "compiled", **common, **{"train.compile": True, "train.compile_backend": "aot_eager"}
        )
    )
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert [s for s, _ in compiled] == [1, 2]
    for (_, a), (_, b) in zip(eager, compiled):
        assert math.isclose(float(a), float(b), rel_tol=1e-5)


def test_resume_follows_optim_fused_of_the_new_start(make_config, tmp_path, monkeypatch):
    from latte.train import setup as S

    seen = []
    build = S._build

    def spy(cfg, env, *args):
        run = build(cfg, env, *args)
        seen.append([g["fused"] for g in run.weights.optimizer.param_groups])
        return run

    monkeypatch.setattr(S, "_build", spy)
    common = {"train.sample_tokens": 0, "model.num_layers": 1, "train.save_every": 2}
    train(make_config(**{"train.steps": 2, "optim.fused": "true", **common}))
    summary = train(make_config(**{"train.steps": 3, "optim.fused": "false", **common}))
    assert seen == [[True, True], [None, None]] and summary["step"] == 3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"optim.fused": "yes"}, r"optim.fused: got 'yes' \(str\), expected bool or None"),
        ({"train.compile": "fast"}, r"train.compile: got 'fast' \(str\), expected bool"),
        ({"train.compile_backend": "cudagraphs"}, r"train.compile_backend: got 'cudagraphs'.*'inductor', 'aot_eager'"),
        ({"data.document_boundaries": 2}, r"data.document_boundaries: got 2 \(int\), expected bool"),
    ],
)
def test_bad_speed_options_are_refused_naming_the_field(make_config, override, message):
    with pytest.raises(ConfigError, match=message):
        make_config(**override)


def test_convert_refuses_document_boundaries():
    from latte.convert.task import ConvertDataConfig

    with pytest.raises(ConfigError, match=r"document_boundaries: got True \(bool\), expected false: the converted"):
        ConvertDataConfig(document_boundaries=True)
