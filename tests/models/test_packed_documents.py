"""Packed documents (cu_seqlens, B == 1; latte/layers/documents.py): a row
of several documents gives each document's own logits and gradients, for
every mixer (the window with sinks, Macchiato with memory slots, learned
positions), through the native model and the Hugging Face adapter
(position_ids restarting at 0); refusals name the argument."""

import pytest
import torch
import torch.nn.functional as F

from latte.models import IGNORE_INDEX, LatteConfig, LatteForCausalLM
from latte.models.causal_lm import next_token_targets

LENGTHS = (13, 1, 22, 9)  # past the window (8) and the chunk (8); one document of a single token
VARIANTS = {
    "latte": dict(mixer="latte"),
    "latte-conv": dict(mixer="latte", qk_mixer="conv", position_embedding="learned"),
    "macchiato-sinks": dict(mixer="macchiato", num_sinks=2, mix="gate"),
    "macchiato-memory": dict(mixer="macchiato", memory_slots=2, memory_rule="recall"),
    "macchiato-cache-slots": dict(mixer="macchiato", num_sinks=1, memory_slots=2, memory_positions="cache"),
    "softmax": dict(mixer="softmax", position_embedding="sinusoidal"),
    "linear": dict(mixer="linear", linear_qk_mixer="conv_rglru"),
    "swa": dict(mixer="swa"),
    "hybrid": dict(mixer=["macchiato", "softmax"], num_sinks=1),
}


def lm(name: str, seed: int = 0) -> LatteForCausalLM:
    torch.manual_seed(seed)
    return LatteForCausalLM(LatteConfig.tiny(**VARIANTS[name])).double()


def documents(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 64, (n,), generator=g) for n in LENGTHS]
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    return docs, torch.cat(docs)[None], cu


def summed_nll(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


def loss_and_grads(model, fn):
    model.zero_grad()
    loss = fn()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_packed_row_gives_each_documents_logits_and_gradients(name):
    model = lm(name)
    docs, ids, cu = documents()
    packed = model(ids, cu_seqlens=cu, return_logits=True).logits[0]
    alone = torch.cat([model(d[None], return_logits=True).logits[0] for d in docs])
    torch.testing.assert_close(packed, alone, atol=1e-10, rtol=0)
    mixed = model(ids, return_logits=True).logits[0]
    assert (mixed[LENGTHS[0] :] - alone[LENGTHS[0] :]).abs().max() > 1e-4  # without boundaries they differ

    # the packed row's loss (labels shifted inside, no target across a boundary) == the documents' losses:
    # the model's own (float32 cross-entropy), then float64 from the logits with its targets, and gradients
    model.train()
    tokens = sum(n - 1 for n in LENGTHS)
    own = model(ids, labels=ids, cu_seqlens=cu).loss * tokens
    torch.testing.assert_close(
        own, sum(model(d[None], labels=d[None]).loss * (len(d) - 1) for d in docs), rtol=1e-6, atol=0
    )
    targets = next_token_targets(ids, None, None, tuple(ids.shape), 64, cu_seqlens=cu)
    lp, gp = loss_and_grads(model, lambda: summed_nll(model(ids, cu_seqlens=cu, return_logits=True).logits, targets))
    la, ga = loss_and_grads(
        model,
        lambda: sum(
            summed_nll(model(d[None], return_logits=True).logits, F.pad(d[1:], (0, 1), value=IGNORE_INDEX)[None])
            for d in docs
        ),
    )
    torch.testing.assert_close(lp, la, atol=1e-10, rtol=0)
    assert gp.keys() == ga.keys()
    for n in gp:
        torch.testing.assert_close(gp[n], ga[n], atol=1e-10, rtol=0, msg=n)


def test_labels_give_no_target_across_a_boundary():
    ids = torch.arange(8)[None]
    cu = torch.tensor([0, 3, 8])
    targets = next_token_targets(ids, None, None, (1, 8), 64, cu_seqlens=cu)
    assert targets.tolist() == [[1, 2, IGNORE_INDEX, 4, 5, 6, 7, IGNORE_INDEX]]
    shifted = torch.arange(1, 9)[None]  # shift_labels are the caller's: kept as given
    assert next_token_targets(None, shifted, None, (1, 8), 64, cu_seqlens=cu).tolist() == shifted.tolist()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(cu_seqlens=torch.tensor([0, 5, 40])), r"cu_seqlens: must end at T=50, got 40"),
        (dict(cu_seqlens=torch.tensor([0, 30, 20, 50])), r"cu_seqlens: must be strictly increasing"),
        (dict(cu_seqlens=torch.tensor([0.0, 50.0])), r"cu_seqlens: expected an int32/int64 tensor"),
        (dict(cu_seqlens=torch.tensor([0, 50]), use_cache=True), r"state/use_cache: a packed forward"),
        (
            dict(cu_seqlens=torch.tensor([0, 50]), attention_mask=torch.arange(50)[None] > 3),
            r"attention_mask: a packed forward \(cu_seqlens\) takes no padding",
        ),
    ],
)
def test_packed_forward_refuses_bad_inputs(kwargs, match):
    model = lm("latte")
    with pytest.raises(ValueError, match=match):
        model(torch.zeros(1, 50, dtype=torch.long), **kwargs)


