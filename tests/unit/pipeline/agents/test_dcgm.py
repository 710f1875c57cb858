"""``stepguard export-health --from-dcgm``: a local HTTP server serves a realistic
dcgm-exporter exposition (default counters, DCP ratios, the commonly enabled ECC,
throttle, NVLink, PCIe and row-remap fields, Kubernetes labels, unknown and missing
series, DCGM blank values); the scraper turns it into NodeHealth."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.agents.dcgm import DcgmError, DcgmScraper, run_dcgm_exporter
from pipeline.io.settings import load_settings
from schemas import NodeHealth

LABELS = (
    'gpu="{g}",UUID="GPU-5f1c{g}a0e-9d2b-4c1e-8f77-3a9b0c{g}d1e2f",pci_bus_id="00000000:{g}8:00.0",'
    'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",'
    'DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="llm",pod="llm-0"'
)


def exposition(*, xid1=0, width1=16, remap1=0, link_down=False):
    """Two GPUs of gpu-node-07; GPU 2 lacks its temperature (left out)."""
    lines = []

    def metric(name, kind, helptext, values):
        lines.append(f"# HELP {name} {helptext}")
        lines.append(f"# TYPE {name} {kind}")
        for g, v in values.items():
            lines.append(f"{name}{{{LABELS.format(g=g)}}} {v}")

    metric(
        "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", {0: 1980, 1: 1410, 2: 1980}
    )
    metric(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        {0: 2619, 1: 2619, 2: 2619},
    )
    metric(
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        {0: 9223372036854775794, 1: 9223372036854775794, 2: 9223372036854775794},
    )
    metric("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", {0: 61, 1: 83})
    metric(
        "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", {0: 612.337, 1: 455.1, 2: 600.0}
    )
    metric(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        {0: 41857374929, 1: 41011234567, 2: 40000000000},
    )
    metric(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        {0: 0, 1: 3, 2: 0},
    )
    metric("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", {0: 100, 2: 99})
    metric(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        {0: 71234, 1: 71102, 2: 70000},
    )
    metric(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        {0: 0, 1: xid1, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        {0: 0, 1: 17, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        {0: 0, 1: 0, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons.",
        {0: 0, 1: 0x40 | 0x8, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        {0: 0, 1: 12, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        {0: 0, 1: 4, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        {0: 1, 1: 30, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        {0: 0, 1: 2, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        {0: 1e12, 1: 1e12, 2: 1e12},
    )
    metric(
        "DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation.", {0: 5, 1: 5, 2: 5}
    )
    metric(
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "PCIe max link generation.", {0: 5, 1: 5, 2: 5}
    )
    metric(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "PCIe current link width.",
        {0: 16, 1: width1, 2: 16},
    )
    metric(
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "PCIe max link width.", {0: 16, 1: 16, 2: 16}
    )
    metric(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        {0: 0, 1: remap1, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "gauge",
        "Whether remapping of rows is pending",
        {0: 0, 1: remap1, 2: 0},
    )
    metric(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        {0: 0, 1: 0, 2: 0},
    )
    metric(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        {0: 0.97, 1: 0.913, 2: 0.95},
    )
    metric(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        {0: 0.61, 1: 0.58, 2: 0.6},
    )
    metric(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active.",
        {0: 0.44, 1: 0.41, 2: 0.4},
    )
    metric(
        "DCGM_FI_DEV_FUTURE_FIELD", "gauge", "Something a newer exporter adds.", {0: 1, 1: 1, 2: 1}
    )
    lines.append("# HELP DCGM_FI_DEV_NVLINK_LINK_STATUS NVLink link state.")
    lines.append("# TYPE DCGM_FI_DEV_NVLINK_LINK_STATUS gauge")
    for g in (0, 1):
        for link in range(4):
            state = 2 if link_down and g == 1 and link == 3 else 3
            lines.append(
                f'DCGM_FI_DEV_NVLINK_LINK_STATUS{{{LABELS.format(g=g)},link="{link}"}} {state}'
            )
    lines.append("# HELP go_goroutines Number of goroutines that currently exist.")
    lines.append("# TYPE go_goroutines gauge")
    lines.append("go_goroutines 23")
    return "\n".join(lines) + "\n"


class Exporter:
    """A local HTTP server answering each GET with the next body of ``bodies``."""

    def __init__(self, bodies):
        self.bodies = list(bodies)
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.bodies[min(outer.requests, len(outer.bodies) - 1)].encode()
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_scrape_maps_series_to_node_and_gpus():
    with Exporter([exposition()]) as ex:
        scraper = DcgmScraper(ex.url, node="fallback", job_id="llm")
        (report,) = scraper.read(interval_s=15.0)
    assert isinstance(report, NodeHealth)
    assert (report.node, report.job_id, report.interval_s) == ("gpu-node-07", "llm", 15.0)
    assert [g.index for g in report.gpus] == [0, 1]  # GPU 2 has no temperature: left out
    g0, g1 = report.gpus
    assert (g0.temperature_c, g0.power_w, g0.sm_clock_mhz, g0.utilization_pct) == (
        61, 612.337, 1980, 100,
    )  # fmt: skip
    assert g1.utilization_pct == pytest.approx(91.3)  # no GPU_UTIL: DCP ratio x 100
    assert (g1.ecc_corrected, g1.ecc_uncorrected) == (17, 0)
    assert g1.throttle_reasons == ("hw_slowdown", "hw_thermal_slowdown")
    assert (g1.nvlink_crc_errors, g1.nvlink_replay_errors, g1.nvlink_errors) == (16, 30, 44)
    assert (g1.pcie_gen, g1.pcie_gen_max, g1.pcie_width, g1.pcie_width_max) == (5, 5, 16, 16)
    assert (g1.nvlink_links_down, g1.remap_pending, g1.remap_failed, g1.xid_codes) == (
        0, False, False, (),
    )  # fmt: skip
    assert scraper.stats.unknown == {"DCGM_FI_DEV_FUTURE_FIELD", "go_goroutines"}
    assert scraper.stats.left_out == {("gpu-node-07", 2, "temperature_c")}


def test_faults_show_up_between_scrapes_and_a_new_xid_is_reported_once():
    bodies = [
        exposition(xid1=13),  # an XID from before the scraper started: history
        exposition(xid1=79, width1=8, remap1=1, link_down=True),
        exposition(xid1=79, width1=8, remap1=1, link_down=True),
    ]
    with Exporter(bodies) as ex:
        scraper = DcgmScraper(ex.url, node="fallback")
        first, second, third = (scraper.read()[0].gpus[1] for _ in range(3))
    assert first.xid_codes == () and third.xid_codes == ()
    assert second.xid_codes == (79,)
    assert (second.pcie_width, second.nvlink_links_down, second.remap_pending) == (8, 1, True)


def test_export_health_from_dcgm_dry_run_prints_reports(capsys):
    with Exporter([exposition()]) as ex:
        code = run_dcgm_exporter(load_settings({}), ex.url, node="x", once=True, dry_run=True)
    assert code == 0
    report = NodeHealth.model_validate_json(capsys.readouterr().out)
    assert report.node == "gpu-node-07" and len(report.gpus) == 2


def test_unreachable_exporter_is_a_clear_error(capsys):
    with Exporter(["x 1\n"]) as ex:
        url = ex.url
    scraper = DcgmScraper(url, node="n")  # the server is gone
    with pytest.raises(DcgmError, match="cannot scrape"):
        scraper.read()
    assert scraper.stats.failures == 1
    code = run_dcgm_exporter(load_settings({}), url, node="n", once=True, dry_run=True)
    assert code == 4 and "cannot scrape" in capsys.readouterr().err


def test_garbage_is_not_an_exposition():
    with (
        Exporter(["DCGM_FI_DEV_GPU_TEMP{gpu=0 61\n"]) as ex,
        pytest.raises(DcgmError, match="not a Prometheus text exposition"),
    ):
        DcgmScraper(ex.url, node="n").read()


def test_series_without_hostname_use_the_given_node_and_bad_labels_are_skipped():
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50\nDCGM_FI_DEV_POWER_USAGE{gpu="0"} 300\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980\nDCGM_FI_DEV_GPU_UTIL{gpu="0"} 90\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="abc"} 50\nDCGM_FI_DEV_GPU_TEMP{gpu="9999"} 50\n'
        'DCGM_FI_DEV_GPU_TEMP 50\nDCGM_FI_DEV_POWER_USAGE{gpu="0"} NaN\n'
    )
    (report,) = DcgmScraper("http://x/metrics", node="n3").reports_from(text)
    assert report.node == "n3" and [g.index for g in report.gpus] == [0]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"url": "file:///etc/passwd"}, "url"),
        ({"node": ""}, "node"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_arguments_are_named(kwargs, name):
    args = {"url": "http://x/metrics", "node": "n"} | kwargs
    with pytest.raises(ValueError, match=name):
        DcgmScraper(args.pop("url"), **args)


def test_stepguard_export_health_from_dcgm_command():
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    with Exporter([exposition()]) as ex:
        result = CliRunner().invoke(
            app, ["export-health", "--from-dcgm", ex.url, "--interval", "2", "--once", "--dry-run"]
        )
    assert result.exit_code == 0, result.output
    report = NodeHealth.model_validate_json(result.stdout.strip().splitlines()[-1])
    assert (report.node, report.interval_s, len(report.gpus)) == ("gpu-node-07", 2.0, 2)


def test_a_scraped_downtrained_link_and_a_drain_xid_reach_the_detector():
    from detectors.hardware.health import HardwareDetector

    bodies = [exposition()] * 3 + [exposition(width1=8, xid1=79)]
    hw = HardwareDetector()
    with Exporter(bodies) as ex:
        scraper = DcgmScraper(ex.url, node="x")
        for _ in range(3):
            hw.learn_one(scraper.read()[0])
        (report,) = scraper.read()
    found = {f.signal: f for f in hw.score_one(report)}
    assert set(found) == {"pcie_downtrain", "hw_fatal"}
    assert found["pcie_downtrain"].score == 0.5 and "GPU 1" in found["hw_fatal"].detail
