"""The controller: policies, the retraining cycle, the canary/drift watch, the scheduler.

- :mod:`~autospec.controller.policy` — YAML policies as strict pydantic models;
- :mod:`~autospec.controller.cycle` — one cycle (lease → window → train → evaluate → gate →
  promote), idempotent per window and crash-consistent;
- :mod:`~autospec.controller.candidates` — a cycle's candidates and which passing one wins;
- :mod:`~autospec.controller.result` — what a cycle reports (``CycleResult``, exit codes);
- :mod:`~autospec.controller.segment_promotion` — after the gate, a segment's own pointer
  to the candidate that wins on that segment;
- :mod:`~autospec.controller.watch` — canary watch after a promotion (automatic rollback)
  and the drift trigger, per segment through :mod:`~autospec.controller.segment_watch`;
- :mod:`~autospec.controller.scheduler` — APScheduler wiring (``autospec controller run``);
- :mod:`~autospec.controller.records` — what the controller records in the audit log;
- :mod:`~autospec.controller.lease` — holding the single-flight lease;
- :mod:`~autospec.controller.cli` — ``status``, ``promote``, ``rollback``, ``versions``,
  ``history`` and ``controller run|once``; :mod:`~autospec.controller.status_view` prints
  the status its ``status`` collects.

It knows nothing of model internals: training and evaluation are called through
:mod:`autospec.train.run` and :mod:`autospec.evaluate.run`.
"""
