"""A small tokenizer wrapper over Hugging Face `tokenizers` or `tiktoken`.

Training uses a byte-level BPE (the GPT-2 recipe, Radford et al. 2019,
section 2.2: bytes as the base alphabet make every string encodable and
decoding lossless). `<|endoftext|>` is the end-of-document token that packing puts
after each document. Both backends map a literal `<|endoftext|>` in the text
to that id, so they agree on it.

`tokenizers` is imported where used (the `train` extra); `tiktoken` is an
optional extra used only for `*.tiktoken` rank files (e.g. the real GPT-2 BPE
shipped offline as `whisper/assets/gpt2.tiktoken` in openai-whisper).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
# Other end-of-text spellings accepted when loading a foreign tokenizer.json.
_EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "<|end_of_text|>")
# GPT-2's pre-tokenization regex (tiktoken r50k/gpt2), used for *.tiktoken files.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
HF_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tokenizer.tiktoken"


class Tokenizer:
    """encode/decode text, with `vocab_size` and `eos_id`; save/load a folder.

    Build it with `train_bpe` or `load_tokenizer`, not directly.
    """

    def __init__(self, backend, *, eos_id: int, tiktoken_ranks: bytes | None = None):
        self._backend = backend  # tokenizers.Tokenizer or tiktoken.Encoding
        self._ranks = tiktoken_ranks  # raw *.tiktoken file, only for tiktoken
        self.eos_id = int(eos_id)

    @property
    def kind(self) -> str:
        return "tiktoken" if self._ranks is not None else "hf"

    @property
    def vocab_size(self) -> int:
        if self._ranks is not None:
            return self._backend.n_vocab
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (both backends parallelise this)."""
        texts = list(texts)
        if self._ranks is not None:
            return self._backend.encode_batch(texts, allowed_special={EOS_TOKEN})
        # add_special_tokens=False: no BOS/EOS from a foreign post-processor;
        # packing adds the document separator itself.
        encs = self._backend.encode_batch(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if self._ranks is not None:
            return self._backend.decode(ids)
        return self._backend.decode(ids, skip_special_tokens=False)

    def fingerprint(self) -> bytes:
        """Bytes that change whenever the id mapping changes (for caches)."""
        if self._ranks is not None:
            head = f"tiktoken\0{GPT2_PATTERN}\0{self.eos_id}\0".encode()
            return head + self._ranks
        return b"hf\0" + self._backend.to_str().encode("utf-8")

    def save(self, directory: str | Path) -> Path:
        """Write the tokenizer into `directory`; `Tokenizer.load(directory)` reads it.

        Hugging Face tokenizers are written as `tokenizer.json`; a tiktoken
        tokenizer keeps its exact rank file as `tokenizer.tiktoken` (no lossy
        conversion). Returns the written file.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self._ranks is not None:
            out = directory / TIKTOKEN_FILE
            out.write_bytes(self._ranks)
        else:
            out = directory / HF_FILE
            self._backend.save(str(out))
        return out

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        return load_tokenizer(path)

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(
            "latte.data tokenizers need Hugging Face tokenizers: "
            "pip install 'tokenizers>=0.19,<0.24' (or pip install 'latte[train]')"
        ) from e
    return tokenizers


def train_bpe(texts: Iterable[str], *, vocab_size: int = 8192, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE with `<|endoftext|>` (id 0) as eos.

    The 256 byte symbols are always in the vocabulary, so any string encodes
    and decodes back exactly; `vocab_size` counts them and the eos token.
    """
    if not isinstance(vocab_size, int) or vocab_size < 257:
        raise ValueError(f"vocab_size={vocab_size!r}: must be an int >= 257 (256 bytes + eos)")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency!r}: must be an int >= 1")
    tk = _import_tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    # add_prefix_space=False keeps decode(encode(s)) == s exactly.
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(tok, eos_id=tok.token_to_id(EOS_TOKEN))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load `tokenizer.json` (or a folder holding one) or a `*.tiktoken` file.

    A folder without `tokenizer.json` may hold exactly one `*.tiktoken` file.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        if (path / HF_FILE).is_file():
            path = path / HF_FILE
        else:
            found = sorted(path.glob("*.tiktoken"))
            if len(found) != 1:
                raise ValueError(
                    f"{path}: expected a {HF_FILE} or exactly one *.tiktoken file, "
                    f"found {[p.name for p in found] or 'neither'}"
                )
            path = found[0]
    if not path.is_file():
        raise ValueError(f"tokenizer path {path}: no such file or folder")
    if path.suffix == ".tiktoken":
        return _load_tiktoken(path)
    if path.suffix == ".json":
        return _load_hf_json(path)
    raise ValueError(
        f"tokenizer path {path}: unsupported file type {path.suffix!r}; "
        "allowed: tokenizer.json, *.tiktoken, or a folder holding one"
    )


def _load_hf_json(path: Path) -> Tokenizer:
    tk = _import_tokenizers()
    try:
        tok = tk.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise ValueError(f"{path}: not a Hugging Face tokenizer.json ({e})") from e
    for candidate in _EOS_CANDIDATES:
        eos_id = tok.token_to_id(candidate)
        if eos_id is not None:
            return Tokenizer(tok, eos_id=eos_id)
    raise ValueError(f"{path}: no end-of-text token; expected one of {list(_EOS_CANDIDATES)}")


def _parse_tiktoken_ranks(path: Path, raw: bytes) -> dict[bytes, int]:
    """Parse `base64(token_bytes) rank` lines (tiktoken's format).

    Parsed here rather than with tiktoken.load_tiktoken_bpe, which caches by
    path in a temp folder and would return stale ranks for a rewritten file.
    """
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: expected 'base64(token) rank', got {line[:60]!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks must be 0..{len(ranks) - 1}, each once")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:  # tiktoken cannot encode text containing a byte it lacks
        raise ValueError(
            f"{path}: {len(missing)} of the 256 single bytes have no rank "
            f"(first missing: {missing[0]}); byte-level BPE needs all of them"
        )
    return ranks


def _load_tiktoken(path: Path) -> Tokenizer:
    """A BPE rank file with GPT-2's regex; eos = number of ranks.

    For the GPT-2 file (50256 ranks) that gives `<|endoftext|>` = 50256 and
    vocab_size 50257, as in GPT-2 itself.
    """
    try:
        import tiktoken
    except ImportError as e:
        raise ImportError(f"loading {path} needs tiktoken: pip install tiktoken") from e
    raw = path.read_bytes()
    ranks = _parse_tiktoken_ranks(path, raw)
    eos_id = len(ranks)
    name = "latte-" + hashlib.sha256(raw).hexdigest()[:12]
    enc = tiktoken.Encoding(
        name,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOS_TOKEN: eos_id},
    )
    return Tokenizer(enc, eos_id=eos_id, tiktoken_ranks=raw)
