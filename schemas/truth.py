"""Simulator ground truth, used only for scoring detection and comparing policies."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, NonNegativeInt

from schemas._base import Message

__all__ = ["FaultKind", "FaultTruth"]


class FaultKind(StrEnum):
    STRAGGLER = "straggler"
    DEGRADATION = "degradation"
    THERMAL = "thermal"
    NIC_FLAP = "nic_flap"
    DATA_STALL = "data_stall"
    ECC_STORM = "ecc_storm"
    CRASH = "crash"
    HANG = "hang"
    DIVERGENCE = "divergence"
    # Silent hardware slowdowns (issue 16 item 2)
    PCIE_DOWNTRAIN = "pcie_downtrain"
    NVLINK_DOWN = "nvlink_down"
    ROW_REMAP = "row_remap"
    DRAIN_XID = "drain_xid"
    CLOCK_THROTTLE = "clock_throttle"
    # Fault shapes of real clusters (issue 23)
    INTERMITTENT = "intermittent"
    STAGE_SLOWDOWN = "stage_slowdown"
    #: several nodes behind one rack, switch, PDU or cooling loop slow together
    GROUP_SLOWDOWN = "group_slowdown"
    # Traps: normal behaviour that must not alert.
    STAGE_IMBALANCE = "stage_imbalance"
    CLUSTER_SLOWDOWN = "cluster_slowdown"
    DIURNAL_TEMPERATURE = "diurnal_temperature"
    SINGLE_STEP_BLIP = "single_step_blip"
    HEALTH_DELAY = "health_delay"
    NOISY_NODE = "noisy_node"
    #: ranks given unequal work (tokens, FLOPs): slower for their work, not faulty
    WORK_IMBALANCE = "work_imbalance"


class FaultTruth(Message):
    """One injected fault or trap (topic key: job id)."""

    kind_name = "fault_truth"
    schema_version: Literal[1] = 1
    scenario: str
    job_id: str = Field(min_length=1, max_length=256)
    fault_id: str
    kind: FaultKind
    is_trap: bool = False
    node: str | None = None
    rank: NonNegativeInt | None = None
    onset_step: NonNegativeInt
    end_step: NonNegativeInt | None = Field(default=None, description="None: until the end.")
    magnitude: float = 0.0
    detail: str = ""
