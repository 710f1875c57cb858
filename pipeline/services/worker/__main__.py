"""``python -m pipeline.services.worker``: the same as ``stepguard worker``."""

from pipeline.cli.app import main

if __name__ == "__main__":
    import sys

    sys.argv = ["stepguard", "worker", *sys.argv[1:]]
    main()
