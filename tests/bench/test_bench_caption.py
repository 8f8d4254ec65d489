"""`raydec bench caption` end to end on the reference VLM with freshly initialised drafts (a
smoke test of the wiring; the shipped drafts are measured by the bench itself)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydec.api import load_target
from raydec.bench.cli import main as bench_main
from raydec.bench.caption import difference_cell, paired_difference
from raydec.models.vispec_draft import DraftConfig, VispecDraft

torch.set_num_threads(1)


def test_bench_caption_writes_every_method(tmp_path):
    target = load_target("reference", "caption")
    for name, vision in (("vispec", True), ("eagle", False)):
        torch.manual_seed(0)
        VispecDraft(DraftConfig.for_target(target.text_config, vision=vision)).save_pretrained(tmp_path / name)
    out = tmp_path / "caption.json"
    code = bench_main([
        "caption", "--methods", "ar,hf,eagle,vispec", "--images", "2", "--dtype", "float32", "--max-new-tokens", "24",
        "--vispec-draft", str(tmp_path / "vispec"), "--eagle-draft", str(tmp_path / "eagle"), "--json", str(out),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"ar", "hf", "eagle", "vispec"}
    for entry in result["methods"].values():
        assert entry["tokens_per_forward"] >= 1.0 and entry["latency_speedup"] > 0
        assert 0.0 <= entry["judge_accuracy"] <= 1.0
    # greedy and lossless: every method writes AR's captions, so scores AR's accuracy image by image
    assert result["captions_identical_to_ar"] == {"ar": 2, "hf": 2, "eagle": 2, "vispec": 2}
    assert "judge_accuracy_vs_ar" not in result["methods"]["ar"]
    for name in ("hf", "eagle", "vispec"):
        assert (result["methods"][name]["judge_accuracy_vs_ar"], result["methods"][name]["judge_accuracy_vs_ar_se"]) == (0.0, 0.0)


def test_paired_difference_is_the_mean_difference_by_image_and_its_standard_error():
    mean, se = paired_difference([1.0, 0.5, 0.75, 1.0], [0.5, 0.5, 0.75, 0.5])  # differences 0.5, 0, 0, 0.5
    assert mean == pytest.approx(0.25)
    assert se == pytest.approx(np.std([0.5, 0, 0, 0.5], ddof=1) / 2)  # sqrt(1/12) / 2
    # a constant shift has no spread: pairing removes the image-to-image variance entirely
    assert paired_difference([0.9, 0.4, 0.7], [0.8, 0.3, 0.6]) == (pytest.approx(0.1), pytest.approx(0.0, abs=1e-12))
    assert paired_difference([0.7], [0.5]) == (pytest.approx(0.2), None)
    assert difference_cell({"judge_accuracy_vs_ar": -0.0031, "judge_accuracy_vs_ar_se": 0.0084}) == "-0.003 ± 0.008"
    assert difference_cell({"judge_accuracy_vs_ar": 0.2, "judge_accuracy_vs_ar_se": None}) == "-"


def test_bench_caption_max_seconds_stops_every_method_at_the_same_image(tmp_path):
    out = tmp_path / "caption.json"
    code = bench_main([
        "caption", "--methods", "ar,hf", "--images", "3", "--dtype", "float32", "--max-new-tokens", "8",
        "--max-seconds", "1e-6", "--json", str(out),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert (result["images"], result["images_requested"]) == (1, 3)
    assert result["captions_identical_to_ar"] == {"ar": 1, "hf": 1}


def test_bench_caption_hf_captions_every_image_of_a_batch(tmp_path):
    out = tmp_path / "caption.json"
    assert bench_main([
        "caption", "--methods", "ar,hf", "--images", "2", "--batch", "2", "--dtype", "float32", "--max-new-tokens", "8",
        "--json", str(out),
    ]) == 0
    result = json.loads(out.read_text())
    assert result["captions_identical_to_ar"] == {"ar": 2, "hf": 2}  # hf used to caption only the first image
    assert result["methods"]["hf"]["tokens"] == result["methods"]["ar"]["tokens"]
