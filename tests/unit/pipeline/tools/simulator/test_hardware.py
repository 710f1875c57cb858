"""The simulator's silent hardware faults (issue 16 item 2): what the node reports."""

from pipeline.tools.simulator import Scenario, SimulatedJob


def reports(faults, steps=60, nodes=4, **kw):
    """{step: {node: NodeHealth}} of every health report of a small job."""
    job = SimulatedJob(
        Scenario(name="t", nodes=nodes, steps=steps, health_interval_steps=5, faults=faults, **kw)
    )
    out = {}
    for ev in job.events():
        for h in ev.health:
            out.setdefault(ev.step, {})[h.node] = h
    return out, job


def test_pcie_downtrain_reports_the_trained_width_from_onset_only():
    got, _ = reports([{"kind": "pcie_downtrain", "variant": "width", "node": 1, "gpu": 3,
                       "onset_step": 30, "magnitude": 8}])  # fmt: skip
    for step, by_node in got.items():
        g = by_node["node-0001"].gpus
        assert (g[3].pcie_width, g[3].pcie_width_max) == ((8 if step >= 30 else 16), 16)
        assert {x.pcie_width for x in g[:3]} == {16} and g[3].pcie_gen == 5
        assert {x.pcie_width for x in by_node["node-0002"].gpus} == {16}


def test_row_remap_raises_its_xid_once_and_stays_pending():
    got, _ = reports([{"kind": "row_remap", "variant": "pending", "node": 2, "gpu": 1,
                       "onset_step": 20}])  # fmt: skip
    gpus = [by_node["node-0002"].gpus[1] for _, by_node in sorted(got.items())]
    assert sum(g.xid_codes == (63,) for g in gpus) == 1
    assert [g.remap_pending for g in gpus] == [s >= 20 for s in sorted(got)]
    assert not any(g.remap_failed for g in gpus)


def test_nvlink_down_and_drain_xid():
    got, _ = reports([
        {"kind": "nvlink_down", "node": 0, "gpu": 5, "onset_step": 10, "magnitude": 2},
        {"kind": "drain_xid", "node": 3, "gpu": 7, "onset_step": 40, "magnitude": 79},
    ])  # fmt: skip
    last = got[max(got)]
    g = last["node-0000"].gpus[5]
    assert g.nvlink_links_down == 2 and g.nvlink_crc_errors > 0 and g.nvlink_errors > 0
    xids = [h["node-0003"].gpus[7].xid_codes for h in got.values()]
    assert xids.count((79,)) == 1


def test_cluster_power_cap_caps_every_gpu_and_slows_every_rank_alike():
    cap = {"kind": "cluster_slowdown", "variant": "power_cap", "onset_step": 20,
           "duration_steps": 20, "magnitude": 0.2}  # fmt: skip
    got, _ = reports([cap])
    for step, by_node in got.items():
        capped = {g.throttle_reasons for h in by_node.values() for g in h.gpus}
        assert capped == ({("sw_power_cap",)} if 20 <= step < 40 else {()})
    job = SimulatedJob(Scenario(name="t", nodes=4, steps=60, warmup_steps=0, faults=[cap]))
    frames = {ev.frame.step: ev.frame.compute for ev in job.events() if ev.frame is not None}
    ratio = frames[30] / frames[10]
    assert 1.15 < float(ratio.mean()) < 1.35 and float(ratio.std()) < 0.05


def test_an_isolated_node_takes_its_faults_with_it():
    job = SimulatedJob(Scenario(name="t", nodes=2, steps=40, health_interval_steps=5, faults=[
        {"kind": "pcie_downtrain", "node": 1, "onset_step": 0, "magnitude": 4},
    ]))  # fmt: skip
    for _ in range(12):
        job.advance()
    job.isolate("node-0001")
    job.restart(job.step)
    late = [h for ev in job.events() for h in ev.health if h.node == "spare-000"]
    assert late and {g.pcie_width for h in late for g in h.gpus} == {16}
