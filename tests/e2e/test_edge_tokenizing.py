"""Tokenizing at the edge (zbatch/client/tokenizing.py: the gateway's ``edge_tokenize``, the client's ``tokenize``)
through real daemons serving the default model: once the gateway or the client has its tokenizer, requests leave it
as token ids and come back with the vectors and token counts the worker gives the same texts; a gateway with the
setting off never fetches one; workers that lie about their tokenizer are not believed; a model whose tokenizer
changes under its name is answered throughout; and every request is answered."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemons import Daemon, broker_stats, http_json, start_broker, start_worker, wait_for_worker, wait_until
from tests.e2e.vectors import cosine
from worker.runners import DEFAULT_MODEL_NAME
from zbatch import AsyncClient
from zbatch.hub import bundled_model_path
from zbatch.protocol import payloads
from zbatch.protocol.messages import Reply
from zbatch.protocol.wire import Status
from zbatch.testing import daemon_env, start_http

MODEL = DEFAULT_MODEL_NAME
FETCHED = "texts are tokenized in the gateway from now on"  # zbatch/client/tokenizing.py's log lines
NOT_FETCHED = "could not be fetched"
NO_TOKENIZERS = "the tokenizers package cannot be imported here"
REFUSED = "a worker refused ids made with tokenizer"
ALL_LINES = 1_000_000
LONG = "the quick brown fox jumps over the lazy dog " * 60 + "and that is the end"
TEXTS = ["hello world", "Ünïcödé café 東京 and a DOG", "a sentence about token ids travelling as arrays", LONG]
PARAMETERS: list[dict[str, Any]] = [{}, {"truncation_direction": "left"}, {"dimensions": 64, "normalize": False}]
LIARS = {"liar-sends-another": "MisfingerprintedTokenizer", "liar-sends-garbage": "UnreadableTokenizer"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Daemon]]:
    """A broker; a worker of the default model and two FAKE peers, workers of it that announce a tokenizer and then
    send another one, or one that is not a tokenizer at all (tests/faults.py); a gateway that tokenizes at the edge
    and one that does not."""
    log_dir: Path = tmp_path_factory.mktemp("edge")
    daemons: dict[str, Daemon] = {}
    try:
        daemons["broker"] = broker = start_broker(log_dir)
        daemons["w1"] = start_worker(broker, log_dir, "w1", wait=False)
        for name, runner in LIARS.items():
            daemons[name] = start_worker(broker, log_dir, name, task=f"python:tests.faults:{runner}", model_name=name)
        wait_for_worker(broker, daemons["w1"])
        for name, edge in (("edge", True), ("plain", False)):  # a log file each
            daemons[name] = start_http("gateway", name, log_dir, frontend=broker.frontend, processes=1,
                                       edge_tokenize=edge)
        daemons["no-tokenizers"] = start_http("gateway", "no-tokenizers", log_dir, frontend=broker.frontend,
                                              processes=1, edge_tokenize=True, env=without_tokenizers(log_dir))
        yield daemons
    finally:
        for daemon in reversed(daemons.values()):
            daemon.stop()


def without_tokenizers(folder: Path) -> dict[str, str]:
    """An environment where ``import tokenizers`` fails, as on a gateway host installed without the package: a FAKE
    ``tokenizers`` first on the path that raises ImportError (uninstalling the real one would touch the suite's
    environment)."""
    fake = folder / "no-tokenizers" / "tokenizers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('FAKE: no tokenizers package on this host')\n")
    return {"PYTHONPATH": os.pathsep.join([str(fake.parent), daemon_env()["PYTHONPATH"]])}


def embeddings(gateway: Daemon, model: str, texts: list[str], **parameters: Any) -> tuple[np.ndarray, int]:
    """The texts' vectors through the gateway's native route, and the tokens it says they took."""
    status, headers, body = http_json(f"{gateway.url}/models/{model}", {"inputs": texts, "parameters": parameters})
    assert status == 200, body
    return np.asarray(body, dtype=np.float32), int(headers["X-Tokens"])


def as_texts(broker: Daemon, model: str, texts: list[str], **parameters: Any) -> tuple[np.ndarray, int]:
    """The same, as the worker answers the texts themselves (straight to the broker: nothing tokenizes before)."""
    async def ask() -> Reply:
        async with AsyncClient(broker.frontend) as client:
            body = payloads.encode_payload({"inputs": texts, "parameters": parameters})
            return await client.request(model, body, items=len(texts), timeout_ms=60_000)

    reply = asyncio.run(ask())
    assert reply.status is Status.OK, reply.message
    answer = payloads.decode_payload(reply.payload)
    return np.asarray(answer["outputs"], dtype=np.float32), sum(answer["tokens"])


def cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [cosine(x, y) for x, y in zip(a, b, strict=True)]


def wait_for_line(gateway: Daemon, model: str, line: str) -> None:
    """Send requests for ``model`` until the gateway's log has ``line`` (the first request starts the fetch)."""
    def logged() -> bool:
        embeddings(gateway, model, ["a request while the tokenizer is fetched"])
        return line in gateway.log(ALL_LINES)

    wait_until(logged, 60, f"the gateway to log {line!r} for {model}")


