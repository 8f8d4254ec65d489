"""Toy targets whose output law is computable exactly, for the exactness harness.

- ``random_markov``: a random first-order Markov chain over a small vocabulary
  (``raydec.reference.textures.MarkovChainTarget``, the real adapter protocol).
- ``tiny_llama``: a real ``LlamaForCausalLM`` with random weights, vocabulary <= 8, saved with
  ``save_pretrained`` and loaded back by path; its law over short sequences is enumerated.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from raydec.config import SamplingConfig
from raydec.models.causal_lm import CausalLMTarget, CfgPrompt
from raydec.reference.textures import MarkovChainTarget as MarkovTarget
from raydec.speculative.proposers.base import Proposer
from raydec.speculative.sampling import VocabConstraint, process_logits


def random_markov(vocab: int, seed: int, sharpness: float = 1.5) -> MarkovTarget:
    generator = torch.Generator().manual_seed(seed)
    return MarkovTarget(torch.randn(vocab, vocab, generator=generator, dtype=torch.float64) * sharpness)


def markov_law(target: MarkovTarget, prompt: Sequence[int], length: int, sampling: SamplingConfig) -> torch.Tensor:
    """Exact joint law of the first ``length`` generated tokens: [V] * length."""
    table = process_logits(target.logits.unsqueeze(1), sampling, target.vocab_size)[:, 0]  # [V, V]
    law = table[prompt[-1]].clone()
    for _ in range(length - 1):
        law = law.unsqueeze(-1) * table  # broadcast over the last token
    return law


def tiny_llama(tmp_path: Path, vocab: int = 8, seed: int = 0, dtype: torch.dtype = torch.float64, layers: int = 2, hidden: int = 16) -> CausalLMTarget:
    """A random-weight LlamaForCausalLM saved and reloaded by path (the real loading code)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits so the law is far from uniform
        model.lm_head.weight.mul_(8.0)
    path = tmp_path / f"tiny-llama-v{vocab}-s{seed}"
    model.save_pretrained(path)
    return CausalLMTarget.from_pretrained(path, dtype=dtype)


@torch.no_grad()
def lm_law(
    target: CausalLMTarget,
    prompt: Sequence[int] | CfgPrompt,
    length: int,
    sampling: SamplingConfig,
    constraint: VocabConstraint | None = None,
) -> torch.Tensor:
    """Exact law of the first ``length`` tokens by enumerating every prefix. -> [V] * length

    A repetition penalty is applied with Hugging Face's own ``RepetitionPenaltyLogitsProcessor``
    (an independent reference for ours)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    vocab = target.vocab_size
    cond = list(prompt.cond) if isinstance(prompt, CfgPrompt) else list(prompt)
    uncond = list(prompt.uncond) if isinstance(prompt, CfgPrompt) else None
    penalty = sampling.repetition_penalty
    sampling = sampling.model_copy(update={"repetition_penalty": 1.0})
    law = torch.ones((), dtype=torch.float64)
    for t in range(length):
        prefixes = list(itertools.product(range(vocab), repeat=t))
        def last_logits(head: list[int]) -> torch.Tensor:
            ids = torch.tensor([head + list(p) for p in prefixes], dtype=torch.long)
            logits = target.model(input_ids=ids).logits[:, -1].to(torch.float64)  # [V^t, V]
            return RepetitionPenaltyLogitsProcessor(penalty)(ids, logits) if penalty != 1.0 else logits
        logits = last_logits(cond)
        rows = len(prefixes)
        if uncond is not None:  # each prefix's conditional row, then its unconditional one
            logits = torch.stack([logits, last_logits(uncond)], dim=1).flatten(0, 1)
        gen_index = torch.full((rows, 1), t, dtype=torch.long)
        probs = process_logits(logits.unsqueeze(1), sampling, rows, constraint, gen_index)[:, 0]  # [V^t, V]
        law = law.unsqueeze(-1) * probs.view(*([vocab] * t), vocab)
    return law


def forked_markov() -> MarkovTarget:
    """A hand-made chain where token 0 leads to a long run of likely tokens {0, 1} and token 1
    leads away to {2, 3}: trees that draft [1, 0] under every node have accepted siblings whose
    subtrees differ in depth, so a verifier that prefers the longest path is visibly biased."""
    table = torch.tensor(
        [[0.45, 0.45, 0.05, 0.05], [0.05, 0.05, 0.45, 0.45], [0.4, 0.3, 0.2, 0.1], [0.3, 0.4, 0.1, 0.2]],
        dtype=torch.float64,
    )
    return MarkovTarget(table.log())


class FixedCandidatesProposer(Proposer):
    """Deterministic (one-hot) drafts: the same ordered candidates under every node of a full
    tree of ``depth`` levels."""

    wants_hidden = False

    def __init__(self, candidates: list[int], depth: int) -> None:
        self.candidates, self.depth = candidates, depth

    def start(self, state, first_probs, prefill) -> None:
        pass

    def observe(self, *args) -> None:
        pass

    def propose(self, state):
        from raydec.speculative.tree import DraftTree, TreeBuilder

        builders = []
        for row in range(state.batch_size):
            builder = TreeBuilder(state.generated[row][-1])
            frontier = [0]
            for _ in range(self.depth):
                frontier = [builder.add(node, c) for node in frontier for c in self.candidates]
            builders.append(builder)
        return DraftTree.stack(builders, state.vocab_size, state.prob_dtype)


def hf_greedy_lm(target, prompts, max_new_tokens: int, batch: int = 1, repetition_penalty: float = 1.0) -> list[list[int]]:
    """Hugging Face ``generate(do_sample=False)`` over token-id prompts, in left-padded batches
    (``batch`` 1: each prompt alone), with HF's repetition penalty."""
    outputs = []
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        out = target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                    repetition_penalty=repetition_penalty, pad_token_id=0, eos_token_id=None)
        outputs += out[:, width:].tolist()
    return outputs
