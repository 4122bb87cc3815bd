"""``autospec demo``: the whole loop on the embedded default, measured and reported.

- :mod:`~autospec.demo.plan` — the quick and full presets and the scaled-down policy;
- :mod:`~autospec.demo.run` — serving, the traffic phases, the controller's cycle, watch,
  drift trigger and retrain, and what each phase measured;
- :mod:`~autospec.demo.report` — tables, chart (PNG), JSON and Markdown;
- :mod:`~autospec.demo.cli` — the command.
"""
