"""`latte experiment convert --quick`: every stage (a recipe run through
`latte convert`, the baselines, long-context evaluation of the original, the
sliding-window and the converted model, decode timing, the original under a window mask with attention sinks, the
long sample) on a
tiny stand-in model; results files and a rerun that resumes."""

import json

import pytest

from latte.experiments.convert import main


@pytest.mark.slow
def test_quick_experiment_writes_results_and_resumes(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(
        "x\n<!-- results:convert:start -->\n<!-- results:convert:end -->\n"
        "<!-- results:convert-recipes:start -->\n<!-- results:convert-recipes:end -->\n"
    )
    args = [
        "--quick",
        "--recipes",
        "end_to_end+lora8",
        "--runs",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        "--readme",
        str(readme),
    ]
    assert main(args) == 0
    records = json.loads((tmp_path / "out" / "convert" / "results.json").read_text())
    sinks = [r for r in records if r["model"].startswith("swa-mask-sinks")]
    records = [r for r in records if r not in sinks]
    assert {r["model"] for r in records} == {"original", "swa", "converted"}
    assert {r["context"] for r in records} == {64, 128}
    # the sinks stage: the window mask without sinks is the swa model, computed another way
    assert {(r["sinks"], r["context"]) for r in sinks} == {(0, 64), (1, 64), (4, 64)}
    swa64 = next(r for r in records if r["model"] == "swa" and r["context"] == 64)
    assert abs(next(r for r in sinks if r["sinks"] == 0)["ppl"] / swa64["ppl"] - 1) < 1e-4
    for r in records:
        assert r["ppl"] > 1 and r["bucket_ppl"] > 1 and r["tokens"] > 0 and r["wall_s"] >= 0
        assert r["train_tokens"] > 0 and r["train_wall_s"] > 0  # what the converted model cost
    conv = [r for r in records if r["model"] == "converted"]
    assert len({r["state_bytes"] for r in conv}) == 1  # constant in the context
    orig = sorted((r["context"], r["state_bytes"]) for r in records if r["model"] == "original")
    assert orig[1][1] == 2 * orig[0][1]  # the KV cache grows with it
    recipes = json.loads((tmp_path / "out" / "convert-recipes" / "results.json").read_text())
    assert [r["recipe"] for r in recipes] == ["end_to_end+lora8", "none (swa)", "none (original)"]
    assert recipes[0]["train_tokens"] > 0 and (tmp_path / "out" / "convert" / "convert.png").is_file()
    text = readme.read_text()
    assert "Perplexity over the first C tokens" in text and "| end_to_end+lora8 |" in text
    assert "window + 4 first tokens" in text
    assert "](out/convert/convert.png)" in text  # the plot's link works from the README
    # contexts below the protocol's are said to be missing, with the full command
    assert "contexts 1,024, 2,048" in text and "Reduced CPU budget" in text
    assert "Reduced CPU budget" in json.loads((tmp_path / "out" / "convert" / "run.json").read_text())["budget"]
    capsys.readouterr()
    assert main(args) == 0  # everything done: nothing recomputed
    assert "already done" in capsys.readouterr().err
    # another --set is another protocol: the finished cells are refused, not reused (issue 23)
    with pytest.raises(ValueError, match=r"cell ran under another protocol \(sets: .* then, .*train.steps=3' now\)"):
        main([*args, "--set", "train.steps=3"])
    with pytest.raises(ValueError, match="--set train.stepz=3: not valid for recipe end_to_end"):
        main([*args, "--set", "train.stepz=3"])
    assert "Past 8K tokens: not measured here" in readme.read_text()
    run = json.loads((tmp_path / "out" / "convert" / "run.json").read_text())
    assert "reused finished cells" in run["budget"] and run["cells_wall_s"] > run["wall_s"]
    # a document's cell names how far it was read: a longer --contexts reads it again
    doc_cells = [
        p.name for p in (tmp_path / "runs" / "cells-eval" / "cells").glob("*.json") if "original-decode" not in p.name
    ]
    assert len(doc_cells) == 3 * 2 and all("max_context=128" in n for n in doc_cells)


def test_past_8k_compares_on_the_documents_the_original_read_that_far():
    """The original reads one document to 16K and the other to 8K only; the
    verdict past 8K must not mix in the converted model's second document."""
    from latte.experiments.convert_report import eval_records, statements

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
        cell("swa", "a", [3.0] * 16393),
        cell("swa", "b", [3.0] * 16393),
    ]
    records = eval_records(cells, contexts)
    conv = next(r for r in records if r["model"] == "converted" and r["context"] == 16384)
    assert conv["documents"] == 2 and abs(conv["bucket_ppl"] - 20.0855) < 1e-3  # exp(3): both documents
    assert conv["original_documents"] == 1 and abs(conv["bucket_ppl_original_documents"] - 2.71828) < 1e-4
    text = statements(records, contexts)
    assert "Past 8K tokens the converted model beats the original" in text and "on 1 document(s)" in text


def test_recipe_statement_names_the_best_and_flags_unequal_budgets():
    from latte.experiments.convert_report import recipe_statement
    from latte.experiments.convert_stages import DEFAULT_RECIPE as D

    def row(recipe, ppl, tokens):
        return {"recipe": recipe, "val_ppl": ppl, "train_tokens": tokens}

    base = [row("none (swa)", 100.0, 0), row("none (original)", 50.0, 0)]
    text = recipe_statement([row(D, 70.0, 512), row("layerwise", 80.0, 512), *base])
    assert f"the default, {D}, is the best here (70.00)" in text and "same 512 training tokens" in text
    text = recipe_statement([row(D, 70.0, 512), row("kl_only", 65.0, 256), *base])
    assert f"kl_only is best here (65.00), not the default {D} (70.00)" in text
    assert "different numbers of training tokens" in text
    assert recipe_statement(base) == ""
