"""Sweeps: a grid of run configs x seeds run as Ray Tune trials, and their report.

- :mod:`vagent.sweep.spec`    the sweep file -> rows (configurations) and trials (row x seed)
- :mod:`vagent.sweep.runner`  trials on Ray Tune, each an ordinary run directory; resumable
- :mod:`vagent.sweep.stats`   mean +- standard error, paired differences with t-intervals
- :mod:`vagent.sweep.report`  tables per metric (Markdown, JSON) and validation curves with bands (PNG)

Nothing here imports Ray, torch or matplotlib at import time.
"""
