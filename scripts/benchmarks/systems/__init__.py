"""The systems under test other than the peers: the model called directly, the HF guide's servers, fakes.

``limit``: the model called directly in a process of its own; ``model``: the model as those
reference systems load it; ``baselines``: the HF guide's servers and a bare aiohttp one;
``echo_worker``: workers (and libzmq's proxy) that answer at once; ``accelerator``: the real worker
around a model that sleeps as a GPU computes.
"""
