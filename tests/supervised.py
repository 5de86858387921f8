"""``python -m tests.supervised SPEC``: the supervisor's shell over the units a JSON spec lists, for its tests.

SPEC: ``{"units": [{"name", "group", "stop_timeout_s", "after", "argv"}], "order": [groups],
"backoff": [first_s, max_s, reset_after_s], "watchdog_s": s or null, "fail_fast": bool}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from zbatch.runtime.logs import setup_logging
from zbatch.supervisor.policy import Backoff, Supervision, Unit
from zbatch.supervisor.shell import Program, Shell


def main() -> None:
    spec = json.loads(sys.argv[1])
    setup_logging("zbatch-supervised", "info", "text")
    units = [Unit(u["name"], u["group"], u["stop_timeout_s"], tuple(u.get("after", ()))) for u in spec["units"]]
    programs = {u["name"]: Program(u["argv"]) for u in spec["units"]}
    supervision = Supervision(units, spec["order"], Backoff(*spec.get("backoff", (1.0, 30.0, 60.0))),
                              watchdog_s=spec.get("watchdog_s"), fail_fast=spec.get("fail_fast", False))
    shell = Shell("zbatch-supervised", supervision, programs, logging.getLogger("zbatch.supervised"))
    sys.exit(asyncio.run(shell.run()))


if __name__ == "__main__":
    main()
