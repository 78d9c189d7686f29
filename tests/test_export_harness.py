"""`latte export` and `latte harness` end to end on a tiny trained run:
transformers loads the exported folder (model, tokenizer, generation
config) and lm-eval scores it through `latte harness` exactly as the native
model does."""

from __future__ import annotations

import json

import pytest
import torch

from latte.cli import main
from tests.train.runs import train_tiny_run

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    train_tiny_run(root)
    assert main(["export", str(root / "run"), str(root / "hf")]) == 0
    return root


@pytest.fixture(scope="module")
def loaded(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from latte.models import hf
    from latte.train.runs import open_run

    hf.register()
    model = AutoModelForCausalLM.from_pretrained(exported / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(exported / "hf")
    return model, tokenizer, open_run(exported / "run")


def test_export_writes_what_transformers_expects(exported, loaded):
    from transformers import GenerationConfig

    out = exported / "hf"
    model, tokenizer, trained = loaded
    eos = trained.tokenizer.eos_id
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (eos, eos, eos)
    assert GenerationConfig.from_pretrained(out).eos_token_id == eos
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == tokenizer.bos_token_id == eos
    text = "def f(x):\n    return x"
    assert tokenizer(text)["input_ids"] == trained.tokenizer.encode(text)
    assert tokenizer.decode(trained.tokenizer.encode(text)) == text
    x = torch.tensor([trained.tokenizer.encode(text)])
    torch.testing.assert_close(model(x).logits, trained.model(x).logits, atol=0, rtol=0)


def test_padding_generate_and_pipeline_stop_at_end_of_document(loaded):
    from transformers import pipeline

    model, tokenizer, trained = loaded
    batch = tokenizer(["The", "A longer prompt for the model"], padding=True, return_tensors="pt")
    assert batch["attention_mask"][0, 0] == 0  # left padding
    ours = trained.model.generate(
        batch["input_ids"],
        6,
        temperature=0,
        attention_mask=batch["attention_mask"],
        eos_token_id=tokenizer.eos_token_id,
    )
    theirs = model.generate(**batch, max_new_tokens=6, do_sample=False)
    assert torch.equal(theirs, ours)
    # Make the end-of-document token the greedy choice after this prompt: HF
    # generate and the pipeline must stop right after it (generation_config).
    prompt = tokenizer("def f", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden, _ = model.model(prompt)
        model.lm_head.weight[tokenizer.eos_token_id] = 50 * hidden[0, -1] / hidden[0, -1].norm()
    out = model.generate(prompt, max_new_tokens=10, do_sample=False)
    assert out.shape[1] == prompt.shape[1] + 1 and out[0, -1] == tokenizer.eos_token_id
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    ids = generate("def f", max_new_tokens=10, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert ids == out[0].tolist()  # the pipeline stops after the end-of-document token too
    assert generate("def f", max_new_tokens=10, do_sample=False)[0]["generated_text"] == "def f"


TASKS = """\
task: latte_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
---
task: latte_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


def _native_loglikelihood(trained, context: str, continuation: str) -> float:
    """Sum of log p(continuation | context), split into tokens as lm-eval
    does (trailing spaces of the context move to the continuation)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    tok = trained.tokenizer
    whole, ctx = tok.encode(context + continuation), tok.encode(context)
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = trained.model(ids[:, :-1]).logits.float().log_softmax(-1)[0]
    return sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole)))


def test_harness_scores_like_the_native_model(exported, loaded, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, _, trained = loaded
    mc = [
        {"question": "def f(x):\n", "choices": ["    return x", " import os", "class A"], "answer": 0},
        {"question": "The value of", "choices": [" the", " x", " None"], "answer": 2},
    ]
    gen = [{"prompt": "def ", "target": "f"}, {"prompt": "Return the", "target": " value"}]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc))
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gen))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for i, part in enumerate(TASKS.format(data=tmp_path).split("---\n")):
        (tasks / f"task{i}.yaml").write_text(part)
    assert (
        main(
            [
                "harness",
                "run",
                "--model",
                "latte",
                "--model_args",
                f"pretrained={exported / 'hf'}",
                "--include_path",
                str(tasks),
                "--tasks",
                "latte_tiny_mc,latte_tiny_gen",
                "--device",
                "cpu",
                "--batch_size",
                "1",
                "--output_path",
                str(tmp_path / "out"),
                "--log_samples",
            ]
        )
        == 0
    )
    samples = {}
    for path in (tmp_path / "out").rglob("samples_*.jsonl"):
        name = path.name.split("_2")[0].removeprefix("samples_")
        samples[name] = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(samples) == ["latte_tiny_gen", "latte_tiny_mc"]
    for s in samples["latte_tiny_mc"]:
        doc = mc[s["doc_id"]]
        got = [float(r[0][0]) for r in s["resps"]]  # logged as text
        want = [_native_loglikelihood(trained, doc["question"] + " ", c) for c in doc["choices"]]
        assert got == pytest.approx(want, abs=1e-4)
    for s in samples["latte_tiny_gen"]:
        prompt = gen[s["doc_id"]]["prompt"]
        ids = torch.tensor([trained.tokenizer.encode(prompt)])
        new = trained.model.generate(ids, 8, temperature=0, eos_token_id=trained.tokenizer.eos_id)[0, ids.shape[1] :]
        text = trained.tokenizer.decode([t for t in new.tolist() if t != trained.tokenizer.eos_id])
        assert s["resps"][0][0] == text.split("\n\n")[0]


