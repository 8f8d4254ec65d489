"""``check_identity`` on tiny checkpoints of every family's real classes, float64: every row of a
speculative method is plain AR's (coupling gumbel, sampled at temperature 1, four rows at batch 3
so the rows run in batches of 3 and 1). SJD-PAC on Janus, Emu3 (its forced layout tokens) and
Lumina-mGPT (Chameleon); ViSpec on LLaVA and Qwen2.5-VL with a random draft saved beside them.
And the forward a differing position is recomputed with (``near_ties.position_scores``: the
prefill, then the prefix as one chain) picks AR's token at the first, a middle and the last position."""

from __future__ import annotations

import pytest
import torch

from raydec.api.check import check_identity
from raydec.api.near_ties import position_scores
from tests.t2i_toys import tiny_chameleon, tiny_emu3, tiny_janus
from tests.vlm_toys import vispec_testbed

PROMPTS = ["a red circle", "two blue squares", "a green triangle", "a red square"]
SAMPLED = {"temperature": 1.0}


def _t2i_target(name: str, folder):
    from raydec.api import load_target
    from raydec.models.registry import load_t2i_target

    if name == "janus":
        return load_t2i_target(tiny_janus(folder, seed=0), dtype=torch.float64)
    if name == "emu3":
        return load_t2i_target(tiny_emu3(folder, seed=0), dtype=torch.float64, image_area=32 * 32)  # 4 x 4 tokens
    return load_target(str(tiny_chameleon(folder, seed=0)), task="t2i", dtype=torch.float64)


@pytest.mark.parametrize("name", ["janus", "emu3", "lumina_mgpt"])
def test_sjd_pac_decodes_ar_rows_on_every_image_family(tmp_path, name):
    target = _t2i_target(name, tmp_path / name)
    decode = {"method": "sjd_pac", "jacobi": {"window": 8, "branching": 2, "tree_depth": 1}, "sampling": SAMPLED}
    size = "64x32" if name == "lumina_mgpt" else None  # two cells of 2 x 2 codes and their layout tokens
    report = check_identity(PROMPTS, model=target, decode=decode, seeds=[5, 6, 7, 8], batch_size=3, size=size, warmup=False)
    assert report.identical_rows == len(PROMPTS) and report.passed, report.table()
    assert report.speculative.tokens_per_forward > report.ar.tokens_per_forward == 1.0
    from raydec.api import generate_images
    from raydec.api.inputs import image_decode_config, sized
    from raydec.config import DecodeConfig
    from raydec.models.image_gen import ImagePrompt

    target = sized(target, size)
    config = image_decode_config(DecodeConfig(method="ar", sampling=SAMPLED), target)
    (row,) = generate_images(PROMPTS[:1], model=target, decode=config, seeds=[5])
    _recomputed_positions_pick_ar_tokens(target, config.sampling, ImagePrompt(PROMPTS[0], None), 5, row.tokens,
                                         constraint=target.vocab_constraint())


@pytest.mark.parametrize("name", ["llava", "qwen2_5_vl"])
def test_vispec_decodes_ar_rows_on_every_vlm_family(tmp_path, name):
    target, images, decode = vispec_testbed(tmp_path, name, first_image=100, images=4, max_new_tokens=12)
    report = check_identity(images, model=target, decode=decode, seeds=[5, 6, 7, 8], batch_size=3, warmup=False)
    assert report.identical_rows == len(images) and report.passed, report.table()
    from raydec.api import caption_images
    from raydec.api.inputs import caption_decode_config, max_positions
    from raydec.config import DecodeConfig
    from raydec.models.hf_vlm import VlmPrompt

    config = caption_decode_config(DecodeConfig(method="ar", max_new_tokens=12, sampling=SAMPLED), target)
    (row,) = caption_images(images[:1], model=target, decode=config, seeds=[5])
    prompt = VlmPrompt(target.format_prompt("describe the image .", 1), images[:1])
    _recomputed_positions_pick_ar_tokens(target, config.sampling, prompt, 5, row.tokens, max_positions=max_positions(target))


def _recomputed_positions_pick_ar_tokens(target, sampling, prompt, seed, tokens, **engine) -> None:
    for position in sorted({0, len(tokens) // 2, len(tokens) - 1}):
        scores = position_scores(target, sampling, prompt, seed, tokens[:position], **engine)
        assert scores.token() == tokens[position] and scores.distance(tokens[position]) == 0.0, position
