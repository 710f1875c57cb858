"""``stepguard-torchrun`` run as the PyTorch page says, venv not activated (issue 41
item 7): a bare ``torchrun`` is found beside the wrapper's own interpreter, and a
relaunch says in one line why the ranks exited 75."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.client.pytorch.relaunch import RELAUNCH_EXIT, find_program, run


def _program(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(0o755)


def test_a_bare_name_is_found_beside_the_interpreter_not_only_on_path(tmp_path):
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir()
    _program(bin_dir, "fake-torchrun", "raise SystemExit(0)")
    env = {"PATH": "/usr/bin:/bin"}  # the venv is not activated
    assert find_program("fake-torchrun", env, bin_dir) == str(bin_dir / "fake-torchrun")
    assert run(["fake-torchrun", "train.py"], env, bin_dir=bin_dir) == 0


def test_a_missing_program_names_where_it_looked_and_how_to_get_torch(tmp_path):
    try:
        find_program("no-such-torchrun", {"PATH": str(tmp_path)}, tmp_path)
    except FileNotFoundError as exc:
        assert str(tmp_path) in str(exc) and "stepguard[torch]" in str(exc)
    else:
        raise AssertionError("found a program that does not exist")


def test_a_relaunch_explains_exit_code_75_in_one_line(tmp_path, capfd):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # the first attempt writes a relaunch request and exits 75, as every rank does
    _program(
        bin_dir,
        "job",
        f"""
import json, os, sys
if os.environ["STEPGUARD_ATTEMPT"] == "0":
    open(os.environ["STEPGUARD_RELAUNCH_FILE"], "w").write(json.dumps({{
        "job_id": "j", "run": "r", "step": 41, "exclude": ["n1"], "replacements": [],
        "rollback_to": None, "command_ids": ["c1"]}}))
    sys.exit({RELAUNCH_EXIT})
""",
    )
    env = {"PATH": "/usr/bin:/bin", "STEPGUARD_NODES": "n0,n1", "STEPGUARD_SPARES": "s0"}
    assert run(["job"], env, bin_dir=bin_dir, summary=tmp_path / "s.json") == 0
    lines = [line for line in capfd.readouterr().err.splitlines() if "relaunch 1" in line]
    assert len(lines) == 1
    assert "exit code 75 on purpose" in lines[0] and "after step 41" in lines[0]
    assert json.loads((tmp_path / "s.json").read_text())["nodes"] == ["n0", "s0"]
