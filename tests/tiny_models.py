"""Tiny, randomly initialised but real Hugging Face checkpoints for runtime tests.

Each builder saves a model and its processor with ``save_pretrained`` into a folder, so the
code under test loads it by path exactly as it would load a 7B checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch

TINY_JANUS_SEED = 1234


def build_tiny_janus(folder: Union[str, Path], seed: int = TINY_JANUS_SEED) -> Path:
    """Save a tiny ``JanusForConditionalGeneration`` (random weights) and its processor.

    It uses the reference model's word-level tokenizer and processor, so shapes prompts
    tokenise, and keeps the 64 x 64 image / 16 x 16 token grid of the reference Janus, but
    with a one-layer, 32-wide language model and a minimal VQ-VAE.
    """
    from raydec.reference.janus import model as jt
    from raydec.reference.shapes import vocabulary

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = jt.build_tokenizer(vocabulary())
    processor = jt.build_processor(tokenizer)
    arch = jt.T2IArchitecture(
        vq_base_channels=32,
        vq_channel_multiplier=(1, 1, 1),
        vq_num_res_blocks=1,
        vq_latent_channels=32,
        vq_embed_dim=8,
        vq_num_embeddings=64,
        lm_hidden_size=32,
        lm_num_layers=1,
        lm_num_heads=2,
        lm_intermediate_size=64,
        lm_max_positions=512,
        vision_hidden_size=32,
    )
    model = jt.build_model(jt.build_config(tokenizer, arch), seed)
    model.eval()
    model.generation_config = jt.build_generation_config(tokenizer, guidance_scale=2.0)
    with torch.no_grad():
        model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
