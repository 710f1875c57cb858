"""``stepguard export-health --from-dcgm URL``: NodeHealth from a running dcgm-exporter.

Many clusters already run NVIDIA's dcgm-exporter on every GPU node and will not
deploy a second GPU agent. :class:`DcgmScraper` fetches its Prometheus text exposition
(``http://node:9400/metrics``), parses it with ``prometheus_client``'s text parser,
maps every series to a node (label ``Hostname``, else the ``--node`` given) and a GPU
(label ``gpu``), and builds one :class:`~schemas.NodeHealth` per node and scrape.

=============================================== =====================================
dcgm-exporter series                            NodeHealth field (per GPU)
=============================================== =====================================
``DCGM_FI_DEV_GPU_TEMP``                        ``temperature_c``
``DCGM_FI_DEV_POWER_USAGE``                     ``power_w``
``DCGM_FI_DEV_SM_CLOCK``                        ``sm_clock_mhz``
``DCGM_FI_DEV_GPU_UTIL``                        ``utilization_pct`` (else 100 x
                                                ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``)
``DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`` / ``_DBE_``   ``ecc_corrected`` / ``ecc_uncorrected``
``DCGM_FI_DEV_XID_ERRORS``                      ``xid_codes``: the last XID, reported
                                                when it changes between scrapes
``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (or      ``throttle_reasons`` (NVML bits)
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``)
``DCGM_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,        ``nvlink_crc_errors``,
REPLAY,RECOVERY}_ERROR_COUNT_TOTAL``            ``nvlink_replay_errors``,
                                                ``nvlink_errors`` (replay + recovery
                                                + CRC flit, as the NVML reader)
``DCGM_FI_DEV_NVLINK_LINK_STATUS`` (per link,   ``nvlink_links_down``: links whose
label ``link`` or ``nvlink``)                   state is Down (2)
``DCGM_FI_DEV_PCIE_LINK_{GEN,WIDTH}``,          ``pcie_gen``, ``pcie_width``,
``DCGM_FI_DEV_PCIE_MAX_LINK_{GEN,WIDTH}``       ``pcie_gen_max``, ``pcie_width_max``
``DCGM_FI_DEV_ROW_REMAP_PENDING`` / ``_FAILURE`` ``remap_pending`` / ``remap_failed``
=============================================== =====================================

The other default counters (memory clock and temperature, energy, PCIe throughput
and replays, framebuffer, encoder/decoder, remapped-row counts, NVLink bandwidth, the
``DCGM_FI_PROF_*`` activity ratios) are known and not needed; any other series is
counted as unknown and ignored, so a newer dcgm-exporter never breaks the scrape. A
value DCGM marks blank (its sentinels of 1.4e14 and up) or a non-finite one is
treated as missing. A GPU whose temperature, power, SM clock or utilisation is
missing is left out of its node's report (logged once): a made-up zero would read as
a cold, idle GPU. Counters that are missing count as zero, as in the NVML reader.

XIDs: dcgm-exporter shows only the last XID a GPU raised. A change of that value is
a new XID; the value at the first scrape predates the scraper and is not reported;
the same XID twice in a row cannot be seen (a limit of the gauge).

Examples
--------
>>> text = '''
... DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="n7"} 61
... DCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="n7"} 612.5
... DCGM_FI_DEV_SM_CLOCK{gpu="0",Hostname="n7"} 1980
... DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n7"} 99
... DCGM_FI_DEV_PCIE_LINK_WIDTH{gpu="0",Hostname="n7"} 8
... DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH{gpu="0",Hostname="n7"} 16
... DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",Hostname="n7"} 4
... DCGM_FI_DEV_SOMETHING_NEW{gpu="0",Hostname="n7"} 1
... '''
>>> scraper = DcgmScraper("http://127.0.0.1:9400/metrics", node="fallback")
>>> (report,) = scraper.reports_from(text, interval_s=10.0)
>>> g = report.gpus[0]
>>> report.node, g.power_w, g.pcie_width, g.pcie_width_max, g.throttle_reasons
('n7', 612.5, 8, 16, ('sw_power_cap',))
>>> sorted(scraper.stats.unknown)
['DCGM_FI_DEV_SOMETHING_NEW']
"""

from __future__ import annotations

import logging
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pipeline.agents.health import THROTTLE_REASONS, publish_reports
from pipeline.io.errors import StepguardError
from pipeline.io.settings import Settings
from schemas import GpuHealth, NodeHealth

__all__ = ["DCGM_FIELDS", "DcgmError", "DcgmScraper", "ScrapeStats", "run_dcgm_exporter"]

log = logging.getLogger(__name__)

