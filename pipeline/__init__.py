"""stepguard's runtime: what runs beside a training job and around it, in floors.

stepguard watches large training jobs step by step, finds slow, hanging or failing
nodes, turns confirmed findings into signed isolate/restart commands and archives
everything in ClickHouse. The pure detection lives in :mod:`detectors` and the
messages in :mod:`schemas`; this package is everything that moves them. It stands in
floors, lowest first; a module imports its own floor and those below, never one above
nor a sibling (``tests/unit/test_import_layers.py`` checks it):

==========================  ===============================================  ==============
floor                       what it owns                                     install
==========================  ===============================================  ==============
:mod:`pipeline.io`          plumbing: settings, Kafka clients, codecs,       (base)
                            trust, clock skew, metrics, redaction
:mod:`pipeline.client`      what training code imports: ``StepExporter``,    (base);
                            ``CommandListener``, ``watch`` (PyTorch)         ``[torch]``
:mod:`pipeline.policy`      the actuator's pure decisions (typed refusals)   (base)
:mod:`pipeline.agents`      node daemons (aggregator, NVML and DCGM health)  ``[nvml]``
:mod:`pipeline.services`    worker, actuator and executors, archiver,        ``[services]``
                            Alertmanager bridge
:mod:`pipeline.tools`       operator and offline tools (up, demo, status,    ``[tools]``
                            simulator, calibrate, compare, report)
:mod:`pipeline.cli`         the ``stepguard`` command line (typer only;      (base)
                            each command names the extra it needs)
==========================  ===============================================  ==============

The public face for training code is :mod:`pipeline.client` (``__all__`` lists it);
the operator's is the ``stepguard`` command (docs/cli.md). Everything else is
importable but internal: it may change between versions without notice.
``pipeline.__version__`` is the installed distribution's version (what ``stepguard
--version`` prints), ``"0+unknown"`` in a checkout that was never installed.
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # resolved on first use: importing the client floor stays as light as it can be
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("stepguard")
        except PackageNotFoundError:  # a checkout that was never installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
