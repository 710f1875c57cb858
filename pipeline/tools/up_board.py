"""What ``stepguard up`` shows while it runs: each service's metrics scraped from its
endpoint (:class:`MetricsBoard`) and the live status table."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from pipeline.tools.supervisor import ServiceState, Supervisor


@dataclass
class ServiceMetrics:
    records: float | None = None  # counter
    records_per_s: float | None = None
    lag: float | None = None
    alerts: float | None = None
    commands: float | None = None
    at: float = 0.0


#: what each column sums, over whichever of these a service serves (pipeline/io/metrics.py)
_SUMS = {
    "records": (
        "stepguard_worker_records_total", "stepguard_actuator_inputs_total",
        "stepguard_executor_consumed_total", "stepguard_archiver_messages_total",
        "stepguard_alertmanager_inputs_total",
    ),
    "lag": ("stepguard_worker_consumer_lag", "stepguard_archiver_consumer_lag"),
    "alerts": ("stepguard_worker_alerts_total", "stepguard_actuator_alerts_total"),
    "commands": ("stepguard_actuator_commands_total", "stepguard_executor_commands_total"),
}  # fmt: skip


def parse_metrics(text: str) -> dict[str, float]:
    """Sums of the samples the table shows, from a Prometheus text exposition.

    >>> parse_metrics('a 1\\nstepguard_worker_records_total{topic="s"} 5.0\\n'
    ...               'stepguard_worker_records_total{topic="h"} 2\\n')
    {'records': 7.0}
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, names in _SUMS.items():
            if name in names:
                with contextlib.suppress(ValueError):
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape(port: int, timeout: float = 0.5) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
            return parse_metrics(r.read().decode(errors="replace"))
    except OSError:
        return None


class MetricsBoard:
    """The latest scrape of every service that has a metrics port (rates between
    scrapes), refreshed every ``every_s`` in a background thread."""

    def __init__(self, ports: Mapping[str, int], every_s: float = 2.0) -> None:
        self.ports = dict(ports)
        self.every_s = every_s
        self.latest: dict[str, ServiceMetrics] = {n: ServiceMetrics() for n in ports}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="up-metrics", daemon=True)

    def start(self) -> MetricsBoard:
        if self.ports:
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for name, port in self.ports.items():
                self.update(name, scrape(port), time.monotonic())

    def update(self, name: str, values: dict[str, float] | None, now: float) -> None:
        prev = self.latest.get(name, ServiceMetrics())
        if values is None:
            self.latest[name] = ServiceMetrics(at=now)
            return
        cur = ServiceMetrics(
            records=values.get("records"), lag=values.get("lag"), alerts=values.get("alerts"),
            commands=values.get("commands"), at=now,
        )  # fmt: skip
        if prev.records is not None and cur.records is not None and now > prev.at:
            cur.records_per_s = max(0.0, (cur.records - prev.records) / (now - prev.at))
        self.latest[name] = cur


def _fmt_uptime(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "" if v is None else fmt.format(v)


_STATE_STYLE = {
    ServiceState.RUNNING: "green",
    ServiceState.STARTING: "yellow",
    ServiceState.BACKOFF: "red",
    ServiceState.FAILED: "bold red",
    ServiceState.DONE: "dim",
}


def status_table(sup: Supervisor, board: MetricsBoard, now: float, title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False, pad_edge=False)
    for col in ("service", "state", "pid", "rst", "uptime"):
        table.add_column(col, no_wrap=True)
    for col in ("rec/s", "lag", "alerts", "cmd"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, s in sup.services.items():
        m = board.latest.get(name, ServiceMetrics())
        state = s.state.value
        if s.state is ServiceState.BACKOFF and s.restart_at is not None:
            state = f"restart in {max(0.0, s.restart_at - now):.0f}s"
        elif s.state in (ServiceState.FAILED, ServiceState.DONE) and s.last_exit:
            state = f"{state} ({s.last_exit})"
        table.add_row(
            name, Text(state, style=_STATE_STYLE.get(s.state, "")), str(s.pid or ""),
            str(s.restarts), _fmt_uptime(s.uptime(now)) if s.pid else "",
            _num(m.records_per_s), _num(m.lag), _num(m.alerts), _num(m.commands),
        )  # fmt: skip
    return table
