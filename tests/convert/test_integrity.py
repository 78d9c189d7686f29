"""What a converted folder trusts, and what it checks (docs/conversion.md §4,
docs/reliability.md §5): the base's config.json and only the files loading
reads are in the reference; the folder's own weights are hashed; a portable
export survives a move; a missing base names what to pass; bad input ids
are named, as in the native model."""

import json
import shutil

import pytest
import torch

from latte.convert import ConversionConfig, base_reference, convert_pretrained, load_converted
from latte.convert.io import BaseNotFoundError, IntegrityError, export_portable
from tests.convert.families import VOCAB, build

CONV = ConversionConfig(window_size=8, latents_per_head=4)


@pytest.fixture
def saved(tmp_path):
    """(base folder, converted folder, reference logits) of a tiny Llama."""
    build("llama").save_pretrained(tmp_path / "base")
    model = convert_pretrained(tmp_path / "base", CONV).eval()
    with torch.no_grad():
        for p in model.new_parameters().values():
            p.add_(torch.randn_like(p) * 0.3)
        logits = model(_ids(), use_cache=False).logits
    model.save_pretrained(tmp_path / "converted")
    return tmp_path / "base", tmp_path / "converted", logits


def _ids():
    return torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(0))


def test_the_base_config_belongs_to_the_reference(saved):
    base, converted, _ = saved
    assert set(json.loads((converted / "config.json").read_text())["base_weights"]["sha256"]) == {
        "config.json",
        "model.safetensors",
    }
    cfg = json.loads((base / "config.json").read_text())
    cfg["rope_parameters"]["rope_theta"] = 500.0  # same shapes, other outputs
    (base / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntegrityError, match=r"config.json: sha256 .* this config is not the one"):
        load_converted(converted)


def test_a_flipped_byte_in_the_converted_weights_is_refused(saved):
    _, converted, _ = saved
    f = converted / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01  # inside the tensor data: safetensors alone would load it
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model.safetensors: sha256 .* damaged or was replaced"):
        load_converted(converted)


def test_only_the_files_loading_reads_are_hashed(saved):
    base, converted, ref_logits = saved
    (base / "pytorch_model.bin").write_bytes(b"an unused file")  # safetensors wins: never read
    assert set(base_reference(base)["sha256"]) == {"config.json", "model.safetensors"}
    (base / "pytorch_model.bin").unlink()
    (base / "notes.txt").write_text("unrelated")
    with torch.no_grad():
        assert torch.equal(load_converted(converted)(_ids(), use_cache=False).logits, ref_logits)


def test_a_portable_export_survives_the_move_and_a_missing_base_says_what_to_pass(saved, tmp_path):
    base, converted, ref_logits = saved
    export_portable(load_converted(converted), tmp_path / "portable")
    shutil.move(tmp_path / "portable", tmp_path / "elsewhere")
    shutil.move(base, tmp_path / "moved-base")  # the recorded absolute path is gone
    with pytest.raises(BaseNotFoundError, match=r"base_path=DIR.*latte export") as e:
        load_converted(converted)
    assert isinstance(e.value, ValueError)  # a user error: `latte` exits 2
    with torch.no_grad():
        moved = load_converted(tmp_path / "elsewhere")
        assert torch.equal(moved(_ids(), use_cache=False).logits, ref_logits)
        again = load_converted(converted, base_path=tmp_path / "moved-base")
        assert torch.equal(again(_ids(), use_cache=False).logits, ref_logits)
    assert json.loads((tmp_path / "elsewhere" / "config.json").read_text())["base_weights"]["path"] == "base"


@pytest.mark.parametrize("bad", ["empty", "too-large", "negative"])
def test_bad_ids_are_named_before_any_compute(saved, bad):
    _, converted, _ = saved
    model = load_converted(converted)
    ids = {
        "empty": torch.zeros(1, 0, dtype=torch.long),
        "too-large": torch.tensor([[1, 2, VOCAB + 5]]),
        "negative": torch.tensor([[1, -3, 2]]),
    }[bad]
    match = {"empty": r"input_ids: expected shape \[B, T >= 1\]", "too-large": f"id {VOCAB + 5}", "negative": "id -3"}
    with pytest.raises(ValueError, match=match[bad]):
        model(ids)
    with pytest.raises(ValueError, match=match[bad]):
        list(model.stream(ids, 3))
    with pytest.raises(ValueError, match=match[bad]):
        model.generate(ids, max_new_tokens=2, do_sample=False)


def test_the_backend_is_saved_and_a_saved_fla_names_its_override(saved, monkeypatch):
    """conversion.backend is saved ("auto" unless set) and reaches the layers;
    a saved "fla" on a machine without CUDA is refused, naming the override."""
    from latte.convert.attention import ConvertedAttention

    _, converted, _ = saved
    config = json.loads((converted / "config.json").read_text())
    assert config["conversion"]["backend"] == "auto"
    model = load_converted(converted)
    assert all(m.backend is None for m in model.modules() if isinstance(m, ConvertedAttention))
    (converted / "config.json").write_text(
        json.dumps({**config, "conversion": {**config["conversion"], "backend": "fla"}})
    )
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the same on a GPU machine
    with pytest.raises(ValueError, match=r"conversion.backend: got 'fla'.*no CUDA.*--set model.backend=auto"):
        load_converted(converted)
    model = load_converted(converted, overrides={"backend": "auto"})  # latte eval --set model.backend=auto
    assert all(m.backend is None for m in model.modules() if isinstance(m, ConvertedAttention))
    with pytest.raises(ValueError, match="backend"):
        ConversionConfig(backend="cuda")
