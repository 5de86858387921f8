"""``python -m zbatch COMMAND``: the same as the ``zbatch`` command (:mod:`zbatch.cli`)."""

from zbatch.cli import main

main()
