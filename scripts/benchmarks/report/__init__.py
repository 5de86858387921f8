"""From result rows to what a reader sees: ratios, the table, detail sections, targets, History, charts.

``results`` computes the ratios and writes the table, BENCHMARKS.md and bench-results.json;
``sections`` the detail sections under the table; ``targets`` the issue's targets, met or not;
``history`` the History section kept across runs; ``charts`` the PNG charts.
"""
