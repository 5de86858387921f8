"""The overload breaker's states, driven directly: no sockets, no clock."""

from __future__ import annotations

from zbatch.client.breaker import OverloadBreaker, Ticket

KEY = ("model", 1)


def opened() -> OverloadBreaker:
    breaker = OverloadBreaker()
    ticket = breaker.admit(KEY)
    assert ticket is Ticket.NORMAL
    breaker.settle(KEY, ticket, overloaded=True, retry_after_ms=1000)
    return breaker


def test_a_closed_breaker_sends_everything() -> None:
    breaker = OverloadBreaker()
    assert [breaker.admit(KEY) for _ in range(3)] == [Ticket.NORMAL] * 3


def test_after_an_overloaded_answer_one_probe_goes_and_the_rest_are_refused_here() -> None:
    breaker = opened()
    assert breaker.admit(KEY) is Ticket.PROBE
    assert breaker.admit(KEY) is None
    assert breaker.admit(KEY) is None
    assert breaker.retry_after_ms[KEY] == 1000


def test_a_refused_probe_lets_the_next_request_probe_again() -> None:
    breaker = opened()
    probe = breaker.admit(KEY)
    assert probe is Ticket.PROBE
    breaker.settle(KEY, probe, overloaded=True)
    assert breaker.admit(KEY) is Ticket.PROBE


def test_a_probe_that_gets_in_closes_the_breaker() -> None:
    breaker = opened()
    probe = breaker.admit(KEY)
    assert probe is Ticket.PROBE
    breaker.settle(KEY, probe, overloaded=False)
    assert breaker.is_closed(KEY)
    assert breaker.admit(KEY) is Ticket.NORMAL


def test_a_late_refusal_of_an_earlier_request_does_not_send_a_second_probe() -> None:
    breaker = opened()
    assert breaker.admit(KEY) is Ticket.PROBE
    breaker.settle(KEY, Ticket.NORMAL, overloaded=True)  # sent before the breaker opened
    assert breaker.admit(KEY) is None


def test_an_earlier_request_admitted_late_does_not_close_the_breaker() -> None:
    breaker = opened()
    breaker.settle(KEY, Ticket.NORMAL, overloaded=False)
    assert breaker.admit(KEY) is Ticket.PROBE


def test_priorities_and_models_have_their_own_breakers() -> None:
    breaker = opened()
    assert breaker.admit(("model", 0)) is Ticket.NORMAL
    assert breaker.admit(("other", 1)) is Ticket.NORMAL