def test_harness_without_lm_eval_says_what_to_install(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_lm_eval(name, *a, **kw):
        if name == "lm_eval" or name.startswith("lm_eval."):
            raise ImportError("No module named 'lm_eval'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_lm_eval)
    assert main(["harness", "--tasks", "x"]) == 2
    assert "pip install 'latte[harness]'" in capsys.readouterr().err


def test_harness_names_a_pretrained_folder_it_cannot_load_before_lm_eval_starts(exported, tmp_path, capsys):
    """A missing local folder, a training run, one of its checkpoints, a
    convert run (whose model is RUN/model) and a folder without config.json
    each exit 2 saying what to pass; the exported folder and a hub-style name
    pass the check."""
    from latte.eval.harness import check_pretrained

    run, empty = exported / "run", tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "converted" / "model").mkdir(parents=True)
    (tmp_path / "converted" / "model" / "config.json").write_text("{}")
    step = sorted(run.glob("step-*"))[-1]
    cases = {
        str(tmp_path / "nope"): "no such folder",
        str(run): f"write one with `latte export {run} DEST`",
        str(step): "a training run or checkpoint folder",
        str(tmp_path / "converted"): f"its model is pretrained={tmp_path / 'converted' / 'model'}",
        str(empty): "no config.json in the folder",
    }
    for value, says in cases.items():
        assert main(["harness", "run", "--model", "latte", "--model_args", f"pretrained={value},dtype=float32"]) == 2
        err = capsys.readouterr().err
        assert f"--model_args pretrained={value}: " in err and says in err, err
    assert main(["harness", f"--model_args=dtype=float32,pretrained={tmp_path / 'nope'}"]) == 2
    assert "no such folder" in capsys.readouterr().err
    check_pretrained(["--model_args", f"pretrained={exported / 'hf'}"])
    check_pretrained(["--model_args", "pretrained=org/name", "--tasks", "x"])


def test_export_of_a_missing_run_exits_2(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "no such run or checkpoint folder" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_export_refuses_a_destination_inside_a_run_or_a_checkpoint(exported, tmp_path, capsys):
    """Issue 23 item 4: OUT inside the run being exported, inside one of its
    checkpoints, or inside any other run folder is refused before anything is
    written; the run's tokenizer and newest checkpoint stay as they were."""
    import hashlib
    import shutil

    from latte.train.checkpoint import find_latest_checkpoint, step_dirs, verify_checkpoint

    run = exported / "run"
    newest = find_latest_checkpoint(run)
    other = tmp_path / "other-run"
    shutil.copytree(run, other)

    def digest():
        return {p.relative_to(run): hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}

    before = digest()
    cases = [
        (run, run, "the folder being exported"),
        (run, newest, "a checkpoint"),  # a step folder of the run exported
        (newest, newest / "hf", "the folder being exported"),
        (newest, run, "the folder being exported"),  # exporting a step into its own run
        (run, step_dirs(run)[-1][1] / "x", "a checkpoint"),
        (run, other, "a run folder"),
        (run, other / "sub" / "hf", "a run folder"),
        (run, next(p for _, p in step_dirs(other)), "a checkpoint"),
    ]
    for source, out, what in cases:
        assert main(["export", str(source), str(out)]) == 2, out
        err = capsys.readouterr().err
        assert f"OUT {out}: inside {what}" in err and "Traceback" not in err
    assert digest() == before and find_latest_checkpoint(run) == newest
    verify_checkpoint(newest)
    assert not (newest / "hf").exists()
