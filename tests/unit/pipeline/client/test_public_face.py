"""What training code imports: ``pipeline.client``'s ``__all__``, torch only on demand,
``py.typed`` shipped, ``pipeline.__version__`` and the docs' list of the public API."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pipeline
import pipeline.client as client
from pipeline.client.listener import CommandListener

ROOT = Path(__file__).resolve().parents[4]
TORCH_NAMES = {"RelaunchRequested", "TorchGuard", "watch"}


def run(code: str) -> str:
    """``code`` in a fresh interpreter at the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_all_is_sorted_unique_and_names_what_training_code_uses():
    assert client.__all__ == sorted(set(client.__all__))
    assert {"StepExporter", "CommandListener", "watch", "load_client_settings"} <= set(
        client.__all__
    )
    assert client.CommandListener is CommandListener
    for name in set(client.__all__) - TORCH_NAMES:
        assert getattr(client, name) is not None, name
    assert set(dir(client)) >= TORCH_NAMES


def test_import_pipeline_client_does_not_import_torch():
    # a fresh interpreter: what ``import pipeline.client`` runs, every eager name touched
    code = (
        "import sys, pipeline.client as c\n"
        f"[getattr(c, n) for n in c.__all__ if n not in {sorted(TORCH_NAMES)!r}]\n"
        "print('torch' in sys.modules)"
    )
    assert run(code) == "False"


def test_watch_without_torch_names_the_extra():
    # torch made unimportable, whether or not this machine has it
    code = (
        "import sys\nsys.modules['torch'] = None\nimport pipeline.client as c\n"
        "try:\n    c.watch\nexcept ImportError as exc:\n    print(exc)"
    )
    assert run(code) == "pipeline.client.pytorch needs PyTorch: pip install 'stepguard[torch]'"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'wach'"):
        client.wach


def test_watch_is_the_pytorch_integrations_own():
    pytest.importorskip("torch")
    from pipeline.client.pytorch.guard import RelaunchRequested, TorchGuard, watch

    assert (client.watch, client.TorchGuard) == (watch, TorchGuard)
    assert client.RelaunchRequested is RelaunchRequested


def test_the_docs_list_the_public_api_exactly():
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("## The public API") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == set(client.__all__)


@pytest.mark.parametrize("package", ["pipeline", "detectors", "schemas"])
def test_every_package_ships_a_py_typed_marker(package):
    assert (ROOT / package / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"][package]


def test_the_version_is_the_installed_distributions():
    assert pipeline.__version__ == importlib.metadata.version("stepguard")
    assert "__version__" in pipeline.__all__
    with pytest.raises(AttributeError):
        pipeline.nothing
