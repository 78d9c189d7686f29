"""Issue 59, part B: every writer holds its folder for the whole write
(latte/guard.py: claim_folder; docs/reliability.md §8). A second writer is
refused while the first one writes, naming the folder and the holder, and
deletes nothing; `latte export` writes a sibling folder swapped in whole,
so a cut export leaves the earlier one, two exports never mix, and a
re-export removes only the files the earlier export listed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from latte.guard import HOLD, MARKER, WriteRefused, check_folder, claim_folder
from tests.helpers import tiny_llama


def _files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _in_thread(fn):
    """fn() in another thread: its result or the exception it raised."""
    box = []
    t = threading.Thread(target=lambda: box.append(_outcome(fn)))
    t.start()
    t.join(timeout=60)
    return box[0]


def _outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  the test looks at it
        return e


def _claim(folder: Path, writer: str, **kw):
    with claim_folder(folder, writer, **kw) as held:
        return held


# ---------------------------------------------------------------- the hold


def test_a_second_writer_is_refused_while_the_first_writes_naming_the_holder(tmp_path):
    """The issue's case 2 at its root: the claim held only while the marker
    was written, so a second `latte export` into the folder passed while the
    first one was still writing. Now a second writer of the same command
    (another thread or another process) is refused until the block ends,
    and nothing in the folder changes."""
    folder = tmp_path / "out"
    with claim_folder(folder, "latte export") as held:
        (held / "config.json").write_text("{}")
        before = _files(folder)
        refused = _in_thread(lambda: _claim(folder, "latte export"))
        assert isinstance(refused, WriteRefused), refused
        assert f"--out {folder}: being written by `latte export` (pid" in str(refused)
        refused = _in_thread(lambda: _claim(folder, "latte experiment mqar"))  # another command: the rule
        assert isinstance(refused, WriteRefused) and "written by `latte export`" in str(refused)
        code = (
            "import sys; from latte.guard import claim_folder\n"
            "try:\n    claim_folder(sys.argv[1], 'latte export').__enter__()\n"
            "except ValueError as e:\n    print(e); sys.exit(2)\n"
        )
        other = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)
        assert other.returncode == 2 and "being written by `latte export`" in other.stdout, other
        assert _files(folder) == before
    assert _claim(folder, "latte export") == folder  # free again once the block ended
    assert sorted(p.name for p in folder.iterdir()) == [MARKER, "config.json"]  # no lock file left


def test_the_thread_holding_a_folder_claims_it_again(tmp_path):
    """The suite holds its folder for its whole run and writes its report
    inside it (experiments/gpu_suite: run, then write_report)."""
    with claim_folder(tmp_path / "out", "latte bench suite") as outer:
        with claim_folder(outer, "latte bench suite") as inner:
            assert inner == outer and (outer / HOLD).exists()
        assert (outer / HOLD).exists()  # still held by the outer block
    assert not (outer / HOLD).exists()


def test_a_hold_a_kill_left_does_not_block(tmp_path):
    """flock is released when its process dies: a lock file left by a kill
    names nobody who holds it."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / HOLD).write_text('{"writer": "latte export", "pid": 1, "host": "h", "since": "then"}')
    check_folder(folder, "latte export")  # the lock file is not the folder's content
    assert _claim(folder, "latte export") == folder
    assert [p.name for p in folder.iterdir()] == [MARKER]


def test_6_a_folder_under_a_file_is_refused_naming_the_file(tmp_path):
    """Case 6: `latte export RUN FILE/sub` ended in a bare [Errno 20]."""
    from latte.convert.export import check_export_destination

    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    for out in (file / "sub", file / "a" / "b"):
        with pytest.raises(WriteRefused, match=rf"OUT {out}: {file} is a file, not a folder"):
            check_export_destination(tmp_path / "run", out)
        with pytest.raises(WriteRefused, match=rf"--out {out}: {file} is a file, not a folder"):
            _claim(out, "latte experiment mqar")
    assert file.read_text() == "mine\n"


# ---------------------------------------------------------------- staged writes


def _staged_write(folder: Path, files: dict, fail_after: int | None = None) -> Path:
    """A staged write of `files` (name: text; a/b makes a folder), cut by an
    exception after `fail_after` files."""
    with claim_folder(folder, "latte export", flag="OUT", staged=True) as stage:
        assert stage != folder and stage.parent == folder.parent
        for i, (name, text) in enumerate(files.items()):
            if i == fail_after:
                raise RuntimeError("cut")
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(text)
    return folder


