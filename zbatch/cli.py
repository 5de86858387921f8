"""``zbatch COMMAND``: one entry point for the commands that are not daemons.

``zbatch serve`` runs a whole stack (:mod:`zbatch.supervisor.serve`);
``zbatch status`` and ``zbatch keys`` are ``zbatch-status`` and
``zbatch-keys``.  Each command takes its own flags; ``zbatch COMMAND --help``
lists them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "serve": ("zbatch.supervisor.serve", "run a broker, workers and the gateway on this host, restarting any that "
                                         "exits; SIGTERM or Ctrl-C stops them in order"),
    "status": ("zbatch.tools.status", "a live view of the brokers' models, backlogs and workers (zbatch-status)"),
    "keys": ("zbatch.tools.keys", "make a CURVE key pair (zbatch-keys)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help}" for name, (_, help) in COMMANDS.items()]
    return "usage: zbatch COMMAND [OPTIONS]\n\ncommands:\n" + "\n".join(lines) + \
        "\n\n'zbatch COMMAND --help' lists a command's options.\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        (sys.stdout if args else sys.stderr).write(usage())
        sys.exit(0 if args else 2)
    command, rest = args[0], args[1:]
    if command not in COMMANDS:  # status 2, as for any unknown flag
        sys.stderr.write(f"zbatch: error: unknown command {command!r}: expected one of {', '.join(COMMANDS)} "
                         f"(see zbatch --help)\n")
        sys.exit(2)
    module = importlib.import_module(COMMANDS[command][0])
    module.main(rest)