def test_the_gateway_tokenizes_and_answers_as_the_worker_does_with_texts(stack: dict[str, Daemon]) -> None:
    gateway, broker = stack["edge"], stack["broker"]
    wait_for_line(gateway, MODEL, f"model {MODEL}: {FETCHED}")
    for parameters in ({}, {"truncation_direction": "left"}, {"dimensions": 64, "normalize": False}):
        got, tokens = embeddings(gateway, MODEL, TEXTS, **parameters)
        want, want_tokens = as_texts(broker, MODEL, TEXTS, **parameters)
        assert min(cosines(got, want)) >= 0.9999 and tokens == want_tokens
        assert parameters.get("normalize", True) or not np.allclose(np.linalg.norm(got, axis=1), 1.0)
    status, _, body = http_json(f"{gateway.url}/models/{MODEL}", {"inputs": [TEXTS[0], LONG],
                                                                   "parameters": {"truncate": False}})
    assert status == 400 and "tokens and the model takes at most 256" in body["error"]["message"], body
    status, _, body = http_json(f"{gateway.url}/v1/embeddings", {"model": MODEL, "input": TEXTS})
    assert status == 200 and body["usage"]["prompt_tokens"] == as_texts(broker, MODEL, TEXTS)[1]


def test_a_gateway_with_the_setting_off_never_fetches_a_tokenizer(stack: dict[str, Daemon]) -> None:
    """The edge gateway logs its fetch after its first request or two; twenty answered here would have let it land."""
    gateway = stack["plain"]
    for _ in range(20):
        embeddings(gateway, MODEL, TEXTS[:2])
    assert FETCHED not in gateway.log(ALL_LINES) and NOT_FETCHED not in gateway.log(ALL_LINES)


def test_a_gateway_that_cannot_import_tokenizers_says_why_once_fetches_nothing_and_sends_texts(
        stack: dict[str, Daemon]) -> None:
    """Each request would otherwise start a fetch of the whole tokenizer from a worker, only to fail to load it;
    a fetch that failed after the transfer would log ``could not be fetched``."""
    gateway, broker = stack["no-tokenizers"], stack["broker"]
    wait_for_line(gateway, MODEL, NO_TOKENIZERS)
    for _ in range(10):
        got, tokens = embeddings(gateway, MODEL, TEXTS)
    want, want_tokens = as_texts(broker, MODEL, TEXTS)
    assert min(cosines(got, want)) >= 0.9999 and tokens == want_tokens
    log = gateway.log(ALL_LINES)
    assert log.count(NO_TOKENIZERS) == 1 and "FAKE: no tokenizers package" in log, log[-3000:]
    assert NOT_FETCHED not in log and FETCHED not in log and "Task exception was never retrieved" not in log


def test_a_worker_that_lies_about_its_tokenizer_is_not_believed(stack: dict[str, Daemon]) -> None:
    gateway, broker = stack["edge"], stack["broker"]
    for model in LIARS:
        wait_for_line(gateway, model, f"model {model}: its tokenizer")
        got, tokens = embeddings(gateway, model, TEXTS)
        want, want_tokens = as_texts(broker, model, TEXTS)
        assert min(cosines(got, want)) >= 0.9999 and tokens == want_tokens
    lines = gateway.log(ALL_LINES).splitlines()
    assert not [line for line in lines if FETCHED in line and "liar" in line]

    def why(model: str) -> str:
        (warning,) = {line.split(NOT_FETCHED)[1] for line in lines if f"model {model}: its tokenizer" in line}
        return warning

    assert why("liar-sends-another").startswith(" (the worker sent a tokenizer other than the one it announced)")
    assert why("liar-sends-garbage").startswith(" (the tokenizer cannot be read")