def test_packed_forward_needs_one_row():
    with pytest.raises(ValueError, match="cu_seqlens: packed input needs batch size 1, got 2"):
        lm("softmax")(torch.zeros(2, 6, dtype=torch.long), cu_seqlens=torch.tensor([0, 6]))


@pytest.mark.parametrize("name", ["macchiato-sinks", "softmax"])
def test_hugging_face_position_ids_restarting_at_zero_pack_documents(name):
    pytest.importorskip("transformers")
    from latte.models import hf

    native = lm(name)
    hfm = hf.LatteHFForCausalLM(hf.LatteHFConfig.from_latte_config(native.config)).double()
    hfm.load_state_dict(native.state_dict())
    docs, ids, cu = documents()
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    with torch.no_grad():
        packed = hfm(ids, position_ids=position_ids, use_cache=False).logits[0]
        alone = torch.cat([hfm(d[None], use_cache=False).logits[0] for d in docs])
        plain = hfm(ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-10, rtol=0)
    torch.testing.assert_close(plain, native(ids, return_logits=True).logits[0], atol=1e-10, rtol=0)

    # labels as transformers' DataCollatorWithFlattening gives them (-100 at each document's first token)
    labels = ids.clone()
    labels[0, cu[:-1]] = IGNORE_INDEX
    hfm.train()
    loss = hfm(ids, position_ids=position_ids, labels=labels, use_cache=False).loss
    each = [hfm(d[None], labels=d[None], use_cache=False).loss * (len(d) - 1) for d in docs]
    torch.testing.assert_close(loss * sum(n - 1 for n in LENGTHS), sum(each), atol=0, rtol=1e-6)  # float32 loss


def test_hugging_face_reads_position_ids_only_without_padding_or_a_cache():
    pytest.importorskip("transformers")
    from latte.models import hf

    hfm = hf.LatteHFForCausalLM(hf.LatteHFConfig.from_latte_config(LatteConfig.tiny())).eval()
    ids, pos = torch.randint(0, 64, (1, 6)), torch.tensor([[0, 1, 2, 0, 1, 2]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    with torch.no_grad():  # with padding, as transformers: the mask is used, position_ids are not
        torch.testing.assert_close(
            hfm(ids, position_ids=pos, attention_mask=mask).logits[0, 1:],
            hfm(ids, attention_mask=mask).logits[0, 1:],
        )
        cache = hfm(ids[:, :2], use_cache=True).past_key_values
        assert hfm(ids, position_ids=pos).past_key_values is None  # a packed row keeps no cache
    with pytest.raises(ValueError, match="position_ids: restart at 0 .packed documents., which a forward with a cache"):
        hfm(ids, position_ids=pos, past_key_values=cache)
    with pytest.raises(ValueError, match="position_ids: restart at 0 .packed documents., so the row must start"):
        hfm(ids, position_ids=torch.tensor([[1, 0, 1, 2, 0, 1]]))
    with pytest.raises(ValueError, match=r"position_ids: expected shape \(1, 6\) like input_ids, got \(3,\)"):
        hfm(ids, position_ids=torch.tensor([0, 1, 2]))
