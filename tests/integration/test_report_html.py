"""``stepguard report`` is one file an SRE can forward (issue 41 item 5), on both backends.

A job with one incident of each kind (a straggler, a hang, a divergence, a hardware
fault) is archived; the report is one self-contained HTML file (images inline, nothing
beside it) with a panel per kind, its causes filled, commands and executor results
counted apart, and it renders in headless Chromium (screenshots in the test's tmp
path). An unknown job is an error: one line, a non-zero exit, no traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import pipeline.services.archive
from pipeline.cli.app import main
from pipeline.io.trust import sign
from pipeline.services.archive import rows_for
from pipeline.tools.report import UnknownJobError, render_report
from schemas import (
    Alert,
    AlertKind,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    GpuHealth,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    RankSample,
    StepTelemetry,
)
from tests.conftest import IN_CI
from tests.factories import EXECUTOR_KEY, JOB_CONTROLLER_KEY, T0, WORKER_KEY, samples

pytestmark = pytest.mark.integration

JOB = "job-report"
NODES = ("node-0001", "node-0002", "node-0003")
SLOW_RANK = 3  # on node-0002 (ranks 2, 3)
HANG = (200, 215)  # no step archived in between; the job restarts as run-1 at 216
DIVERGE = (300, 320)


def _at(step: int) -> Any:
    return T0 + timedelta(seconds=step)


def _steps() -> list[StepTelemetry]:
    out = []
    for step in [s for s in range(40, 460) if not HANG[0] <= s <= HANG[1]]:
        diverging = DIVERGE[0] <= step <= DIVERGE[1]
        for n, node in enumerate(NODES):
            samples_ = []
            for rank in (2 * n, 2 * n + 1):
                slow = rank == SLOW_RANK and 100 <= step <= 130
                samples_.append(
                    RankSample(
                        rank=rank, local_rank=rank % 2, dp_group=0, pp_stage=0, tp_group=0,
                        phase=Phase.TRAIN, step_time_s=0.6 if slow else 0.45,
                        compute_s=0.5 if slow else 0.38, comm_wait_s=0.05, data_wait_s=0.02,
                        loss=2.5 + (step - DIVERGE[0]) * 0.5 if diverging else 2.5 - step / 1000,
                        grad_norm=50.0 if diverging else 1.1,
                    )
                )  # fmt: skip
            out.append(
                StepTelemetry(
                    job_id=JOB, node=node, step=step, ts_start=_at(step),
                    ts_end=_at(step) + timedelta(milliseconds=450), samples=tuple(samples_),
                    run="run-1" if step > HANG[1] else "run-0",
                )
            )  # fmt: skip
    return out


def _alert(kind: AlertKind, node: str, rank: int, step: int, incident: str, seq: int = 0):
    base = samples()["decisions"]
    return sign(
        base.model_copy(
            update={
                "job_id": JOB, "kind": kind, "node": node, "rank": rank, "step": step,
                "fingerprint": f"{incident}-fp".ljust(24, "0")[:24], "incident": incident,
                "seq": seq,
                "grade": Grade.CRITICAL if kind == AlertKind.HARDWARE else Grade.WARNING,
                "ts": _at(step), "started_at": _at(step),
                "summary": f"{kind.value} at step {step}",
            }
        ),
        WORKER_KEY,
    )  # fmt: skip


def _archive_job(archive) -> None:
    alerts: list[Alert] = [
        _alert(AlertKind.STRAGGLER, "node-0002", SLOW_RANK, 105, "inc-straggler"),
        _alert(AlertKind.STRAGGLER, "node-0002", SLOW_RANK, 130, "inc-straggler", 1),
        _alert(AlertKind.HANG, "", -1, 200, "inc-hang"),
        _alert(AlertKind.DIVERGENCE, "", -1, 305, "inc-divergence"),
        _alert(AlertKind.HARDWARE, "node-0003", -1, 400, "inc-hardware"),
    ]
    health = []
    for step in range(380, 420, 5):  # node-0003: XID 79 and uncorrected ECC at 400
        fault = step >= 400
        gpus = tuple(
            GpuHealth(
                index=i, temperature_c=93.0 if fault and i == 0 else 60.0, power_w=400,
                sm_clock_mhz=900 if fault and i == 0 else 1980, utilization_pct=95,
                ecc_corrected=1, ecc_uncorrected=2 if fault and i == 0 else 0,
                xid_codes=(79,) if fault and i == 0 else (), nvlink_errors=0,
            )
            for i in range(2)
        )  # fmt: skip
        health.append(NodeHealth(job_id=JOB, node="node-0003", ts=_at(step), gpus=gpus))
    events = [
        JobEvent(job_id=JOB, kind=JobEventKind.PHASE, phase=Phase.CHECKPOINT,
                 expected_s=30, ts=_at(190), step=190, run="run-0", source="node-0001"),
        JobEvent(job_id=JOB, kind=JobEventKind.WAIT, ts=_at(199), step=199, run="run-0",
                 source="node-0001"),
        JobEvent(job_id=JOB, kind=JobEventKind.START, ts=_at(216), run="run-1",
                 source="node-0001"),
    ]  # fmt: skip
    restart = sign(samples()["commands"].model_copy(update={
        "command_id": "cmd-restart", "kind": CommandKind.RESTART, "job_id": JOB,
        "targets": (), "replacements": (), "issued_at": _at(212),
        "expires_at": _at(212) + timedelta(minutes=5),
    }), JOB_CONTROLLER_KEY)  # fmt: skip
    isolate = sign(samples()["commands"].model_copy(update={
        "command_id": "cmd-isolate", "job_id": JOB, "targets": ("node-0002",),
        "issued_at": _at(131), "expires_at": _at(131) + timedelta(minutes=5),
    }), JOB_CONTROLLER_KEY)  # fmt: skip
    results = [
        sign(CommandResult(command_id=c, job_id=JOB, executor=e, status=CommandStatus.SUCCEEDED,
                           detail="ok", ts=_at(s)), EXECUTOR_KEY)
        for c, e, s in (("cmd-restart", "slurm", 213), ("cmd-restart", "dry-run", 213),
                        ("cmd-isolate", "slurm", 132))
    ]  # fmt: skip
    messages: list[Any] = [*alerts, *health, *events, restart, isolate, *results, *_steps()]
    assert all(isinstance(m, Command) for m in (restart, isolate))
    for table, cols in rows_for([(m, 0) for m in messages], list(range(len(messages)))).items():
        archive.insert(table, cols)


def test_the_report_is_one_file_with_a_panel_per_incident_kind(archive, tmp_path):
    _archive_job(archive)
    out = tmp_path / "report" / "report.html"
    result = render_report(archive, JOB, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html"]  # nothing beside
    page = out.read_text()
    sources = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)""", page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    kinds = {key: [p.kind for p in panels] for key, panels in result.panels.items()}
    assert kinds == {
        "inc-straggler": ["ranks"],
        "inc-hang": ["steps"],
        "inc-divergence": ["divergence"],
        "inc-hardware": ["hardware"],
    }
    assert len(sources) == 4
    captions = {key: panels[0].caption for key, panels in result.panels.items()}
    assert "XID 79" in captions["inc-hardware"] and "ECC uncorrected 2" in captions["inc-hardware"]
    assert "SM clock down to 900" in captions["inc-hardware"]
    assert "+32 %" in captions["inc-straggler"]  # 0.5 s against a 0.38 s peer median
    for marker in ("phase checkpoint", "wait", "restart (run run-1)", "command restart"):
        assert marker in captions["inc-hang"], captions["inc-hang"]
    assert "up to" in captions["inc-divergence"]
    # causes: every row filled, in order with the step each cause began
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<h2>Timeline</h2>")[0])[1:]
    causes = [re.findall(r"<td>(.*?)</td>", r)[-1] for r in rows]
    assert causes == [
        "straggler (step 105)", "hang (step 200)", "divergence (step 305)",
        "hardware (step 400)",
    ]  # fmt: skip
    # counts say what they count: 2 commands, 3 executor results (command x executor rows)
    assert (result.commands, result.results) == (2, 3)
    assert "2 command(s), 3 executor result(s)" in result.text
    assert "<h2>Commands (2 issued, 3 executor result(s))</h2>" in page


