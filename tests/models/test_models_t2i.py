"""Text-to-image adapters (Janus, Emu3), the registry and ``api.generate_images``.

Tiny random-weight checkpoints of the real Hugging Face classes are saved with
``save_pretrained`` and loaded back by path through the registry.
"""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from raydec import api
from raydec.config import DecodeConfig, JacobiDraftConfig, SamplingConfig
from raydec.models.base import CheckpointError
from raydec.models.emu3 import Emu3T2ITarget
from raydec.models.generation_config import sampling_from_generation_config
from raydec.models.image_gen import ImagePrompt
from raydec.models.janus import JanusT2ITarget
from raydec.models.registry import load_t2i_target
from raydec.speculative.engine import Engine
from raydec.speculative.requests import RowRequest
from raydec.speculative.sampling import process_logits
from raydec.speculative.proposers.ar import ARProposer
from raydec.speculative.proposers.factory import make_proposer
from tests.proposers import RandomTreeProposer
from tests.t2i_toys import tiny_emu3, tiny_janus

torch.set_num_threads(1)

PROMPTS = ["a red circle", "big blue square on the left", "a small green triangle on the right"]
EMU3_AREA = 32 * 32  # 4 x 4 tokens at the processor's downsample 8


@pytest.fixture(scope="module")
def janus_path(tmp_path_factory):
    return tiny_janus(tmp_path_factory.mktemp("janus") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def emu3_path(tmp_path_factory):
    return tiny_emu3(tmp_path_factory.mktemp("emu3") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def janus(janus_path):
    return load_t2i_target(janus_path)


@pytest.fixture(scope="module")
def emu3(emu3_path):
    return load_t2i_target(emu3_path, image_area=EMU3_AREA)


def decode(target, proposer, sampling: SamplingConfig, prompts, seeds, draft: JacobiDraftConfig = JacobiDraftConfig()):
    config = DecodeConfig(max_new_tokens=target.num_image_tokens, sampling=sampling, jacobi=draft)
    engine = Engine(target, proposer, config.sampling, config.max_new_tokens, constraint=target.vocab_constraint(), eos_token_ids=target.eos_token_ids)
    return engine.generate([RowRequest(p, seed=s) for p, s in zip(prompts, seeds)])


def test_registry_picks_adapter_and_reads_layout(janus, emu3):
    assert isinstance(janus, JanusT2ITarget) and isinstance(emu3, Emu3T2ITarget)
    assert janus.grid_shape == (4, 4) and janus.num_image_tokens == 16 and janus.vocab_size == 64
    assert janus.image_size == (8, 8)
    assert emu3.grid_shape == (4, 4) and emu3.num_image_tokens == 4 * 5 + 3 and emu3.image_size == (32, 32)
    # HF generate's effective defaults: sampling, unset top_k -> 50, guidance_scale -> cfg_scale
    assert janus.default_sampling() == SamplingConfig(temperature=1.0, top_k=50, cfg_scale=3.0, cfg_space="logits")
    assert emu3.default_sampling() == SamplingConfig(temperature=1.0, top_k=16, cfg_scale=3.0, cfg_space="logprobs")


def test_registry_errors_name_path_and_type(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
        load_t2i_target(tmp_path / "missing")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"llama.*model_type='llama'"):
        load_t2i_target(tmp_path / "llama")
    from raydec.models.causal_lm import CausalLMTarget

    with pytest.raises(FileNotFoundError, match=rf"no causal LM checkpoint at {tmp_path / 'missing'}"):
        CausalLMTarget.from_pretrained(tmp_path / "missing")  # a path, never a Hub repo id


def test_reference_model_loads():
    """"reference" -> raydec/reference/weights/t2i (a Janus, shipped in the repository)."""
    target = load_t2i_target("reference")
    assert isinstance(target, JanusT2ITarget)
    assert target.num_image_tokens == target.grid_shape[0] * target.grid_shape[1]


def test_janus_prompts_match_hf_generate_layout(janus):
    cond = janus.prompt_inputs("a red circle").input_ids
    uncond = janus.prompt_inputs("a red circle", unconditional=True).input_ids
    tokens = janus.tokenizer.convert_ids_to_tokens(cond)
    assert tokens == ["<bos>", "a", "red", "circle", "<begin_of_image>"]
    assert janus.tokenizer.convert_ids_to_tokens(uncond) == ["<bos>", "<pad>", "<pad>", "<pad>", "<begin_of_image>"]
    negative = janus.prompt_inputs(ImagePrompt("a red circle", negative="blue"), unconditional=True).input_ids
    assert janus.tokenizer.convert_ids_to_tokens(negative) == ["<bos>", "blue", "<begin_of_image>"]


def test_janus_greedy_cfg_equals_hf_generate(janus):
    """(a) Our AR (batch of 3 prompts of different lengths) == HF generate(generation_mode="image")."""
    ours = decode(janus, ARProposer(), SamplingConfig(temperature=0.0, cfg_scale=3.0), PROMPTS, [0, 1, 2])
    for prompt, out in zip(PROMPTS, ours):
        inputs = janus.processor(text=[prompt], generation_mode="image", return_tensors="pt")
        reference = janus.model.generate(**inputs, generation_mode="image", do_sample=False, guidance_scale=3.0)
        assert out.tokens == reference[0].tolist()
        assert out.stats.target_forwards == janus.num_image_tokens
    assert len({tuple(o.tokens) for o in ours}) == len(PROMPTS)
    assert max(len(set(o.tokens)) for o in ours) > 3  # context-dependent, not one repeated token


def _emu3_allowed_fn(emu3):
    """Hugging Face's Emu3 image-generation example constraint (``prefix_allowed_tokens_fn``)."""
    (height, width), tok = emu3.grid_shape, emu3.tokenizer
    visual = emu3.visual_token_ids.tolist()
    eol = int(emu3.output_token_ids[emu3.layout.eol])

    def allowed(batch_id, input_ids):
        offset = input_ids.shape[0] - int(torch.nonzero(input_ids == tok.image_wrapper_token_id)[0, 0])
        if offset % (width + 1) == 0:
            return [eol]
        for k, token in enumerate([tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]):
            if offset == (width + 1) * height + 1 + k:
                return [token]
        return visual

    return allowed


def test_emu3_greedy_cfg_equals_hf_generate(emu3):
    """Our batched CFG (log-prob mix) + forced layout == HF generate with its unbatched CFG
    processor (negative prompt = our unconditional prefix) and the example's prefix constraint."""
    ours = decode(emu3, ARProposer(), SamplingConfig(temperature=0.0, cfg_scale=3.0, cfg_space="logprobs"), PROMPTS, [0, 1, 2])
    for prompt, out in zip(PROMPTS, ours):
        cond = emu3.prompt_ids(prompt)[None]
        uncond = emu3.prompt_inputs(prompt, unconditional=True).input_ids[None]
        reference = emu3.model.generate(
            input_ids=cond, attention_mask=torch.ones_like(cond), max_new_tokens=emu3.num_image_tokens,
            do_sample=False, prefix_allowed_tokens_fn=_emu3_allowed_fn(emu3), guidance_scale=3.0,
            negative_prompt_ids=uncond, negative_prompt_attention_mask=torch.ones_like(uncond),
        )
        assert emu3.to_vocab_ids(torch.tensor(out.tokens)).tolist() == reference[0, cond.shape[1] :].tolist()


def test_emu3_decodes_over_its_image_tokens_only(emu3):
    """The output space is the visual codes and the five layout tokens, through a gathered head
    whose logits equal the full head's at those ids."""
    codes = len(emu3.visual_token_ids)
    assert emu3.vocab_size == codes + 5 < emu3.model.get_output_embeddings().weight.shape[0]
    hidden = torch.randn(2, 3, emu3.model.lm_head.weight.shape[1])
    full = emu3.model.lm_head(hidden)[..., emu3.output_token_ids]
    assert torch.allclose(emu3.window_head(hidden), full, atol=1e-6)
    assert emu3.to_vocab_ids(torch.tensor([0, codes])).tolist() == [int(emu3.visual_token_ids[0]), int(emu3.model.vocabulary_mapping.eol_token_id or emu3.tokenizer.convert_tokens_to_ids("<|extra_200|>"))]


METHODS = ["ar", "random", "sjd", "sjd_ac", "sjd_pac"]
PAC_DRAFT = JacobiDraftConfig(window=8, branching=2, tree_depth=1)


def method_proposer(method: str, target):
    """The proposer ``api.generate_images`` uses for ``method``; "random": the test-only
    RandomTreeProposer (dense q), which no public method names."""
    if method == "random":
        return RandomTreeProposer(PAC_DRAFT, "dense")
    return make_proposer(DecodeConfig(method=method, jacobi=PAC_DRAFT), target)


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_decodes_to_images(request, name, method):
    """(b) CFG on, batch 2: exactly the layout's tokens, decodable into images of the right size."""
    target = request.getfixturevalue(name)
    outs = decode(target, method_proposer(method, target), target.default_sampling(), PROMPTS[:2], [5, 6], PAC_DRAFT)
    assert [len(o.tokens) for o in outs] == [target.num_image_tokens] * 2
    assert all(o.stats.finish_reason == "length" for o in outs)
    images = target.decode_tokens(torch.tensor([o.tokens for o in outs]))
    assert all(isinstance(im, Image.Image) and im.size == target.image_size[::-1] and im.mode == "RGB" for im in images)


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("method", METHODS[1:])
def test_drafted_methods_greedy_equal_ar(request, name, method):
    """Lossless at temperature 0 with CFG: every drafted method reproduces AR's tokens."""
    target = request.getfixturevalue(name)
    greedy = SamplingConfig(temperature=0.0, cfg_scale=3.0, cfg_space=target.default_sampling().cfg_space)
    ar = decode(target, ARProposer(), greedy, PROMPTS, [0, 1, 2])
    drafted = decode(target, method_proposer(method, target), greedy, PROMPTS, [0, 1, 2], PAC_DRAFT)
    assert [o.tokens for o in drafted] == [o.tokens for o in ar]
    assert sum(o.stats.target_forwards for o in drafted) <= sum(o.stats.target_forwards for o in ar)


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("init", ["left", "above"])
def test_spatial_prior_drafts_greedy_equal_ar(request, name, init):
    """The fresh-draft priors the tuner may pick, through api's proposer (grid width from the
    layout; Emu3's rows end in forced end-of-line tokens): still AR's tokens at temperature 0."""
    target = request.getfixturevalue(name)
    greedy = SamplingConfig(temperature=0.0, cfg_scale=3.0, cfg_space=target.default_sampling().cfg_space)
    draft = PAC_DRAFT.model_copy(update={"init": init})
    proposer = make_proposer(DecodeConfig(method="sjd_pac", jacobi=draft), target)
    assert proposer.init == init and proposer.grid_width == target.layout_grid[1]
    ar = decode(target, ARProposer(), greedy, PROMPTS, [0, 1, 2])
    drafted = decode(target, proposer, greedy, PROMPTS, [0, 1, 2], draft)
    assert [o.tokens for o in drafted] == [o.tokens for o in ar]


def test_emu3_layout_tokens_exactly_at_row_ends(emu3):
    """(c) end-of-line after every row, eof / end-of-image / eos at the end, visual tokens elsewhere."""
    height, width = emu3.grid_shape
    tok = emu3.tokenizer
    visual = set(emu3.visual_token_ids.tolist())
    eol = int(emu3.output_token_ids[emu3.layout.eol])
    outs = decode(emu3, method_proposer("sjd_pac", emu3), emu3.default_sampling(), PROMPTS, [1, 2, 3], PAC_DRAFT)
    for out in outs:
        ids = emu3.to_vocab_ids(torch.tensor(out.tokens)).tolist()
        rows = torch.tensor(ids[: height * (width + 1)]).view(height, width + 1)
        assert rows[:, width].tolist() == [eol] * height
        assert all(t in visual for t in rows[:, :width].flatten().tolist())
        assert ids[height * (width + 1) :] == [tok.eof_token_id, tok.eoi_token_id, tok.eos_token_id]
    grid = emu3.image_token_grid(torch.tensor([o.tokens for o in outs]))
    assert grid.shape == (3, height, width)


@pytest.mark.parametrize("name", ["janus", "emu3"])
@pytest.mark.parametrize("method", ["random", "sjd_pac"])
def test_row_in_batch_equals_row_alone(request, name, method):
    """(d) float64: a row's tokens do not depend on its batch (CFG, sampling, drafted windows)."""
    path = request.getfixturevalue(f"{name}_path")
    kwargs = {"image_area": EMU3_AREA} if name == "emu3" else {}
    target = load_t2i_target(path, dtype=torch.float64, **kwargs)
    sampling = target.default_sampling()
    prompts = [PROMPTS[1], ImagePrompt(PROMPTS[2], negative="red")]
    together = decode(target, method_proposer(method, target), sampling, prompts, [11, 12], PAC_DRAFT)
    for i, prompt in enumerate(prompts):
        alone = decode(target, method_proposer(method, target), sampling, [prompt], [11 + i], PAC_DRAFT)[0]
        assert alone.tokens == together[i].tokens
    assert together[0].tokens != together[1].tokens


# -- api -------------------------------------------------------------------------------------


def test_generate_images_end_to_end(janus_path):
    pipeline = api.load_target(janus_path)
    assert api.load_target(str(janus_path)) is pipeline  # loaded once
    results = api.generate_images(PROMPTS, model=janus_path, seeds=[3, 4, 5], batch_size=2, progress=True)
    assert [r.seed for r in results] == [3, 4, 5]
    for result in results:
        assert result.image.size == (8, 8) and len(result.tokens) == result.num_tokens == 16
        assert result.target_forwards == 16 and result.tokens_per_forward == pytest.approx(1.0)
        assert result.latency_s > 0
    # a row's image depends on its prompt and seed only, not on the batch
    again = api.generate_images([PROMPTS[2]], model=pipeline, seeds=[5], negative_prompts=[None])
    assert again[0].tokens == results[2].tokens
    decode_pac = DecodeConfig(method="sjd_pac", jacobi=PAC_DRAFT, sampling=SamplingConfig(temperature=0.0, cfg_scale=3.0))
    drafted = api.generate_images(PROMPTS, model=pipeline, decode=decode_pac, seeds=[3, 4, 5])
    greedy = api.generate_images(PROMPTS, model=pipeline, decode=DecodeConfig(sampling=decode_pac.sampling), seeds=[3, 4, 5])
    assert [r.tokens for r in drafted] == [r.tokens for r in greedy]
    assert all(r.num_tokens == 16 and r.tokens_per_forward == pytest.approx(16 / r.target_forwards) for r in drafted)


def test_generate_images_batching_refills_rows_without_changing_them(janus_path):
    """batching="continuous" gives a finished row's place to the next prompt (the default on
    an accelerator); each row's sampled image equals the one from consecutive batches."""
    pipeline = api.load_target(janus_path)
    prompts, seeds = PROMPTS + PROMPTS[:2], [3, 4, 5, 6, 7]
    assert api.continuous_batching("cpu") is False and api.continuous_batching("cpu", "continuous") is True
    assert api.continuous_batching("cuda") is True and api.continuous_batching("cuda", "consecutive") is False
    by_mode = {}
    for batching in ("consecutive", "continuous"):
        decode = {"method": "sjd_pac", "jacobi": PAC_DRAFT.model_dump(), "batching": batching}  # a dict is validated into a DecodeConfig
        by_mode[batching] = api.generate_images(prompts, model=pipeline, decode=decode, seeds=seeds, batch_size=2)
    assert [r.tokens for r in by_mode["continuous"]] == [r.tokens for r in by_mode["consecutive"]]
    assert [r.target_forwards for r in by_mode["continuous"]] == [r.target_forwards for r in by_mode["consecutive"]]
    with pytest.raises(ValueError, match="batching"):
        DecodeConfig(batching="sometimes")
    with pytest.raises(ValueError, match="batching: expected 'auto', 'continuous' or 'consecutive', got 'sometimes'"):
        api.continuous_batching("cpu", "sometimes")


def test_generate_images_validation(janus):
    assert api.generate_images([], model="reference") == []
    with pytest.raises(ValueError, match=r"prompts\[1\].*'  '"):
        api.generate_images(["a red circle", "  "], model=janus)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        api.generate_images([""], model=janus)
    with pytest.raises(ValueError, match="seeds has 1 entries but prompts has 2"):
        api.generate_images(["a", "b"], model=janus, seeds=[1])
    with pytest.raises(ValueError, match=r"prompts\[1\]: holds a lone surrogate U\+D800 at character 2"):
        api.generate_images(["a", "a \ud800"], model=janus)  # no tokenizer's TypeError
    with pytest.raises(ValueError, match=r"negative_prompts\[0\]: holds a lone surrogate U\+DC00"):
        api.generate_images(["a"], model=janus, negative_prompts=["\udc00"])
    with pytest.raises(ValueError, match="negative_prompts has 1"):
        api.generate_images(["a", "b"], model=janus, negative_prompts=["x"])
    with pytest.raises(TypeError, match="negative_prompts must be a list .* got str: 'ab'"):
        api.generate_images(["a", "b"], model=janus, negative_prompts="ab")  # not split into 'a', 'b'
    for device, message in (("gpu", "device: 'gpu' is not a torch device"), ("cuda:7", "device: 'cuda:7', but")):
        if not (device.startswith("cuda") and torch.cuda.device_count() > 7):
            with pytest.raises(ValueError, match=message):
                api.load_target("reference", task="t2i", device=device)
    with pytest.raises(TypeError, match=r"prompts must be a list of strings, got generator"):
        api.generate_images((p for p in ["a"]), model=janus)
    limit = janus.model.config.get_text_config().max_position_embeddings
    with pytest.raises(ValueError, match=rf"prompts\[1\]: \d+ prompt tokens \+ {janus.num_image_tokens} new tokens = \d+ positions, more than the model's {limit}"):
        api.generate_images(["a red circle", "red " * limit], model=janus)
    with pytest.raises(ValueError, match="batch_size"):
        api.generate_images(["a"], model=janus, batch_size=0)
    with pytest.raises(TypeError, match="batch_size must be an integer >= 1, got float: 2.5"):
        api.generate_images(["a"], model=janus, batch_size=2.5)
    with pytest.raises(ValueError, match="model: a loaded .* is not a vision-language target"):
        api.load_target(janus, task="caption")
    with pytest.raises(ValueError, match="unknown task='nonsense'"):
        api.load_target(janus, task="nonsense")
    with pytest.raises(TypeError, match="list of strings"):
        api.generate_images("a red circle", model=janus)
    with pytest.raises(ValueError, match="max_new_tokens=10"):
        api.generate_images(["a"], model=janus, decode=DecodeConfig(max_new_tokens=10))
    with pytest.raises(ValueError, match="vispec"):
        api.generate_images(["a"], model=janus, decode=DecodeConfig(method="vispec"))
    for seeds, error, message in (
        ([1.7], TypeError, r"seeds\[0\] must be an integer, got float: 1.7"),
        (["abc"], TypeError, r"seeds\[0\] must be an integer, got str"),
        ([-1], ValueError, r"seeds\[0\] must be an integer in \[0, 2\*\*63\), got -1"),
        ([2**70], ValueError, r"seeds\[0\] must be an integer in \[0, 2\*\*63\)"),
        (7, TypeError, "seeds must be a list of integers"),
    ):
        with pytest.raises(error, match=message):
            api.generate_images(["a"], model=janus, seeds=seeds)
    with pytest.raises(TypeError, match="decode must be a raydec.config.DecodeConfig or a dict of its fields, got str: 'sjd'"):
        api.generate_images(["a"], model=janus, decode="sjd")
    with pytest.raises(ValueError, match="method"):
        api.generate_images(["a"], model=janus, decode={"method": "sjd_pca"})


# -- the sampling law itself -------------------------------------------------------------------


def _teacher_forced_probs(target, prompt: str, tokens: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """Our processed P at every generated position along ``tokens`` (one causal forward). -> [N, V]"""
    rows = [target.prompt_inputs(prompt), target.prompt_inputs(prompt, unconditional=True)]
    width = max(r.length for r in rows)
    embeds, valid = [], []
    image = target.embed_output_tokens(torch.tensor([tokens[:-1]]))  # [1, N-1, H]
    for r in rows:  # left-pad each row to the same width
        pad = width - r.length
        prefix = target.embed_prompt_tokens(r.input_ids[None])
        embeds.append(torch.cat([prefix.new_zeros(1, pad, prefix.shape[-1]), prefix, image], dim=1))
        valid.append(torch.tensor([False] * pad + [True] * (r.length + len(tokens) - 1)))
    embeds, valid = torch.cat(embeds), torch.stack(valid)  # [2, T, H], [2, T]
    length = valid.shape[1]
    allowed = torch.tril(torch.ones(length, length, dtype=torch.bool)) & valid[:, None, :]
    allowed |= torch.eye(length, dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=target.dtype).masked_fill(~allowed, torch.finfo(target.dtype).min)[:, None]
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    from transformers import DynamicCache

    logits = target.forward(embeds, None, positions, mask, DynamicCache()).logits[:, width - 1 :]  # [2, N, V]
    gen_index = torch.arange(len(tokens))[None]
    return process_logits(logits, sampling, 1, target.vocab_constraint(), gen_index)[0]


@pytest.mark.parametrize("name", ["janus", "emu3"])
def test_sampling_law_equals_hf_generate(request, name, monkeypatch):
    """Every distribution HF ``generate`` samples from (CFG, constraints, temperature, top-k,
    top-p from a generation config) equals our processed P along HF's own sampled tokens."""
    from transformers import GenerationConfig

    target = request.getfixturevalue(name)
    settings = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, guidance_scale=3.0)
    generation = GenerationConfig(**{**target.model.generation_config.to_dict(), **settings})
    space = "logits" if name == "janus" else "logprobs"
    sampling = sampling_from_generation_config(generation, space)
    assert sampling == SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, cfg_scale=3.0, cfg_space=space)
    recorded: list[torch.Tensor] = []
    original = torch.multinomial

    def recording_multinomial(probs, *args, **kwargs):
        recorded.append(probs.detach().clone())
        return original(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording_multinomial)
    torch.manual_seed(0)
    prompt = PROMPTS[1]
    if name == "janus":
        inputs = target.processor(text=[prompt], generation_mode="image", return_tensors="pt")
        tokens = target.model.generate(**inputs, generation_mode="image", generation_config=generation)[0].tolist()
    else:
        cond = target.prompt_ids(prompt)[None]
        uncond = target.prompt_inputs(prompt, unconditional=True).input_ids[None]
        out = target.model.generate(
            input_ids=cond, attention_mask=torch.ones_like(cond), generation_config=generation,
            max_new_tokens=target.num_image_tokens, prefix_allowed_tokens_fn=_emu3_allowed_fn(target),
            negative_prompt_ids=uncond, negative_prompt_attention_mask=torch.ones_like(uncond),
        )
        tokens = out[0, cond.shape[1] :].tolist()
    monkeypatch.setattr(torch, "multinomial", original)
    hf_probs = torch.cat(recorded)  # [N, V]
    if name == "emu3":  # our output space: the image and layout tokens; HF's mass is all on them
        columns = target.output_token_ids[: len(target.visual_token_ids) + 4]  # pad is never sampled
        assert float(hf_probs[:, columns].sum(dim=1).min()) > 1 - 1e-5
        hf_probs = torch.cat([hf_probs[:, columns], torch.zeros(len(hf_probs), target.vocab_size - len(columns))], dim=1)
        tokens = target.from_vocab_ids(torch.tensor(tokens)).tolist()
    ours = _teacher_forced_probs(target, prompt, tokens, sampling)
    assert hf_probs.shape == ours.shape == (target.num_image_tokens, target.vocab_size)
    assert (hf_probs > 0).sum() < hf_probs.numel() / 2  # top-k / top-p / the layout really cut
    torch.testing.assert_close(ours.float(), hf_probs.float(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["janus_path", "emu3_path"])
def test_half_precision_on_cpu_decodes_pixels_in_float32(request, name):
    """bf16 convolutions have no fast CPU kernel: the VQ decoder runs in float32 (its bf16
    weights upcast, so pixels equal a float32 decode of those weights); the rest stays bf16."""
    path = request.getfixturevalue(name)
    extra = {"image_area": EMU3_AREA} if name == "emu3_path" else {}
    half, upcast = (load_t2i_target(path, dtype=torch.bfloat16, **extra) for _ in range(2))
    upcast.model.model.vqmodel.float()
    results = api.generate_images(PROMPTS[:2], model=half, seeds=[3, 4])
    assert next(half.model.model.vqmodel.parameters()).dtype == torch.float32
    assert half.dtype == torch.bfloat16 and next(half.window_head.parameters()).dtype == torch.bfloat16
    again = upcast.decode_tokens(torch.tensor([r.tokens for r in results]))
    assert [r.image.tobytes() for r in results] == [im.tobytes() for im in again]


def test_an_emu3_with_32768_codes_samples_over_its_codes_not_its_head(tmp_path):
    """Emu3-Gen's codebook size: every step's P has the codes and the 5 layout tokens as columns
    (32,773), not the LM head's (all text and special tokens as well)."""
    from raydec.speculative.verify import verify_tree

    target = load_t2i_target(tiny_emu3(tmp_path / "emu3-32k", codebook=32768), image_area=EMU3_AREA)
    widths = set()

    def recording(tree, target_probs, uniforms):
        widths.add(target_probs.shape[-1])
        return verify_tree(tree, target_probs, uniforms)

    decode_config = DecodeConfig(method="sjd_pac", max_new_tokens=target.num_image_tokens, sampling=target.default_sampling(), jacobi=PAC_DRAFT)
    engine = Engine(target, make_proposer(decode_config, target), decode_config.sampling, decode_config.max_new_tokens, constraint=target.vocab_constraint(), verifier=recording)
    out = engine.generate([RowRequest(ImagePrompt(PROMPTS[0], None), seed=0)])[0]
    assert widths == {32768 + 5} and target.model.lm_head.weight.shape[0] > 32768 + 5
    assert len(out.tokens) == target.num_image_tokens and len(target.decode_tokens(torch.tensor([out.tokens]))) == 1
