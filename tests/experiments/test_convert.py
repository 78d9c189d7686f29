"""`python -m experiments.convert --quick`: the eval stage (`latte eval`'s
ppl suite: per-token loss of the original, window + sinks and the converted
model over held-out documents, decode ms/token and state bytes) on a tiny
stand-in model the study converts itself; results files, README section and
a rerun that resumes. The other stages: test_convert_retrieval.py."""

import json

import pytest

from experiments.convert.study import main, parse_args
from latte.eval import open_subject


@pytest.mark.slow
def test_quick_experiment_writes_results_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    readme = tmp_path / "README.md"
    names = ("convert", "convert-other")
    readme.write_text("x\n" + "".join(f"<!-- results:{n}:start -->\n<!-- results:{n}:end -->\n" for n in names) + "y\n")
    where = ["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--readme", str(readme)]
    args = ["--quick", "--stages", "eval", *where]
    assert main(args) == 0
    data = json.loads((tmp_path / "out" / "convert" / "results.json").read_text())
    assert data["command"].startswith("python -m experiments.convert --quick") and data["kind"] == "converted"
    records = data["records"]
    assert {r["model"] for r in records} == {"original", "window", "converted"}
    assert {r["context"] for r in records} == {64, 128} and {r["suite"] for r in records} == {"ppl"}
    for r in records:
        assert r["ppl"] > 1 and r["bucket_ppl"] > 1 and r["tokens"] > 0 and r["decode_ms_per_token"] > 0
    state = {(r["model"], r["context"]): r["state_bytes"] for r in records}
    assert state["converted", 64] == state["converted", 128]  # constant in the context
    assert state["original", 128] == 2 * state["original", 64]  # the KV cache grows with it
    text = readme.read_text()
    assert "| window + 4 sinks | 64 |" in text and "| decode ms/token | state MB |" in text
    capsys.readouterr()
    assert main(args) == 0  # everything done: nothing recomputed, the stand-in not converted again
    assert "6 of 6 cells already done" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--set train.stepz=3: not valid"):
        main([*args, "--set", "train.stepz=3"])
    # one step-N folder of a run is a subject of its own (a point of the learning curve)
    (step_dir,) = [m.parent for m in (tmp_path / "runs").rglob("step-00000002/manifest.json")]
    subject = open_subject(step_dir)
    assert subject.identity == str(step_dir) and subject.run.step == 2
    assert subject.hf_tokenizer_dir == open_subject(step_dir.parent).hf_tokenizer_dir
    # --name NAME/SUB: another model's results inside these, in a folder and README section of their own
    before = (tmp_path / "out" / "convert" / "results.json").read_text()
    other = [*args, "--models", "original,converted", "--converted", str(step_dir), "--name", "convert/other"]
    assert main(other) == 0
    assert (tmp_path / "out" / "convert" / "results.json").read_text() == before  # untouched
    mine = json.loads((tmp_path / "out" / "convert" / "other" / "results.json").read_text())["records"]
    assert {r["model"] for r in mine} == {"original", "converted"}
    assert {r["ppl"] for r in mine if r["model"] == "converted"} == {
        r["ppl"] for r in records if r["model"] == "converted"
    }  # the newest step: the run's own weights
    section = readme.read_text().split("<!-- results:convert-other:start -->")[1].split("end -->")[0]
    assert f"latte eval: {step_dir}" in section and "| original | 128 |" in section
    for bad in ("../elsewhere", "a/b/c"):
        with pytest.raises(SystemExit):
            main([*other[:-1], bad])
    with pytest.raises(ValueError, match="one of its step-N folders"):
        open_subject(tmp_path / "nowhere")


def test_the_converted_model_defaults_to_the_shipped_run_and_the_recipes_stage_is_gone(capsys):
    """The recipes stage left (results/convert-recipes is archived): the
    evaluated model is named, by default the shipped run."""
    from experiments.convert import study

    assert study.DEFAULT_CONVERTED == "runs/convert-smollm2" and study.STAGES[0] == "eval"
    assert parse_args([]).stages == "eval,tasks,needle" and parse_args([]).data == "plays"
    assert parse_args(["--quick"]).data == "validation"
    with pytest.raises(SystemExit):
        parse_args(["--stages", "recipes"])
    assert "unknown 'recipes'" in capsys.readouterr().err


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
