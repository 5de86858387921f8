"""Python's garbage collector once a daemon has started (zbatch/runtime/memory.py): the start's garbage collected, what
it left alive frozen out of every later collection, the young generation collected less often; still collecting."""

from __future__ import annotations

import gc
import logging
import re
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import start_broker, wait_until
from zbatch.runtime.memory import OLDER_THRESHOLDS, YOUNG_THRESHOLD, collect_off_the_hot_path


class Node:
    """A cyclic garbage candidate: refcounting alone never frees two nodes that point at each other."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    """Two nodes in a cycle, dropped at once; the reference tells whether the collector has freed them."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    return weakref.ref(first)


@pytest.fixture
def collector() -> Iterator[None]:
    """This test process's collector as it was, afterwards."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector")
def test_the_start_is_collected_then_frozen_and_the_young_generation_waits_longer() -> None:
    gc.disable()  # no collection of its own between here and the call
    try:
        start_garbage = cycle()
        kept = Node()
        frozen = collect_off_the_hot_path(logging.getLogger("test"))
    finally:
        gc.enable()
    assert start_garbage() is None, "the start's garbage is collected, not frozen"
    assert frozen == gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    assert not any(obj is kept for obj in gc.get_objects()), "what the start left alive no collection walks"
    later_garbage = cycle()
    gc.collect()
    assert later_garbage() is None, "cycles made while serving are still collected"


def test_a_daemon_freezes_its_start_once_started(log_dir: Path) -> None:
    broker = start_broker(log_dir)
    try:
        line = wait_until(lambda: re.search(r"garbage collector: the (\d+) objects alive after the start are frozen",
                                            broker.log_path.read_text()), 10, "the collector's line", broker.log)
        assert int(line[1]) > 0
    finally:
        broker.stop()
