"""The agents floor: node daemons.

Owns the node aggregator (:mod:`pipeline.agents.node`: one producer per node fed by its
ranks over a Unix socket) and the health exporters (:mod:`pipeline.agents.health`, NVML;
:mod:`pipeline.agents.dcgm`, a running dcgm-exporter). May import :mod:`pipeline.client`,
:mod:`pipeline.io` and :mod:`schemas`; never services or tools.
"""
