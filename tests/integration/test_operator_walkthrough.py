"""Issue 41's acceptance walkthrough: an operator's session, scripted (pexpect, a
terminal as a person has), against real services.

`stepguard up --mode approve --scenario ci_smoke` on the embedded broker (a simulated
job with a straggler on node-0005), then in another "shell" with up.env: `alerts`,
`pending`, `approve` with a key the services do not trust and with one they do,
`status`, `report`, a broker restart under `alerts --follow` (up's broker stopped, up
restarts it: one line when it is lost, one when it is back, alerts resume; Ctrl-C ends
the follower) and Ctrl-C on `up`. Each step asserts what the operator reads. Every wait
is a bounded poll of a command's own output or an expect with a deadline.
"""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.settings import load_settings
from pipeline.io.trust import SigningKey, sign
from tests.integration.test_cli_errors import _alert, _publish

pexpect = pytest.importorskip("pexpect", reason="pip install 'stepguard[dev]' (pexpect)")

pytestmark = pytest.mark.integration

STEPGUARD = str(Path(sys.executable).parent / "stepguard")
STRAGGLER = "node-0005"


class Session:
    """`up` in a terminal, and the operator's commands in another."""

    def __init__(self, tmp: Path, operator: SigningKey) -> None:
        self.tmp = tmp
        self.state = tmp / ".stepguard"
        # the workers' key is given to up (it trusts a configured key as its own), so
        # that the test can speak as a worker after the broker restart
        self.worker = SigningKey.generate("walkthrough-worker")
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
        env |= {
            "STEPGUARD_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
            "STEPGUARD_CONSUMER_GROUP": f"g{uuid.uuid4().hex[:10]}",
            "STEPGUARD_WORKER_TICK_INTERVAL_S": "0.5",
            # the services trust this operator (and the operator's shell gets the list
            # back in up.env)
            "STEPGUARD_OPERATOR_PUBLIC_KEYS": operator.public_text(),
            "COLUMNS": "200",
        }
        self.base = env
        env = env | {"STEPGUARD_WORKER_PRIVATE_KEY": self.worker.private_text()}
        argv = ["up", "--mode", "approve", "--scenario", "ci_smoke", "--workers", "1",
                "--speed", "4"]  # fmt: skip
        self.up = pexpect.spawn(STEPGUARD, argv, cwd=str(tmp), env=env, encoding="utf-8",
                                timeout=240, dimensions=(50, 200))  # fmt: skip
        # what the operator's terminal shows, read as it comes (a terminal nobody reads
        # fills up and blocks `up`), without its colours and cursor moves
        self.screen = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                self.screen += plain(self.up.read_nonblocking(65536, timeout=1))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return

    def wait_screen(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` on `up`'s terminal (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.screen)
            if found:
                return found
            self._reader.join(0.2)  # reading the terminal, bounded
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {pattern!r}\n{self.tail()}")

    def shell(self, operator: SigningKey) -> dict[str, str]:
        """The operator's shell: `set -a; . up.env` and their own private key."""
        env = dict(self.base)
        for line in (self.state / "up.env").read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                env[key] = value
        return env | {"STEPGUARD_OPERATOR_PRIVATE_KEY": operator.private_text()}

    def spawn(self, env: dict[str, str], *args: str, timeout: float = 120) -> Any:
        """One command in a terminal of its own (a pexpect child)."""
        return pexpect.spawn(STEPGUARD, list(args), cwd=str(self.tmp), env=env,
                             encoding="utf-8", timeout=timeout, dimensions=(50, 200))  # fmt: skip

    def run(self, env: dict[str, str], *args: str, timeout: float = 120) -> tuple[int, str]:
        """One command in a terminal: its exit status and what it printed (one line per
        line, however the terminal wrapped it)."""
        cmd = self.spawn(env, *args, timeout=timeout)
        out = cmd.read()  # to its end (bounded by ``timeout``)
        cmd.close()
        return int(cmd.exitstatus if cmd.exitstatus is not None else -1), plain(out)

    def until(
        self, check: Callable[[], Any], timeout: float, what: str
    ) -> Any:  # a bounded poll of a command's output
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            assert self.up.isalive(), self.tail()
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{self.tail()}")

    def status(self) -> dict[str, Any] | None:
        """up.json, once written (polled, bounded by the caller)."""
        try:
            return json.loads((self.state / "up.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            time.sleep(0.2)  # polling up.json, bounded
            return None

    def tail(self) -> str:
        text = self.screen[-3000:]
        for log in sorted((self.state / "logs").glob("*.log")):
            text += f"\n== {log.name}\n{log.read_text(errors='replace')[-1500:]}"
        return text

    def close(self) -> None:
        if self.up.isalive():
            self.up.terminate(force=True)
        self._reader.join(10)


@pytest.fixture
def operator() -> SigningKey:
    return SigningKey.generate("op-alice")


@pytest.fixture
def session(tmp_path: Path, operator: SigningKey) -> Iterator[Session]:
    s = Session(tmp_path, operator)
    yield s
    s.close()


def plain(text: str) -> str:
    """Terminal output as a person reads it: no colour or cursor codes, one newline."""
    return _ANSI.sub("", text).replace("\r\n", "\n")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def words(text: str) -> str:
    return " ".join(text.split())


def test_an_operator_session_reads_the_truth_at_every_step(session, operator):
    up = session.up
    # `up` says where the other shell's settings are
    session.wait_screen(r"another shell: set -a; \. \S+up\.env", 120)
    doc = session.until(session.status, 60, "up.json")
    job = doc["job_id"]
    shell = session.shell(operator)

    # alerts: the straggler, by node and kind
    def straggler() -> str | None:
        code, out = session.run(shell, "alerts", "--job", job)
        assert code == 0, out
        return out if STRAGGLER in out and "straggler" in out else None

    said = session.until(straggler, 240, f"a straggler alert on {STRAGGLER}")
    assert job in said

    # pending: the held action, and the mode the running actuator reports
    def held() -> str | None:
        code, out = session.run(shell, "pending")
        assert code == 0, out
        return out if "1 action(s)" in out else None

    listed = words(session.until(held, 180, "a held action"))
    assert "actuator mode approve" in listed and "reported by the actuator" in listed, listed
    (action,) = set(re.findall(r"act-[0-9a-f]{24}", listed))

    # approve with a key the services do not trust: refused before anything is sent
    stranger = shell | {
        "STEPGUARD_OPERATOR_PRIVATE_KEY": SigningKey.generate("op-mallory").private_text()
    }
    code, out = session.run(stranger, "approve", action)
    out = words(out)
    assert code == 1, out
    assert "refused before sending" in out and "'op-mallory'" in out, out
    assert "nothing was sent" in out and f"approved {action}" not in out, out

    # approve with the trusted key: the actuator's answer, with the commands it issued
    code, out = session.run(shell, "approve", action)
    out = words(out)
    assert code == 0, out
    assert f"approved {action} by {getpass.getuser()}: issued cmd-" in out, out
    code, out = session.run(shell, "pending")
    assert code == 0 and "0 action(s)" in out, out

    # status: the stack and the job
    code, out = session.run(shell, "status")
    assert code == 0, out
    assert job in out, out

    # report: one HTML file for the job, from the archive the stack writes
    code, out = session.run(shell, "report", "--job", job, "--out", "report.html")
    assert code == 0, out
    html = (session.tmp / "report.html").read_text()
    assert job in html

    # a broker restart under `alerts --follow`: the history first, one line when the
    # broker is lost, one when it is back, then the alerts resume; Ctrl-C ends it
    follow_broker_restart(session, shell, job)

    # Ctrl-C: the stack stops cleanly, and says its broker was restarted once
    up.sendintr()
    stopped = session.wait_screen(r"up: stopped; [^\n]*", 120).group(0)
    assert "broker 1" in stopped, stopped
    session._reader.join(60)  # to the end of its output
    up.close()
    assert up.exitstatus == 0, session.tail()
    final = json.loads((session.state / "up.json").read_text())
    assert all(s["pid"] is None for s in final["services"].values()), final


def follow_broker_restart(session: Session, shell: dict[str, str], job: str) -> None:
    """`alerts --follow --job JOB` while up's broker (memory only) is stopped and up
    restarts it (and its topics): what the follower's terminal shows, step by step."""
    follower = session.spawn(shell, "alerts", "--follow", "--job", job, timeout=120)
    read = io.StringIO()
    follower.logfile_read = read
    try:
        follower.expect(rf"{STRAGGLER}/r\d+ straggler: ")  # the job's alerts so far
        broker = session.until(session.status, 60, "up.json")["services"]["broker"]
        os.kill(broker["pid"], signal.SIGTERM)  # the broker goes away (as a crash would)
        follower.expect(r"stepguard alerts: broker lost \([^\n]*\); reconnecting every second "
                        r"\(Ctrl-C stops\)", timeout=60)  # fmt: skip
        bootstrap = shell["STEPGUARD_KAFKA_BOOTSTRAP"]
        follower.expect(rf"stepguard alerts: reconnected to the broker at {re.escape(bootstrap)}",
                        timeout=180)  # fmt: skip
        restarted = session.until(
            lambda: (d := session.status()) and d["services"]["broker"]["restarts"] >= 1,
            60, "up's broker restarted",
        )  # fmt: skip
        assert restarted
        # a worker's alert after the restart (the played job is over): it is shown
        fp = f"fp-after-restart-{uuid.uuid4().hex[:6]}"
        after = _alert(fp).model_copy(update={"job_id": job, "node": STRAGGLER})
        _publish(load_settings(shell), sign(after, session.worker))
        follower.expect(rf"{STRAGGLER}/r5 straggler: node-3 slow")
        follower.sendintr()
        follower.expect(pexpect.EOF, timeout=60)
    finally:
        follower.close(force=True)
    assert follower.exitstatus in (0, 130), read.getvalue()[-3000:]
    text = plain(read.getvalue())
    assert "Traceback" not in text and " WARNING " not in text and " ERROR " not in text, text
    # one notice each way, not a line per retry; a signed alert carries no mark
    assert text.count("broker lost") == 1 and text.count("reconnected to the broker") == 1, text
    assert "UNSIGNED" not in text and "BAD SIGNATURE" not in text, text
