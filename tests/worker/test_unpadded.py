"""On an accelerator, whether a batch runs packed: the start's timings of both ways, and the choice per batch.

No accelerator here: the choice is pure arithmetic on timings, and a runner of the default model on the CPU
stands in for one (buckets and the one-call packer set, as ``--unpadded-attention auto`` on CUDA sets them;
torch runs the same code on both), with stand-in graphs where CUDA graphs would be.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.worker.test_shapes import StandInGraphs
from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, embeddings, load_runner
from worker.runners.packing import PackedBert
from worker.runners.shapes import Buckets
from worker.runners.spec import InputError
from worker.runners.text import Planned
from worker.runners.unpadded import PassTimings, fit_packed, packing_pays

BUCKETS = Buckets(max_length=64, max_rows=4)
TIMINGS = PassTimings({(2, 64): 0.0025, (1, 64): 0.0014, (2, 16): 0.0012, (4, 64): 0.003}, 0.001, 1e-5)
TEXTS = ["hi", "a short sentence", "a much longer sentence that would pad every short one in its batch " * 3]


def test_the_packed_line_is_fitted_through_its_timings() -> None:
    fixed, per_token = fit_packed([(16, 0.00116), (128, 0.00228), (512, 0.00612)]) or (0.0, 0.0)
    assert fixed == pytest.approx(0.001, rel=1e-6) and per_token == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.parametrize("points", [[(16, 0.002), (512, 0.002)], [(16, 0.003), (512, 0.002)], [(64, 0.002)] * 3,
                                    []])
def test_timings_that_do_not_rise_with_the_tokens_pack_nothing(points: list[tuple[int, float]]) -> None:
    assert fit_packed(points) is None


@pytest.mark.parametrize(("lengths", "budget", "packs"), [
    ([10, 60], 0, True),  # 1.7 ms packed against 2.5 ms in the (2, 64) bucket
    ([60], 0, False),  # 1.6 ms packed against 1.4 ms: one input has no padding to save
    ([10, 60, 5, 5], 0, True),  # four rows in the 4-row bucket: 3 ms padded, 1.8 ms packed
    ([10, 60, 5], 128, True),  # padded within 128 tokens: (2, 16) and (1, 64), 2.6 ms; packed at once, 1.75 ms
    ([10, 60, 5], 64, False),  # packed within 64 tokens: three passes, 3.75 ms
])
def test_a_batch_packs_where_its_timings_say_it_wins(lengths: list[int], budget: int, packs: bool) -> None:
    assert packing_pays(lengths, BUCKETS, TIMINGS, budget, budget or None) is packs


def test_an_untimed_bucket_or_no_timings_never_pack() -> None:
    assert not packing_pays([10, 60], BUCKETS, PassTimings({}, 0.0, 1e-9), 0, None), "a guess never packs"
    assert not packing_pays([10, 60], BUCKETS, None, 0, None)
    assert not packing_pays([], BUCKETS, TIMINGS, 0, None)


@pytest.fixture(scope="module")
def loaded() -> embeddings.EmbeddingRunner:
    runner = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path(), device="cpu"))
    assert isinstance(runner, embeddings.EmbeddingRunner)
    return runner


@pytest.fixture
def stand_in(loaded: embeddings.EmbeddingRunner, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        embeddings.EmbeddingRunner]:
    """The loaded runner as on an accelerator with unpadded attention, for one test."""
    monkeypatch.setattr(loaded, "buckets", Buckets(max_length=128, max_rows=4))
    monkeypatch.setattr(loaded, "_packer", PackedBert(loaded._model, one_call=True))
    monkeypatch.setattr(loaded, "_pass_timings", None)
    monkeypatch.setattr(loaded, "_graphs", StandInGraphs(captures=True))
    yield loaded


def test_warm_up_times_every_captured_bucket_both_ways_after_the_capture(
        stand_in: embeddings.EmbeddingRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass really runs; the seconds it reports are made up from its shape (a busy host's real ones are
    noise, and what is tested is which passes are timed and what is kept of them)."""
    events: list[str] = []
    graphs = stand_in._graphs
    assert isinstance(graphs, StandInGraphs)
    capture, timed = graphs.capture, stand_in._timed

    def made_up(planned: Planned) -> float:
        timed(planned)
        events.append("packed" if planned.packed else "padded")
        ((_, arrays),) = planned.groups
        tokens = int(arrays["input_ids"].size)
        return 0.001 + 1e-5 * tokens if planned.packed else 0.002 + 1e-6 * tokens

    monkeypatch.setattr(graphs, "capture", lambda shapes: (events.append("capture"), capture(shapes)))
    monkeypatch.setattr(stand_in, "_timed", made_up)
    stand_in.warm_up()
    after = events[events.index("capture") + 1:]
    assert after.count("padded") == after.count("packed") == 2 * len(graphs.asked), "twice each way, after it"
    timings = stand_in._pass_timings
    assert timings is not None
    assert timings.padded == {(rows, length): 0.002 + 1e-6 * rows * length for rows, length in graphs.asked}
    assert (timings.packed_fixed_s, timings.packed_per_token_s) == (pytest.approx(0.001), pytest.approx(1e-5))


@pytest.mark.parametrize("packed_wins", [True, False])
def test_each_batch_runs_the_way_its_timings_choose_and_gives_the_same_vectors(
        stand_in: embeddings.EmbeddingRunner, packed_wins: bool) -> None:
    buckets = stand_in.buckets
    assert buckets is not None
    encodings = stand_in.encode(TEXTS, {})
    lengths = [each.length for each in encodings if not isinstance(each, InputError)]
    bucket = (buckets.rows(len(lengths)), buckets.length(max(lengths)))
    packed = 0.001 + 1e-5 * sum(lengths)
    stand_in._pass_timings = PassTimings({bucket: packed * (2.0 if packed_wins else 0.5)}, 0.001, 1e-5)
    planned = stand_in.plan(encodings, {})
    assert planned.packed is packed_wins
    if not packed_wins:
        assert planned.groups[0][1]["input_ids"].shape == bucket, "padded to its bucket"
    outputs = stand_in.run_planned(planned)
    stand_in._packer = None  # the reference: every batch padded
    for want, got in zip(stand_in.run_planned(stand_in.plan(encodings, {})), outputs, strict=True):
        assert float(np.dot(want, got) / np.linalg.norm(want) / np.linalg.norm(got)) >= 0.9999


def test_a_packer_that_fails_on_the_device_leaves_every_batch_padded(
        stand_in: embeddings.EmbeddingRunner, caplog: pytest.LogCaptureFixture) -> None:
    """A fake: a packer that raises, as one attention call over a jagged tensor might on some accelerator."""
    def fails(*_: Any) -> Any:
        raise RuntimeError("no kernel for a jagged tensor here")

    stand_in._packer = fails  # type: ignore[assignment]
    stand_in.warm_up()
    assert stand_in._packer is None and stand_in._pass_timings is None
    assert "every batch runs padded" in caplog.text
    assert not stand_in.plan(stand_in.encode(TEXTS, {}), {}).packed
