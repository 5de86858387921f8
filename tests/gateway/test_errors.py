"""The error table (gateway/errors.py) against the answers the gateway really gives, in process."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.errors import BROKER_ERRORS, ERRORS, HTTP_ERROR_CODES
from tests.gateway.inprocess import Answer, StubClient, call
from zbatch.client import Overloaded, ZBatchError, raise_for_status
from zbatch.protocol.wire import Reply, Status

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def infer(stub: StubClient) -> Answer:
    return call(stub, "POST", "/models/m", body=b'{"inputs": "a"}', headers={"Content-Type": "application/json"})


def test_every_client_error_has_a_code() -> None:
    assert set(BROKER_ERRORS) == {ZBatchError, *ZBatchError.__subclasses__()}


def test_only_the_gateways_own_faults_are_a_500() -> None:
    """What a worker or the broker did wrong is a 502 (or a 503 while it cannot serve): never a 500."""
    assert [code for code, error in ERRORS.items() if error.status == 500] == ["internal_error"]
    assert {ERRORS[code].status for code in ("worker_error", "worker_lost", "upstream_error")} == {502}


def test_a_status_the_gateway_does_not_know_is_a_502() -> None:
    reply = Reply(b"r", Status.CANCELLED, "skipped")  # a status no client should ever see
    with pytest.raises(ZBatchError) as raised:
        raise_for_status(reply)
    answer = infer(StubClient(raised.value))
    assert (answer.status, answer.body["error"]["code"]) == (502, "upstream_error")
    assert "cancelled" in answer.body["error"]["message"]


def test_each_status_of_an_aiohttp_refusal_has_one_code() -> None:
    statuses = [error.status for error in ERRORS.values() if error.http_exception]
    assert len(statuses) == len(set(statuses)) == len(HTTP_ERROR_CODES)


def test_every_code_the_gateway_raises_is_in_the_table() -> None:
    """Outside errors.py, whose codes come from the table itself, every ApiError names its code literally."""
    raised = set()
    for source in GATEWAY.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ApiError":
                code = node.args[0]
                if isinstance(code, ast.Constant):
                    raised.add(code.value)
                else:
                    assert source.name == "errors.py", f"{source.name}:{node.lineno}: name the code literally"
    assert raised and raised <= set(ERRORS), raised - set(ERRORS)


@pytest.mark.parametrize("error", list(BROKER_ERRORS))
def test_a_client_error_is_answered_with_its_status_and_code(error: type[ZBatchError]) -> None:
    answer = infer(StubClient(error("what the broker said")))
    assert (answer.status, answer.body["error"]["code"]) == BROKER_ERRORS[error]
    assert answer.status == ERRORS[answer.body["error"]["code"]].status
    assert answer.body["error"]["message"] == "what the broker said"
    assert ("Retry-After" in answer.headers) == (error is Overloaded)


def test_overload_says_when_to_retry_in_whole_seconds() -> None:
    answer = infer(StubClient(Overloaded("backlog full", retry_after_ms=1500)))
    assert answer.headers["Retry-After"] == "2"


def test_an_unexpected_failure_is_an_internal_error() -> None:
    answer = infer(StubClient(RuntimeError("bug")))
    assert (answer.status, answer.body["error"]["code"]) == (500, "internal_error")
    assert "bug" not in answer.body["error"]["message"]


@pytest.mark.parametrize(("method", "path", "code"), [("GET", "/nope", "not_found"),
                                                      ("DELETE", "/healthz", "method_not_allowed")])
def test_aiohttp_refusals_take_their_code_from_the_table(method: str, path: str, code: str) -> None:
    answer = call(StubClient(), method, path)
    assert answer.body["error"]["code"] == code
    assert answer.status == ERRORS[code].status
