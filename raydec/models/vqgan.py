"""A VQ-GAN image decoder in the layout of Chameleon's image tokenizer (Meta's ``vqgan.yaml`` and
``vqgan.ckpt``, which Lumina-mGPT decodes its images with; transformers ships only the encoder).

The decoder is the convolutional decoder of taming-transformers' VQ-GAN, and its parameter names
are that checkpoint's, so its ``state_dict`` loads as it is:

    quantize.embedding       [n_embed, embed_dim]   code -> latent vector
    post_quant_conv          1x1, embed_dim -> z_channels
    decoder.conv_in          3x3, z_channels -> ch * ch_mult[-1]
    decoder.mid.block_1 / attn_1 / block_2
    decoder.up[i].block[j]   num_res_blocks + 1 residual blocks per level, i = 0 the finest
    decoder.up[i].attn[j]    self-attention after block j where the level's size is in attn_resolutions
    decoder.up[i].upsample   nearest x2 then 3x3 (every level but the finest)
    decoder.norm_out, decoder.conv_out

A residual block is GroupNorm(32) -> swish -> 3x3 -> GroupNorm -> swish -> 3x3, plus the input
(through a 1x1 ``nin_shortcut`` where the width changes). One code covers
``2 ** (len(ch_mult) - 1)`` pixels a side: 16 for Chameleon's ``ch_mult: [1, 1, 2, 2, 4]``.
Decoded pixels are in [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_NAME = "vqgan.yaml"
WEIGHT_NAMES = ("vqgan.safetensors", "vqgan.ckpt")


@dataclass(frozen=True)
class VQGanConfig:
    """The decoder's shape: ``model.params`` of a taming-transformers VQ-GAN yaml (its ``ddconfig``
    flattened beside ``embed_dim`` and ``n_embed``)."""

    embed_dim: int = 256
    n_embed: int = 8192
    z_channels: int = 256
    ch: int = 128
    out_ch: int = 3
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = field(default_factory=tuple)
    resolution: int = 512

    @property
    def pixels_per_code(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "VQGanConfig":
        import yaml

        path = Path(path)
        try:
            params = yaml.safe_load(path.read_text())["model"]["params"]
            dd = params["ddconfig"]
            return cls(
                embed_dim=int(params["embed_dim"]), n_embed=int(params["n_embed"]), z_channels=int(dd["z_channels"]),
                ch=int(dd["ch"]), out_ch=int(dd["out_ch"]), ch_mult=tuple(int(m) for m in dd["ch_mult"]),
                num_res_blocks=int(dd["num_res_blocks"]), attn_resolutions=tuple(int(r) for r in dd.get("attn_resolutions") or ()),
                resolution=int(dd["resolution"]),
            )
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: not a VQ-GAN config (model.params with embed_dim, n_embed and a ddconfig): {error}") from None

    def to_yaml(self) -> str:
        import yaml

        dd = {"double_z": False, "z_channels": self.z_channels, "resolution": self.resolution, "in_channels": self.out_ch,
              "out_ch": self.out_ch, "ch": self.ch, "ch_mult": list(self.ch_mult), "num_res_blocks": self.num_res_blocks,
              "attn_resolutions": list(self.attn_resolutions), "dropout": 0.0}
        return yaml.safe_dump({"model": {"params": {"embed_dim": self.embed_dim, "n_embed": self.n_embed, "ddconfig": dd}}})


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class _Residual(nn.Module):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(channels_in), nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.norm2, self.conv2 = _norm(channels_out), nn.Conv2d(channels_out, channels_out, 3, padding=1)
        if channels_in != channels_out:
            self.nin_shortcut = nn.Conv2d(channels_in, channels_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, H, W] -> [B, C', H, W]
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class _SelfAttention(nn.Module):
    """Single-head attention over the H*W positions, 1x1 projections."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, H, W]
        batch, channels, height, width = x.shape
        h = self.norm(x)
        q, k, v = (proj(h).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))  # [B, HW, C]
        attended = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))[:, 0]
        return x + self.proj_out(attended.transpose(1, 2).reshape(batch, channels, height, width))


