"""The torch integration's pure parts, without torch: topology, codec, relaunch."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.client.pytorch import codec, relaunch, topology
from pipeline.client.pytorch.relaunch import RelaunchRequest, swap_nodes
from pipeline.client.pytorch.topology import from_env
from schemas import ActuatorMode, Command, CommandKind


@pytest.mark.parametrize("module", [topology, codec, relaunch])
def test_doctests(module):
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_torchrun_environment_gives_rank_node_and_one_replica_per_rank():
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "rdzv-7",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    t = from_env(env, hostname="gpu-17")
    assert (t.job_id, t.node, t.rank, t.local_rank, t.node_index) == ("rdzv-7", "gpu-17", 5, 1, 1)
    assert t.dp_group == 5 and t.run == "rdzv-7-a0-r2"
    assert not t.is_job_leader and not t.is_node_leader
    assert from_env(env, dp_group=1, hostname="h").dp_group == 1


def test_emulated_nodes_and_a_relaunch_attempt():
    env = {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "STEPGUARD_JOB_ID": "j",
        "STEPGUARD_ATTEMPT": "1",
        "STEPGUARD_NODES": "node-a,spare-0",
        "STEPGUARD_RANKS_PER_NODE": "2",
    }
    t = from_env(env)
    assert (t.node, t.local_rank, t.local_world_size, t.is_node_leader) == ("spare-0", 0, 2, True)
    assert t.run == "j-a1-r0" and t.attempt == 1


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "0"}, "no job id"),
        ({"TORCHELASTIC_RUN_ID": "none"}, "no job id"),
        ({"STEPGUARD_JOB_ID": "j", "RANK": "x"}, "RANK='x'"),
        ({"STEPGUARD_JOB_ID": "j", "RANK": "4", "WORLD_SIZE": "4"}, "outside world size"),
        ({"STEPGUARD_JOB_ID": "j", "STEPGUARD_NODES": "a,a"}, "named twice"),
        (
            {
                "STEPGUARD_JOB_ID": "j",
                "RANK": "3",
                "WORLD_SIZE": "4",
                "STEPGUARD_NODES": "a",
                "STEPGUARD_RANKS_PER_NODE": "2",
            },
            "names 1 nodes",
        ),
    ],
)
def test_a_wrong_environment_is_one_clear_error(env, match):
    with pytest.raises(ValueError, match=match):
        from_env(env)


def _cmd(kind: CommandKind, **kw: object) -> Command:
    return Command(
        command_id=f"c-{kind.value}",
        kind=kind,
        job_id="j",
        reason=("fp",),
        mode=ActuatorMode.AUTO,
        issued_at=datetime.now(UTC),
        **kw,
    )  # type: ignore[arg-type]


def test_commands_cross_ranks_as_json_and_anything_else_is_refused():
    cmds = [_cmd(CommandKind.ISOLATE, targets=("b",), replacements=("s",)),
            _cmd(CommandKind.RESTART, targets=("b",))]  # fmt: skip
    data = codec.encode_commands(cmds)
    assert codec.decode_commands(data) == cmds
    assert b"__reduce__" not in data and data.startswith(b"[")
    with pytest.raises(ValueError):
        codec.decode_commands(b'[{"kind": "checkpoint"}]')
    with pytest.raises(ValueError, match="bytes"):
        codec.decode_commands(b"[" + b" " * codec.MAX_COMMAND_BYTES + b"]")


def test_swap_takes_the_named_spare_or_refuses_without_one():
    assert swap_nodes(["a", "b", "c"], ["s0", "s1"], ["c", "a"], ["s1", "s0"]) == (
        ("s0", "b", "s1"),
        (),
    )
    with pytest.raises(ValueError, match="no spare left to replace b"):
        swap_nodes(["a", "b"], [], ["b"], [])


def test_the_helper_relaunches_once_with_the_spare_then_returns_the_exit_code(tmp_path):
    # a stand-in for torchrun: the first run asks for a relaunch as rank 0 would
    child = tmp_path / "child.py"
    child.write_text(
        "import os, pathlib, sys\n"
        f"log = pathlib.Path({str(tmp_path / 'runs.txt')!r})\n"
        "log.open('a').write(os.environ['STEPGUARD_ATTEMPT'] + ' '"
        " + os.environ['STEPGUARD_NODES'] + '\\n')\n"
        "if os.environ['STEPGUARD_ATTEMPT'] == '0':\n"
        f"    req = {RelaunchRequest('j', 'r', 41, ('b',), ('s0',), None, ('c1',)).to_json()!r}\n"
        "    pathlib.Path(os.environ['STEPGUARD_RELAUNCH_FILE']).write_text(req)\n"
        "    sys.exit(75)\n"
        "sys.exit(3)\n"
    )
    env = {"STEPGUARD_NODES": "a,b", "STEPGUARD_SPARES": "s0", "PATH": "/usr/bin:/bin"}
    summary = tmp_path / "summary.json"
    code = relaunch.run([sys.executable, str(child)], env, summary=summary)
    assert code == 3
    assert (tmp_path / "runs.txt").read_text().splitlines() == ["0 a,b", "1 a,s0"]
    doc = json.loads(summary.read_text())
    assert [r["step"] for r in doc["relaunches"]] == [41] and doc["nodes"] == ["a", "s0"]


def test_the_helper_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.client.pytorch.relaunch", "--", sys.executable, "-c",
         "import sys; sys.exit(4)"], capture_output=True, check=False, timeout=60,
        cwd=Path(__file__).parents[5],
    )  # fmt: skip
    assert done.returncode == 4, done.stderr


def test_importing_the_integration_without_torch_names_the_extra():
    if "torch" in sys.modules or _has_torch():
        pytest.skip("torch is installed here")
    import pipeline.client.pytorch as pt

    with pytest.raises(ImportError, match=r"stepguard\[torch\]"):
        _ = pt.watch


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None
