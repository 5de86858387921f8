"""The cores of one host, shared by its workers: a ledger in shared memory that each marks busy around a batch.

Theory of operation
-------------------
Torch on a CPU splits each operator across its threads and waits for the
slowest, so a thread that finds its core taken stalls the whole pass.  Hence
the rule: **all local workers' torch threads together must fit the cores**;
busy workers never oversubscribe them.  Within that rule the cores should go
where the work is:

* a lone busy worker runs torch on all of them, so one request at a time
  gets the whole machine, whichever worker it reaches;
* busy workers split them, since batches side by side on fewer threads each
  do more work than one batch at a time on all of them (an operator's
  synchronisation does not shrink with its share).

The ledger is a small file in shared memory (``/dev/shm``) with a slot per
worker process.  Around each batch a worker :meth:`~CoreLedger.acquire`\\ s
cores and :meth:`~CoreLedger.release`\\ s them; :func:`grant` decides, under
the ledger's lock:

1. Free cores are those no other live worker holds.  Workers that wait for
   cores come first, the longest waiting first: each reserves the cores it
   waits for (one for a batch) ahead of a worker that waited less or not at
   all.  With no core left, a worker marks itself waiting and looks again
   every ``POLL_S``.  A worker that loads its model waits for every core, as
   its warm-up times the model on all of them.
2. A worker that has not run side by side with another one within
   ``SHARE_HOLD_S`` takes every free core.  Requests that come one at a time
   never overlap, even when the broker hands them to the workers in turn.
3. Otherwise it takes its share: the cores over the workers that are active
   (holding cores, waiting for them, or done with a batch within
   ``SHARE_HOLD_S``), at least one, at most what is free.  A worker sees that
   it runs side by side when another one holds or waits for cores as it
   acquires, or started a batch while its own one ran.
4. A worker's cap (``wanted``: ``--torch-threads``, or one thread while
   :mod:`worker.threads` finds foreign processes on the cores) bounds it.

A worker holds a lock on its slot for as long as it lives (an open file
description lock, which the kernel drops when the process ends, however it
ends), so the cores of a dead worker are free at once.  A *stopped* worker (SIGSTOP) keeps
its cores; a worker that has waited ``STALE_WAIT_S`` for cores takes one
anyway and says so in its log, the one case where the rule yields.

Workers share a ledger when they name the same file (``--cores-ledger``,
by default one per user in ``/dev/shm``), so the cores they split are those
of one host; workers on GPUs do not use it.  :func:`grant` is pure, with the
clock passed in; :class:`CoreLedger` is the file.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("zbatch.worker")

SHARE_HOLD_S = 1.0  # after running side by side with another worker, take only a share for this long
POLL_S = 0.001  # how often a worker with no core free looks again
STALE_WAIT_S = 10.0  # a worker that waited this long takes one core anyway (a holder is stopped)
MAGIC = b"zbcores1"
HEADER = struct.Struct("<8sIIQ")  # magic, cores, slots ever claimed (a high-water mark), batches started
SLOT = struct.Struct("<qiiddQ")  # pid, cores held, cores waited for, waiting since, last batch ended, batches
HEADER_BYTES = SLOT_BYTES = 64
SLOTS = 128
SIZE = HEADER_BYTES + SLOTS * SLOT_BYTES


def host_cores() -> int:
    """The cores this process may run on (its affinity, as a container's cpuset limits it)."""
    return len(os.sched_getaffinity(0))


# GNU OpenMP's busy-wait after a parallel region, in spins (libgomp's own default is 300,000):
# long enough to span the gaps inside one forward pass, short enough that a worker done with its batch leaves
# the cores to the next one.  Intel's OpenMP counts it in milliseconds (KMP_BLOCKTIME, 200 by default).
OPENMP_IDLE_SPIN = {"GOMP_SPINCOUNT": "10000", "KMP_BLOCKTIME": "1"}


def openmp_idle_spin(environ: Mapping[str, str]) -> dict[str, str]:
    """What a worker on the ledger adds to its environment before torch loads OpenMP: a short spin, where
    the user set none (an ``OMP_WAIT_POLICY`` of their own also decides the spin, so it wins too)."""
    if "OMP_WAIT_POLICY" in environ:
        return {}
    return {name: value for name, value in OPENMP_IDLE_SPIN.items() if name not in environ}


def default_path() -> str:
    """One ledger per user on this host: workers of different users do not see each other's files."""
    return f"/dev/shm/zbatch-cores-{os.getuid()}"


@dataclass(frozen=True, slots=True)
class Other:
    """Another live worker's slot, as :func:`grant` reads it."""

    held: int = 0
    waiting_since: float = 0.0  # 0: not waiting
    last_end: float = float("-inf")
    need: int = 1  # how many cores it waits for


def grant(cores: int, wanted: int, others: Sequence[Other], now: float, shared_until: float,
          waiting_since: float = 0.0, whole: bool = False) -> int:
    """How many cores a worker takes now (0: it must wait); ``waiting_since`` is its own wait (0: none);
    ``whole``: all ``wanted`` or none."""
    free = cores - sum(other.held for other in others)
    ahead = sum(other.need for other in others
                if other.waiting_since and (not waiting_since or other.waiting_since < waiting_since))
    usable = free - ahead
    if usable < (wanted if whole else 1):
        return 0
    if whole or now >= shared_until:
        return min(wanted, usable)
    active = 1 + sum(1 for other in others
                     if other.held or other.waiting_since or now - other.last_end < SHARE_HOLD_S)
    return min(wanted, usable, max(1, cores // active))


class CoreLedger:
    """This worker's slot in the ledger file at ``path``; cores are counted as ``cores`` when it is created."""

    def __init__(self, path: str, cores: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.path = path
        self._clock = clock
        self._sleep = sleep
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with self._locked():
                if os.fstat(self._fd).st_size < SIZE:
                    os.ftruncate(self._fd, SIZE)
                self._map = mmap.mmap(self._fd, SIZE)
                magic, stored, _, _ = HEADER.unpack_from(self._map, 0)
                if magic != MAGIC:
                    HEADER.pack_into(self._map, 0, MAGIC, cores, 0, 0)
                    stored = cores
                self.cores = int(stored)
                self._slot = self._claim_slot()
        except BaseException:
            os.close(self._fd)
            raise
        if self.cores != cores:
            log.warning("cores ledger %s counts %d cores and this worker sees %d; it follows the ledger", path,
                        self.cores, cores)
        self.held = 0
        self._shared_until = float("-inf")
        self._started_at_acquire = 0
        self._waited_beyond = False

    # ------------------------------------------------------------------ use

    def acquire(self, wanted: int, whole: bool = False) -> int:
        """Take cores for a batch (at most ``wanted``, at least 1; ``whole``: exactly ``wanted``), waiting
        while they are not free; returns them."""
        wanted = max(1, min(wanted, self.cores))
        waiting_since = 0.0
        while True:
            with self._locked():
                now = self._clock()
                others = self._others()
                if any(other.held or other.waiting_since for other in others):
                    self._shared_until = now + SHARE_HOLD_S
                cores = grant(self.cores, wanted, others, now, self._shared_until, waiting_since, whole)
                if not cores and waiting_since and now - waiting_since >= STALE_WAIT_S:
                    cores = wanted if whole else 1
                    if not self._waited_beyond:
                        self._waited_beyond = True
                        log.warning("waited %.0f s for cores held by another worker on this host (is it "
                                    "stopped?); running on %d thread(s) beyond the cores ledger %s",
                                    now - waiting_since, cores, self.path)
                if cores:
                    self._take(cores)
                    return cores
                waiting_since = waiting_since or now
                self._write(waiting_since=waiting_since, need=wanted if whole else 1)
            self._sleep(POLL_S)

    def release(self) -> None:
        """The batch is done: give its cores back."""
        with self._locked():
            now = self._clock()
            _, _, _, started = HEADER.unpack_from(self._map, 0)
            if started > self._started_at_acquire:  # another worker started a batch while this one ran
                self._shared_until = now + SHARE_HOLD_S
            self.held = 0
            self._write(last_end=now)

    def close(self) -> None:
        """Leave the ledger (the kernel would drop the slot's lock at exit anyway)."""
        if self._fd < 0:
            return
        with self._locked():
            SLOT.pack_into(self._map, self._offset(self._slot), 0, 0, 0, 0.0, float("-inf"), 0)
        self._map.close()
        os.close(self._fd)  # drops the slot's lock
        self._fd = -1

    @property
    def sharing(self) -> bool:
        """Whether this worker ran side by side with another within SHARE_HOLD_S."""
        return self._clock() < self._shared_until

    # -------------------------------------------------------------- the file

    def _take(self, cores: int) -> None:
        magic, stored, claimed, started = HEADER.unpack_from(self._map, 0)
        HEADER.pack_into(self._map, 0, magic, stored, claimed, started + 1)
        self._started_at_acquire = started + 1
        self.held = cores
        _, _, _, _, last_end, batches = SLOT.unpack_from(self._map, self._offset(self._slot))
        SLOT.pack_into(self._map, self._offset(self._slot), os.getpid(), cores, 0, 0.0, last_end, batches + 1)

    def _write(self, waiting_since: float = 0.0, last_end: float | None = None, need: int = 1) -> None:
        offset = self._offset(self._slot)
        _, _, _, _, previous_end, batches = SLOT.unpack_from(self._map, offset)
        SLOT.pack_into(self._map, offset, os.getpid(), self.held, need, waiting_since,
                       previous_end if last_end is None else last_end, batches)

    def _others(self) -> list[Other]:
        """The other live workers' slots; a dead worker's slot is cleared on the way."""
        found = []
        _, _, claimed, _ = HEADER.unpack_from(self._map, 0)
        for index in range(claimed):
            if index == self._slot:
                continue
            offset = self._offset(index)
            pid, held, need, waiting_since, last_end, _ = SLOT.unpack_from(self._map, offset)
            if not pid:
                continue
            if not self._alive(index):
                SLOT.pack_into(self._map, offset, 0, 0, 0, 0.0, float("-inf"), 0)
                continue
            found.append(Other(held, waiting_since, last_end, max(1, need)))
        return found

    def _claim_slot(self) -> int:
        for index in range(SLOTS):
            offset = self._offset(index)
            if not _lock_range(self._fd, fcntl.F_WRLCK, offset, SLOT_BYTES):
                continue  # a live worker's
            SLOT.pack_into(self._map, offset, os.getpid(), 0, 0, 0.0, float("-inf"), 0)
            magic, cores, claimed, started = HEADER.unpack_from(self._map, 0)
            HEADER.pack_into(self._map, 0, magic, cores, max(claimed, index + 1), started)
            return index
        raise OSError(f"the cores ledger {self.path} has no free slot: more than {SLOTS} workers on this host")

    def _alive(self, index: int) -> bool:
        """Whether a live process holds slot ``index``'s lock (never ask about this worker's own slot)."""
        offset = self._offset(index)
        if not _lock_range(self._fd, fcntl.F_WRLCK, offset, SLOT_BYTES):
            return True
        _lock_range(self._fd, fcntl.F_UNLCK, offset, SLOT_BYTES)
        return False

    @staticmethod
    def _offset(index: int) -> int:
        return HEADER_BYTES + index * SLOT_BYTES

    def _locked(self) -> _FileLock:
        return _FileLock(self._fd)


def _lock_range(fd: int, kind: int, start: int, length: int) -> bool:
    """Lock (``F_WRLCK``) or unlock (``F_UNLCK``) bytes of the file, without waiting; False if another open
    file holds them.  Open file description locks: owned by this ``fd``, not by the process, so two ledgers
    in one process (tests) are two workers too."""
    flock = struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class _FileLock:
    """The ledger's lock, for one short read-and-write of the slots (``flock``: all processes on the host)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


def holders(path: str) -> dict[int, int]:
    """Cores held now in the ledger at ``path``, by worker pid (live workers holding some only)."""
    return {pid: held for pid, held, _ in _live_slots(path) if held}


def waiters(path: str) -> set[int]:
    """The pids of the live workers in the ledger at ``path`` that wait for cores now."""
    return {pid for pid, _, waiting_since in _live_slots(path) if waiting_since}


def _live_slots(path: str) -> list[tuple[int, int, float]]:
    """Each live worker's pid, cores held and waiting-since (0: not waiting) in the ledger at ``path``."""
    fd = os.open(path, os.O_RDWR)
    try:
        with _FileLock(fd), mmap.mmap(fd, SIZE) as view:
            _, _, claimed, _ = HEADER.unpack_from(view, 0)
            found = []
            for index in range(claimed):
                offset = HEADER_BYTES + index * SLOT_BYTES
                pid, held, _, waiting_since, _, _ = SLOT.unpack_from(view, offset)
                if pid and not _lock_range(fd, fcntl.F_WRLCK, offset, SLOT_BYTES):
                    found.append((pid, held, waiting_since))
            return found
    finally:
        os.close(fd)  # drops any lock taken above on a dead worker's slot


def open_ledger(path: str | None, cores: int | None = None) -> CoreLedger | None:
    """The ledger in file ``path`` (None: no ledger); None if it cannot be opened, which is logged (the worker
    then keeps a fixed thread count)."""
    if path is None:
        return None
    try:
        if not Path(path).parent.is_dir():
            raise FileNotFoundError(f"{Path(path).parent} does not exist")
        return CoreLedger(path, cores or host_cores())
    except OSError as exc:
        log.warning("cannot use the cores ledger %s (%s): this worker keeps a fixed thread count", path, exc)
        return None
