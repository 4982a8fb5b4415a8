"""``python -m tools.golden``: a file it cannot read or write ends it in one line before any
run (its runs take a minute)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.golden import main


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["check", "{tmp}/missing.json"], "{tmp}/missing.json cannot be read: No such file"),
        (["check", "{tmp}/a-file"], "{tmp}/a-file is not a golden record"),
        (["check", "{tmp}/record.json", "--presets", "dqn_atari"], "records no dqn_atari"),
        (["record", "{tmp}"], "file '{tmp}' is a directory: give a file"),
        (["record", "{tmp}/a-file/golden.json"], "file '{tmp}/a-file' cannot be made"),
    ],
)
def test_a_file_it_cannot_use_ends_it_in_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], error: str
) -> None:
    (tmp_path / "a-file").write_text("not json\n")
    (tmp_path / "record.json").write_text('{"default": []}\n')
    assert main([part.format(tmp=tmp_path) for part in args]) == 2
    printed = capsys.readouterr().err
    assert printed.startswith("error: ") and error.format(tmp=tmp_path) in printed
    assert printed.count("\n") == 1
