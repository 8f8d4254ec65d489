"""The reference Janus's VQ-VAE side: uint8 images <-> pixels <-> code ids.

* the VQ's two training forwards: ids -> pixels along the stock ``decode`` path
  (:func:`decode_codes`), and pixels -> logits over the L2-normalised codebook
  (:func:`code_logits`; :func:`vq_encode` takes their argmax), so the stock ``decode`` /
  ``decode_image_tokens`` reproduce what was trained;
* :func:`init_vq_for_training`, the VQ-VAE's initialisation that :func:`raydec.reference.janus.model.build_model` applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import JanusVQVAE


VQ_CARRIER = 4.0  # constant level on even channels: GroupNorm (2 channels / group) then keeps absolute levels


def _identity_conv_(conv: torch.nn.Conv2d, carrier_only: bool = False) -> None:
    """Make ``conv`` pass channel ``i`` to channel ``i`` (centre tap); extra outputs get zero."""
    with torch.no_grad():
        conv.weight.zero_()
        conv.bias.zero_()
        centre = conv.kernel_size[0] // 2
        for channel in range(min(conv.in_channels, conv.out_channels)):
            conv.weight[channel, channel, centre, centre] = 1.0


def _carrier_conv_(conv: torch.nn.Conv2d) -> None:
    """Even output channels become the constant ``VQ_CARRIER``; odd ones keep their init."""
    with torch.no_grad():
        conv.weight[0::2].zero_()
        conv.bias[0::2].fill_(VQ_CARRIER)


def init_vq_for_training(vq: JanusVQVAE) -> None:
    """Re-initialise the VQ-VAE so that it starts close to a linear patch autoencoder.

    ``post_init`` draws every conv from N(0, 0.02), far below fan-in scale, and every
    GroupNorm removes each group's spatial mean and scale, so absolute colour is lost at
    every layer and the autoencoder learns colour very slowly. Here: fan-in init; the last
    layer of every residual / attention branch zeroed (each block starts as the identity);
    down- / up-sampling and 1x1 shortcut convs start as channel identities; the first conv
    of encoder and decoder writes a constant carrier on even channels, so in every
    two-channel GroupNorm group the carrier dominates the statistics and the content channel
    passes through almost linearly. Training is free to move away from all of it.
    """
    for module in vq.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.reset_parameters()
    for name, module in vq.named_modules():
        if name.endswith(".conv2") or name.endswith(".proj_out"):
            torch.nn.init.zeros_(module.weight)
            torch.nn.init.zeros_(module.bias)
        elif name.endswith(".nin_shortcut") or name.endswith("sample.conv"):
            _identity_conv_(module)
    _carrier_conv_(vq.encoder.conv_in)
    _carrier_conv_(vq.decoder.conv_in)



def images_to_pixels(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` -> float ``[B, 3, H, W]`` in [-1, 1] (the processor's range)."""
    return images.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def pixels_to_images(pixels: torch.Tensor) -> torch.Tensor:
    """float ``[B, 3, H, W]`` in [-1, 1] -> uint8 ``[B, H, W, 3]``."""
    return pixels.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8).permute(0, 2, 3, 1)


def _normalised_latents(vq: JanusVQVAE, pixels: torch.Tensor) -> torch.Tensor:
    """Encoder output projected to ``embed_dim`` and L2-normalised per position. # [B, D, h, w]"""
    return F.normalize(vq.quant_conv(vq.encoder(pixels)), p=2, dim=1)


def _nearest_codes(latents: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Cosine-nearest code per position. latents [B, D, h, w], codebook [K, D] -> [B, h*w]."""
    flat = latents.permute(0, 2, 3, 1).reshape(latents.shape[0], -1, latents.shape[1])  # [B, N, D]
    return torch.einsum("bnd,kd->bnk", flat, codebook).argmax(dim=-1)


def code_vectors(vq: JanusVQVAE, ids: torch.Tensor) -> torch.Tensor:
    """Unit code vectors of ``ids`` ``[B, h, w]`` as the stock ``get_codebook_entry`` returns them. # [B, D, h, w]"""
    return F.normalize(vq.quantize.embedding.weight, p=2, dim=-1)[ids].permute(0, 3, 1, 2)


def decode_codes(vq: JanusVQVAE, ids: torch.Tensor) -> torch.Tensor:
    """Pixels ``[B, 3, H, W]`` of token ids ``[B, h, w]``: the stock ``decode`` path, with gradients."""
    return vq.decoder(vq.post_quant_conv(code_vectors(vq, ids)))


def code_logits(vq: JanusVQVAE, pixels: torch.Tensor, scale: float) -> torch.Tensor:
    """Encoder logits over the codes: ``scale`` x cosine(latent, code). # [B, K, h, w]"""
    codebook = F.normalize(vq.quantize.embedding.weight, p=2, dim=-1)
    return scale * torch.einsum("bdhw,kd->bkhw", _normalised_latents(vq, pixels), codebook)


@torch.no_grad()
def vq_encode(vq: JanusVQVAE, pixels: torch.Tensor) -> torch.Tensor:
    """Token ids of ``pixels`` (``[B, 3, H, W]`` in [-1, 1]) as the model was trained. # [B, N]"""
    codebook = F.normalize(vq.quantize.embedding.weight, p=2, dim=-1)
    return _nearest_codes(_normalised_latents(vq, pixels), codebook)
