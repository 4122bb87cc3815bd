"""``autospec bench soak``: hours of constant traffic through the whole loop with faults
injected, and every request, row, pointer move and megabyte accounted for (docs/soak.md).

Units: :mod:`~autospec.bench.soak.config` (settings, policy, fault schedule),
:mod:`~autospec.bench.soak.procs` (the serve and controller subprocesses, memory),
:mod:`~autospec.bench.soak.load` (constant-rate traffic), :mod:`~autospec.bench.soak.faults`,
:mod:`~autospec.bench.soak.storeview` (what the store says), :mod:`~autospec.bench.soak.accounting`
and :mod:`~autospec.bench.soak.figures` (the figures), :mod:`~autospec.bench.soak.report`,
:mod:`~autospec.bench.soak.runner` (one run), :mod:`~autospec.bench.soak.target` (the short
form's tiny target). It drives autospec only through its CLI, HTTP API and store.
"""
