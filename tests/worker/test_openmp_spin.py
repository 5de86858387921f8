"""A worker on the cores ledger gives OpenMP a short idle spin before torch loads it, unless the user chose one.

libgomp prints the settings it read when ``OMP_DISPLAY_ENV=VERBOSE`` is set (to stderr, the worker's log),
so these tests read what the OpenMP runtime itself took, in real worker processes with the default model.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.daemons import Daemons, start_broker, start_worker, wait_until
from worker.cores import OPENMP_IDLE_SPIN, openmp_idle_spin

SPIN = re.compile(r"GOMP_SPINCOUNT = '(\d+)'")


def spin_count_read_by_openmp(log_path: Path) -> int:
    """The spin count libgomp reports in the worker's log, once it has loaded."""
    found = wait_until(lambda: SPIN.search(log_path.read_text(errors="replace")), 60,
                       "libgomp to print its settings (OMP_DISPLAY_ENV)")
    return int(found.group(1))


def test_a_ledger_worker_runs_openmp_with_the_short_spin_and_the_users_policy_wins(log_dir: Path) -> None:
    shown = {"OMP_DISPLAY_ENV": "VERBOSE"}
    with Daemons(log_dir) as daemons:
        broker = daemons.add(start_broker(log_dir))
        ours = daemons.add(start_worker(broker, log_dir, "ours", workers=2, env=shown))
        theirs = daemons.add(start_worker(broker, log_dir, "theirs", workers=2,
                                          env=shown | {"OMP_WAIT_POLICY": "ACTIVE"}))
        assert spin_count_read_by_openmp(ours.log_path) == int(OPENMP_IDLE_SPIN["GOMP_SPINCOUNT"])
        assert spin_count_read_by_openmp(theirs.log_path) > 1_000_000  # ACTIVE: libgomp's own long spin


def test_only_what_the_user_left_unset_is_added() -> None:
    assert openmp_idle_spin({}) == OPENMP_IDLE_SPIN
    assert openmp_idle_spin({"GOMP_SPINCOUNT": "5"}) == {"KMP_BLOCKTIME": OPENMP_IDLE_SPIN["KMP_BLOCKTIME"]}
    assert openmp_idle_spin({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
