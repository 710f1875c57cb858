"""``python -m pipeline`` is ``stepguard``."""

from pipeline.cli.app import main

main()
