"""The measurement scripts under benchmarks/ run end to end (tiny Janus, a few prompts)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory) -> str:
    from tests.tiny_models import build_tiny_janus

    return str(build_tiny_janus(tmp_path_factory.mktemp("janus")))


def test_draft_shapes_counts_forwards_per_shape(janus_folder, monkeypatch, capsys):
    script = _script("draft_shapes")
    monkeypatch.setattr(sys, "argv", ["draft_shapes.py", "--model", janus_folder, "--prompts", "2", "--dtype", "float32", "sjd:8", "sjd_pac:8:2:1"])
    script.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("sjd")]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("sjd", "8", "1", "0"), ("sjd_pac", "8", "2", "1")]
    for row in rows:  # forwards per image, then tokens per forward: at least one token each
        forwards, compression = float(row[4]), float(row[5])
        assert forwards > 0 and 1.0 <= compression <= 9.0
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys, "argv", ["draft_shapes.py", "eagle:8"])
        script.main()


def test_neighbour_dependence_reports_total_variations(janus_folder, monkeypatch, capsys):
    script = _script("neighbour_dependence")
    monkeypatch.setattr(sys, "argv", ["neighbour_dependence.py", "--model", janus_folder, "--prompts", "2", "--per-image", "2"])
    script.main()
    out = capsys.readouterr().out
    assert "2 AR images, 4 random tokens swapped" in out
    mean = float(re.search(r"all +n= +4 +TV mean (\d\.\d+)", out).group(1))
    assert 0.0 <= mean <= 1.0
