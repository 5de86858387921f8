"""Side-by-side benchmarks of zbatch and the alternatives a reader would compare it with.

``scripts/bench`` runs them (``python -m scripts.benchmarks``). Every number is
measured in one run on one machine, so ratios between rows mean more than any
absolute figure on a noisy, shared 2-core box.
"""
