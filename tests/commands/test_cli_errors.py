"""Every `raydec` command turns a user's error into one message and a non-zero exit, never a
traceback: missing files and folders, checkpoints it cannot load, bad sizes, values and configs."""

from __future__ import annotations

import json
import re

import pytest

from raydec.cli import COMMANDS, main


def _bad_inputs(tmp: str) -> list[list[str]]:
    """(argv) per case; ``tmp`` holds a folder that is no checkpoint and files with bad contents."""
    return [
        ["generate", "--model", "/nonexistent", "--out", f"{tmp}/o", "x"],
        ["generate", "--model", f"{tmp}/not_a_checkpoint", "--out", f"{tmp}/o", "x"],  # config.json without model_type
        ["generate", "--size", "13", "--out", f"{tmp}/o", "x"],
        ["generate", "--decode-config", f"{tmp}/bad_decode.yaml", "--out", f"{tmp}/o", "x"],
        ["generate", "--decode-config", f"{tmp}/bad_coupling.yaml", "--out", f"{tmp}/o", "x"],
        ["generate", "--prompts-file", f"{tmp}/missing.txt", "--out", f"{tmp}/o"],
        ["generate", "--out", f"{tmp}/a_file", "x"],  # refused before the model loads
        ["caption", "--model", "/nonexistent", f"{tmp}/image.png"],
        ["check", "--model", "/nonexistent", "x"],
        ["check", "--method", "vispec", f"{tmp}/missing.png"],
        ["caption", f"{tmp}/missing.png"],
        ["run", "/nonexistent.yaml"],
        ["run", f"{tmp}/bad_job.yaml"],
        ["serve", "--config", "/nonexistent.yaml"],
        ["serve", "--config", f"{tmp}/bad_serve.yaml"],
        ["train", "--config", "/nonexistent.yaml"],
        ["bench", "t2i", "--model", "/nonexistent", "--prompts", "1"],
        ["demo", "--out", f"{tmp}/a_file"],
    ]


@pytest.fixture
def bad_files(tmp_path):
    from PIL import Image

    (tmp_path / "not_a_checkpoint").mkdir()
    (tmp_path / "not_a_checkpoint" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "bad_decode.yaml").write_text("method: sjd_pac\nwindoww: 3\n")
    (tmp_path / "bad_coupling.yaml").write_text("method: sjd_pac\ncoupling: maximal\n")
    (tmp_path / "bad_job.yaml").write_text("task: t2i\nmodel: reference\ninput:\n  path: in.parquet\noutput:\n  path: out\npool:\n  workerz: 2\n")
    (tmp_path / "bad_serve.yaml").write_text("models:\n  - name: m\n    task: t2i\n    gpus_per_worker: 2\n")
    (tmp_path / "a_file").write_text("in the way of a folder")
    Image.new("RGB", (8, 8)).save(tmp_path / "image.png")
    return str(tmp_path)


def test_every_command_ends_a_users_error_with_one_message_not_a_traceback(bad_files, capsys, monkeypatch):
    monkeypatch.delenv("RAYDEC_TRACEBACK", raising=False)
    cases = _bad_inputs(bad_files)
    assert {argv[0] for argv in cases} == set(COMMANDS)  # every command
    for argv in cases:
        refusal = ""
        try:
            code = main(argv)
        except SystemExit as done:  # argparse's and the job scripts' refusals (Python prints a message given as the code)
            code, refusal = (done.code, "") if isinstance(done.code, int) else (1, str(done.code))
        err = capsys.readouterr().err + refusal
        said = [line for line in err.splitlines() if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]  # not the logs
        assert code not in (0, None), argv
        assert "Traceback" not in err and said, (argv, err)
        assert any(len(line) > 30 for line in said), (argv, said)  # it says what was wrong
