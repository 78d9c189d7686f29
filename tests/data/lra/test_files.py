"""The download-only LRA tasks, read from small files written here in the
published formats (aclImdb folders, the LRA AAN TSV, CIFAR-10 python batches)."""

import pickle

import numpy as np
import pytest

from latte.data.lra import files as F


def test_imdb_folder(tmp_path):
    root = tmp_path / "aclImdb"
    reviews = {}
    for split in ("train", "test"):
        for label, name in ((0, "neg"), (1, "pos")):
            (root / split / name).mkdir(parents=True)
            for i in range(12):
                text = f"{name} review {i} of {split}: caf\u00e9 " + "x" * i
                (root / split / name / f"{i}_{7 + label}.txt").write_text(text, encoding="utf-8")
                reviews[(split, name, i)] = text
    (root / "train" / "unsup").mkdir()  # the unlabelled reviews of the release are ignored
    (root / "train" / "unsup" / "0_0.txt").write_text("no label")
    data = F.load_imdb(tmp_path, max_length=20, val_fraction=0.25)  # the parent folder works too
    assert len(data["train"]) + len(data["validation"]) == 24 and len(data["test"]) == 24
    assert 0 < len(data["validation"]) < 24
    test = data["test"]
    assert test.labels.tolist() == [0] * 12 + [1] * 12  # neg then pos, files sorted by name
    first = reviews[("test", "neg", 0)].encode("utf-8")[:20]
    np.testing.assert_array_equal(test.inputs[0][0], np.frombuffer(first, np.uint8) + F.BYTE_OFFSET)
    assert test.inputs[0].lengths.max() == 20  # cut to max_length bytes
    assert test.vocab_size == F.BYTE_VOCAB_SIZE and test.inputs[0].tokens.max() < F.BYTE_VOCAB_SIZE


def test_imdb_missing_says_what_to_get(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"LRA text: .* not found.*aclImdb_v1.tar.gz, extract it.*data.path"):
        F.load_imdb(tmp_path / "nowhere")


def _aan_rows(n):
    rows = []
    for i in range(n):
        label = f"{i % 2}.0"
        rows.append([label, f"P{i}-a", f"P{i}-b", f'Paper {i} text "quoted" ' * (1 + i), f"Other {i} body"])
    return rows


def test_aan_tsv(tmp_path):
    folder = tmp_path / "lra_release" / "tsv_data"
    folder.mkdir(parents=True)
    written = {}
    for split, name in F.AAN_FILES.items():
        rows = _aan_rows(6)
        written[split] = rows
        (folder / name).write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    data = F.load_aan(tmp_path, max_length=50)
    test = data["test"]
    assert test.is_pair and len(test) == 6 and test.labels.tolist() == [0, 1, 0, 1, 0, 1]
    expected = written["test"][2][3].encode()[:50]  # quotes are plain characters (no quoting in the format)
    np.testing.assert_array_equal(test.inputs[0][2], np.frombuffer(expected, np.uint8) + F.BYTE_OFFSET)
    np.testing.assert_array_equal(test.inputs[1][2], np.frombuffer(b"Other 2 body", np.uint8) + F.BYTE_OFFSET)
    batch = test.batch([0, 3])
    assert set(batch) == {"input_ids", "attention_mask", "input_ids_2", "attention_mask_2", "labels"}
    assert batch["input_ids_2"].shape == (2, len("Other 0 body"))


def test_aan_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"LRA retrieval: .*new_aan_pairs.train.tsv.*lra_release.gz"):
        F.load_aan(tmp_path)
    for name in F.AAN_FILES.values():
        (tmp_path / name).write_text("1.0\tA\tB\tonly four fields\n")
    with pytest.raises(ValueError, match=r"new_aan_pairs.train.tsv:1: expected 5 tab-separated fields"):
        F.load_aan(tmp_path)
    for name in F.AAN_FILES.values():
        (tmp_path / name).write_text("yes\tA\tB\tx\ty\n")
    with pytest.raises(ValueError, match=r":1: label 'yes' is not 0 or 1"):
        F.load_aan(tmp_path)


