"""Target-generated training data (``autospec synth``).

The target answers prompts — logged prompts resampled at temperature > 0, and prompts of the
workload domains (:mod:`autospec.workloads`) — in batches (:mod:`autospec.synth.generate`),
and the answers are stored as *synthetic* sequences (:mod:`autospec.store.synthetic`), a
table apart from traffic: never logged as requests, never in a held-out set of traffic.
:mod:`autospec.synth.run` plans and runs one generation run; :mod:`autospec.synth.cli` is
the command. Training mixes them into a window at the policy's share
(:mod:`autospec.train.data`); evaluation replays the held-out ones for the overfitting
guard (:mod:`autospec.evaluate.guard`). :mod:`autospec.synth.pretrain` trains a base eagle3
head from them (``autospec pretrain``) through :mod:`autospec.train`. Knows nothing of
serving.
"""
