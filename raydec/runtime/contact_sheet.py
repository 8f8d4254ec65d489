"""A contact sheet: generated images in a grid, each above its (wrapped) prompt or caption."""

from __future__ import annotations

import textwrap
from typing import Optional, Sequence

from PIL import Image, ImageDraw, ImageFont

LINE_HEIGHT = 12
ELLIPSIS = "..."


def wrap_text(text: str, width: int, max_lines: Optional[int] = None) -> list[str]:
    """``text`` wrapped to ``width`` characters; past ``max_lines`` the last kept line ends in
    "..." so a cut caption never reads as a whole one."""
    lines = textwrap.wrap(text, width)
    if max_lines is None or len(lines) <= max_lines:
        return lines
    kept = lines[:max_lines]
    kept[-1] = kept[-1][: max(0, width - len(ELLIPSIS))].rstrip() + ELLIPSIS
    return kept


def contact_sheet(
    images: Sequence[Optional[Image.Image]],
    captions: Sequence[str],
    columns: int = 4,
    tile: int = 160,
    caption_lines: Optional[int] = None,
    title: Optional[str] = None,
) -> Image.Image:
    """Lay out `images` (None: a grey placeholder) `columns` wide, with captions under each tile.

    caption_lines: lines of text under a tile (None: as many as the longest caption needs).
    """
    if len(images) != len(captions):
        raise ValueError(f"contact_sheet: {len(images)} images but {len(captions)} captions")
    if caption_lines is not None and caption_lines < 1:
        raise ValueError(f"contact_sheet: caption_lines must be >= 1, got {caption_lines}")
    font = ImageFont.load_default()
    wrap = max(8, tile // 6)
    wrapped = [wrap_text(caption, wrap, caption_lines) for caption in captions]
    lines_per_cell = caption_lines if caption_lines is not None else max([1, *map(len, wrapped)])
    cell_h = tile + 6 + lines_per_cell * LINE_HEIGHT
    title_h = 2 * LINE_HEIGHT if title else 0
    rows = max(1, -(-len(images) // columns))
    sheet = Image.new("RGB", (columns * (tile + 8) + 8, title_h + rows * (cell_h + 8) + 8), "white")
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((8, 6), title, fill="black", font=font)
    for index, (image, lines) in enumerate(zip(images, wrapped)):
        x = 8 + (index % columns) * (tile + 8)
        y = title_h + 8 + (index // columns) * (cell_h + 8)
        if image is None:
            draw.rectangle([x, y, x + tile - 1, y + tile - 1], fill=(200, 200, 200))
        else:
            sheet.paste(image.convert("RGB").resize((tile, tile), Image.NEAREST), (x, y))
        for line_index, line in enumerate(lines):
            draw.text((x, y + tile + 4 + line_index * LINE_HEIGHT), line, fill="black", font=font)
    return sheet
