"""The NVML exporter's link and memory-repair readings (NodeHealth v2), on a fake NVML."""

from pipeline.agents.health import NvmlReader
from tests.unit.pipeline.client.test_exporter import FakeNvml


class LinkFakeNvml(FakeNvml):
    """Two GPUs with 4 NVLinks each and a PCIe Gen5 x16 slot. GPU 1: trained to x8, one
    link down from the second read on, CRC errors, a row remap pending then failed."""

    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h == "gpu1" and link == 3 and self.reads > 0:
            return 0
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        if h != "gpu1":
            return 0
        return {0: 5, 1: 0, 2: 7, 3: 1}[counter]  # replay, recovery, CRC flit, CRC data

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 8 if h == "gpu1" else 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetRemappedRows(self, h):
        if h != "gpu1":
            return (0, 0, 0, 0)
        return (0, 1, 1, 0) if self.reads == 0 else (0, 2, 0, 1)


def test_nvml_reader_reads_pcie_nvlink_links_and_row_remapping():
    nv = LinkFakeNvml()
    with NvmlReader(nv) as reader:
        first = reader.read("n1")
        nv.reads += 1
        second = reader.read("n1")
    assert first.schema_version == 2
    g0, g1 = first.gpus
    assert (g0.pcie_gen, g0.pcie_gen_max, g0.pcie_width, g0.pcie_width_max) == (5, 5, 16, 16)
    assert (g1.pcie_width, g1.pcie_width_max) == (8, 16)
    assert (g1.nvlink_replay_errors, g1.nvlink_crc_errors, g1.nvlink_errors) == (20, 32, 48)
    assert (g0.nvlink_errors, g0.nvlink_links_down, g1.nvlink_links_down) == (0, 0, 0)
    assert (g1.remap_pending, g1.remap_failed, g0.remap_pending) == (True, False, False)
    s0, s1 = second.gpus
    assert (s0.nvlink_links_down, s1.nvlink_links_down) == (0, 1)
    assert (s1.remap_pending, s1.remap_failed) == (False, True)


def test_a_gpu_without_link_readings_reports_them_unknown():
    nv = FakeNvml()  # no PCIe, link state or remap calls: NVML lacks them
    with NvmlReader(nv) as reader:
        g0, _ = reader.read("n1").gpus
    assert (g0.pcie_gen, g0.pcie_width_max, g0.nvlink_links_down) == (None, None, 0)
    assert (g0.remap_pending, g0.remap_failed, g0.nvlink_crc_errors) == (False, False, 4)


class BrokenLinkNvml(LinkFakeNvml):
    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 4_294_967_295  # NVML's "unknown" value


def test_unsupported_or_absurd_pcie_values_are_unknown_not_an_error():
    with NvmlReader(BrokenLinkNvml()) as reader:
        g0, _ = reader.read("n1").gpus
    assert (g0.pcie_gen, g0.pcie_width_max, g0.pcie_gen_max) == (None, None, 5)
