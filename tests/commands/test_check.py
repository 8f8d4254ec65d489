"""``raydec check``: the reference VLM's rows are AR's in float64 (exit 0, the JSON report), a
verifier that accepts a draft on a near-match is named as a decoding bug (exit 1, its row,
position and both tokens), and coupling rejection is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from raydec import cli
from raydec.speculative import verify_step
from tests.broken import near_match_coupled_verifier
from tests.t2i_toys import tiny_janus

torch.set_num_threads(1)


def test_reference_captions_are_ar_rows_in_float64(tmp_path, capsys):
    report = tmp_path / "check.json"
    code = cli.main(["check", "--method", "vispec", "--dtype", "float64", "--temperature", "1", "--rows", "3", "--max-new-tokens", "24",
                     "--no-warmup", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    written = json.loads(report.read_text())
    assert written["identical_rows"] == written["rows"] == 3 and written["passed"] and written["coupling"] == "gumbel"
    assert written["method_run"]["tokens_per_forward"] > written["ar"]["tokens_per_forward"] == 1.0
    assert "rows identical: 3/3" in out and "raydec check: passed: every row identical to AR's" in out


def test_a_verifier_that_accepts_a_near_match_is_named_as_a_bug(tmp_path, capsys, monkeypatch):
    folder = tiny_janus(tmp_path / "janus", seed=0)
    monkeypatch.setattr(verify_step, "verify_coupled", near_match_coupled_verifier)
    report = tmp_path / "check.json"
    code = cli.main(["check", "a red circle", "two blue squares", "a green triangle", "a red square", "--model", str(folder),
                     "--method", "sjd_pac", "--dtype", "float64", "--no-warmup", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 1, out
    written = json.loads(report.read_text())
    bugs = [row for row in written["row_checks"] if not row["identical"]]
    assert bugs and not written["passed"] and written["not_near_ties"] == len(bugs)
    for row in bugs:
        difference = row["difference"]
        assert not difference["near_tie"] and difference["gap"] > difference["tolerance"]
        assert difference["ar_token"] != difference["method_token"] and difference["reference_token"] == difference["ar_token"]
        assert (f"row {row['id']} (seed {row['seed']}), position {difference['position']}: AR token {difference['ar_token']}, "
                f"sjd_pac token {difference['method_token']}") in out
    assert "not a numeric near-tie (a decoding bug)" in out


@pytest.mark.parametrize("method", ["sjd_pac", "vispec"])
def test_coupling_rejection_has_nothing_to_check(capsys, method):
    assert cli.main(["check", "--method", method, "--coupling", "rejection"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("raydec check: coupling: rejection has no row identity to check (a seed's tokens depend on the method and "
                   "draft shape); check with coupling: gumbel")
