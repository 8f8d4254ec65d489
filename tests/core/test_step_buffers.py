"""The step's buffer reuse changes no bits: P written over its own input (CFG into a kept
buffer, top-k and softmax in place) equals P built from fresh tensors, and the model's logits
are never written."""

import torch

from raydec.config import SamplingConfig
from raydec.speculative.sampling import process_logits


def _fresh_p(logits: torch.Tensor, rows: int, scale: float, top_k: int) -> torch.Tensor:
    cond, uncond = logits[0::2], logits[1::2]  # each request's cond row, then its uncond row
    scores = uncond + scale * (cond - uncond)
    kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
    return torch.softmax(scores.masked_fill(scores < kth, float("-inf")), dim=-1)


def test_processed_p_in_a_kept_buffer_equals_the_fresh_formula_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    rows, slots, vocab = 3, 5, 700
    logits = torch.randn(2 * rows, slots, vocab, generator=gen)
    kept = logits.clone()
    config = SamplingConfig(cfg_scale=2.5, top_k=40)
    buffer = torch.full((rows, slots, vocab), float("nan"))
    probs = process_logits(logits, config, rows, out=buffer)
    assert probs.data_ptr() == buffer.data_ptr()  # computed in the buffer
    assert torch.equal(probs, _fresh_p(kept, rows, 2.5, 40))
    assert torch.equal(logits, kept)  # the model's logits untouched


def test_p_without_cfg_never_writes_the_logits():
    logits = torch.randn(2, 4, 300, generator=torch.Generator().manual_seed(1))
    kept = logits.clone()
    probs = process_logits(logits, SamplingConfig(top_k=30), 2, out=torch.empty(2, 4, 300))
    kth = torch.topk(kept, 30, dim=-1).values[..., -1:]
    assert torch.equal(probs, torch.softmax(kept.masked_fill(kept < kth, float("-inf")), dim=-1))
    assert torch.equal(logits, kept)
