"""CLI surface: every subcommand has --help; tools fail fast naming the bad input."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()


def _commands(group=app):
    import typer.main

    cmd = typer.main.get_command(group)
    out = []
    for name, sub in cmd.commands.items():
        if hasattr(sub, "commands"):
            out.extend([name, child] for child in sub.commands)
        else:
            out.append([name])
    return out


@pytest.mark.parametrize("argv", _commands(), ids=" ".join)
def test_every_subcommand_has_help(argv):
    result = runner.invoke(app, [*argv, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_score_series_is_causal_and_flags_the_spike(tmp_path):
    rows = ["ts,step_time"] + [f"{i},{1.0 + 0.01 * (i % 3)}" for i in range(30)] + ["30,2.0"]
    path = tmp_path / "s.csv"
    path.write_text("\n".join(rows) + "\n")
    result = runner.invoke(app, ["score-series", str(path), "--warmup", "5"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "ts,score" and len(lines) == 32
    scores = [float(line.split(",")[1]) for line in lines[1:]]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[-1] > 0.9 and max(scores[:-1]) < 0.5
    # causal: appending rows never changes the scores of earlier rows
    path.write_text("\n".join([*rows, "31,9.0"]) + "\n")
    again = runner.invoke(app, ["score-series", str(path), "--warmup", "5"])
    assert again.output.strip().splitlines()[: len(lines)] == lines


def test_score_series_names_the_bad_cell(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("ts,a\n1,1.0\n2,oops\n")
    result = runner.invoke(app, ["score-series", str(path)])
    assert result.exit_code == 2
    assert "line 3" in result.output and "'a'" in result.output


def test_bad_setting_fails_fast_naming_the_variable(monkeypatch):
    monkeypatch.setenv("STEPGUARD_KAFKA_BOOTSTRAP", "not-a-host-port")
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exc:
        monkeypatch.setattr("sys.argv", ["stepguard", "topics"])
        main()
    assert exc.value.code == 2


def test_unknown_demo_scenario_is_a_clear_error():
    from pipeline.errors import ConfigError
    from pipeline.simulator import find_scenario

    with pytest.raises(ConfigError, match="--scenario"):
        find_scenario("no_such_scenario")
