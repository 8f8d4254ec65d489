"""Calibration rows a worker can make itself, for a choice made before any request arrives (a Serve
replica's ``auto`` draft shape and batch size): a few generic prompts (text-to-image) or a few plain
generated pictures (captioning, with the default question), validated as a job's input rows are, so the same
tuning code decodes them (``raydec.runtime.shapes``)."""

from __future__ import annotations

import io
from typing import Any, Dict, List

from raydec.io import validate_caption_rows, validate_t2i_rows
from raydec.io.config import RowFormat

PROMPTS = (
    "a red circle on the left", "a blue square at the top", "two green triangles", "a yellow star in the middle",
    "a purple circle above a white square", "an orange cross on a grey background", "three small blue circles in a row",
    "a large red square at the bottom", "a cat sitting on a wooden chair", "a lighthouse on a rocky coast at sunset",
    "a bowl of fruit on a kitchen table", "a city street in the rain at night",
)
COLOURS = ((220, 40, 40), (40, 90, 220), (40, 170, 70), (240, 200, 40), (150, 60, 190), (250, 140, 30), (240, 240, 240), (30, 30, 30))


def calibration_image(index: int, size: int = 224) -> bytes:
    """A PNG of plain shapes (a circle, a rectangle, a triangle) on a flat background, varied by ``index``."""
    from PIL import Image, ImageDraw

    background = COLOURS[(index * 3 + 6) % len(COLOURS)]
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    step = size // 8
    for shape in range(3):
        colour = COLOURS[(index + shape) % len(COLOURS)]
        if colour == background:
            colour = COLOURS[(index + shape + 1) % len(COLOURS)]
        left, top = step * ((index + 2 * shape) % 5), step * ((3 * index + shape) % 5)
        box = (left, top, left + 3 * step, top + 3 * step)
        if (index + shape) % 3 == 0:
            draw.ellipse(box, fill=colour)
        elif (index + shape) % 3 == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def builtin_calibration_rows(task: str, count: int, rows: RowFormat | None = None) -> List[Dict[str, Any]]:
    """``count`` validated, error-free rows of ``task`` ("t2i" or "caption") made here, seeded by their index."""
    rows = rows or RowFormat()
    if task == "t2i":
        raw = [{rows.id_column: f"calibration-{i}", rows.prompt_column: PROMPTS[i % len(PROMPTS)], rows.seed_column: i}
               for i in range(count)]
        return validate_t2i_rows(raw, rows, file_key="calibration")
    if task == "caption":
        raw = [{rows.id_column: f"calibration-{i}", rows.image_column: calibration_image(i), rows.seed_column: i} for i in range(count)]
        return validate_caption_rows(raw, rows, file_key="calibration")
    raise ValueError(f"task: {task!r} has no calibration rows (use 't2i' or 'caption')")
