"""docs/pytorch.md's job step is one an operator can run as written (issue 41 item 7):
the venv is not activated (a `.venv/bin/` path), both files `up` wrote are sourced, the
emulated node size and a free rendezvous port are on the line. test_torch_ddp runs this
very line (with torch; it skips without)."""

from __future__ import annotations

from tests.integration.pytorch_page import job_step


def test_the_job_step_runs_without_an_activated_venv_and_follows_ups_hint():
    step = job_step()
    assert step.sourced == (".stepguard/up.env", ".stepguard/job-controller.env")
    assert step.argv[0] == ".venv/bin/stepguard-torchrun" and step.argv[1] == "--"
    assert step.argv[2] == "torchrun"  # found beside stepguard-torchrun's own python
    assert "--standalone" in step.argv  # a free port, not 29500 on a shared host
    assert step.env == {"STEPGUARD_RANKS_PER_NODE": "2"}
    assert step.argv[-1] == "train.py"


def test_the_page_sources_what_up_tells_another_shell_to_source():
    import re
    from pathlib import Path

    from pipeline.tools.up import shell_hint
    from tests.integration.pytorch_page import PAGE

    text = PAGE.read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index("**4. Run the job**") :], re.S)
    assert block is not None
    assert block.group(1).splitlines()[0] == shell_hint(Path(".stepguard"), watched_job=True)
