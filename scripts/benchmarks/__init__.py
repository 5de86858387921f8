"""Side-by-side benchmarks of zbatch and the alternatives a reader would compare it with.

``scripts/bench`` runs them (``python -m scripts.benchmarks``). Every number is
measured in one run on one machine, so ratios between rows mean more than any
absolute figure on a noisy, shared 2-core box.

The package is in rooms (README.md beside this file maps them): ``cases`` (one module per case),
``systems`` and ``peers`` (what is measured), ``load`` (the load generators), ``report``
(BENCHMARKS.md and the JSON), ``studies`` (measurements that run on their own) and ``common``
(helpers every room uses).  Imports go one way: report, then cases, then systems and peers,
then load, then common.
"""
