"""A worker of several brokers: each broker's share of the capacity, and which broker each job came from.

Theory of operation
-------------------
The worker holds at most its capacity in items, whichever brokers sent them
(PROTOCOL.md 6.6).  Each broker connection (a *link*, by index) has a share:
the registered links split evenly what the unregistered links' work leaves
free; an unregistered link (silent, gone, not yet registered) gets 0, and
the work it sent keeps its items until that work ends, so a dead broker's
share moves to the others as its work finishes.  The worker announces each
share to its broker (READY, then the heartbeat's ``capacity``), and
:meth:`Shares.admit` declines a request that would take it past its capacity
anyway (shares change while requests travel).

Job ids are scoped to a link, so the worker keys its work by link and job id:
with several links a job's *local* id is the link's index byte then the
broker's job id; :meth:`Shares.route` turns each reply back into the link
and job id to answer.  Replies to work from a link that was lost are
dropped (:meth:`Shares.orphan`): that broker gave the work up, and its new
connection must not hear of it.

With one link none of this shows: the local id is the job id, the share is
the whole capacity, nothing is declined or orphaned, and no ``capacity`` is
announced, exactly as a worker of one broker behaves.

Plain state with no I/O, driven by :class:`worker.server.WorkerServer`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from zbatch.protocol.wire import Reply, Request, Status

DECLINED_MESSAGE = "this worker is full with other brokers' work; send it elsewhere or later"


@dataclass(slots=True)
class Link:
    registered: bool = False
    held: int = 0  # items of this link's jobs not answered yet
    announced: int | None = None  # the share its broker was last told


@dataclass(slots=True)
class _Job:
    link: int
    job_id: bytes
    items: int
    grouped: bool = False  # its broker takes the answer in a REPLIES message
    orphaned: bool = False


@dataclass
class Shares:
    capacity: int
    links: list[Link] = field(default_factory=list)
    _jobs: dict[bytes, _Job] = field(default_factory=dict)

    @classmethod
    def of(cls, links: int, capacity: int) -> Shares:
        return cls(capacity, [Link() for _ in range(links)])

    @property
    def several(self) -> bool:
        return len(self.links) > 1

    @property
    def held(self) -> int:
        return sum(link.held for link in self.links)

    def share(self, index: int, *, registering: bool = False) -> int:
        """What link ``index``'s broker may have in flight here now (``registering``: once it registers)."""
        if not self.several:
            return self.capacity
        if not (self.links[index].registered or registering):
            return 0
        live = [i for i, link in enumerate(self.links) if link.registered or i == index]
        kept = sum(link.held for i, link in enumerate(self.links) if i not in live)
        base, extra = divmod(max(0, self.capacity - kept), len(live))
        return base + (live.index(index) < extra)

    def changed(self) -> list[int]:
        """The registered links whose share differs from the one last announced; each counts as announced."""
        changed = []
        for index, link in enumerate(self.links):
            if link.registered and link.announced != self.share(index):
                changed.append(index)
        for index in changed:
            self.links[index].announced = self.share(index)
        return changed

    def announce(self, index: int) -> int:
        """The share to tell link ``index``'s broker now (recorded as told).

        A broker that hears from the worker knows it, or is about to (the READY went first):
        it gets the share it has once registered, never a passing 0.
        """
        share = self.links[index].announced = self.share(index, registering=True)
        return share

    def set_registered(self, index: int, registered: bool) -> None:
        self.links[index].registered = registered
        if not registered:
            self.links[index].announced = None

    def admit(self, index: int, request: Request) -> Request | Reply:
        """The request under its local id, or the ``declined`` reply when it would overfill the worker."""
        held = self.held
        if self.several and held and held + request.items > self.capacity:
            return Reply(request.request_id, Status.DECLINED, DECLINED_MESSAGE)
        local = self.local_id(index, request.request_id)
        if local not in self._jobs:  # a duplicate id is refused by the worker, under the first job's name
            self._jobs[local] = _Job(index, request.request_id, request.items, request.grouped)
            self.links[index].held += request.items
        return request if local == request.request_id else dataclasses.replace(request, request_id=local)

    def local_id(self, index: int, job_id: bytes) -> bytes:
        return bytes((index,)) + job_id if self.several else job_id

    def route(self, reply: Reply) -> tuple[int, Reply, bool] | None:
        """The link to answer on, the reply under the broker's job id and whether that broker takes it grouped;
        None to drop it."""
        job = self._jobs.pop(reply.request_id, None)
        if job is None:
            return (0, reply, False) if not self.several else None
        self.links[job.link].held -= job.items
        if job.orphaned:
            return None
        same = reply.request_id == job.job_id
        return job.link, reply if same else dataclasses.replace(reply, request_id=job.job_id), job.grouped

    def orphan(self, index: int) -> list[bytes]:
        """Link ``index`` was lost: its jobs' replies will be dropped; returns their local ids, to skip them."""
        if not self.several:
            return []
        orphans = [local for local, job in self._jobs.items() if job.link == index and not job.orphaned]
        for local in orphans:
            self._jobs[local].orphaned = True
        return orphans