def changed_tokenizer(folder: Path) -> str:
    """The bundled model with one token added to its tokenizer: another fingerprint, and the same ids and vectors for
    these texts (a model whose tokenizer changed under its name, as a rolling upgrade brings)."""
    from tokenizers import Tokenizer

    source, target = Path(bundled_model_path()), folder / "changed-tokenizer"
    target.mkdir()
    for item in source.iterdir():
        if item.name != "tokenizer.json":
            (target / item.name).symlink_to(item)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_tokens(["zbatchrollingupgrade"])
    tokenizer.save(str(target / "tokenizer.json"))
    return str(target)


def announced(broker: Daemon, model: str) -> str | None:
    """The fingerprint of the tokenizer ``model``'s workers announce, as the broker's STATS say."""
    stats = broker_stats(broker.frontend) or {}
    fingerprint = stats.get("models", {}).get(model, {}).get("info", {}).get("tokenizer")
    return fingerprint if isinstance(fingerprint, str) else None


def swap_tokenizer(broker: Daemon, old: Daemon, folder: Path, model: str) -> Daemon:
    """Stop ``old`` and start a worker of ``model`` whose tokenizer differs; returns it once it alone serves."""
    old.stop()
    new = start_worker(broker, folder, f"{model}-new", model_path=changed_tokenizer(folder), model_name=model,
                       workers=1)

    def alone() -> bool:
        stats = broker_stats(broker.frontend) or {}
        return bool(stats.get("models", {}).get(model, {}).get("workers") == 1)
    wait_until(alone, 30, f"the new worker alone to serve {model}")
    return new


def test_the_gateway_answers_a_model_whose_tokenizer_changed_under_its_name(stack: dict[str, Daemon],
                                                                            tmp_path: Path) -> None:
    """Its catalog names the old tokenizer for a while: the ids it makes are refused, and the texts answered."""
    gateway, broker, model = stack["edge"], stack["broker"], "rolling-gateway"
    old = start_worker(broker, tmp_path, f"{model}-old", model_name=model, workers=1)
    new = None
    try:
        fingerprint = wait_until(lambda: announced(broker, model), 30, f"{model}'s tokenizer in STATS")
        wait_for_line(gateway, model, f"{FETCHED} (tokenizer {fingerprint})")  # for this model, or the default
        new = swap_tokenizer(broker, old, tmp_path, model)
        want, want_tokens = as_texts(broker, model, TEXTS)
        for _ in range(5):
            got, tokens = embeddings(gateway, model, TEXTS)  # each answered 200
            assert min(cosines(got, want)) >= 0.9999 and tokens == want_tokens
        assert gateway.log(ALL_LINES).count(f"model {model}: {REFUSED}") == 1
    finally:
        for worker in (old, new):
            if worker is not None:
                worker.stop()


def test_a_client_that_tokenizes_answers_as_the_worker_does_and_through_a_tokenizer_change(
        stack: dict[str, Daemon], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broker, model = stack["broker"], "rolling-client"
    caplog.set_level("INFO", logger="zbatch.client")
    old = start_worker(broker, tmp_path, f"{model}-old", model_name=model, workers=1)
    new = None
    try:
        async def until_tokenizing(client: AsyncClient) -> None:
            """Requests, each awaited, until the client logs that it tokenizes: it learns the fingerprint from STATS,
            then fetches the tokenizer, both started by requests."""
            deadline = time.monotonic() + 60
            while f"model {model}: texts are tokenized in this client from now on" not in caplog.text:
                assert time.monotonic() < deadline, f"the client never tokenized: {caplog.text[-2000:]}"
                await client.infer(model, ["a request while the tokenizer is fetched"])

        async def scenario() -> tuple[list[Any], list[Any]]:
            nonlocal new
            async with AsyncClient(broker.frontend, tokenize=True) as client:
                await until_tokenizing(client)
                async with AsyncClient(broker.frontend, tokenize=True) as eager:
                    assert await eager.prepare_tokenizer(model) and not await eager.prepare_tokenizer("no-such-model")
                async with AsyncClient(broker.frontend) as plain:
                    assert not await plain.prepare_tokenizer(model)
                before = [await client.infer(model, TEXTS, parameters) for parameters in PARAMETERS]
                new = await asyncio.to_thread(swap_tokenizer, broker, old, tmp_path, model)
                after = [await client.infer(model, TEXTS, parameters) for parameters in PARAMETERS]
                return before, after

        before, after = asyncio.run(scenario())
        for answers in (before, after):
            for got, parameters in zip(answers, PARAMETERS, strict=True):
                want, _ = as_texts(broker, model, TEXTS, **parameters)
                assert min(cosines(np.asarray(got, dtype=np.float32), want)) >= 0.9999
        assert caplog.text.count(f"model {model}: {REFUSED}") == 1
    finally:
        for worker in (old, new):
            if worker is not None:
                worker.stop()
