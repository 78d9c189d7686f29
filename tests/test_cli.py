"""`latte train | generate | eval | bench` end to end on a tiny run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from latte.cli import _split_train_args, main
from tests.train.runs import REPO, train_tiny_run


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("cli"))


def test_train_args_split():
    assert _split_train_args(["--config", "a.yaml", "--train.steps=3", "--resume", "auto", "--model.dim", "8"]) == (
        "a.yaml",
        ["--train.steps=3", "--train.resume=auto", "--model.dim", "8"],
    )
    assert _split_train_args(["--config=b.yaml"]) == ("b.yaml", [])


def test_train_wrote_a_checkpoint(trained_run):
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["step"] == 4 and (trained_run / "step-00000004" / "manifest.json").is_file()


def test_generate_streams_a_continuation(trained_run, capsys):
    assert (
        main(["generate", "--run", str(trained_run), "--prompt", "The ", "--max-new-tokens", "12", "--seed", "1"]) == 0
    )
    out = capsys.readouterr()
    assert out.out.startswith("The ") and len(out.out) > len("The \n")
    assert "step-00000004" in out.err
    # same seed, same text
    assert (
        main(["generate", "--run", str(trained_run), "--prompt", "The ", "--max-new-tokens", "12", "--seed", "1"]) == 0
    )
    assert capsys.readouterr().out == out.out


def test_streaming_equals_model_generate(trained_run):
    from latte.eval.generation import IncrementalDecoder, stream_tokens
    from latte.train.runs import open_run

    t = open_run(trained_run)
    ids = t.tokenizer.encode("def f")
    streamed = list(stream_tokens(t.model, ids, 10, temperature=0))
    ref = t.model.generate(torch.tensor([ids]), 10, temperature=0)[0, len(ids) :].tolist()
    assert streamed == ref
    d = IncrementalDecoder(t.tokenizer)
    assert "".join(d.push(i) for i in streamed) + d.flush() == t.tokenizer.decode(streamed)


def test_eval_prints_table_and_writes_json(trained_run, capsys):
    assert main(["eval", "--run", str(trained_run), "--lengths", "1,2", "--max-tokens", "512"]) == 0
    out = capsys.readouterr().out
    assert "length" in out and "1-128" in out
    report = json.loads((trained_run / "eval.json").read_text())
    assert [r["seq_len"] for r in report["results"]] == [32, 64]
    assert report["results"][0]["tokens"] == report["results"][1]["tokens"]


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    assert main(["train", "--train.stepz=3", "--optim.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert "train.stepz: unknown key (did you mean 'steps'?)" in err and "optim.lr: got -1" in err


def test_eval_of_a_folder_without_checkpoints_exits_2(tmp_path, capsys):
    assert main(["eval", "--run", str(tmp_path)]) == 2
    assert "no verified checkpoint" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path / "typo")]) == 2
    assert "no such run or checkpoint folder" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()  # nothing created on the way


def test_unknown_command_and_help(capsys):
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "latte train" in capsys.readouterr().out


def test_the_first_line_names_every_command(capsys):
    import latte.cli

    assert main(["fly"]) == 2
    commands = capsys.readouterr().err.split("expected one of ", 1)[1].split("\n", 1)[0].split(", ")
    first = latte.cli.__doc__.splitlines()[0].split(": ", 1)[1].rstrip(".").split(", ")
    assert "train" in commands and sorted(first) == sorted(commands)


def test_train_help_lists_the_shipped_configs(capsys):
    from latte.train.config import shipped_configs

    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert {"tiny", "paper-table6", "mixers/latte"} <= set(shipped_configs())
    assert all(name in out for name in shipped_configs())


def test_bench_dispatches_lazily(monkeypatch, capsys):
    import importlib

    real = importlib.import_module
    calls = []

    def fake(name, *a):
        if name == "latte.bench.decode":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name == "latte.bench.ops":
            calls.append(name)
            return type("M", (), {"main": staticmethod(lambda argv: calls.append(argv) or 0)})
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    assert main(["bench", "decode"]) == 2
    assert "latte.bench.decode is not available" in capsys.readouterr().err
    assert main(["bench", "ops", "--quick"]) == 0 and calls == ["latte.bench.ops", ["--quick"]]
    assert main(["bench", "nope"]) == 2


def test_retired_laboratory_verbs_exit_2_printing_the_new_command(monkeypatch, capsys):
    """`latte experiment NAME` and the repository's `latte bench NAME` are
    retired: they exit 2 printing the `python -m` command that runs them now,
    import nothing of the laboratory and leave sys.path and PYTHONPATH alone."""
    import experiments
    from latte import cli

    assert cli.STUDIES == experiments.COMMANDS  # every study named, by the module that runs it
    path, env = list(sys.path), os.environ.get("PYTHONPATH")
    loaded = {m for m in sys.modules if m.split(".")[0] in ("experiments", "benchmarks")}
    for argv, said in (
        (["experiment", "mqar", "--quick"], "`python -m experiments.mqar --quick`"),
        (
            ["experiment", "convert-sinks", "--threads", "1"],
            "`python -m experiments.sinks --threads 1`",
        ),
        (["experiment", "no-such-study"], "`python -m experiments.NAME`"),
        (["experiment", "--help"], "`python -m experiments.NAME`"),
        (["bench", "train", "--quick"], "`python -m benchmarks.train --quick`"),
        (["bench", "suite", "--dry-run"], "`python -m experiments.gpu_suite --dry-run`"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"latte {' '.join(argv[:2]) if argv[0] == 'bench' else 'experiment'} is no longer" in err, err
        assert said in err and "Traceback" not in err, err
    assert sys.path == path and os.environ.get("PYTHONPATH") == env
    assert {m for m in sys.modules if m.split(".")[0] in ("experiments", "benchmarks")} == loaded


def test_run_command_gives_the_latte_exit_codes(capsys):
    """The `python -m` entry points of the laboratory exit as latte commands do."""
    from latte.cli import run_command

    def fails(error):
        def handler(args):
            raise error

        return handler

    assert run_command("python -m x", lambda args: {"results": 1}, []) == 0
    assert run_command("python -m x", lambda args: 3, []) == 3
    assert run_command("python -m x", fails(ValueError("--dims abc: bad")), []) == 2
    assert "python -m x: error: --dims abc: bad" in capsys.readouterr().err
    assert run_command("python -m x", fails(OSError("disk full")), []) == 1
    assert run_command("python -m x", fails(SystemExit("no")), []) == 2


def test_bench_device_cuda_without_a_gpu_exits_2_saying_why(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["bench", "ops", "--device", "cuda", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "latte bench: error: --device cuda: torch.cuda.is_available() is False" in err and "--device cpu" in err


def test_python_dash_m_latte():
    proc = subprocess.run(
        [sys.executable, "-m", "latte", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert proc.returncode == 0 and "torchrun" in proc.stdout


def test_bench_command_runs_and_updates_a_readme_section(tmp_path):
    from latte.cli import main

    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:ops:start -->\nold numbers\n<!-- bench:ops:end -->\nrest\n")
    out = tmp_path / "bench"
    assert main(["bench", "ops", "--quick", "--no-memory", "--out", str(out), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old numbers" not in text and "latte bench ops (quick)" in text
    assert text.startswith("intro\n") and text.endswith("rest\n")
    assert "![ops](bench/ops.png)" in text  # the plot's link works from the README's folder
    assert (out / "ops.json").exists()


# --------------------------------------------------------------------------- arguments (issue 10, items 8-9)


@pytest.mark.parametrize(
    "args",
    [
        ["--top-p", "0"],
        ["--top-p", "-0.5"],
        ["--top-p", "2"],
        ["--top-p", "nan"],
        ["--top-k", "-5"],
        ["--temperature", "nan"],
        ["--temperature", "-1"],
        ["--temperature", "inf"],
        ["--max-new-tokens", "-3"],
        ["--top-k", "x"],
    ],
)
def test_generate_refuses_bad_arguments_before_printing_anything(trained_run, capsys, args):
    assert main(["generate", "--run", str(trained_run), "--prompt", "The ", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and f"argument {args[0]}: expected" in out.err and "Traceback" not in out.err


def test_generate_accepts_the_edges_of_the_ranges(trained_run, capsys):
    assert (
        main(
            [
                "generate",
                "--run",
                str(trained_run),
                "--prompt",
                "The ",
                "--top-p",
                "1",
                "--top-k",
                "0",
                "--temperature",
                "0",
                "--max-new-tokens",
                "0",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "The \n"


@pytest.mark.parametrize("args", [["--batch-size", "0"], ["--batch-size", "-2"], ["--max-tokens", "-5"]])
def test_eval_refuses_bad_arguments(trained_run, capsys, args):
    assert main(["eval", "--run", str(trained_run), *args]) == 2
    assert f"argument {args[0]}: expected an integer" in capsys.readouterr().err


def test_an_abbreviated_flag_is_refused_not_guessed(trained_run, capsys):
    # argparse would read --max-tok as --max-tokens, and a later option
    # sharing the prefix would silently change what an old command means
    assert main(["eval", "--run", str(trained_run), "--max-tok", "256"]) == 2
    assert "unrecognized arguments: --max-tok" in capsys.readouterr().err


def test_eval_out_into_a_missing_folder_is_created_and_the_table_printed(trained_run, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "eval.json"
    assert main(["eval", "--run", str(trained_run), "--lengths", "1", "--max-tokens", "256", "--out", str(out)]) == 0
    assert "length" in capsys.readouterr().out and json.loads(out.read_text())["results"]


def test_eval_out_that_cannot_be_written_fails_before_computing(trained_run, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["eval", "--run", str(trained_run), "--out", str(blocker / "eval.json")]) == 2
    err = capsys.readouterr().err
    assert f"--out {blocker}: a file, not a folder" in err and "evaluating up to" not in err
    assert main(["eval", "--run", str(trained_run), "--out", str(blocker / "deeper" / "eval.json")]) == 2
    err = capsys.readouterr().err
    assert f"{blocker} is a file, not a folder" in err and "evaluating up" not in err  # the file in the way, named


def test_eval_out_follows_the_write_rule_and_reruns_over_its_own_file(trained_run, tmp_path, capsys):
    # docs/reliability.md §8: never over a foreign file, into a checkpoint, a
    # run or another command's folder; the same command replaces its own file
    fast = ["eval", "--run", str(trained_run), "--lengths", "1", "--max-tokens", "256", "--out"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "eval.json").write_text("mine\n")
    step = trained_run / "step-00000004"
    for out, named in (
        (notes / "eval.json", "holds 1 entry (eval.json), not written by a latte command"),
        (step / "eval.json", "a checkpoint"),
        (trained_run / "other.json", "a run folder"),
        (trained_run / "plots" / "eval.json", f"inside {trained_run}"),
    ):
        assert main([*fast, str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out.parent}" in err and named in err and "evaluating up to" not in err, err
    assert (notes / "eval.json").read_text() == "mine\n" and not (trained_run / "other.json").exists()
    assert not (step / "eval.json").exists() and not (trained_run / "plots").exists()
    mine = tmp_path / "evals" / "eval.json"
    assert main([*fast, str(mine)]) == 0 and main([*fast, str(mine)]) == 0  # its own file, replaced
    assert json.loads(mine.read_text())["results"]
    (mine.parent / "notes.txt").write_text("mine\n")  # a file the command did not write, in its folder
    assert main([*fast, str(mine.parent / "notes.txt")]) == 2
    assert "notes.txt is there, not recorded as written by `latte eval`" in capsys.readouterr().err
    # the run's own report (the default; lm-variants names it with --out) is the run's to write
    assert main([*fast, str(trained_run / "eval.json")]) == 0 and (trained_run / "eval.json").is_file()


def test_bad_float_in_config_fails_before_the_run_folder_is_touched(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--optim.lr=.inf", f"--train.run_dir={run_dir}"]) == 2
    assert "optim.lr: got inf (float), expected a finite number" in capsys.readouterr().err
    assert not run_dir.exists()


def test_eval_latents_writes_json_png_and_table(trained_run, capsys):
    """The tiny run is Macchiato: per layer and head the utilisation metrics
    and the window share, written next to the run with a heat map."""
    assert main(["eval", "--run", str(trained_run), "--latents", "--max-tokens", "256"]) == 0
    out = capsys.readouterr().out
    assert "effective latents" in out and "p(window) mean" in out
    report = json.loads((trained_run / "latents.json").read_text())
    assert report["mixer"] == "macchiato" and report["tokens"] == 256
    heads = [h for layer in report["layers"] for h in layer["heads"]]
    assert len(heads) == 4 and all(1.0 <= h["effective_latents"] <= h["latents_per_head"] for h in heads)
    assert all(0.0 < h["p_window_mean"] < 1.0 and len(h["p_window_by_position"]) == 32 for h in heads)
    assert (trained_run / "latents.png").stat().st_size > 0


def test_generate_turns_memory_slots_on_without_retraining(trained_run, capsys, monkeypatch):
    base = ["generate", "--run", str(trained_run), "--prompt", "The ", "--max-new-tokens", "40", "--temperature", "0"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--set", "model.memory_slots=4", "--set", "model.memory_rule=key_norm"]) == 0
    assert capsys.readouterr().out.startswith("The ")
    assert main([*base, "--set", "model.memory_slots=-1"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "memory_slots: got -1" in out.err and "Traceback" not in out.err
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a machine without CUDA
    assert main([*base, "--set", "model.backend=fla"]) == 2  # as if saved with the run
    assert "--set model.backend=torch" in capsys.readouterr().err
    assert main([*base, "--set", "model.backend=torch"]) == 0 and capsys.readouterr().out == plain
    assert plain.startswith("The ")
    from latte.layers import MacchiatoAttention
    from latte.train.runs import open_run

    layers = [m for m in open_run(trained_run, sets=["model.memory_slots=4"]).model.modules()]
    assert {m.memory.slots for m in layers if isinstance(m, MacchiatoAttention)} == {4}
