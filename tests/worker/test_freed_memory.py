"""A worker keeps the memory one batch frees for the next, instead of faulting it back in page by page.

Real workers run the same batch of 32 long texts over and over; the kernel's count of the worker's minor page
faults shows whether each batch's activations came back from the system again.  Their model is a BERT of the
default model's widths (12 heads, a 1,536-wide feed-forward, 256 tokens) with two narrow layers: the default
model's activations, at a small part of its arithmetic.  The workers run torch: ONNX Runtime (``--runtime auto`` on
the CPU) keeps its own arena whatever glibc does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemons import Daemons, start_broker, start_worker
from tests.slow_peers import minor_faults
from tests.worker.tiny_models import WORDS, make_tiny_bert
from zbatch import Client
from zbatch.runtime.memory import users_own_choice

# 32 texts that truncate at 256 tokens: one batch's feed-forward activations (8,192 tokens x 1,536) and attention
# maps take 50 to 100 MiB, beyond glibc's largest mmap threshold (32 MiB), so with --freed-memory return glibc maps
# and unmaps them on every batch.
LONG_TEXTS = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(300)) for i in range(32)]
SHAPE = {"hidden_size": 96, "num_attention_heads": 12, "intermediate_size": 1536, "num_hidden_layers": 2}
MODEL = "wide"
REPEATS = 3


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_bert(tmp_path_factory.mktemp("models"), "feature-extraction", max_length=256, **SHAPE)


def faults_per_batch(log_dir: Path, model: str, freed_memory: str) -> float:
    """The worker's minor faults per batch once warm, with ``--freed-memory freed_memory``."""
    (log_dir / freed_memory).mkdir()
    with Daemons(log_dir / freed_memory) as daemons:
        broker = daemons.add(start_broker(daemons.log_dir))
        worker = daemons.add(start_worker(broker, daemons.log_dir, "w", workers=1, freed_memory=freed_memory,
                                          runtime="torch", model_path=model, model_name=MODEL))
        with Client(broker.frontend) as client:
            client.infer(MODEL, LONG_TEXTS)  # warm: the first batch of this size faults in either way
            before = minor_faults(worker.process.pid)
            for _ in range(REPEATS):
                assert len(client.infer(MODEL, LONG_TEXTS)) == len(LONG_TEXTS)
            return (minor_faults(worker.process.pid) - before) / REPEATS


def test_a_batch_reuses_the_memory_the_last_one_freed(log_dir: Path, wide_model: str) -> None:
    returned = faults_per_batch(log_dir, wide_model, "return")
    kept = faults_per_batch(log_dir, wide_model, "keep")
    assert returned > 10_000, f"return faulted only {returned:.0f} pages a batch: the batch is too small"
    assert kept < returned / 10, f"kept: {kept:.0f} faults a batch, against {returned:.0f} with return"


def test_the_users_own_malloc_settings_win() -> None:
    assert users_own_choice({}) == ""
    assert users_own_choice({"MALLOC_ARENA_MAX": "2"}) == "MALLOC_ARENA_MAX"
    assert users_own_choice({"OMP_NUM_THREADS": "2", "LD_PRELOAD": "libfoo.so"}) == ""
    assert users_own_choice({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    assert users_own_choice({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=8"}) == "GLIBC_TUNABLES"
    assert users_own_choice({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == "LD_PRELOAD"
