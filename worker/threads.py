"""How many torch threads the next batch gets: all of them, unless other processes hold the cores.

Theory of operation
-------------------
Torch splits each operator across its threads and waits for the slowest one.
When other processes take a core (the gateway and broker answering a retry
storm, a load generator, a neighbour), one of those threads is descheduled and
the whole pass waits for it, so a contended batch can run slower on all the
cores than on one (``python -m scripts.benchmarks.studies.contention`` measures it).

So the worker runs with its full thread count while the machine is quiet and
with one thread while it is contended:

1. The runner's cost model, calibrated at warm-up, says how long each batch
   would take on the full thread count; the *slowdown* of a batch is its real
   time over that.  The governor keeps the slowdowns of the last few batches
   at the current thread count.
2. When their median says something is wrong (full count, median at least
   ``SUSPECT_SLOWDOWN``), or now and then anyway (one thread: the neighbours
   may have gone), batches run at the other count as a probe.
3. The other count wins only if ``PROBE_BATCHES`` probe batches in a row are
   each clearly faster than the current median; then it becomes the current
   count.  Batch times next to busy neighbours are noisy, and one lucky batch
   must not move the count.
4. A losing probe doubles the wait before the next one, up to
   ``MAX_PROBE_INTERVAL_S``.
5. Calibration may itself have run on a busy host (its record is kept
   between starts), and then contended batches do not look slow against it.
   So the governor also keeps, for each model (each has its own calibration),
   the lowest median of ``RECENT_BATCHES`` of its full-count batches' times
   over their modelled times.  Once that *floor* is under ``TRUSTED_FLOOR``
   (batches ran clearly faster than calibrated), it is the model's quiet
   reference and its batches' slowdowns are measured against it; above it,
   model misfit, not a busy calibration, explains the gap and calibration
   stays the reference.

Sans I/O: the caller reports each batch and asks for the next count; the
clock is passed in.  Batches without a modelled time (batch 1, tasks with no
cost model, GPUs, where padding is free and threads hardly matter) change
nothing.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable

SUSPECT_SLOWDOWN = 1.5  # below this the full thread count is doing fine: no probes at all
WIN_MARGIN = 0.9  # a probe must beat the current median by 10 % to win
RECENT_BATCHES = 3
PROBE_BATCHES = 2  # probe batches in a row that must each win before the count switches
TRUSTED_FLOOR = 0.67  # full-count batches this much faster than calibrated: calibration ran on a busier host
BASE_PROBE_INTERVAL_S = 2.0
MAX_PROBE_INTERVAL_S = 32.0


class ThreadGovernor:
    """Chooses between ``full`` threads and one, from each batch's time against its modelled time."""

    def __init__(self, full: int, clock: Callable[[], float]) -> None:
        self.full = full
        self.current = full
        self._clock = clock
        self._recent: deque[float] = deque(maxlen=RECENT_BATCHES)
        self._full_count: dict[str, deque[float]] = {}  # by model: recent full-count batch times over modelled
        self._floors: dict[str, float] = {}  # by model: the lowest median of those (rule 5)
        self._probing = False
        self._probe_wins: list[float] = []  # slowdowns of this probe's winning batches so far
        self._probe_interval_s = BASE_PROBE_INTERVAL_S
        self._next_probe_at = 0.0
        self.lost_slowdown = 0.0  # the median slowdown of the count the last winning probe replaced

    @property
    def threads(self) -> int:
        """The thread count for the next batch (a probe runs at the other one)."""
        return self._other() if self._probing else self.current

    def observe(self, threads: int, seconds: float, modelled_seconds: float, model: str = "") -> None:
        """One batch of ``model`` ran on ``threads`` in ``seconds``; its calibration says ``modelled_seconds`` on
        the full count."""
        if self.full <= 1 or modelled_seconds <= 0:
            return
        if threads == self.full:
            self._lower_floor(model, seconds / modelled_seconds)
        slowdown = seconds / modelled_seconds / self.reference(model)
        if self._probing and threads != self.current:
            self._settle_probe(slowdown)
        elif threads == self.current:
            self._recent.append(slowdown)
            self._probing = self._probe_due()

    def reference(self, model: str = "") -> float:
        """A quiet full-count batch's time over its modelled time: 1 (calibration), or the model's floor (rule 5)."""
        floor = self._floors.get(model, 1.0)
        return floor if floor < TRUSTED_FLOOR else 1.0

    @property
    def lowest_reference(self) -> float:
        """The lowest reference of any model: under 1 once some model's calibration proved to be a busy one."""
        return min((self.reference(model) for model in self._floors), default=1.0)

    @property
    def slowdown(self) -> float:
        """Median slowdown of the recent batches at the current count, against their quiet reference (0 before
        any)."""
        return statistics.median(self._recent) if self._recent else 0.0

    def _lower_floor(self, model: str, ratio: float) -> None:
        recent = self._full_count.setdefault(model, deque(maxlen=RECENT_BATCHES))
        recent.append(ratio)
        if len(recent) == RECENT_BATCHES:
            self._floors[model] = min(self._floors.get(model, 1.0), statistics.median(recent))

    def _probe_due(self) -> bool:
        if self._clock() < self._next_probe_at:
            return False
        return self.current != self.full or self.slowdown >= SUSPECT_SLOWDOWN

    def _settle_probe(self, slowdown: float) -> None:
        """Count a probe batch: keep probing while it wins, switch after PROBE_BATCHES wins, back off on a loss."""
        if slowdown >= WIN_MARGIN * self.slowdown:
            self._end_probe(min(2 * self._probe_interval_s, MAX_PROBE_INTERVAL_S))
            return
        self._probe_wins.append(slowdown)
        if len(self._probe_wins) < PROBE_BATCHES:
            return
        self.lost_slowdown = self.slowdown
        self.current = self._other()
        self._recent.clear()
        self._recent.extend(self._probe_wins)
        self._end_probe(BASE_PROBE_INTERVAL_S)

    def _end_probe(self, next_interval_s: float) -> None:
        self._probing = False
        self._probe_wins.clear()
        self._probe_interval_s = next_interval_s
        self._next_probe_at = self._clock() + next_interval_s

    def _other(self) -> int:
        return 1 if self.current == self.full else self.full
