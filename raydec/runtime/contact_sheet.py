"""A contact sheet: generated images in a grid, each above its (wrapped) prompt."""

from __future__ import annotations

import textwrap
from typing import Optional, Sequence

from PIL import Image, ImageDraw, ImageFont


def contact_sheet(
    images: Sequence[Optional[Image.Image]],
    captions: Sequence[str],
    columns: int = 4,
    tile: int = 160,
    caption_lines: int = 6,
    title: Optional[str] = None,
) -> Image.Image:
    """Lay out `images` (None: a grey placeholder) `columns` wide, with captions under each tile."""
    if len(images) != len(captions):
        raise ValueError(f"contact_sheet: {len(images)} images but {len(captions)} captions")
    font = ImageFont.load_default()
    line_height = 12
    wrap = max(8, tile // 6)
    cell_h = tile + 6 + caption_lines * line_height
    title_h = 2 * line_height if title else 0
    rows = max(1, -(-len(images) // columns))
    sheet = Image.new("RGB", (columns * (tile + 8) + 8, title_h + rows * (cell_h + 8) + 8), "white")
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((8, 6), title, fill="black", font=font)
    for index, (image, caption) in enumerate(zip(images, captions)):
        x = 8 + (index % columns) * (tile + 8)
        y = title_h + 8 + (index // columns) * (cell_h + 8)
        if image is None:
            draw.rectangle([x, y, x + tile - 1, y + tile - 1], fill=(200, 200, 200))
        else:
            sheet.paste(image.convert("RGB").resize((tile, tile), Image.NEAREST), (x, y))
        lines = textwrap.wrap(caption, wrap)[:caption_lines]
        for line_index, line in enumerate(lines):
            draw.text((x, y + tile + 4 + line_index * line_height), line, fill="black", font=font)
    return sheet
