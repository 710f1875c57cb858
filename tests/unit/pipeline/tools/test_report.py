"""``stepguard report`` shows one incident per sick node with its causes in order."""

from pipeline.tools.report import Incident, _chain


def test_the_chain_of_causes_comes_from_the_culprits_newest_update():
    inc = Incident("k", "hardware+straggler+thermal", "node-0005", (43,), 3, 100, 180,
                   "critical", False, ("a", "b", "c"))  # fmt: skip
    timeline = [
        ("t0", "alert thermal warning firing", "node-0005", "step 100: thermal on node-0005"),
        ("t1", "alert straggler warning firing", "node-0005 rank 43",
         "step 112: slow; incident chain: thermal (step 100) -> straggler (step 110)"),
        ("t2", "alert hardware warning firing", "node-0005",
         "step 130: clock; incident chain: thermal (step 100) -> straggler (step 110) -> "
         "hardware (step 128)"),
        ("t3", "alert straggler warning firing", "node-0007 rank 60",
         "step 140: slow; incident chain: thermal (step 1) -> straggler (step 2)"),
        ("t4", "alert straggler warning firing", "node-0005 rank 43",
         "step 400: later; incident chain: other (step 390) -> straggler (step 400)"),
    ]  # fmt: skip
    assert _chain(inc, timeline) == (
        "thermal (step 100) -> straggler (step 110) -> hardware (step 128)"
    )
    lone = Incident("j", "straggler", "node-0001", (9,), 1, 5, 9, "warning", True, ("d",))
    assert _chain(lone, timeline) == ""