def test_a_cut_staged_write_leaves_the_earlier_files_and_no_stage(tmp_path):
    folder = tmp_path / "out"
    _staged_write(folder, {"config.json": "A", "model.safetensors": "A"})
    before = _files(folder)
    with pytest.raises(RuntimeError, match="cut"):
        _staged_write(folder, {"config.json": "B", "model.safetensors": "B"}, fail_after=1)
    assert _files(folder) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the stage went with the exception
    # a stage a kill left (no marker yet: only new files) is removed by the next staged write
    stale = tmp_path / ".out.latte-stage-999999-1"
    stale.mkdir()
    (stale / "config.json").write_text("half")
    _staged_write(folder, {"config.json": "C"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert json.loads((folder / MARKER).read_text()) == {"writer": "latte export", "files": ["config.json"]}


def test_7_a_staged_write_removes_only_what_the_earlier_one_listed(tmp_path):
    """Case 7 at the guard: the earlier export's base/ goes, a file the user
    put there stays; a file of the user's that the new write would replace
    is refused, nothing changed."""
    folder = tmp_path / "out"
    _staged_write(folder, {"config.json": "conv", "model.safetensors": "conv", "base/weights.safetensors": "w"})
    (folder / "notes.txt").write_text("mine")
    _staged_write(folder, {"config.json": "lm", "model.safetensors": "lm", "tokenizer.json": "t"})
    assert _files(folder) == {
        MARKER: (folder / MARKER).read_bytes(),
        "config.json": b"lm",
        "model.safetensors": b"lm",
        "notes.txt": b"mine",
        "tokenizer.json": b"t",
    }
    assert json.loads((folder / MARKER).read_text())["files"] == ["config.json", "model.safetensors", "tokenizer.json"]
    (folder / "README.md").write_text("mine too")
    before = _files(folder)
    with pytest.raises(WriteRefused, match=r"README.md is there, not written by `latte export`"):
        _staged_write(folder, {"config.json": "x", "README.md": "generated"})
    assert _files(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_export_written_before_markers_listed_files_keeps_what_is_not_replaced(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / MARKER).write_text('{"writer": "latte export"}\n')
    (folder / "config.json").write_text("old")
    (folder / "extra.txt").write_text("unknown")
    _staged_write(folder, {"config.json": "new"})
    assert (folder / "config.json").read_text() == "new" and (folder / "extra.txt").read_text() == "unknown"


# ---------------------------------------------------------------- latte export


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A converted folder (a tiny random Llama, converted, its tokenizer
    beside it) and a tiny Latte language model with its tokenizer."""
    pytest.importorskip("transformers")

    from latte.convert import ConversionConfig, convert_pretrained, save_converted
    from latte.data import train_bpe
    from latte.models import LatteConfig, LatteForCausalLM
    from tests.train.runs import write_corpus

    root = tmp_path_factory.mktemp("export-models")
    (root / "corpus").mkdir()
    texts = [p.read_text() for p in sorted(write_corpus(root / "corpus").glob("*.txt"))]
    tokenizer = train_bpe(texts, vocab_size=320)
    tiny_llama(320).save_pretrained(root / "base")
    converted = convert_pretrained(root / "base", ConversionConfig(window_size=8, latents_per_head=4, chunk_size=8))
    save_converted(converted, root / "converted")
    tokenizer.save(root / "converted")
    lm = LatteForCausalLM(LatteConfig.tiny(mixer="macchiato", vocab_size=320)).eval()
    return root / "converted", lm, tokenizer


def _export_lm(models, out: Path) -> Path:
    from latte.convert.export import export_language_model

    _, lm, tokenizer = models
    return export_language_model(lm, tokenizer, out)


def test_7_an_export_over_a_converted_models_export_leaves_no_base(models, tmp_path):
    from latte.convert.export import export_converted

    out = tmp_path / "hf"
    export_converted(models[0], out)
    assert (out / "base").is_dir() and (out / "tokenizer.json").is_file()
    assert _export_lm(models, out) == out
    assert not (out / "base").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "latte"
    listed = json.loads((out / MARKER).read_text())["files"]
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == listed


def test_2_two_exports_into_one_folder_never_mix(models, tmp_path, monkeypatch):
    """Case 2: an export that has written its config and weights while a
    second export writes the folder: the second is refused (it used to
    succeed, and the first then copied its tokenizer over the second's
    model). The folder ends as the first model's complete export."""
    from latte.convert import export as E
    from latte.convert import load_converted

    out, inside, second_done = tmp_path / "hf", threading.Event(), threading.Event()
    real = E.export_portable

    def slow_portable(*args, **kw):
        written = real(*args, **kw)
        inside.set()
        assert second_done.wait(60)
        return written

    monkeypatch.setattr(E, "export_portable", slow_portable)
    box = []
    first = threading.Thread(target=lambda: box.append(_outcome(lambda: E.export_converted(models[0], out))))
    first.start()
    assert inside.wait(120)
    try:
        second = _outcome(lambda: _export_lm(models, out))
    finally:
        second_done.set()
    first.join(timeout=120)
    assert isinstance(second, WriteRefused) and f"OUT {out}: being written by `latte export`" in str(second), second
    assert box == [out.resolve()]
    monkeypatch.setattr(E, "export_portable", real)
    reference = E.export_converted(models[0], tmp_path / "reference")
    assert json.loads((out / "config.json").read_text())["model_type"] == "latte_converted"
    got, want = _files(out), _files(reference)
    assert sorted(got) == sorted(want)  # the converted model's files, nothing of the language model's export
    assert all(got[k] == want[k] for k in want if k.startswith("base/") or k.startswith("tokenizer"))
    load_converted(out)  # its config.json records the sha256 of the model.safetensors beside it


def test_a_cut_export_leaves_the_earlier_export(models, tmp_path, monkeypatch):
    """A crash in the middle of `latte export` used to leave half an export
    over the earlier one (new config, old weights)."""
    from latte.models import pretrained

    out = tmp_path / "hf"
    _export_lm(models, out)
    before = _files(out)

    def cut(model, tokenizer, directory):
        (Path(directory) / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrained, "export_for_transformers", cut)
    with pytest.raises(KeyboardInterrupt):
        _export_lm(models, out)
    assert _files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
