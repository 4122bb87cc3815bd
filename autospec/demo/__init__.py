"""``autospec demo``: the whole loop on the embedded default, measured and reported.

- :mod:`~autospec.demo.plan` — the quick and full presets and the scaled-down policy;
- :mod:`~autospec.demo.run` — the :class:`~autospec.demo.run.Demo` that sequences the run:
  serving (:mod:`~autospec.demo.serving`), the base head (:mod:`~autospec.demo.base`), the
  traffic phases and what each measured (:mod:`~autospec.demo.phases`), the controller's
  cycle, watch, drift trigger and retrain (:mod:`~autospec.demo.control`), all recorded in
  :mod:`~autospec.demo.record`;
- :mod:`~autospec.demo.report` — tables, chart (PNG), JSON and Markdown;
- :mod:`~autospec.demo.cli` — the command.
"""
