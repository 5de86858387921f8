"""Run by Python at start where this folder leads ``PYTHONPATH``: marks the lone request's points (a study tool).

:func:`scripts.benchmarks.load.lone.marked_env` puts this folder there for the daemons it measures.
"""

from scripts.benchmarks.common.marks import install_at_import
from scripts.benchmarks.load.lone_points import POINTS

install_at_import(POINTS)