#: dcgm-exporter series -> the reading it fills (see the module docstring).
DCGM_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_pct",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_corrected",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "nvl_crc_flit",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "nvl_crc_data",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvl_replay",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvl_recovery",
    "DCGM_FI_DEV_NVLINK_LINK_STATUS": "link_state",
    "DCGM_FI_DEV_NVLINK_GET_STATE": "link_state",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "pcie_gen",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": "pcie_gen_max",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "pcie_width",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": "pcie_width_max",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remap_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remap_failed",
}
#: dcgm-exporter series known and not needed (its default counters, DCP ratios).
DCGM_IGNORED: frozenset[str] = frozenset(
    {
        "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
    }
)  # fmt: skip
_REQUIRED = ("temperature_c", "power_w", "sm_clock_mhz", "utilization_pct")
#: DCGM's blank values (DCGM_FP64_BLANK = 2**47 and the INT64 sentinels above it).
_BLANK_FROM = 140737488355328.0
_LINK_DOWN = 2  #: dcgmNvLinkLinkState_t: 0 not supported, 1 disabled, 2 down, 3 up
_MAX_BYTES = 16 << 20  #: an exposition larger than this is refused
_MAX_GPUS = 64  #: GPU indices beyond this are not a GPU of one node
_MAX_NODES = 4096  #: nodes one exposition may name
_MAX_UNKNOWN = 256  #: distinct unknown names remembered


class DcgmError(StepguardError):
    """A scrape failed: the exporter cannot be reached or its answer cannot be read."""


@dataclass
class ScrapeStats:
    """What the scraper has seen (bounded)."""

    scrapes: int = 0
    failures: int = 0
    unknown: set[str] = field(default_factory=set)  #: series names not understood
    left_out: set[tuple[str, int, str]] = field(default_factory=set)  #: (node, gpu, missing)


