"""CUDA graphs of a BERT encoder's pooled embeddings, one per bucket shape: a batch costs one launch.

Theory of operation
-------------------
A small encoder on a big GPU is bound by its launches, not its arithmetic:
all-MiniLM-L6-v2 runs about a hundred kernels a pass, each launched from
Python, and at a few dozen short texts the GPU finishes each kernel before
the CPU has launched the next.  A CUDA graph records the kernels of one pass
once and replays them with a single launch.  A graph is fixed to its shapes
and its memory, so:

1. Each bucket shape (:mod:`worker.runners.shapes`) gets its own graph,
   captured at warm-up, before READY, largest first, all sharing one memory
   pool (a smaller graph reuses the larger ones' blocks: they never run at
   once).  ``--cuda-graphs auto`` captures every shape: the graphed pass
   gains most on small batches, whose time is mostly launches, and least on
   the largest (BENCHMARKS.md, GPU: CUDA graphs); ``off`` captures none.
2. The graphed pass is written here with the model's own layers and weights
   (:func:`bert_pooled`), not through transformers' forward, which builds its
   attention mask with checks that read the GPU back to the CPU: a capture
   cannot contain those.  It is the same arithmetic (tested against
   transformers' forward on the CPU), ending in the model's own pooling and
   Dense layers (:class:`~worker.runners.pooling.SentenceHead`), in float32.
3. A batch copies its arrays into the graph's input buffers, replays it,
   and reads the pooled rows back before the next replay overwrites them.
   A model whose pooling leaves a prompt's tokens out takes the pooling
   mask as one more input (the prompt's length varies with the request).
   Only the inference thread replays, one graph at a time.
4. A capture that fails (a model this does not know after all, a driver
   that refuses) leaves the model eager, with one log line: graphs are a
   speed-up, never a condition for serving.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from worker.runners.pooling import SentenceHead

log = logging.getLogger("zbatch.worker")


def graphable(model: Any) -> bool:
    """Whether :func:`bert_pooled` computes ``model``'s pass: a plain BERT encoder with absolute positions, in
    eval mode (no dropout)."""
    from transformers import BertModel

    config = model.config
    return (type(model) is BertModel and not config.is_decoder and not model.training
            and getattr(config, "position_embedding_type", "absolute") == "absolute")


def bert_pooled(model: Any, head: SentenceHead, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, pool_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's last hidden states through ``head`` (its pooling over ``pool_mask``, default the attention
    mask, and its Dense layers), ``(rows, dimensions)`` in float32, by the model's own layers: nothing in it
    reads the GPU back, so it can be captured."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    rows, length = input_ids.shape
    embeddings = model.embeddings
    positions = torch.arange(length, device=input_ids.device).expand(rows, length)
    hidden = (embeddings.word_embeddings(input_ids) + embeddings.token_type_embeddings(token_type_ids)
              + embeddings.position_embeddings(positions))
    hidden = embeddings.LayerNorm(hidden)
    dtype = hidden.dtype
    blocked = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    heads = int(model.config.num_attention_heads)
    for layer in model.encoder.layer:
        attention = layer.attention
        per_head = int(attention.self.attention_head_size)
        query, key, value = (projection(hidden).view(rows, length, heads, per_head).transpose(1, 2)
                             for projection in (attention.self.query, attention.self.key, attention.self.value))
        context = scaled_dot_product_attention(query, key, value, attn_mask=blocked)
        context = context.transpose(1, 2).reshape(rows, length, heads * per_head)
        hidden = attention.output.LayerNorm(attention.output.dense(context) + hidden)
        hidden = layer.output.LayerNorm(layer.output.dense(layer.intermediate(hidden)) + hidden)
    return head(hidden, attention_mask, pool_mask)


class GraphedPooling:
    """One captured :func:`bert_pooled` per shape, replayed for batches of that shape (rules 1 and 3)."""

    def __init__(self, model: Any, device: str, head: SentenceHead) -> None:
        self._model = model
        self._device = device
        self._head = head
        self._inputs = ("input_ids", "token_type_ids", "attention_mask",
                        *(("pool_mask",) if head.excludes_prompt else ()))
        self._graphs: dict[tuple[int, int], tuple[Any, dict[str, torch.Tensor], torch.Tensor]] = {}
        self._pool: Any = None

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    def capture(self, shapes: list[tuple[int, int]]) -> None:
        """Capture a graph for each ``(rows, length)``, largest first; on a failure, none (rule 4)."""
        import torch

        if not shapes:
            return
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                self._pool = torch.cuda.graph_pool_handle()
                for rows, length in sorted(shapes, key=lambda shape: shape[0] * shape[1], reverse=True):
                    self._graphs[(rows, length)] = self._capture(rows, length)
        except Exception as exc:
            self._graphs.clear()
            log.warning("CUDA graphs could not be captured (%s: %s); the model runs without them",
                        type(exc).__name__, exc)
            return
        log.info("CUDA graphs captured for %d shapes (up to %d rows) in %.1f s", len(shapes),
                 max(rows for rows, _ in shapes), time.perf_counter() - started)

    def pooled(self, encoded: dict[str, torch.Tensor], pool_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """The pooled rows of a padded batch by its shape's graph (valid until the next call); None without one.
        ``pool_mask``: the tokens that pool, where they are not the attention mask's."""
        entry = self._graphs.get(tuple(encoded["input_ids"].shape))  # type: ignore[arg-type]
        if entry is None:
            return None
        graph, inputs, output = entry
        inputs["input_ids"].copy_(encoded["input_ids"])
        inputs["attention_mask"].copy_(encoded["attention_mask"])
        if "pool_mask" in inputs:
            inputs["pool_mask"].copy_(encoded["attention_mask"] if pool_mask is None else pool_mask)
        types = encoded.get("token_type_ids")
        if types is None:
            inputs["token_type_ids"].zero_()
        else:
            inputs["token_type_ids"].copy_(types)
        graph.replay()
        return output

    def _capture(self, rows: int, length: int) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
        import torch

        inputs = {key: torch.zeros((rows, length), dtype=torch.long, device=self._device) for key in self._inputs}
        inputs["attention_mask"].fill_(1)
        if "pool_mask" in inputs:
            inputs["pool_mask"].fill_(1)
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # a capture needs its kernels' lazy set-up done first, on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._pass(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self._pass(inputs)
        return graph, inputs, output

    def _pass(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return bert_pooled(self._model, self._head, inputs["input_ids"], inputs["token_type_ids"],
                           inputs["attention_mask"], inputs.get("pool_mask"))
