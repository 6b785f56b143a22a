"""``vagent view``: see what the agent saw, said, and was credited for, token by token.

- :mod:`vagent.viewer.data`    run / evaluation directories -> index, episode summaries, episodes
- :mod:`vagent.viewer.files`   the viewer's errors, safe reading of run files, record and token checks
- :mod:`vagent.viewer.legend`  an env's legend for the episode page
- :mod:`vagent.viewer.turns`   an episode's turns: reward parts, its summary, token rows split per turn
- :mod:`vagent.viewer.sweep`   a sweep directory -> the report's tables, curves and trials (vagent.sweep.report)
- :mod:`vagent.viewer.server`  the loopback HTTP server and the self-contained ``--out`` page
- :mod:`vagent.viewer.cli`     the ``view`` subcommand
- ``static/``                  the pages (index.html a run's, sweep.html a sweep's): plain HTML, CSS and JS
                               written for vagent (no CDN, no library)

The run writes what the viewer reads with :mod:`vagent.runs.samples` (episodes, frames) and
:mod:`vagent.runs.tokens` (token rows). Guide: docs/viewer.md. Nothing is imported here, so
that ``vagent --help`` stays fast.
"""
