"""The CLI floor: typer commands only, each a thin shell over a lower floor.

:mod:`~pipeline.cli.app` is the ``stepguard`` command; ``worker``, ``actuator`` and
``alertmanager`` add the service commands; ``util`` holds the console helpers they
share and the exit codes, ``options`` the shared options (one spelling each,
docs/cli.md). Nothing imports this floor but entry points; this package imports
nothing itself, so ``python -m pipeline.services.worker`` loads only the worker's commands.
"""
