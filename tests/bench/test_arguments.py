"""Issue 23 on `latte bench`: a bad option is refused before anything runs,
with exit 2 and one line naming the flag, the value and what is allowed; no
crash inside a kernel (--seqs 0 was a SIGFPE in flex_attention), no silent
default (--tokens 0), no exit 0 with an all-skip table (--mixers foo)."""

from __future__ import annotations

import importlib

import pytest

from latte.cli import main, run_command

# the repository's benchmarks run as `python -m benchmarks.NAME`; the
# package's own as `latte bench NAME`
CHECKOUT = {"window", "train", "audit"}


def bench(argv: list[str]) -> int:
    """`latte bench NAME ARGS` or `python -m benchmarks.NAME ARGS`."""
    if argv[0] not in CHECKOUT:
        return main(["bench", *argv])
    module = importlib.import_module(f"benchmarks.{argv[0]}")
    return run_command(f"python -m benchmarks.{argv[0]}", module.main, argv[1:])


@pytest.mark.parametrize(
    "argv, named",
    [
        (["window", "--seqs", "0"], "argument --seqs: expected comma-separated integers >= 1, got '0' (0 < 1)"),
        (["window", "--seqs", "-5"], "argument --seqs: expected comma-separated integers >= 1"),
        (["window", "--seqs", "abc"], "argument --seqs: expected comma-separated integers >= 1, got 'abc'"),
        (["train", "--seqs", "0"], "argument --seqs: expected comma-separated integers >= 1, got '0'"),
        (["train", "--seqs", "-5"], "argument --seqs: expected comma-separated integers >= 1"),
        (["train", "--mixers", "foo"], "argument --mixers: unknown 'foo'; expected some of latte, macchiato"),
        (["train", "--mixers", "latte:bogus"], "argument --mixers: unknown 'latte:bogus'"),
        (["train", "--tokens-per-step", "0"], "argument --tokens-per-step: expected an integer >= 1, got 0"),
        (["train", "--tag", "One Thread"], "argument --tag: expected lowercase letters, digits and inner hyphens"),
        (["train", "--tag", "x/../y"], "argument --tag: expected lowercase letters, digits and inner hyphens"),
        (["decode", "--tokens", "0"], "argument --tokens: expected an integer >= 5, got 0"),
        (["decode", "--mixers", "foo"], "argument --mixers: unknown 'foo'"),
        (["decode", "--contexts", "256,64"], "argument --contexts: expected comma-separated integers >= 1, increasing"),
        (["decode", "--prefill-chunk", "0"], "argument --prefill-chunk: expected an integer >= 1, got 0"),
        (["decode", "--prefill-cap", "-1"], "argument --prefill-cap: expected a number of seconds > 0, got -1"),
        (["decode", "--backends", "cuda"], "argument --backends: unknown 'cuda'"),
        (["ops", "--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
        (["ops", "--repeats", "2"], "argument --repeats: expected an integer >= 5, got 2"),
        (["ops", "--warmup", "-1"], "argument --warmup: expected an integer >= 0, got -1"),
        (["ops", "--time-cap", "0"], "argument --time-cap: expected a number > 0, got 0"),
        (["ops", "--time-cap", "inf"], "argument --time-cap: expected a number > 0, got inf"),
        (["ops", "--recurrent-max-t", "0"], "argument --recurrent-max-t: expected an integer >= 1, got 0"),
        (["audit", "--threads", "x"], "argument --threads: expected an integer >= 1, got 'x'"),
        (["check", "--device", "cpu", "--exact-max-t", "0"], "argument --exact-max-t: expected an integer >= 1"),
        (["check", "--device", "cpu", "--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_bench_arguments_exit_2_naming_flag_value_and_what_is_allowed(tmp_path, capsys, argv, named):
    assert bench([*argv, "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_explicit_tokens_are_kept_and_the_default_fills_only_when_absent():
    from latte.bench.decode import parse_args

    assert parse_args(["--quick"]).tokens == 8 and parse_args(["--quick", "--tokens", "6"]).tokens == 6
    assert parse_args(["--quick", "--contexts", "16,32"]).contexts == [16, 32]
