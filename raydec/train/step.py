"""One training step's forward: stored samples -> draft input sequences -> rollout passes -> loss.

The sequences are built exactly as at inference (``DraftTreeProposer.start``): pair t
(t = 0 .. T-2) reads token_embeds = embeds[t+1], features = hidden[t], token_image =
image_index[t+1], position t, through ``VispecDraft.build_sequence`` (image spans compressed,
``img_fc`` global feature on text after an image and on every generated pair: the last image's).
The draft output at pair t stands for f_{t+1}; its logits are trained against the target's
distribution of x_{t+2}, ``softmax(lm_head(hidden[t+1]))``, where x_{t+2} is a generated token.

Self-rollout (``mtp_steps``): pass k > 0 feeds the previous pass's outputs, shifted right by one,
as the features of the generated pairs (t >= L, those a tree node reads at inference), against
the same targets; gradients flow through all passes. Uniform noise of width ``feature_noise``
is added to the target features once, before the first pass, so later passes read the same noisy
features wherever they do not roll out (the prompt pairs). Noise draws come from a per-sample
generator seeded by (seed, step, sample seed), so a step's loss does not depend on how the
batch is split over workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from raydec.train.config import DraftTrainConfig
from raydec.train.dataset import DraftSample
from raydec.train.losses import eagle_loss, vispec_loss


@dataclass
class PairBatch:
    """Padded draft inputs of a batch (right padding).

    token_embeds, features, globals_: [B, N, H]; use_global, valid, rollout, supervised: [B, N] bool;
    positions: [B, N] long; target_hidden: [B, N, H] (target f_{t+1} of each pair).
    """

    token_embeds: torch.Tensor
    features: torch.Tensor
    globals_: torch.Tensor
    use_global: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    rollout: torch.Tensor
    supervised: torch.Tensor
    target_hidden: torch.Tensor

    def attention_mask(self) -> torch.Tensor:
        """[B, 1, N, N] additive: causal over valid keys (each query sees itself)."""
        width = self.valid.shape[1]
        causal = torch.tril(torch.ones(width, width, dtype=torch.bool, device=self.valid.device))
        allowed = (causal.unsqueeze(0) & self.valid.unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=self.valid.device)
        mask = torch.zeros(allowed.shape, dtype=self.features.dtype, device=self.valid.device)
        return mask.masked_fill_(~allowed, torch.finfo(mask.dtype).min).unsqueeze(1)


def noise_generator(seed: int, step: int, sample_seed: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 2_000_003 + sample_seed)


def build_pairs(draft_model: torch.nn.Module, samples: list[DraftSample], step: int, config: DraftTrainConfig, device: torch.device) -> PairBatch:
    """Draft input sequences of ``samples`` (the adaptor runs here, with gradients)."""
    rows = []
    for sample in samples:
        length = sample.length
        embeds = sample.embeds.to(device, torch.float32)
        hidden = sample.hidden.to(device, torch.float32)
        features = hidden[:-1]
        if config.feature_noise > 0:
            noise = torch.rand(features.shape, generator=noise_generator(config.seed, step, sample.seed))
            features = features + (noise.to(device) - 0.5) * config.feature_noise
        pair_index = torch.arange(length - 1, device=device)
        seq = draft_model.build_sequence(embeds[1:], features, sample.image_index[1:].to(device), pair_index)
        t = seq.positions  # original pair index of each kept pair
        target_at = (t + 2).clamp(max=length - 1)
        supervised = sample.loss_mask.to(device)[target_at] & (t + 2 < length)
        globals_ = seq.globals_[seq.global_index.clamp(min=0)] if seq.globals_.shape[0] else torch.zeros_like(seq.features)
        rows.append((seq, globals_, supervised, t >= sample.prompt_len, hidden[t + 1]))
    batch, width, size = len(rows), max(r[0].length for r in rows), samples[0].embeds.shape[-1]
    tok = torch.zeros(batch, width, size, device=device)
    feat, glob, target = torch.zeros_like(tok), torch.zeros_like(tok), torch.zeros_like(tok)
    flags = torch.zeros(4, batch, width, dtype=torch.bool, device=device)  # use_global, valid, rollout, supervised
    pos = torch.zeros(batch, width, dtype=torch.long, device=device)
    for r, (seq, globals_, supervised, rollout, target_hidden) in enumerate(rows):
        n = seq.length
        tok[r, :n], feat[r, :n], glob[r, :n], target[r, :n] = seq.token_embeds, seq.features, globals_, target_hidden
        pos[r, :n] = seq.positions
        pos[r, n:] = seq.positions[-1] + 1 + torch.arange(width - n, device=device)
        flags[0, r, :n], flags[1, r, :n], flags[2, r, :n], flags[3, r, :n] = seq.global_index >= 0, True, rollout, supervised
    return PairBatch(tok, feat, glob, flags[0], pos, flags[1], flags[2], flags[3], target)


def rollout_losses(
    draft_model: torch.nn.Module, lm_head: torch.nn.Module, pairs: PairBatch, config: DraftTrainConfig, stage1: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss per sample, averaged over supervised pairs and the 1 + mtp_steps passes. -> [B], stats

    ``draft_model`` is the (possibly wrapped) network whose forward is ``VispecDraft.forward``.
    """
    mask = pairs.attention_mask()
    with torch.no_grad():
        target_probs = torch.softmax(lm_head(pairs.target_hidden).float(), dim=-1)  # [B, N, V]
    weight = pairs.supervised.float()
    count = weight.sum(-1).clamp(min=1)  # [B]
    features = pairs.features
    per_sample = torch.zeros(pairs.valid.shape[0], device=features.device)
    stats: dict[str, float] = {}
    passes = 1 + config.mtp_steps
    for k in range(passes):
        hidden = draft_model(pairs.token_embeds, features, pairs.positions, mask, None, pairs.globals_, pairs.use_global)
        logits = lm_head(hidden)
        if stage1:
            loss = eagle_loss(logits, target_probs, hidden, pairs.target_hidden, config.loss)
        else:
            loss = vispec_loss(logits, target_probs, config.loss)
        pass_loss = (loss * weight).sum(-1) / count  # [B]
        per_sample = per_sample + pass_loss / passes
        with torch.no_grad():
            hit = (logits.argmax(-1) == target_probs.argmax(-1)).float()
            stats[f"acc{k}"] = float(((hit * weight).sum(-1) / count).mean())
            stats[f"loss{k}"] = float(pass_loss.mean())
        if k + 1 < passes:  # the draft's own features, shifted right by one, on the generated pairs
            shifted = torch.cat([features[:, :1], hidden[:, :-1]], dim=1)
            features = torch.where(pairs.rollout.unsqueeze(-1), shifted, pairs.features)
    return per_sample, stats