def test_an_unknown_job_is_an_error_in_one_line(archive, tmp_path, monkeypatch, capsys):
    _archive_job(archive)
    out = tmp_path / "none.html"
    with pytest.raises(UnknownJobError, match="no-such-job"):
        render_report(archive, "no-such-job", out)
    with pytest.raises(UnknownJobError, match="no incident"):
        render_report(archive, JOB, out, incident="inc-nothing")
    assert not out.exists()
    monkeypatch.setattr(
        pipeline.services.archive, "open_backend", lambda _settings: _Borrowed(archive)
    )
    argv = ["stepguard", "report", "--job", "no-such-job", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code not in (0, None)
    said = capsys.readouterr()
    lines = [line for line in said.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "no-such-job" in lines[0], said.err
    assert "Traceback" not in said.err and not out.exists()


class _Borrowed:
    """The test's archive handed to the CLI, which must not close the shared session."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def close(self) -> None:
        pass


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if IN_CI:
            pytest.fail("CI=true but chromium is not installed; .ci/run installs it")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return found


def _headless(chromium: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}  # its profile and crash dumps stay in tmp
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={home / 'profile'}",
         "--virtual-time-budget=10000", *args],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip


def test_the_report_renders_in_headless_chromium(archive, tmp_path):
    chromium = _chromium()
    _archive_job(archive)
    out = tmp_path / "report.html"
    render_report(archive, JOB, out)
    shot = tmp_path / "report.png"
    done = _headless(chromium, f"--screenshot={shot}", "--window-size=1200,4000",
                     out.as_uri(), home=tmp_path)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000, done.stderr[-2000:]
    import matplotlib.image as mpimg

    pixels = mpimg.imread(shot)
    assert pixels.std() > 0.05  # not a blank page
    # every inline image decoded: a copy that reports each image's natural size
    probe = tmp_path / "probe.html"
    probe.write_text(
        out.read_text() + "<script>addEventListener('load', () => { for (const i of "
        "document.images) i.setAttribute('data-width', String(i.naturalWidth)); });</script>"
    )
    dom = _headless(chromium, "--dump-dom", probe.as_uri(), home=tmp_path)
    widths = [int(w) for w in re.findall(r'data-width="(\d+)"', dom.stdout)]
    assert len(widths) == 4 and min(widths) > 300, (widths, dom.stderr[-2000:])
