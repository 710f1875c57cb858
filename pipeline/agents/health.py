"""``stepguard export-health``: GPU health through NVML (``nvidia-ml-py``).

:class:`NvmlReader` reads, per GPU, temperature, power, SM clock, utilisation, ECC
counters (volatile: since the driver loaded), XID events (critical-error events
registered on every GPU, drained without waiting), clock throttle reasons, NVLink
error counters (replay, recovery, CRC) and link states, the PCIe link's current and
maximum generation and width, and row remapping (pending, failed), and builds one
NodeHealth per interval. The NVML module is injected (``nvml=``), so tests run against
a fake; every counter a GPU does not support counts as zero, every link reading it
does not support as unknown. Without an NVIDIA driver the command exits 3 with a clear
message.

NVLink links down: NVML tells which links are active, not how many a GPU should
have (a PCIe card may have none, a bridged pair a few, an SXM board all of them). A
GPU's links down are the most links any GPU of this node has had active since the
reader started, minus its own active links now.

``--from-dcgm URL`` reads the same report from a running dcgm-exporter instead
(:mod:`pipeline.agents.dcgm`). A report dated more than
``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond the exporter's clock is not published (counted,
one warning per interval; :class:`~pipeline.io.clockskew.FutureGate`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from pipeline.io.clockskew import FutureGate
from pipeline.io.errors import StepguardError
from pipeline.io.settings import Settings
from schemas import GpuHealth, NodeHealth, encode

__all__ = ["NvmlReader", "NvmlUnavailable", "run_health_exporter"]

log = logging.getLogger(__name__)

#: Throttle-reason bits -> names (NVML ``nvmlClocksEventReason*``).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: NVLink error counters summed into ``nvlink_errors``: DL replay, recovery, CRC FLIT.
NVLINK_COUNTERS = (0, 1, 2)
#: NVLink CRC counters (``nvmlNvLinkErrorCounter_t``): DL CRC FLIT, DL CRC DATA.
NVLINK_CRC_COUNTERS = (2, 3)
NVLINK_REPLAY_COUNTER = 0


class NvmlUnavailable(StepguardError):
    """NVML cannot be used here (no driver, no GPU, library missing)."""


def _load_nvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise NvmlUnavailable("nvidia-ml-py is not installed") from exc
    return pynvml


class NvmlReader:
    """Read NodeHealth from NVML. Use as a context manager (shuts NVML down)."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nv = nvml if nvml is not None else _load_nvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML is not available (no NVIDIA driver or GPU on this machine?): {exc}"
            ) from exc
        try:
            count = nv.nvmlDeviceGetCount()
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nv.NVMLError as exc:
            nv.nvmlShutdown()
            raise NvmlUnavailable(f"NVML cannot list GPUs: {exc}") from exc
        self._events: Any = None
        self._handle_index: dict[Any, int] = {}
        self._links_up_max = 0  #: most NVLink links active on one GPU since the start
        with contextlib.suppress(nv.NVMLError):
            self._events = nv.nvmlEventSetCreate()
            for i, h in enumerate(self.handles):
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
                    self._handle_index[_hkey(h)] = i

    def _call(self, default: Any, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except (self.nvml.NVMLError, AttributeError):
            return default

    def _xids(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        nv = self.nvml
        for _ in range(1000):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # timeout: no more events
                break
            idx = self._handle_index.get(_hkey(data.device), 0)
            out.setdefault(idx, []).append(int(data.eventData))
        return out

    def _nvlink(self, h: Any) -> tuple[int, int, int, int]:
        """``(errors, crc, replay, active links)`` of one GPU; links whose counters
        are not supported are left out."""
        nv = self.nvml
        errors = crc = replay = active = 0
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0)):
            state = self._call(None, "nvmlDeviceGetNvLinkState", h, link)
            if state:
                active += 1
            try:
                counts = {c: int(nv.nvmlDeviceGetNvLinkErrorCounter(h, link, c)) for c in (0, 1, 2)}
            except (nv.NVMLError, AttributeError):
                continue
            errors += sum(counts[c] for c in NVLINK_COUNTERS)
            replay += counts[NVLINK_REPLAY_COUNTER]
            flit, data = NVLINK_CRC_COUNTERS
            crc += counts[flit] + max(
                0, int(self._call(0, "nvmlDeviceGetNvLinkErrorCounter", h, link, data))
            )
        return max(0, errors), max(0, crc), max(0, replay), active

    def _pcie(self, h: Any) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for field, fn in (
            ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            value = self._call(None, fn, h)
            top = 16 if "gen" in field else 64
            out[field] = int(value) if value is not None and 0 <= int(value) <= top else None
        return out

    def _remap(self, h: Any) -> tuple[bool, bool]:
        """``(pending, failed)`` from ``nvmlDeviceGetRemappedRows`` (False: unsupported)."""
        rows = self._call(None, "nvmlDeviceGetRemappedRows", h)
        if not rows or len(rows) < 4:
            return False, False
        return bool(rows[2]), bool(rows[3])

    def read(self, node: str, job_id: str | None = None, interval_s: float = 10.0) -> NodeHealth:
        nv = self.nvml
        xids = self._xids()
        gpus = []
        links = [self._nvlink(h) for h in self.handles]
        self._links_up_max = max([self._links_up_max, *(a for *_, a in links)])
        for i, h in enumerate(self.handles):
            reasons_fn = (
                "nvmlDeviceGetCurrentClocksEventReasons"
                if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons"
            )
            mask = int(self._call(0, reasons_fn, h))
            util = self._call(None, "nvmlDeviceGetUtilizationRates", h)
            nvlink, crc, replay, active = links[i]
            pending, failed = self._remap(h)
            gpus.append(
                GpuHealth(
                    index=i,
                    temperature_c=min(
                        200.0,
                        max(
                            -50.0,
                            float(
                                self._call(
                                    0, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU
                                )
                            ),
                        ),
                    ),
                    power_w=max(0.0, float(self._call(0, "nvmlDeviceGetPowerUsage", h)) / 1000),
                    sm_clock_mhz=max(
                        0.0, float(self._call(0, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM))
                    ),
                    utilization_pct=min(100.0, max(0.0, float(util.gpu) if util else 0.0)),
                    ecc_corrected=max(
                        0,
                        int(
                            self._call(
                                0,
                                "nvmlDeviceGetTotalEccErrors",
                                h,
                                nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                nv.NVML_VOLATILE_ECC,
                            )
                        ),
                    ),
                    ecc_uncorrected=max(
                        0,
                        int(
                            self._call(
                                0,
                                "nvmlDeviceGetTotalEccErrors",
                                h,
                                nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                nv.NVML_VOLATILE_ECC,
                            )
                        ),
                    ),
                    xid_codes=tuple(xids.get(i, ())),
                    throttle_reasons=tuple(
                        name for bit, name in THROTTLE_REASONS.items() if mask & bit
                    ),
                    nvlink_errors=nvlink,
                    nvlink_crc_errors=crc,
                    nvlink_replay_errors=replay,
                    nvlink_links_down=min(64, self._links_up_max - active),
                    remap_pending=pending,
                    remap_failed=failed,
                    **self._pcie(h),
                )
            )
        return NodeHealth(
            job_id=job_id,
            node=node,
            ts=datetime.now(UTC),
            interval_s=interval_s,
            gpus=tuple(gpus),
        )

    def close(self) -> None:
        nv = self.nvml
        if self._events is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()

    def __enter__(self) -> NvmlReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hkey(handle: Any) -> Any:
    """A hashable identity for an NVML handle (ctypes pointers compare by address)."""
    value = getattr(handle, "value", None)
    if value is not None:
        return value
    try:
        hash(handle)
    except TypeError:
        return id(handle)
    return handle


def run_health_exporter(
    settings: Settings,
    *,
    node: str | None = None,
    job_id: str | None = None,
    interval_s: float = 10.0,
    once: bool = False,
    dry_run: bool = False,
    nvml: Any = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """Publish a report every ``interval_s``; returns the exit code (3: no NVML).

    ``clock`` is the wall clock reports are checked against (tests move it)."""

    node = node or socket.gethostname()
    try:
        reader = NvmlReader(nvml)
    except NvmlUnavailable as exc:
        print(f"stepguard export-health: {exc}", file=sys.stderr)
        return 3
    with reader:
        publish_reports(
            settings, lambda: [reader.read(node, job_id, interval_s)], name="export-health",
            interval_s=interval_s, once=once, dry_run=dry_run, clock=clock,
        )  # fmt: skip
    return 0


def publish_reports(
    settings: Settings,
    read: Callable[[], Iterable[NodeHealth]],
    *,
    name: str,
    interval_s: float,
    once: bool,
    dry_run: bool,
    clock: Callable[[], float],
) -> None:
    """Publish what ``read`` returns every ``interval_s`` until SIGTERM or Ctrl-C
    (one round with ``once``); ``dry_run`` prints the JSON instead.

    A report dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond ``clock`` is not
    published (counted, one warning per interval); what was not published is said on
    stderr at the end. Both health exporters (NVML and DCGM) run through here.
    """
    from pipeline.client.sink import KafkaSink

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    sink = None if dry_run else KafkaSink(settings)
    future = FutureGate(settings.max_clock_skew_s, name, clock=clock)
    try:
        while not stop.is_set():
            for report in read():
                if not future.admit(report.ts):
                    continue  # counted and logged; the next report may be fine
                if sink is None:
                    print(encode(report).decode(), flush=True)
                else:
                    sink.send("health", report)
            if once:
                break
            stop.wait(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        if future.dropped:
            print(f"stepguard {name}: {future.dropped} reports dated in the future "
                  "not published", file=sys.stderr)  # fmt: skip
        if sink is not None:
            sink.flush(10.0)
            sink.close()
            if sink.stats.dropped:
                print(f"stepguard {name}: {sink.stats.dropped} reports dropped",
                      file=sys.stderr)  # fmt: skip
