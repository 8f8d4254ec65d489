"""Every `raydec` command: its --help, and a run on a tiny input (the reference models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from raydec.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_documents_its_options(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage:") and "--" in text


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
    assert main(["nonsense"]) == 2


def test_generate_writes_the_images_generate_images_gives(tmp_path):
    from raydec.api import generate_images

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle on the left\n\na blue square at the top\n")
    assert main(["generate", "--prompts-file", str(prompts), "--method", "sjd", "--shape", "default", "--seed", "5",
                 "--out", str(tmp_path / "png")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "png" / "results.jsonl").read_text().splitlines()]
    assert [row["seed"] for row in rows] == [5, 6] and rows[0]["method"] == "sjd"
    expected = generate_images(["a red circle on the left", "a blue square at the top"], decode={"method": "sjd"}, seeds=[5, 6])
    for row, result in zip(rows, expected):
        assert np.array_equal(np.asarray(Image.open(row["image"]).convert("RGB")), np.asarray(result.image))
    table = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": ["x1"], "prompt": ["a green cross"]}), table)
    assert main(["generate", "--parquet", str(table), "--method", "ar", "--out", str(tmp_path / "pq")]) == 0
    assert (tmp_path / "pq" / "x1.png").is_file()
    with pytest.raises(SystemExit, match="exactly one"):
        main(["generate", "a cat", "--parquet", str(table), "--out", str(tmp_path / "x")])


def test_generate_and_caption_take_the_coupling(tmp_path, capsys):
    """--coupling gumbel reaches the decode: a seed's image (caption) is the one generate_images
    (caption_images) gives under the Gumbel coupling with plain AR, though the command drafts (sjd,
    vispec), and results.jsonl records the coupling; a value that is none ends in one message."""
    from raydec.api import caption_images, generate_images
    from raydec.reference.shapes import sample_images

    prompts = ["a red circle on the left", "a blue square at the top"]
    assert main(["generate", *prompts, "--method", "sjd", "--coupling", "gumbel", "--seed", "31", "--out", str(tmp_path / "png")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "png" / "results.jsonl").read_text().splitlines()]
    assert [(row["method"], row["coupling"]) for row in rows] == [("sjd", "gumbel")] * 2
    expected = generate_images(prompts, decode={"method": "ar", "coupling": "gumbel"}, seeds=[31, 32])
    for row, result in zip(rows, expected):
        assert np.array_equal(np.asarray(Image.open(row["image"]).convert("RGB")), np.asarray(result.image))

    image = sample_images([3])[0]
    image.save(tmp_path / "shape.png")
    capsys.readouterr()
    assert main(["caption", str(tmp_path / "shape.png"), "--method", "vispec", "--temperature", "1", "--coupling", "gumbel",
                 "--json", str(tmp_path / "c.jsonl")]) == 0
    expected = caption_images([image], decode={"method": "ar", "coupling": "gumbel", "sampling": {"temperature": 1.0}}, seeds=[0])[0]
    assert capsys.readouterr().out.strip() == f"shape: {expected.caption}"
    row = json.loads((tmp_path / "c.jsonl").read_text())
    assert (row["coupling"], row["method"]) == ("gumbel", "vispec") and row["tokens_per_forward"] > 1

    with pytest.raises(SystemExit) as done:
        main(["generate", "x", "--coupling", "maximal", "--out", str(tmp_path / "bad")])
    assert done.value.code == 2
    said = capsys.readouterr().err.splitlines()[-1]  # argparse's usage, then the one line that says what was wrong
    assert said.startswith("raydec generate: error: argument --coupling: invalid choice: 'maximal'") and "gumbel" in said


def test_generate_makes_an_emu3_at_two_sizes_and_names_the_sizes_it_can(tmp_path, capsys):
    """`--size WIDTHxHEIGHT` reaches the model: a tiny Emu3 (one token per 8x8 pixels) makes 32x32
    and 16x24 images, each equal to generate_images at that size; 20x20 is refused, naming the sizes."""
    from raydec.api import generate_images
    from tests.t2i_toys import tiny_emu3

    emu3 = str(tiny_emu3(tmp_path / "emu3", seed=0))
    for size, (width, height) in (("32x32", (32, 32)), ("16x24", (16, 24))):
        out = tmp_path / size
        assert main(["generate", "a red circle", "--model", emu3, "--size", size, "--method", "sjd_pac", "--shape", "default",
                     "--out", str(out)]) == 0
        (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        image = Image.open(row["image"])
        assert image.size == (width, height)
        (expected,) = generate_images(["a red circle"], model=emu3, decode={"method": "sjd_pac"}, seeds=[row["seed"]], size=size)
        assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(expected.image))
    assert main(["generate", "a red circle", "--model", emu3, "--size", "20x20", "--out", str(tmp_path / "bad")]) == 1
    assert "size: '20x20' is not a size this Emu3 makes: widths and heights in multiples of 8 pixels" in capsys.readouterr().err
    assert main(["generate", "a red circle", "--size", "16x16", "--out", str(tmp_path / "janus")]) == 1
    assert "size: '16x16' is not a size this Janus makes: 64x64 only" in capsys.readouterr().err


def test_generate_tunes_the_draft_shape_once_and_decodes_as_the_api_with_auto(tmp_path, monkeypatch, capsys):
    """--shape auto: tuned on the first run (cached under $RAYDEC_CACHE_DIR), then taken from the cache;
    the method it prints is the one the rows were decoded with."""
    from raydec.api import generate_images
    from tests.t2i_toys import tiny_janus

    monkeypatch.setenv("RAYDEC_CACHE_DIR", str(tmp_path / "cache"))
    janus = str(tiny_janus(tmp_path / "janus"))
    prompts = ["a red circle", "a blue square", "a green triangle"]
    auto = ["--model", janus, "--method", "sjd_pac", "--shape", "auto", "--batch-size", "2"]
    assert main(["generate", *prompts, *auto, "--out", str(tmp_path / "out")]) == 0
    [entry] = (tmp_path / "cache" / "shapes").glob("*.json")
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    expected = generate_images(prompts, model=janus, decode={"method": "sjd_pac", "jacobi": "auto"}, seeds=[r["seed"] for r in rows],
                               batch_size=2)  # the cached choice: no second tuning
    assert list((tmp_path / "cache" / "shapes").glob("*.json")) == [entry]
    for row, result in zip(rows, expected):
        assert np.array_equal(np.asarray(Image.open(row["image"]).convert("RGB")), np.asarray(result.image))
        assert (row["method"], row["plan"]) == (result.method, result.plan)  # what the tuner chose, which may be plain AR

    # where the cached choice is plain AR, the results and the summary say so, not "sjd_pac"
    cached = json.loads(entry.read_text())
    entry.write_text(json.dumps({**cached, "shape": {"method": "ar", "jacobi": None, "draft_tree": None, "label": "ar"}}))
    capsys.readouterr()
    assert main(["generate", *prompts, *auto, "--out", str(tmp_path / "ar")]) == 0
    assert "(ar: plain AR, which the auto draft shape chose over sjd_pac at this batch size," in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "ar" / "results.jsonl").read_text().splitlines()]
    assert {row["method"] for row in rows} == {"ar"} and all(row["tokens_per_forward"] == 1.0 for row in rows)


def test_caption_prints_what_caption_images_gives(tmp_path, capsys):
    from raydec.api import caption_images
    from raydec.reference.shapes import sample_images

    image = sample_images([3])[0]
    path = tmp_path / "shape.png"
    image.save(path)
    assert main(["caption", str(path), "--method", "vispec", "--shape", "default", "--json", str(tmp_path / "c.jsonl")]) == 0
    expected = caption_images([image], decode={"method": "vispec"}, seeds=[0])[0].caption
    assert capsys.readouterr().out.strip() == f"shape: {expected}"
    assert json.loads((tmp_path / "c.jsonl").read_text())["caption"] == expected


def test_run_takes_a_job_config_and_reports_bad_ones_in_one_line(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("task: t2i\nmodel: reference\ninput:\n  path: nowhere/*.parquet\noutput:\n  path: out\n")
    done = subprocess.run([sys.executable, "-m", "raydec.cli", "run", str(config)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "input" in done.stderr and "Traceback" not in done.stderr


def test_run_executes_a_small_job_and_max_rows_makes_a_trial_run(tmp_path):
    data = tmp_path / "in" / "prompts.parquet"
    data.parent.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "prompt": ["a red circle on the left", "a blue square at the top",
                                                               "a green cross"]}), data)
    config = tmp_path / "job.yaml"
    config.write_text(f"task: t2i\nmodel: reference\ninput:\n  path: {data}\noutput:\n  path: {tmp_path / 'out'}\n"
                      "decode:\n  method: ar\npool:\n  workers: 1\n  batch_size: 2\n")
    env = {"PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "PATH": "/usr/bin:/bin"}

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "raydec.cli", "run", str(config), *extra], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=env)

    bad = run("--max-rows", "0")
    assert bad.returncode != 0 and "--max-rows 0" in bad.stderr and "Traceback" not in bad.stderr
    trial = run("--max-rows", "1")
    assert trial.returncode == 0, trial.stderr[-2000:]
    assert len(list((tmp_path / "out" / "images").glob("*.png"))) == 1 and "re-run without max_rows" in trial.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["status"] == "incomplete" and manifest["counts"]["missing"] == 2  # a re-run resumes (tests/runtime)
