"""The sender's rules for token ids (zbatch/client/tokenizing.py, rule 4), with the bundled model's real tokenizer
and a FAKE send that answers as a worker would: ids refused while the texts pass teach the sender to send texts for a
while; a request refused either way teaches nothing; ids answered are sent once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import numpy as np

from zbatch.client import AsyncClient, tokenizing
from zbatch.client.catalog import ModelCatalog
from zbatch.client.tokenizing import RETRY_S, TimeLeft, Tokenizers, send_tokenized
from zbatch.hub import bundled_model_path
from zbatch.protocol.messages import Reply
from zbatch.protocol.wire import Status

MODEL, FINGERPRINT = "m", "0123456789abcdef"
TEXTS = ["hello world", "a second text"]


class FakeWorker:
    """A FAKE send: records the form each request came in, and answers ids or texts with the status set for each."""

    def __init__(self, ids: Status, texts: Status) -> None:
        self.answers = {"ids": ids, "texts": texts}
        self.forms: list[str] = []

    async def __call__(self, inputs: list[Any], parameters: dict[str, Any]) -> Reply:
        form = "texts" if all(isinstance(item, str) for item in inputs) else "ids"
        assert (form == "ids") == ("tokenized_by" in parameters)
        self.forms.append(form)
        return Reply(b"r", self.answers[form], f"{form} answered")


def sender(now: list[float]) -> tuple[Tokenizers, ModelCatalog]:
    """Tokenizers holding the bundled tokenizer as FINGERPRINT (as if fetched), and a catalog that names it."""
    from tokenizers import Tokenizer

    tokenizers = Tokenizers(lambda: now[0], where="this test")
    serialized = (Path(bundled_model_path()) / "tokenizer.json").read_text()
    tokenizers._ready[FINGERPRINT] = tokenizing._loaded(Tokenizer, serialized)  # as a fetch leaves it
    catalog = ModelCatalog(lambda: now[0])
    catalog.update({"models": {MODEL: {"workers": 1, "info": {"tokenizer": FINGERPRINT}}}})
    return tokenizers, catalog


def send(tokenizers: Tokenizers, catalog: ModelCatalog, worker: FakeWorker) -> Reply:
    client = cast(AsyncClient, None)  # nothing is fetched or refreshed: the tokenizer is held and the catalog fresh
    return asyncio.run(send_tokenized(tokenizers, catalog, client, MODEL, list(TEXTS), {}, worker))


def test_ids_answered_are_sent_once_and_are_the_tokenizers_own() -> None:
    tokenizers, catalog = sender([0.0])
    worker = FakeWorker(Status.OK, Status.OK)
    assert send(tokenizers, catalog, worker).status is Status.OK and worker.forms == ["ids"]
    tokenized = tokenizers.tokenized(cast(AsyncClient, None), MODEL, FINGERPRINT, list(TEXTS), {})
    assert tokenized is not None
    ids, parameters = tokenized
    assert parameters == {"tokenized_by": FINGERPRINT} and ids[0].dtype == np.int32
    assert ids[0].tolist() == [101, 7592, 2088, 102]  # [CLS] hello world [SEP]


def test_ids_refused_where_the_texts_pass_send_texts_until_the_retry_time() -> None:
    now = [100.0]
    tokenizers, catalog = sender(now)
    worker = FakeWorker(Status.BAD_REQUEST, Status.OK)
    reply = send(tokenizers, catalog, worker)
    assert reply.status is Status.OK and reply.message == "texts answered" and worker.forms == ["ids", "texts"]
    now[0] += RETRY_S - 1
    catalog.update({"models": {MODEL: {"workers": 1, "info": {"tokenizer": FINGERPRINT}}}})
    assert send(tokenizers, catalog, worker).status is Status.OK and worker.forms[2:] == ["texts"]
    now[0] += 2
    catalog.update({"models": {MODEL: {"workers": 1, "info": {"tokenizer": FINGERPRINT}}}})
    send(tokenizers, catalog, worker)
    assert worker.forms[3:] == ["ids", "texts"]  # tried again after RETRY_S, and refused again


def test_a_request_refused_as_ids_and_as_texts_gets_the_texts_answer_and_teaches_nothing() -> None:
    tokenizers, catalog = sender([0.0])
    worker = FakeWorker(Status.BAD_REQUEST, Status.BAD_REQUEST)
    reply = send(tokenizers, catalog, worker)
    assert reply.status is Status.BAD_REQUEST and reply.message == "texts answered"
    send(tokenizers, catalog, worker)
    assert worker.forms == ["ids", "texts", "ids", "texts"]


def test_other_refusals_of_ids_are_not_sent_again() -> None:
    """An overloaded or lost answer is about the moment, not the form: the caller's own rules apply to it."""
    tokenizers, catalog = sender([0.0])
    worker = FakeWorker(Status.OVERLOADED, Status.OK)
    assert send(tokenizers, catalog, worker).status is Status.OVERLOADED and worker.forms == ["ids"]


def test_a_text_the_tokenizer_cannot_take_goes_as_text_for_the_worker_to_judge() -> None:
    """A lone surrogate makes the tokenizer raise; the request goes once, as the caller gave it."""
    tokenizers, catalog = sender([0.0])
    worker = FakeWorker(Status.OK, Status.BAD_REQUEST)
    client = cast(AsyncClient, None)
    reply = asyncio.run(send_tokenized(tokenizers, catalog, client, MODEL, ["a\ud800b"], {}, worker))
    assert reply.status is Status.BAD_REQUEST and worker.forms == ["texts"]


def test_a_second_send_gets_what_is_left_of_the_callers_time() -> None:
    now = [50.0]
    given = TimeLeft(2_000, 30_000, lambda: now[0])
    assert given.next_ms() == 2_000
    now[0] += 0.5
    assert given.next_ms() == 1_500
    now[0] += 5
    assert given.next_ms() == 1  # past it: the broker answers deadline_exceeded at once
    default = TimeLeft(None, 30_000, lambda: now[0])
    assert default.next_ms() is None  # the broker's default, as for any request
    now[0] += 1
    assert default.next_ms() == 29_000
