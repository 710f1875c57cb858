"""``python -m pipeline`` is ``stepguard``."""

from pipeline.cli import main

main()
