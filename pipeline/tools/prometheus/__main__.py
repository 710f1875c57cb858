"""``python -m pipeline.tools.prometheus rules|rules-test|compose``: the path of a shipped file
(for a Prometheus's ``rule_files``, or ``promtool test rules``)."""

from __future__ import annotations

import sys

from pipeline.tools.prometheus import RULES_FILE, RULES_TEST_FILE, rules_path

_FILES = {"rules": RULES_FILE, "rules-test": RULES_TEST_FILE, "compose": "compose.yml"}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in _FILES:
        print(f"usage: python -m pipeline.tools.prometheus {{{'|'.join(_FILES)}}}", file=sys.stderr)
        return 2
    print(rules_path(_FILES[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