def _write_cifar(folder, n_per_batch=4):
    """Batches as the CIFAR-10 python release holds them: a pickled dict with
    bytes keys, 'data' uint8 [N, 3072] (R, G, B planes) and 'labels'."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = {}
    for name in (*F.CIFAR_TRAIN, "test_batch"):
        data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n_per_batch).tolist()
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img{i}.png".encode() for i in range(n_per_batch)],
        }
        # protocol 2 as the release; numpy's module named as in those (Python 2, numpy 1) files
        raw = pickle.dumps(batch, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / name).write_bytes(raw)
        images[name] = (data, labels)
    return images


def test_cifar_batches(tmp_path):
    written = _write_cifar(tmp_path / "cifar-10-batches-py")
    data = F.load_cifar10(tmp_path, val_fraction=0.25)
    assert (len(data["train"]), len(data["validation"]), len(data["test"])) == (15, 5, 4)
    raw, labels = written["test_batch"]
    rgb = raw[1].reshape(3, 32, 32).transpose(1, 2, 0).astype(float)
    grey = np.round(0.2989 * rgb[..., 0] + 0.5870 * rgb[..., 1] + 0.1140 * rgb[..., 2]).astype(np.uint8)
    np.testing.assert_array_equal(data["test"].inputs[0][1], grey.reshape(-1))  # row by row
    assert data["test"].labels.tolist() == labels
    # the validation images are the last ones of the training batches (the LRA's train[90%:])
    last = written["data_batch_5"][0][-1].reshape(3, 32, 32).transpose(1, 2, 0)
    np.testing.assert_array_equal(data["validation"].inputs[0][4], F.to_grey(last[None])[0].reshape(-1))


def test_cifar_refuses_foreign_pickles(tmp_path):
    _write_cifar(tmp_path)
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"evil": print}, f, protocol=2)
    with pytest.raises(ValueError, match=r"test_batch: not a CIFAR-10 python batch .*refusing to unpickle .*print"):
        F.load_cifar10(tmp_path)
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((1, 100), np.uint8), b"labels": [0]}, f, protocol=2)
    with pytest.raises(ValueError, match=r"'data' must be a uint8 array \[N, 3072\]"):
        F.load_cifar10(tmp_path)


def test_cifar_missing_says_what_to_get(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"LRA image: .*data_batch_1 not found.*cifar-10-python.tar.gz"):
        F.load_cifar10(tmp_path)


# ---------------------------------------------------------------- issue 23 item 14: every bad file named


def _cifar_labels(folder, labels, protocol=4):
    """test_batch with these `labels` (protocol 4: sets and dicts need no global)."""
    batch = {b"data": np.zeros((2, 3072), np.uint8)}
    if labels is not None:
        batch[b"labels"] = labels
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch, f, protocol=protocol)


@pytest.mark.parametrize(
    "labels, message",
    [
        (None, "got nothing"),
        ({0, 1}, "got set"),
        ({0: 1, 1: 2}, "got dict"),
        ([0.0, 1.7], "got float64 values such as 0.0"),
        ([0, 10], r"got shape \(2,\), values 0-10"),
        ([0], r"got shape \(1,\)"),
    ],
    ids=["missing", "a-set", "a-dict", "floats", "out-of-range", "too-few"],
)
def test_cifar_bad_labels_name_the_file(tmp_path, labels, message):
    _write_cifar(tmp_path)
    _cifar_labels(tmp_path, labels)
    with pytest.raises(
        ValueError, match=rf"test_batch: 'labels' must be a list of 2 integer classes in 0-9, {message}"
    ):
        F.load_cifar10(tmp_path)


def test_empty_documents_name_the_file_and_line(tmp_path):
    root = tmp_path / "aclImdb"
    for split in ("train", "test"):
        for name in ("neg", "pos"):
            (root / split / name).mkdir(parents=True)
            (root / split / name / "0_1.txt").write_text("a review")
    (root / "test" / "pos" / "1_9.txt").write_text("")
    with pytest.raises(ValueError, match=r"test/pos/1_9.txt: an empty review"):
        F.load_imdb(tmp_path)
    for name in F.AAN_FILES.values():
        (tmp_path / name).write_text("1.0\tA\tB\tx\ty\n0.0\tC\tD\t\ty\n")
    with pytest.raises(ValueError, match=r"new_aan_pairs.train.tsv:2: text1 empty"):
        F.load_aan(tmp_path)


def test_a_byte_that_is_not_utf8_is_named_with_file_line_and_column(tmp_path):
    from latte.data.lra.listops import read_lra_tsv

    for name in F.AAN_FILES.values():
        (tmp_path / name).write_bytes(b"1.0\tA\tB\tx\ty\n0.0\tC\tD\tcaf\xe9\ty\n")
    with pytest.raises(ValueError, match=r"new_aan_pairs.train.tsv:2: not UTF-8 \(byte 0xe9 at column 12\)"):
        F.load_aan(tmp_path)
    tsv = tmp_path / "basic_train.tsv"
    tsv.write_bytes(b"Source\tTarget\n[MAX 2 3 ]\t3\n[MIN 4 \xff]\t4\n")
    with pytest.raises(ValueError, match=r"basic_train.tsv:3: not UTF-8 \(byte 0xff at column 8\)"):
        read_lra_tsv(tsv)


def test_missing_data_path_exits_2_like_every_user_error(tmp_path, capsys):
    from latte.cli import main

    for task in ("text", "retrieval", "image", "listops"):
        with pytest.raises(FileNotFoundError):  # still a FileNotFoundError for callers
            from latte.data.lra import load_task

            load_task(task, path=str(tmp_path / "nowhere"))
    args = ["train", "--config", "lra/listops", f"--data.path={tmp_path / 'nowhere'}"]
    args += [f"--train.run_dir={tmp_path / 'run'}", "--train.steps=1", "--optim.warmup_steps=0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "not found" in err and "Traceback" not in err
