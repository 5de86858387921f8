"""Measurements that are programs of their own (``python -m scripts.benchmarks.studies.NAME``), not cases.

Each answers one question behind a design choice or an operator's setting and prints a Markdown
table; BENCHMARKS.md and the docs quote them with the command that reproduces them.  They use the
same systems, load generator and helpers as the cases.
"""
