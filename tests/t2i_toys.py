"""Tiny, random-weight text-to-image checkpoints of the real Hugging Face classes.

``tiny_janus`` and ``tiny_emu3`` build a ``JanusForConditionalGeneration`` /
``Emu3ForConditionalGeneration`` with a word-level tokenizer and the real processor, and save
everything with ``save_pretrained`` so tests load them back by path, exactly like a 7B
checkpoint. Sizes are chosen so a whole image is a handful of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import (
    Emu3Config,
    Emu3ForConditionalGeneration,
    Emu3ImageProcessor,
    Emu3Processor,
    GenerationConfig,
    JanusConfig,
    JanusForConditionalGeneration,
    JanusImageProcessorPil,
    JanusProcessor,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

WORDS = ("a", "red", "blue", "green", "circle", "square", "triangle", "on", "the", "left", "right", "big", "small")


def _word_tokenizer(
    specials: Sequence[str], words: Sequence[str], bos: str, add_bos: bool, **kwargs
) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: specials first, then ``words``; digits and ``*`` are single tokens.

    add_bos: encoded texts start with ``bos`` (Janus's tokenizer does; Emu3's processor adds
    BOS itself).
    """
    vocab: dict[str, int] = {}
    for token in list(specials) + list(words) + [str(d) for d in range(10)] + ["*"]:
        vocab.setdefault(token, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[0-9*]"), behavior="isolated")]
    )
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, unk_token="<unk>", padding_side="left", **kwargs)


def _sharpen(layers: torch.nn.Module, head: torch.nn.Linear, layer_scale: float = 10.0, head_scale: float = 4.0) -> None:
    """Scale random weights up so tokens depend on their context (with the default init a tiny
    model mostly repeats its last token) and the next-token law is far from uniform."""
    with torch.no_grad():
        for parameter in layers.parameters():
            if parameter.ndim == 2:
                parameter.mul_(layer_scale)
        head.weight.mul_(head_scale)


def _llama_sizes(vocab: int, hidden: int = 32, layers: int = 2) -> dict:
    return dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )


