"""Lumina-mGPT / Chameleon as a text-to-image target: a tiny random ``ChameleonForConditionalGeneration``
saved and loaded by path, laid out as Lumina-mGPT generates images, decoded through our VQ-GAN.

- The VQ-GAN decoder has the parameter names and shapes of Chameleon's image tokenizer (taming's
  VQ-GAN layout) and loads a ``vqgan.ckpt`` with ``weights_only=True``.
- Our logits over the output space are the model's own (its decoder and head, which transformers'
  Chameleon masks for image tokens), with the layout's tokens forced.
- Greedy: every drafted method commits AR's tokens, at two sizes; images decode to the requested size.
- SJD-PAC samples at T=1 with CFG follow the exact law computed from the model's own forward.
"""

from __future__ import annotations

import pytest
import torch

from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.speculative.proposers.jacobi import JacobiProposer
from raydec.speculative.sampling import process_logits
from tests.lawtest import compare_to_law, sample_engine
from tests.t2i_toys import tiny_chameleon

torch.set_num_threads(1)

PROMPTS = ["a red circle", "big blue square on the left", "a small green triangle on the right"]


@pytest.fixture(scope="module")
def chameleon_path(tmp_path_factory):
    return tiny_chameleon(tmp_path_factory.mktemp("chameleon") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def chameleon(chameleon_path):
    from raydec.api import load_target

    return load_target(str(chameleon_path), task="t2i")


def test_the_vqgan_decoder_has_the_layout_of_chameleons_image_tokenizer():
    """Chameleon's vqgan.yaml (ch 128, ch_mult 1,1,2,2,4, two residual blocks, no attention but the
    middle's): the names and shapes of its checkpoint's decoder parameters, built on the meta device."""
    from raydec.models.vqgan import VQGanConfig, VQGanDecoder

    with torch.device("meta"):
        state = VQGanDecoder(VQGanConfig()).state_dict()
    shapes = {name: tuple(tensor.shape) for name, tensor in state.items()}
    expected = {
        "quantize.embedding.weight": (8192, 256), "post_quant_conv.weight": (256, 256, 1, 1),
        "decoder.conv_in.weight": (512, 256, 3, 3), "decoder.mid.block_1.norm1.weight": (512,),
        "decoder.mid.attn_1.q.weight": (512, 512, 1, 1), "decoder.mid.attn_1.proj_out.weight": (512, 512, 1, 1),
        "decoder.up.4.block.0.conv1.weight": (512, 512, 3, 3), "decoder.up.4.upsample.conv.weight": (512, 512, 3, 3),
        "decoder.up.3.block.0.nin_shortcut.weight": (256, 512, 1, 1), "decoder.up.3.block.2.conv2.weight": (256, 256, 3, 3),
        "decoder.up.1.block.0.nin_shortcut.weight": (128, 256, 1, 1), "decoder.up.0.block.2.conv2.weight": (128, 128, 3, 3),
        "decoder.norm_out.weight": (128,), "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    for name, shape in expected.items():
        assert shapes.get(name) == shape, (name, shapes.get(name))
    assert not any(name.startswith("decoder.up.0.upsample") or "temb_proj" in name or "attn." in name.replace("attn_1", "")
                   for name in shapes)
    assert sum(1 for name in shapes if ".block." in name and name.endswith("conv1.weight")) == 5 * 3
    assert VQGanConfig().pixels_per_code == 16


def test_the_vqgan_loads_a_state_dict_checkpoint_and_refuses_another_models(chameleon_path, tmp_path):
    from raydec.models.vqgan import VQGanDecoder

    decoder = VQGanDecoder.from_folder(chameleon_path / "vqgan")  # vqgan.yaml + vqgan.ckpt {"state_dict": ...}
    codes = torch.tensor([[[0, 3], [5, 7]]])
    pixels = decoder.decode_codes(codes)
    assert pixels.shape == (1, 3, 32, 32) and pixels.std() > 0
    (tmp_path / "vqgan.yaml").write_text((chameleon_path / "vqgan" / "vqgan.yaml").read_text().replace("ch: 32", "ch: 64"))
    torch.save({"state_dict": decoder.state_dict()}, tmp_path / "vqgan.ckpt")
    with pytest.raises(ValueError, match="has shape .* vqgan.yaml makes"):
        VQGanDecoder.from_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="no VQ-GAN at .*vqgan.yaml"):
        VQGanDecoder.from_folder(tmp_path / "nowhere")


def test_output_logits_are_the_models_own_with_the_layout_forced(chameleon):
    """Teacher-forced over a generated image: our window logits equal the model's decoder and
    head (unmasked) at the output space's vocabulary ids; end of line and end of image are forced."""
    from raydec.api import generate_images

    target = chameleon.with_size(64, 32)
    (result,) = generate_images(["a red circle"], model=target, decode={"method": "ar", "sampling": {"temperature": 0, "cfg_scale": 1.0}},
                                seeds=[0])
    tokens = torch.tensor(result.tokens)
    rows, columns = target.grid_shape
    assert tokens.shape == (rows * (columns + 1) + 1,) == (11,)
    assert tokens.view(-1)[columns :: columns + 1][:rows].tolist() == [target.vocab_size - 2] * rows  # end of lines
    assert int(tokens[-1]) == target.vocab_size - 1  # end of image
    ids = torch.cat([target.prompt_ids("a red circle"), target.output_token_ids[tokens]])
    with torch.no_grad():
        hidden = target.model.model(input_ids=ids[None]).last_hidden_state
        full = target.model.lm_head(hidden)[0, -len(tokens) - 1 : -1]  # [N, vocabulary] the head, unmasked
    free = (torch.arange(len(tokens)) + 1) % (columns + 1) != 0
    free[-1] = False
    expected = full[free][:, target.output_token_ids[: target.vocab_size - 2]].argmax(-1)
    assert torch.equal(expected, tokens[free])  # greedy over the image codes: the model's own argmax


@pytest.mark.parametrize("size", [(32, 32), (64, 32)])
def test_drafted_methods_decode_ar_greedy_tokens_and_images_of_the_size_asked(chameleon, size):
    from raydec.api import generate_images

    greedy = {"temperature": 0.0, "cfg_scale": 3.0}
    results = {method: generate_images(PROMPTS, model=chameleon, size=f"{size[0]}x{size[1]}", seeds=[1, 2, 3],
                                       decode={"method": method, "sampling": greedy, "jacobi": {"window": 6}})
               for method in ("ar", "sjd", "sjd_ac", "sjd_pac")}
    for method, rows in results.items():
        assert [r.tokens for r in rows] == [r.tokens for r in results["ar"]], method
        assert all(r.image.size == size for r in rows)
    assert sum(r.target_forwards for r in results["sjd_pac"]) < sum(r.target_forwards for r in results["ar"])
    assert len({r.image.tobytes() for r in results["ar"]}) == 3


def _exact_law(target, prompt: str, length: int, sampling: SamplingConfig) -> torch.Tensor:
    """The law of the first ``length`` tokens under ``sampling`` with CFG, from the model's own
    forward (conditional prompt and the unconditional image header), enumerating the prefixes of
    nonzero probability. -> [V] * length"""
    cond = target.prompt_ids(prompt).tolist()
    uncond = target.prompt_inputs(prompt, unconditional=True).input_ids.tolist()
    vocab = target.vocab_size
    law = torch.zeros([vocab] * length, dtype=torch.float64)
    frontier = {(): 1.0}
    constraint = target.vocab_constraint()
    for step in range(length):
        grown = {}
        for prefix, mass in frontier.items():
            ids = [target.output_token_ids[t].item() for t in prefix]
            with torch.no_grad():
                rows = [target.model.lm_head(target.model.model(input_ids=torch.tensor([head + ids])).last_hidden_state)[0, -1]
                        for head in (cond, uncond)]
            logits = torch.stack(rows)[:, target.output_token_ids].double().unsqueeze(1)  # [2, 1, V]
            probs = process_logits(logits, sampling, 1, constraint, torch.full((1, 1), step))[0, 0]
            for token in probs.nonzero().flatten().tolist():
                grown[prefix + (token,)] = mass * float(probs[token])
        frontier = grown
    for sequence, mass in frontier.items():
        law[sequence] = mass
    return law


@pytest.mark.slow
def test_sjd_pac_samples_follow_the_exact_law_with_cfg(chameleon):
    """6,000 rows (a budget), top-k 3 and CFG 3 in logit space: the first row of a 64x32 image
    (4 codes, then its forced end of line)."""
    target = chameleon.with_size(64, 32)
    sampling = SamplingConfig(temperature=1.0, top_k=3, cfg_scale=3.0, cfg_space="logits")
    config = DecodeConfig(max_new_tokens=5, sampling=sampling, jacobi=JacobiDraftConfig(window=5, branching=2, tree_depth=1))
    proposer = JacobiProposer(config.jacobi, "sjd_pac", "left", grid_width=target.layout_grid[1])
    samples = sample_engine(target, proposer, config, [PROMPTS[1]], list(range(6000)), 1500, constraint=target.vocab_constraint())
    report = compare_to_law(samples, _exact_law(target, PROMPTS[1], 5, sampling))
    assert report.passed, str(report)


def test_a_vqgan_kept_elsewhere_is_named_by_vqgan_path_in_every_entry_point(chameleon_path, tmp_path):
    """Lumina-mGPT keeps Meta's VQ-GAN in ckpts/chameleon/tokenizer/, apart from the language model:
    ``vqgan_path`` names that folder in ``load_target``, ``raydec generate --vqgan``, a job and a served
    model. Without it a checkpoint lacking ``vqgan/`` is refused naming what is missing; it is refused
    for a model that decodes its images itself, and for captioning."""
    import shutil

    from pydantic import ValidationError

    from raydec.api import generate_images, load_target
    from raydec.cli import main
    from raydec.runtime.config import JobConfig
    from raydec.serve import ServeConfig
    from tests.t2i_toys import tiny_janus

    model = tmp_path / "lumina"
    shutil.copytree(chameleon_path, model, ignore=shutil.ignore_patterns("vqgan"))
    tokenizer = tmp_path / "ckpts" / "chameleon" / "tokenizer"
    shutil.copytree(chameleon_path / "vqgan", tokenizer)
    with pytest.raises(FileNotFoundError, match="vqgan"):
        load_target(str(model), task="t2i")
    target = load_target(str(model), task="t2i", vqgan_path=tokenizer)
    decode = DecodeConfig(method="sjd_pac", jacobi=JacobiDraftConfig(window=6, init="left"), sampling=SamplingConfig(temperature=0.0))
    (image,) = generate_images(["a red circle"], model=target, decode=decode, size="32x32", seeds=[0])
    (expected,) = generate_images(["a red circle"], model=str(chameleon_path), decode=decode, size="32x32", seeds=[0])
    assert image.tokens == expected.tokens and image.image.tobytes() == expected.image.tobytes()

    assert main(["generate", "a red circle", "--model", str(model), "--vqgan", str(tokenizer), "--method", "ar",
                 "--temperature", "0", "--size", "32x32", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "00000.png").is_file()

    job = {"model": str(model), "vqgan_path": str(tokenizer), "input": {"path": "in.parquet"}, "output": {"path": "out"}}
    assert JobConfig.model_validate(job).processor_config().vqgan_path == str(tokenizer)
    with pytest.raises(ValidationError, match="vqgan_path: .* only text-to-image decodes images"):
        JobConfig.model_validate({**job, "task": "caption", "decode": {"method": "ar"}})
    served = {"models": [{"name": "lumina", "task": "t2i", "model": str(model), "vqgan_path": str(tokenizer)}]}
    assert ServeConfig.model_validate(served).models[0].vqgan_path == str(tokenizer)
    with pytest.raises(ValueError, match="is a 'janus' checkpoint, which decodes its images itself"):
        load_target(str(tiny_janus(tmp_path / "janus")), task="t2i", vqgan_path=tokenizer)
    with pytest.raises(ValueError, match="holds no vqgan.yaml"):
        load_target(str(model), task="t2i", vqgan_path=tmp_path)
