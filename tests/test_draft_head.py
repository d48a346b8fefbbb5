"""bench/draft_head.py judges an EAGLE head by its drafts at every output position at once (one
batched unroll per sequence, with hand-written attention over the true prefix and the draft's
own steps). The oracle: drafting one position at a time by teacher-forced passes over the
prefix followed by the head's own tokens and predicted states, the way the head would draft
in an engine."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bench.draft_head import DraftHead, Sequence_, accepted, head_drafts, simulate  # noqa: E402


def tiny_target() -> torch.nn.Module:
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def test_batched_unroll_equals_drafting_one_position_at_a_time() -> None:
    target = tiny_target()
    head = DraftHead(target)
    for p in head.parameters():
        p.add_(torch.randn_like(p) * 0.3)  # not the copied layer: a head that has learnt something
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (30,), generator=g).tolist()
    h = torch.randn(30, 32, generator=g)
    seq = Sequence_(ids, start=20)
    k = 4
    drafts, probs = head_drafts(head, seq, h, None, k)
    assert drafts.shape == (9, k) and bool(((probs > 0) & (probs <= 1)).all())
    for p in (1, 4, 9):
        j = seq.start + p - 1  # the last emitted token's index
        toks, prev = list(ids[: j + 1]), torch.cat([torch.zeros(1, 32), h[:j]])
        want, top = [], []
        for _ in range(k):
            out, _, _ = head(torch.tensor([toks]), prev[None], torch.arange(len(toks))[None])
            state = out[0, -1]
            pr = torch.softmax(head.logits(state), -1)
            want.append(int(pr.argmax()))
            top.append(float(pr.max()))
            toks.append(want[-1])
            prev = torch.cat([prev, state[None]])
        assert drafts[p - 1].tolist() == want
        assert torch.allclose(probs[p - 1], torch.tensor(top), rtol=1e-4, atol=1e-6)


@torch.no_grad()
def test_masked_drafts_keep_to_the_mask() -> None:
    target = tiny_target()
    head = DraftHead(target)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 97, (16,), generator=g).tolist()
    seq = Sequence_(ids, start=10)
    masks = torch.zeros(6, 97, dtype=torch.bool)
    masks[:, 5] = masks[:, 7] = True
    drafts, _ = head_drafts(head, seq, torch.randn(16, 32, generator=g), masks, 3)
    assert set(drafts.flatten().tolist()) <= {5, 7}


def test_accepted_prefix_and_decode_simulation() -> None:
    out = [9, 1, 2, 3, 4, 5]
    assert accepted([[1, 2, 9], [2], [], [4, 5, 6], [0]], out) == [2, 1, 0, 2, 0]
    # no drafts: one step per token, the first from the prefill; forced text appended at 2 and 4
    assert simulate(6, [0] * 5, [0] * 7) == 6
    assert simulate(6, [0] * 5, [0, 0, 1, 0, 1, 0, 0]) == 4
    assert simulate(6, [4, 0, 0, 0, 0], [0] * 7) == 2