def _fetch_url(url: str, timeout_s: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (scheme checked)
            body = resp.read(_MAX_BYTES + 1)
    except (urllib.error.URLError, OSError) as exc:
        raise DcgmError(f"cannot scrape {url}: {exc}") from exc
    if len(body) > _MAX_BYTES:
        raise DcgmError(f"{url}: exposition larger than {_MAX_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


class DcgmScraper:
    """Scrape a dcgm-exporter and build NodeHealth reports.

    Parameters
    ----------
    url
        The exporter's metrics URL (``http://`` or ``https://``).
    node
        Node name for series without a ``Hostname`` label.
    job_id
        The job running on the node(s), if known.
    timeout_s
        Seconds one scrape may take.
    fetch
        ``fetch(url, timeout_s) -> text``; the default uses ``urllib``.
    """

    def __init__(
        self,
        url: str,
        *,
        node: str,
        job_id: str | None = None,
        timeout_s: float = 5.0,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not node:
            raise ValueError("node must not be empty")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.url = url
        self.node = node
        self.job_id = job_id
        self.timeout_s = timeout_s
        self._fetch = fetch or _fetch_url
        self._last_xid: dict[tuple[str, int], int] = {}
        self.stats = ScrapeStats()

    def read(self, interval_s: float = 10.0) -> list[NodeHealth]:
        """Scrape once; one report per node seen. Raises :class:`DcgmError`."""
        try:
            text = self._fetch(self.url, self.timeout_s)
            reports = self.reports_from(text, interval_s)
        except DcgmError:
            self.stats.failures += 1
            raise
        self.stats.scrapes += 1
        return reports

    def reports_from(self, text: str, interval_s: float = 10.0) -> list[NodeHealth]:
        """The reports of one exposition (updates the XID memory)."""
        readings = self._parse(text)
        ts = datetime.now(UTC)
        out = []
        for node in sorted(readings):
            gpus = [
                g
                for index in sorted(readings[node])
                if (g := self._gpu(node, index, readings[node][index])) is not None
            ]
            out.append(
                NodeHealth(
                    job_id=self.job_id, node=node, ts=ts, interval_s=interval_s, gpus=tuple(gpus)
                )
            )
        return out

    def _parse(self, text: str) -> dict[str, dict[int, dict[str, Any]]]:
        readings: dict[str, dict[int, dict[str, Any]]] = {}
        try:
            families = list(text_string_to_metric_families(text))
        except (ValueError, TypeError, IndexError) as exc:
            raise DcgmError(f"{self.url}: not a Prometheus text exposition: {exc}") from exc
        for family in families:
            for sample in family.samples:
                name = sample.name
                if family.type == "counter" and name == family.name + "_total":
                    name = family.name  # the parser adds "_total" to counters without it
                key = DCGM_FIELDS.get(name)
                if key is None:
                    if name not in DCGM_IGNORED and len(self.stats.unknown) < _MAX_UNKNOWN:
                        if name not in self.stats.unknown:
                            log.info("dcgm: ignoring unknown series %s", name)
                        self.stats.unknown.add(name)
                    continue
                value = float(sample.value)
                if not math.isfinite(value) or abs(value) >= _BLANK_FROM:
                    continue
                labels = sample.labels
                try:
                    index = int(labels.get("gpu", ""))
                except ValueError:
                    continue
                if not 0 <= index < _MAX_GPUS:
                    continue
                node = (labels.get("Hostname") or self.node)[:256]
                if node not in readings and len(readings) >= _MAX_NODES:
                    continue
                gpu = readings.setdefault(node, {}).setdefault(index, {})
                if key == "link_state":
                    gpu["links_down"] = gpu.get("links_down", 0) + (int(value) == _LINK_DOWN)
                else:
                    gpu[key] = value
        return readings

    def _gpu(self, node: str, index: int, r: dict[str, Any]) -> GpuHealth | None:
        if "utilization_pct" not in r and "gr_engine_active" in r:
            r["utilization_pct"] = 100.0 * r["gr_engine_active"]
        missing = [k for k in _REQUIRED if k not in r]
        if missing:
            key = (node, index, ",".join(missing))
            if key not in self.stats.left_out and len(self.stats.left_out) < _MAX_UNKNOWN:
                log.warning("dcgm: %s GPU %d left out: no %s", node, index, key[2])
                self.stats.left_out.add(key)
            return None

        def count(k: str) -> int:
            return max(0, int(r.get(k, 0)))

        def small(k: str, top: int) -> int | None:
            v = r.get(k)
            return int(v) if v is not None and 0 <= v <= top else None

        xids: tuple[int, ...] = ()
        if "xid" in r:
            xid = max(0, int(r["xid"]))
            last = self._last_xid.get((node, index))
            if last is not None and xid != last and xid > 0:
                xids = (xid,)
            if last is not None or len(self._last_xid) < _MAX_NODES * _MAX_GPUS:
                self._last_xid[(node, index)] = xid
        mask = count("throttle")
        crc_flit = count("nvl_crc_flit")
        return GpuHealth(
            index=index,
            temperature_c=min(200.0, max(-50.0, r["temperature_c"])),
            power_w=max(0.0, r["power_w"]),
            sm_clock_mhz=max(0.0, r["sm_clock_mhz"]),
            utilization_pct=min(100.0, max(0.0, r["utilization_pct"])),
            ecc_corrected=count("ecc_corrected"),
            ecc_uncorrected=count("ecc_uncorrected"),
            xid_codes=xids,
            throttle_reasons=tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit),
            nvlink_errors=count("nvl_replay") + count("nvl_recovery") + crc_flit,
            nvlink_crc_errors=crc_flit + count("nvl_crc_data"),
            nvlink_replay_errors=count("nvl_replay"),
            nvlink_links_down=min(64, count("links_down")),
            pcie_gen=small("pcie_gen", 16),
            pcie_gen_max=small("pcie_gen_max", 16),
            pcie_width=small("pcie_width", 64),
            pcie_width_max=small("pcie_width_max", 64),
            remap_pending=count("remap_pending") > 0,
            remap_failed=count("remap_failed") > 0,
        )


def run_dcgm_exporter(
    settings: Settings,
    url: str,
    *,
    node: str,
    job_id: str | None = None,
    interval_s: float = 10.0,
    once: bool = False,
    dry_run: bool = False,
    fetch: Callable[[str, float], str] | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """Scrape every ``interval_s`` and publish the reports; returns the exit code.

    A report dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond ``clock`` is not
    published (counted, one warning per interval).

    A failed scrape is logged and the next one is tried (the worker notices a node
    whose health goes silent); with ``once`` it exits 4 with the reason.
    """

    try:
        scraper = DcgmScraper(
            url, node=node, job_id=job_id, timeout_s=min(10.0, interval_s), fetch=fetch
        )
    except ValueError as exc:
        print(f"stepguard export-health --from-dcgm: {exc}", file=sys.stderr)
        return 2
    code = 0

    def read() -> list[NodeHealth]:
        nonlocal code
        try:
            return scraper.read(interval_s)
        except DcgmError as exc:
            print(f"stepguard export-health --from-dcgm: {exc}", file=sys.stderr)
            if once:
                code = 4
            return []

    publish_reports(
        settings, read, name="export-health --from-dcgm", interval_s=interval_s,
        once=once, dry_run=dry_run, clock=clock,
    )  # fmt: skip
    return code
