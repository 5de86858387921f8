"""The systems under test other than the peers, and the stacks the cases share.

``stacks``: the zbatch stacks (one worker, or ``scripts/serve``'s shape) and the HF guide's servers as
the cases share them; ``limit``: the model called directly in a process of its own; ``model``: the
model as those reference systems load it; ``baselines``: the HF guide's servers and a bare aiohttp
one; ``echo_worker``: workers (and libzmq's proxy) that answer at once; ``accelerator``: the real
worker around a model that sleeps as a GPU computes.
"""
