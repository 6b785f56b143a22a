"""ViGoRL on vagent: visually grounded reasoning (docs/algorithms.md reference section 10, docs/vigorl.md).

- :mod:`vagent.vigorl.grounding`  the grounded reply parser, the zoom tool call, the rewards
- :mod:`vagent.vigorl.data`       JSONL datasets, the synthetic visual-search generator
- :mod:`vagent.vigorl.scene`      the synthetic scenes' shapes, drawing, pixel geometry, zoom crops
- :mod:`vagent.vigorl.env`        the envs ``vigorl_search`` (one turn) and ``vigorl_zoom`` (zoom tool)
- :mod:`vagent.vigorl.task`       their configs and presets, the task view, prompts, step info
- :mod:`vagent.vigorl.scripted`   a scripted pixel-reading policy for the synthetic task (tests, CLI)
- :mod:`vagent.vigorl.mcts`       MCTS over grounded thoughts with any Policy
- :mod:`vagent.vigorl.tree`       the search tree's nodes and records (``ThoughtTree``), its metrics
- :mod:`vagent.vigorl.traces`     trees -> SFT chats (with backtracking), in the env's own prompts
- :mod:`vagent.vigorl.cli`        ``vagent vigorl make-data | mcts | traces``

Importing this package imports nothing heavy; import the submodules you need.
"""