class _Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    def __init__(self, blocks: list[nn.Module], attention: list[nn.Module], upsample: nn.Module | None) -> None:
        super().__init__()
        self.block, self.attn = nn.ModuleList(blocks), nn.ModuleList(attention)
        if upsample is not None:
            self.upsample = upsample


class _Middle(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = _Residual(channels, channels), _SelfAttention(channels), _Residual(channels, channels)


class _Decoder(nn.Module):
    def __init__(self, config: VQGanConfig) -> None:
        super().__init__()
        levels = len(config.ch_mult)
        channels = config.ch * config.ch_mult[-1]
        size = config.resolution // 2 ** (levels - 1)
        self.conv_in = nn.Conv2d(config.z_channels, channels, 3, padding=1)
        self.mid = _Middle(channels)
        up: list[nn.Module] = [None] * levels  # type: ignore[list-item]
        for level in reversed(range(levels)):
            out = config.ch * config.ch_mult[level]
            blocks, attention = [], []
            for _ in range(config.num_res_blocks + 1):
                blocks.append(_Residual(channels, out))
                channels = out
                if size in config.attn_resolutions:
                    attention.append(_SelfAttention(channels))
            up[level] = _Level(blocks, attention, _Upsample(channels) if level != 0 else None)
            size = size * 2 if level != 0 else size
        self.up = nn.ModuleList(up)
        self.norm_out = _norm(channels)
        self.conv_out = nn.Conv2d(channels, config.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # [B, z_channels, h, w] -> [B, out_ch, H, W]
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for index, block in enumerate(stage.block):
                h = block(h)
                if len(stage.attn):
                    h = stage.attn[index](h)
            if hasattr(stage, "upsample"):
                h = stage.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class _Codebook(nn.Module):
    def __init__(self, config: VQGanConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.n_embed, config.embed_dim)


class VQGanDecoder(nn.Module):
    """Codes -> pixels. Load one with :meth:`from_folder` (``vqgan.yaml`` and its weights)."""

    def __init__(self, config: VQGanConfig) -> None:
        super().__init__()
        self.config = config
        self.quantize = _Codebook(config)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.decoder = _Decoder(config)

    @torch.inference_mode()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, h, w] (codebook indices) -> pixels [B, out_ch, h * p, w * p] in [-1, 1] (p: pixels per code)."""
        weight = self.post_quant_conv.weight
        latents = self.quantize.embedding(codes.to(weight.device)).permute(0, 3, 1, 2).to(weight.dtype)  # [B, embed_dim, h, w]
        return self.decoder(self.post_quant_conv(latents))

    @classmethod
    def from_folder(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> "VQGanDecoder":
        """``folder``/vqgan.yaml and ``vqgan.safetensors`` (or Meta's ``vqgan.ckpt``, read with
        ``torch.load(weights_only=True)``); the encoder's weights in the file are not read."""
        folder = Path(folder)
        config = VQGanConfig.from_yaml(folder / CONFIG_NAME) if (folder / CONFIG_NAME).is_file() else None
        weights = next((folder / name for name in WEIGHT_NAMES if (folder / name).is_file()), None)
        if config is None or weights is None:
            raise FileNotFoundError(f"no VQ-GAN at {folder}: it needs {CONFIG_NAME} and one of {', '.join(WEIGHT_NAMES)} "
                                    "(Chameleon's image tokenizer files)")
        decoder = cls(config)
        state = _read_state(weights)
        wanted = decoder.state_dict()
        missing = sorted(set(wanted) - set(state))
        if missing:
            raise ValueError(f"{weights}: not this VQ-GAN's weights: {len(missing)} decoder parameter(s) missing, e.g. {missing[:3]}")
        for name, tensor in wanted.items():
            if tuple(state[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{weights}: {name} has shape {tuple(state[name].shape)}, {CONFIG_NAME} makes {tuple(tensor.shape)}")
        decoder.load_state_dict({name: state[name] for name in wanted})
        return decoder.to(dtype).eval()

    def save_folder(self, folder: str | Path) -> None:
        """``vqgan.yaml`` and ``vqgan.safetensors`` (the decoder's parameters only)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(self.config.to_yaml())
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHT_NAMES[0]))


def _read_state(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    return loaded.get("state_dict", loaded) if isinstance(loaded, dict) else {}
