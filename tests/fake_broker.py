"""FAKE FAULT for tests: the real broker daemon, whose socket pump fails on one marker message.

Nothing a peer can send makes the real broker's pump raise (the hostile tests
try), so ``python -m tests.fake_broker`` runs the real ``zbatch-broker`` with
the same flags, except that a client message whose request id is
:data:`BREAK_PUMP_ID` raises in the pump, as a bug in the routing would.
"""

from __future__ import annotations

from broker.__main__ import main
from broker.server import BrokerServer

BREAK_PUMP_ID = b"FAKE: break the pump"
_from_client = BrokerServer._from_client


def _from_client_or_break(self: BrokerServer, frames: list[bytes]) -> None:
    if len(frames) > 2 and frames[2] == BREAK_PUMP_ID:  # routing id, header, request id, ...
        raise RuntimeError("FAKE: a bug in the routing")
    _from_client(self, frames)


if __name__ == "__main__":
    BrokerServer._from_client = _from_client_or_break  # type: ignore[method-assign]
    main()