def tiny_janus(folder: Path, seed: int = 0, grid: int = 4, codebook: int = 64, guidance_scale: float = 3.0) -> Path:
    """Save a random ``JanusForConditionalGeneration`` (``grid`` x ``grid`` image tokens) to ``folder``."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>", "<image_placeholder>", "<begin_of_image>", "<end_of_image>"]
    tokenizer = _word_tokenizer(
        specials, WORDS, "<bos>", True, eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"},
    )
    image_size = grid * 4  # patch 4 for the vision tower; the VQ below downsamples by 2
    processor = JanusProcessor(
        image_processor=JanusImageProcessorPil(size={"height": image_size, "width": image_size}, min_size=4,
                                            image_mean=[0.5] * 3, image_std=[0.5] * 3),
        tokenizer=tokenizer,
        num_image_tokens=grid * grid,
    )
    hidden = 32
    text_config = LlamaConfig(**_llama_sizes(len(tokenizer), hidden), pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = JanusConfig(
        text_config=text_config,
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=1, image_size=image_size,
                           patch_size=4, mlp_ratio=2.0, projection_dim=hidden, depth=1, num_image_tokens=grid * grid),
        vq_config=dict(embed_dim=8, num_embeddings=codebook, latent_channels=32, base_channels=32,
                       channel_multiplier=[1, 1], num_res_blocks=1, projection_dim=hidden,
                       image_token_embed_dim=hidden, num_hidden_layers=2),
        image_token_id=tokenizer.convert_tokens_to_ids("<image_placeholder>"),
    )
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config)
    _sharpen(model.model.language_model.layers, model.model.generation_head.vision_head)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        do_sample=True, temperature=1.0, guidance_scale=guidance_scale,
        generation_kwargs={"boi_token_id": tokenizer.convert_tokens_to_ids("<begin_of_image>")},
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


EMU3_SPECIALS = {
    "pad": "<|endoftext|>", "bos": "<|extra_203|>", "eos": "<|extra_204|>", "image": "<image>",
    "boi": "<|image start|>", "eoi": "<|image end|>", "wrapper": "<|image token|>", "eof": "<|extra_201|>",
    "eol": "<|extra_200|>",
}


def tiny_emu3(folder: Path, seed: int = 0, codebook: int = 48) -> Path:
    """Save a random ``Emu3ForConditionalGeneration`` (VQ downsample 8, as the processor assumes)."""
    s = EMU3_SPECIALS
    visual = [f"<|visual token {i:06d}|>" for i in range(codebook)]
    specials = ["<unk>", s["pad"], s["bos"], s["eos"], s["image"], s["boi"], s["eoi"], s["wrapper"], s["eof"], s["eol"]]
    tokenizer = _word_tokenizer(
        specials + visual, WORDS, s["bos"], False, eos_token=s["eos"], pad_token=s["pad"],
        extra_special_tokens={"image_token": s["image"], "boi_token": s["boi"], "eoi_token": s["eoi"],
                              "image_wrapper_token": s["wrapper"], "eof_token": s["eof"]},
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[4:] + visual})
    processor = Emu3Processor(image_processor=Emu3ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64), tokenizer=tokenizer)
    text = _llama_sizes(len(tokenizer))
    text.update(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = Emu3Config(
        text_config=text,
        vq_config=dict(codebook_size=codebook, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                       temporal_downsample_factor=4),
        vocabulary_map=tokenizer.get_vocab(),
    )
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config)
    _sharpen(model.model.text_model.layers, model.lm_head)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        do_sample=True, temperature=1.0, top_k=16, guidance_scale=3.0,
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _image_token_name(code: int) -> str:
    """Chameleon's name of image code ``code``: IMGIMG, the digits as letters A-J, then Z."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_chameleon(folder: Path, seed: int = 0, codebook: int = 24, max_cells: int = 4) -> Path:
    """Save a random ``ChameleonForConditionalGeneration`` laid out as Lumina-mGPT (its image
    layout tokens, image tokens named as Chameleon names them) and, in ``folder/vqgan``, a random
    VQ-GAN in Meta's format (``vqgan.yaml`` and a ``vqgan.ckpt`` holding a ``state_dict``) whose
    code covers 16 pixels, so a 32-pixel cell is 2 x 2 codes, as in Lumina-mGPT."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from raydec.models.chameleon import END_OF_LINE, IMAGE_END, IMAGE_START, TURN_END, size_token
    from raydec.models.vqgan import VQGanConfig, VQGanDecoder

    folder = Path(folder)
    images = [_image_token_name(code) for code in range(codebook)]
    layout = [IMAGE_START, IMAGE_END, END_OF_LINE, TURN_END] + [size_token(n) for n in range(1, max_cells + 1)]
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>"] + layout
    words = list(WORDS) + ["Generate", "an", "image", "of", "according", "to", "following", "prompt:", "x"]
    tokenizer = _word_tokenizer(specials + images, words, "<s>", False, eos_token="</s>", pad_token="<pad>")
    tokenizer.add_special_tokens({"additional_special_tokens": layout})
    text = _llama_sizes(len(tokenizer), layers=2)
    text["max_position_embeddings"] = 512
    config = ChameleonConfig(
        **text, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        vq_config=dict(embed_dim=4, num_embeddings=codebook, latent_channels=4, base_channels=32, channel_multiplier=[1, 1, 1, 1, 1],
                       num_res_blocks=1, attn_resolutions=[], resolution=32),
        vocabulary_map=tokenizer.get_vocab(), image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config)
    _sharpen(model.model.layers, model.lm_head)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    vqgan = VQGanDecoder(VQGanConfig(embed_dim=8, n_embed=codebook, z_channels=8, ch=32, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1,
                                     attn_resolutions=(2,), resolution=32))
    with torch.no_grad():
        vqgan.quantize.embedding.weight.normal_()  # distinct codes decode to visibly different pixels
    (folder / "vqgan").mkdir()
    (folder / "vqgan" / "vqgan.yaml").write_text(vqgan.config.to_yaml())
    torch.save({"state_dict": dict(vqgan.state_dict())},
               folder / "vqgan" / "vqgan.ckpt")
    return folder
