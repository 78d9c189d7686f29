import base64
import json

import pytest

from latte.data import EOS_TOKEN, Tokenizer, load_tokenizer, train_bpe

SAMPLES = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing   \n\n\ttabs\r\nand CRLF ",
    "Unicode: café naïve Ærø ß, 日本語のテキスト, emoji 🙂👍🏽, maths ∑∫√π",
    "",
    "<|endoftext|> marks the end",
]


def test_train_bpe_properties(small_tokenizer):
    tok = small_tokenizer
    assert tok.vocab_size == 512
    assert tok.eos_id == 0
    assert tok.decode([tok.eos_id]) == EOS_TOKEN
    # merges were learned: common English compresses below one token per byte
    text = "the function returns the value of the object"
    assert len(tok.encode(text)) < len(text.encode()) / 2


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_lossless(small_tokenizer, text):
    ids = small_tokenizer.encode(text)
    assert all(0 <= i < small_tokenizer.vocab_size for i in ids)
    assert small_tokenizer.decode(ids) == text


def test_literal_eos_maps_to_eos_id(small_tokenizer):
    ids = small_tokenizer.encode("a<|endoftext|>b")
    assert ids.count(small_tokenizer.eos_id) == 1


def test_save_load_round_trip(small_tokenizer, tmp_path):
    out = small_tokenizer.save(tmp_path / "run")
    assert out.name == "tokenizer.json"
    json.loads(out.read_text())  # valid HF json
    for path in (tmp_path / "run", out):
        loaded = Tokenizer.load(path)
        assert (loaded.vocab_size, loaded.eos_id) == (512, 0)
        for text in SAMPLES:
            assert loaded.encode(text) == small_tokenizer.encode(text)
        assert loaded.fingerprint() == small_tokenizer.fingerprint()


def test_encode_batch_matches_encode(small_tokenizer):
    assert small_tokenizer.encode_batch(SAMPLES) == [small_tokenizer.encode(t) for t in SAMPLES]


def test_different_training_gives_different_fingerprint(small_tokenizer, pydoc_docs):
    other = train_bpe([d.text for d in pydoc_docs[20:40]], vocab_size=512)
    assert other.fingerprint() != small_tokenizer.fingerprint()


@pytest.mark.parametrize("bad", [256, 0, 100.0])
def test_train_bpe_rejects_small_vocab(bad):
    with pytest.raises(ValueError, match=f"vocab_size={bad}"):
        train_bpe(["abc"], vocab_size=bad)


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="expected a tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        load_tokenizer(bad)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a")
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'"):
        load_tokenizer(vocab)


def _write_ranks(path, extra=(b"th", b"the", b" t", b" the")):
    """256 single bytes, then merges: a tiny GPT-2-style ranks file."""
    tokens = [bytes([b]) for b in range(256)] + list(extra)
    lines = [f"{base64.b64encode(t).decode()} {r}" for r, t in enumerate(tokens)]
    path.write_text("\n".join(lines) + "\n")
    return tokens


def test_tiktoken_ranks_file(tmp_path):
    pytest.importorskip("tiktoken")
    tokens = _write_ranks(tmp_path / "tiny.tiktoken")
    tok = load_tokenizer(tmp_path / "tiny.tiktoken")
    assert tok.kind == "tiktoken"
    assert tok.eos_id == len(tokens) == 260 and tok.vocab_size == 261
    assert tok.encode("the") == [tokens.index(b"the")]
    assert tok.encode("the the") == [tokens.index(b"the"), tokens.index(b" the")]
    assert tok.encode("a<|endoftext|>") == [ord("a"), tok.eos_id]
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    saved = tok.save(tmp_path / "run")
    assert saved.name == "tokenizer.tiktoken"
    again = Tokenizer.load(tmp_path / "run")
    assert again.encode(SAMPLES[2]) == tok.encode(SAMPLES[2])
    assert again.fingerprint() == tok.fingerprint()


def test_tiktoken_file_errors(tmp_path):
    pytest.importorskip("tiktoken")
    p = tmp_path / "bad.tiktoken"
    _write_ranks(p)
    p.write_text(p.read_text() + "not-base64-and-no-rank\n")
    with pytest.raises(ValueError, match=r"bad\.tiktoken:261"):
        load_tokenizer(p)
    q = tmp_path / "gaps.tiktoken"
    q.write_text(f"{base64.b64encode(b'a').decode()} 5\n")
    with pytest.raises(ValueError, match="ranks must be 0..0"):
        load_tokenizer(q)
