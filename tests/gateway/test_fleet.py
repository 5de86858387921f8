"""The gateway in front of several brokers: /readyz, /models and /v1/stats ask every broker (a stand-in client)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.gateway.inprocess import CONFIG, StubClient, call
from zbatch.client import BrokerUnavailable

MODEL = CONFIG.default_model


def broker(workers: int, draining: bool = False) -> dict[str, Any]:
    listed = [{"identity": "aa", "name": "w1", "models": [MODEL], "capacity": 4}] if workers else []
    return {"draining": draining, "models": {MODEL: {"workers": workers, "requests": {"ok": 2}}}, "workers": listed}


@dataclass
class FleetStub(StubClient):
    brokers: dict[str, Any] = field(default_factory=dict)

    async def stats_by_broker(self, **options: Any) -> dict[str, Any]:
        return dict(self.brokers)


def test_ready_while_one_broker_has_a_worker_for_each_required_model() -> None:
    stub = FleetStub(brokers={"tcp://a:1": BrokerUnavailable("gone"), "tcp://b:1": broker(1)})
    answer = call(stub, "GET", "/readyz")
    assert answer.status == 200
    assert answer.body["brokers"] == {"tcp://a:1": "not answering (gone)", "tcp://b:1": "ready"}


def test_not_ready_when_no_broker_is_and_the_answer_says_why_for_each() -> None:
    stub = FleetStub(brokers={"tcp://a:1": broker(1, draining=True), "tcp://b:1": broker(0)})
    answer = call(stub, "GET", "/readyz")
    assert answer.status == 503 and answer.body["error"]["code"] == "no_worker"
    assert "tcp://a:1: draining" in answer.body["error"]["message"]
    assert f"tcp://b:1: no worker serves {MODEL}" in answer.body["error"]["message"]


def test_no_broker_answering_is_broker_unavailable() -> None:
    stub = FleetStub(brokers={"tcp://a:1": BrokerUnavailable("gone a"), "tcp://b:1": BrokerUnavailable("gone b")})
    for path in ("/readyz", "/models", "/v1/stats"):
        answer = call(stub, "GET", path)
        assert answer.status == 503 and answer.body["error"]["code"] == "broker_unavailable", path


def test_stats_keep_each_broker_and_merge_the_workers() -> None:
    stub = FleetStub(brokers={"tcp://a:1": broker(1), "tcp://b:1": broker(1)})
    stats = call(stub, "GET", "/v1/stats").body
    assert set(stats["brokers"]) == {"tcp://a:1", "tcp://b:1"}
    assert stats["models"][MODEL]["workers"] == 1 and stats["models"][MODEL]["requests"] == {"ok": 4}
    [model] = call(stub, "GET", "/models").body["models"]
    assert [w["brokers"] for w in model["workers"]] == [["tcp://a:1", "tcp://b:1"]]
