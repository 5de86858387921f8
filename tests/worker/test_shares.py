"""A worker's capacity shared by several brokers, and its jobs keyed by link (worker/shares.py)."""

from __future__ import annotations

from worker.shares import Shares
from zbatch.protocol.wire import Reply, Request, Status


def request(job_id: bytes, items: int = 1) -> Request:
    return Request(job_id, "m", items, b"P")


def registered(links: int, capacity: int) -> Shares:
    shares = Shares.of(links, capacity)
    for index in range(links):
        shares.set_registered(index, True)
    return shares


def test_registered_brokers_split_the_capacity_the_first_ones_taking_the_remainder() -> None:
    shares = registered(3, 8)
    assert [shares.share(i) for i in range(3)] == [3, 3, 2]
    shares.set_registered(1, False)
    assert [shares.share(i) for i in range(3)] == [4, 0, 4]
    assert shares.share(1, registering=True) == 3  # what READY announces before it registers


def test_a_lost_brokers_share_moves_to_the_others_as_its_work_ends() -> None:
    shares = registered(2, 8)
    held = shares.admit(0, request(b"j", 3))
    assert isinstance(held, Request)
    shares.set_registered(0, False)
    assert shares.orphan(0) == [held.request_id]
    assert shares.share(1) == 5
    assert shares.route(Reply(held.request_id, Status.CANCELLED)) is None  # its broker gave it up
    assert shares.share(1) == 8


def test_replies_go_back_over_their_link_under_the_brokers_job_id() -> None:
    shares = registered(2, 8)
    first = shares.admit(0, request(b"same"))
    second = shares.admit(1, request(b"same"))
    assert isinstance(first, Request) and isinstance(second, Request)
    assert first.request_id != second.request_id  # job ids are scoped to a link
    assert shares.route(Reply(second.request_id, Status.OK)) == (1, Reply(b"same", Status.OK), False)
    assert shares.route(Reply(first.request_id, Status.OK)) == (0, Reply(b"same", Status.OK), False)
    assert shares.held == 0


def test_work_past_the_capacity_is_declined_unless_the_worker_holds_nothing() -> None:
    shares = registered(2, 4)
    assert isinstance(shares.admit(0, request(b"big", 6)), Request)  # alone: as one broker would send it
    declined = shares.admit(1, request(b"more", 1))
    assert isinstance(declined, Reply) and declined.status is Status.DECLINED and "full" in declined.message
    assert shares.held == 6


def test_changed_shares_are_announced_once() -> None:
    shares = Shares.of(2, 8)
    shares.set_registered(0, True)
    assert shares.changed() == [0] and shares.changed() == []
    shares.set_registered(1, True)
    assert shares.changed() == [0, 1]


def test_one_broker_sees_the_worker_as_before() -> None:
    shares = Shares.of(1, 4)
    assert shares.share(0) == 4 and not shares.several
    admitted = shares.admit(0, request(b"j", 9))
    assert isinstance(admitted, Request) and admitted.request_id == b"j"
    assert isinstance(shares.admit(0, request(b"k", 9)), Request)  # never declined
    assert shares.orphan(0) == []
    assert shares.route(Reply(b"j", Status.OK)) == (0, Reply(b"j", Status.OK), False)
    assert shares.route(Reply(b"unknown", Status.OK)) == (0, Reply(b"unknown", Status.OK), False)
