"""Helpers every room of the bench uses: starting and stopping processes, CPU accounting, texts, batches.

``procs``: systems as groups of daemons on the test harness (:mod:`zbatch.testing`), and the progress
log; ``cpu``: CPU used by the processes under test and by everything else, from /proc; ``texts``:
the fixed, seeded sentences every system embeds; ``batches``: the worker's batch sizes and times,
from its Prometheus page.  Nothing here imports another room of the bench.
"""
