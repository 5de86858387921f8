"""EmbeddingRunner.set_length_grouping: off, every batch runs as one padded pass, with the same embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from worker.runners import DEFAULT_MODEL_NAME, ModelSpec, default_model_path, embeddings, load_runner
from worker.runners.grouping import CostModel, plan_groups

TEXTS = ["hi", "a short sentence", "a much longer sentence that pads every short one in its batch " * 4] * 4


@pytest.fixture(scope="module")
def runner() -> embeddings.EmbeddingRunner:
    loaded = load_runner(ModelSpec(DEFAULT_MODEL_NAME, default_model_path()))
    assert isinstance(loaded, embeddings.EmbeddingRunner)
    return loaded


def test_off_runs_one_padded_pass_and_on_again_packs(
        runner: embeddings.EmbeddingRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the default model packs (worker.runners.packing); off, it runs as plain serving code does."""
    plans: list[tuple[CostModel, int]] = []

    def spy(lengths: Sequence[int], model: CostModel) -> list[list[int]]:
        groups = plan_groups(lengths, model)
        plans.append((model, len(groups)))
        return groups

    monkeypatch.setattr("worker.runners.text.plan_groups", spy)
    packed = runner.run(TEXTS, {})
    assert runner.plan(runner.encode(TEXTS, {}), {}).packed
    runner.set_length_grouping(False)
    try:
        assert not runner.plan(runner.encode(TEXTS, {}), {}).packed
        one_pass = runner.run(TEXTS, {})
        one_pass_seconds = runner.modelled_seconds
    finally:
        runner.set_length_grouping(True)
    again = runner.run(TEXTS, {})
    assert [count for _, count in plans] == [1, 1], "off: one padded pass; on: no length groups to plan"
    if runner.cost_model.seconds_per_token:
        assert one_pass_seconds > 0, "off, the thread governor still gets the pass's modelled time"
    for want, got, back in zip(packed, one_pass, again, strict=True):
        assert np.abs(want - got).max() < 1e-5
        assert np.abs(want - back).max() < 1e-5
