"""How soon an idle core wakes: a hold that keeps this host's cores out of slow idle states while a program runs.

Theory of operation
-------------------
A core with nothing to run enters an idle state, and the deeper the state the longer the core takes to leave it
when work arrives (each state's exit latency, in sysfs).  A lone request crosses several processes and threads,
and each hop hands it to a thread whose core may be idle: the client's send wakes the broker, the broker's
wakes the worker's I/O loop, which wakes its inference thread, and back.  Where cores sleep deeply, or a virtual
machine's idle vCPUs halt and wait for the host to run them again, every such hop pays a wake-up that no
profile of the daemons shows (BENCHMARKS.md, "One client's request, stage by stage").

Linux bounds it through its PM QoS file ``/dev/cpu_dma_latency``: while a process holds the file open with a
number of µs written to it, no core enters an idle state that takes longer to leave; 0 keeps idle cores polling.
That costs power while the host is idle, and it is the host's policy, so nothing holds it unless asked:
``zbatch serve --cpu-wake-latency-us N`` holds it for as long as the stack runs (:func:`held`).  Closing the file,
or the process ending, releases it.  Writing it takes root (or a file mode that allows it); the shipped systemd
units run as their own user without device access, so there it is the host's to set: a service of its own that
holds the file, or tuned's ``force_latency``.  Tuned's latency-performance profile allows idle states that take up
to a few µs to leave; on bare metal that keeps cores out of the deep ones, but a virtual machine's haltpoll idle
state takes 1 µs by its own count, so there only 0 keeps the vCPUs polling.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PM_QOS = Path("/dev/cpu_dma_latency")
CPUS = Path("/sys/devices/system/cpu")
HALT_POLL = Path("/sys/module/haltpoll/parameters")  # a KVM guest's idle driver: how long it polls before halting
HOST_POLICY = -1  # the setting's value that leaves the host's idle states as they are
MAX_WAKE_US = 2_000_000_000  # the kernel's own bound when nothing is held


def idle_states(cpu: int = 0) -> str:
    """One line: the idle driver and governor, ``cpu``'s idle states with the µs each takes to leave, and a
    virtual machine's guest halt-polling window where it has one."""
    def read(path: Path) -> str:
        return path.read_text().strip() if path.exists() else "?"

    states = []
    for state in sorted((CPUS / f"cpu{cpu}" / "cpuidle").glob("state*"), key=lambda path: int(path.name[5:])):
        disabled = read(state / "disable") == "1"
        states.append(f"{read(state / 'name')} {read(state / 'latency')} µs" + (" (disabled)" if disabled else ""))
    halt_poll = HALT_POLL / "guest_halt_poll_ns"
    return (f"idle driver {read(CPUS / 'cpuidle' / 'current_driver')}, governor "
            f"{read(CPUS / 'cpuidle' / 'current_governor_ro')}; cpu{cpu}'s idle states: "
            f"{', '.join(states) or 'none listed'}" + (f"; guest halt polling {read(halt_poll)} ns"
                                                         if halt_poll.exists() else ""))


def has_idle_driver() -> bool:
    """Whether this host's cores have idle states a PM QoS bound can limit: a cpuidle driver (not ``none``) with
    states listed for cpu0.  A virtual machine may have neither, and its idle vCPUs sleep as its hypervisor decides."""
    driver = CPUS / "cpuidle" / "current_driver"
    return (driver.exists() and driver.read_text().strip() not in ("", "none")
            and (CPUS / "cpu0" / "cpuidle").exists())


def bound_us() -> int | None:
    """The bound in force on this host's idle states (µs; :data:`MAX_WAKE_US`: none), or None where this process
    may not read it."""
    try:
        with PM_QOS.open("rb") as qos:
            value: int = struct.unpack("i", qos.read(4))[0]
    except OSError:
        return None
    return value


@contextmanager
def held(max_wake_us: int, log: logging.Logger) -> Iterator[bool]:
    """While inside, keep every core of this host in idle states it leaves within ``max_wake_us`` µs; yields
    whether the hold is on.  :data:`HOST_POLICY` asks for none; a hold this process may not take is logged as a
    warning, with what would allow it, and the program goes on without it."""
    if max_wake_us == HOST_POLICY:
        yield False
        return
    if not has_idle_driver():
        log.warning("cpu_wake_latency_us=%d is not held: this host has no cpuidle driver, so its idle cores sleep "
                    "as its kernel or hypervisor decides, and a PM QoS bound has nothing to limit", max_wake_us)
        yield False
        return
    try:
        fd = os.open(PM_QOS, os.O_WRONLY)
    except OSError as exc:
        log.warning("cpu_wake_latency_us=%d is not held: %s cannot be opened for writing (%s); run zbatch serve as "
                    "root, or set the host's own policy (tuned's force_latency)", max_wake_us, PM_QOS,
                    exc.strerror or exc)
        yield False
        return
    try:
        os.write(fd, struct.pack("i", max_wake_us))
        log.info("holding this host's cores in idle states they leave within %d µs while running (%s; %s)",
                 max_wake_us, PM_QOS, idle_states())
        yield True
    finally:
        os.close(fd)
