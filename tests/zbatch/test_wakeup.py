"""The hold on this host's idle states (zbatch/runtime/wakeup.py), in this process and in a real ``zbatch serve``.

Where this process may not write Linux's PM QoS file, or the host has no cpuidle driver (a virtual machine may
have none), the holding tests skip; the refusals run everywhere, on a faked sysfs where the host lacks what they need.
A hold by another process on the host (a test beside this one) can only lower the value read, so each test
checks its own process's open file and the value 0 while it holds, never the value after.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.daemons import wait_until
from zbatch.runtime import wakeup
from zbatch.supervisor.config import load_config
from zbatch.testing import START_TIMEOUT_S, spawn_serve

log = logging.getLogger("test.wakeup")


def _may_hold() -> bool:
    """Whether this process may take the hold: it opens the file for writing (root alone may not, in a container
    whose device rules refuse it) on a host with a cpuidle driver."""
    try:
        os.close(os.open(wakeup.PM_QOS, os.O_WRONLY))
    except OSError:
        return False
    return wakeup.has_idle_driver()


may_hold = pytest.mark.skipif(not _may_hold(),
                              reason=f"{wakeup.PM_QOS} cannot be held here (not writable, or no cpuidle driver)")


def holds_pm_qos(pid: int) -> bool:
    """Whether process ``pid`` has the PM QoS file open (a descriptor closed while it is read does not count)."""
    found = False
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found = found or os.readlink(fd) == str(wakeup.PM_QOS)
        except OSError:
            continue
    return found


def test_the_idle_states_line_names_the_driver_and_each_state_with_its_wake_time() -> None:
    line = wakeup.idle_states()
    assert line.startswith("idle driver "), line
    for state in (wakeup.CPUS / "cpu0" / "cpuidle").glob("state*"):
        assert f"{(state / 'name').read_text().strip()} {(state / 'latency').read_text().strip()} µs" in line


def test_the_host_s_policy_takes_no_hold() -> None:
    with wakeup.held(wakeup.HOST_POLICY, log) as held:
        assert held is False and not holds_pm_qos(os.getpid())


@may_hold
def test_a_hold_keeps_idle_cores_polling_while_inside_and_ends_with_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, log.name), wakeup.held(0, log) as held:
        assert held and holds_pm_qos(os.getpid()) and wakeup.bound_us() == 0
    assert not holds_pm_qos(os.getpid())
    assert "holding this host's cores in idle states they leave within 0 µs" in caplog.text


def _fake_cpus(root: Path, driver: str | None) -> Path:
    """FAKE: a sysfs CPU folder whose cpuidle driver is ``driver`` (None: no cpuidle folder), with cpu0's one idle
    state listed where there is a driver; a host's idle driver cannot be changed by a test."""
    (root / "cpu0").mkdir(parents=True)
    if driver is not None:
        (root / "cpuidle").mkdir()
        (root / "cpuidle" / "current_driver").write_text(f"{driver}\n")
        if driver != "none":
            state = root / "cpu0" / "cpuidle" / "state0"
            state.mkdir(parents=True)
            (state / "name").write_text("POLL\n")
            (state / "latency").write_text("0\n")
    return root


def test_a_hold_that_cannot_be_taken_is_a_warning_saying_what_would_allow_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """FAKE: the file made absent (as in a container without it), since a root test cannot be refused it, on a host
    with an idle driver (faked too: a virtual machine may have none)."""
    monkeypatch.setattr(wakeup, "CPUS", _fake_cpus(tmp_path / "cpu", "haltpoll"))
    monkeypatch.setattr(wakeup, "PM_QOS", tmp_path / "cpu_dma_latency")
    with caplog.at_level(logging.WARNING, log.name), wakeup.held(0, log) as held:
        assert held is False and not holds_pm_qos(os.getpid())
    assert "cpu_wake_latency_us=0 is not held" in caplog.text and "run zbatch serve as root" in caplog.text


@pytest.mark.parametrize("driver", [None, "none"], ids=["no cpuidle folder", "driver none"])
def test_a_host_without_an_idle_driver_takes_no_hold_and_says_why(
        driver: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(wakeup, "CPUS", _fake_cpus(tmp_path / "cpu", driver))
    with caplog.at_level(logging.WARNING, log.name), wakeup.held(0, log) as held:
        assert held is False and not holds_pm_qos(os.getpid())
    assert "cpu_wake_latency_us=0 is not held: this host has no cpuidle driver" in caplog.text



@may_hold
def test_zbatch_serve_holds_the_cores_while_it_runs(tmp_path: Path) -> None:
    """A real ``zbatch serve`` (a broker and the gateway: no workers, so it starts at once) asked for 0 µs."""
    served = spawn_serve(tmp_path, "zbatch-serve", workers=0, processes=1, cpu_wake_latency_us=0)
    try:
        def holding() -> bool:
            served.check()
            return "holding this host's cores" in served.log_path.read_text(errors="replace")

        wait_until(holding, START_TIMEOUT_S, "zbatch serve to take the hold", served.log)
        held_by_serve, bound = holds_pm_qos(served.process.pid), wakeup.bound_us()
    finally:
        status = served.stop(60)
    assert held_by_serve and bound == 0, served.log()
    assert status == 0, served.log()


def test_a_wake_latency_past_the_kernel_s_bound_is_refused_as_a_setting() -> None:
    with pytest.raises(SystemExit):
        load_config(["--cpu-wake-latency-us", str(wakeup.MAX_WAKE_US + 1)], {})
    assert load_config(["--cpu-wake-latency-us", "0"], {}).cpu_wake_latency_us == 0
    assert load_config([], {}).cpu_wake_latency_us == wakeup.HOST_POLICY
