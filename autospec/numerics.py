"""The serving numerics: one source of truth for which target, revision, dtype and engine
a deployment serves.

Every replica records, when it starts, the target spec it loaded, the target's id and
revision, the engine it decodes with (``native`` or ``vllm``), the dtype it resolved
(``auto`` → ``bfloat16`` or ``float32`` on *its* hardware) and, on a CPU, the threads torch
decodes on (a Ray replica gets ``num_cpus`` of them) in the store's ``deployments`` row
(:func:`record_served`). Whatever trains or shadow-evaluates for that deployment — the
controller, ``autospec train``, ``autospec evaluate`` — reads the row when not told
otherwise (:func:`resolve`) and refuses a target that does not match it
(:func:`check_target`), and the controller a policy trained for another engine
(:func:`engine_for`), before any training or replay, so a promoted candidate is always
one the replicas can load and the shadow τ is measured in the numerics the replicas decode
in; candidates' speed is measured on as many threads as the replicas decode on. With no
row yet (nothing served), the defaults apply: the embedded target, ``auto``.

The target revision does not depend on the dtype (:func:`autospec.engine.target._revision`):
a speculator is built for the target's weights, not for the precision they run in. The
dtype is checked here, as a property of the deployment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from sqlalchemy import Engine

from autospec import store
from autospec.engine import target as targets
from autospec.engine.target import DEFAULT_TARGET, Target

log = logging.getLogger(__name__)

AUTO = "auto"


class NumericsMismatch(RuntimeError):
    """What was asked for is not what the deployment serves; the message says both."""


@dataclass(frozen=True)
class Served:
    """What a deployment's replicas serve, as recorded (None fields: nothing recorded)."""

    deployment: str
    target: str
    dtype: str
    target_id: str | None = None
    revision: str | None = None
    recorded_by: str | None = None
    engine: str = "native"
    threads: int | None = None  # torch CPU threads per replica; None: GPU or not recorded

    @property
    def recorded(self) -> bool:
        return self.target_id is not None

    def describe(self) -> str:
        if not self.recorded:
            return f"{self.target} in {self.dtype} (nothing served yet: the defaults)"
        return (f"target {self.target_id} revision {self.revision} in {self.dtype} "
                f"(recorded by {self.recorded_by})")


def served(db: Engine, *, deployment: str) -> Served:
    """The deployment's recorded numerics, or the defaults when no replica recorded any."""
    with store.session_scope(db, readonly=True) as session:
        row = store.get_deployment(session, name=deployment)
        if row is None:
            return Served(deployment, DEFAULT_TARGET, AUTO)
        return Served(deployment, row.target, row.dtype, row.target_id, row.target_revision,
                      row.updated_by, row.engine, row.threads)


def resolve(db: Engine, *, deployment: str, target: str | None = None,
            dtype: str | None = None) -> tuple[str, str]:
    """``(target spec, dtype)`` to load for work on ``deployment``.

    Unset options (``None``; a ``dtype`` of ``auto``) take the deployment's recorded values;
    an explicit dtype other than the recorded one is refused (:class:`NumericsMismatch`).
    A target given explicitly is loaded as given and checked by :func:`check_target`.
    """
    if dtype is not None:
        targets.check_dtype(dtype)  # an unknown name: TargetLoadError
    rec = served(db, deployment=deployment)
    if dtype not in (None, AUTO) and rec.recorded and dtype != rec.dtype:
        raise NumericsMismatch(
            f"deployment {deployment!r} serves {rec.describe()}; --dtype {dtype} would train "
            f"and evaluate in other numerics than the replicas decode in. Leave --dtype out "
            f"(the deployment's is used) or redeploy the replicas in {dtype}")
    if not rec.recorded:
        return target or rec.target, dtype or AUTO
    return target or rec.target, rec.dtype


def check_target(db: Engine, *, deployment: str, target: Target) -> None:
    """Refuse ``target`` unless it is what ``deployment``'s replicas serve (if recorded)."""
    rec = served(db, deployment=deployment)
    if not rec.recorded:
        return
    have = (target.info.target_id, target.info.revision, target.dtype_name)
    if have != (rec.target_id, rec.revision, rec.dtype):
        raise NumericsMismatch(
            f"deployment {deployment!r} serves {rec.describe()}; this process loaded target "
            f"{have[0]} revision {have[1]} in {have[2]}: a candidate built here would be "
            f"refused by the replicas or evaluated in other numerics. Leave --target and "
            f"--dtype out (the deployment's are used) or redeploy the replicas")


def engine_for(db: Engine, *, deployment: str, wanted: str) -> str:
    """The engine to train ``deployment``'s candidates for: ``wanted`` (a policy's
    ``training.engine``), where ``auto`` is the engine its replicas recorded (``native``
    until one has started). An explicit engine other than the recorded one is refused
    (:class:`NumericsMismatch`): its candidates would be trained for what the replicas do
    not run (trees or an index a vLLM replica would refuse to run as chains)."""
    rec = served(db, deployment=deployment)
    if wanted == AUTO:
        return rec.engine
    if rec.recorded and rec.engine != wanted:
        raise NumericsMismatch(
            f"deployment {deployment!r} serves with engine {rec.engine} (recorded by "
            f"{rec.recorded_by}) but the policy trains for engine {wanted}: set "
            f"`training.engine: auto` (or {rec.engine}) in the policy (docs/configuration.md)")
    return wanted


def load_served_target(db: Engine, *, deployment: str, target: str | None = None,
                       dtype: str | None = None, device: str | None = None) -> Target:
    """Load the target ``deployment`` serves (see :func:`resolve`), checked."""
    spec, resolved = resolve(db, deployment=deployment, target=target, dtype=dtype)
    model = targets.load_target(spec, dtype=resolved, device=device)
    check_target(db, deployment=deployment, target=model)
    return model


def record_served(db: Engine, *, deployment: str, spec: str, target: Target,
                  actor: str, engine: str = "native") -> None:
    """A replica's record of what it serves (see the module docstring), with the CPU threads
    torch decodes on in this process (None on a GPU, and for vLLM, whose threads are its
    own)."""
    on_cpu = engine == "native" and target.device.type == "cpu"
    threads = torch.get_num_threads() if on_cpu else None
    for attempt in range(2):  # replicas starting together: the loser updates the row
        try:
            with store.session_scope(db) as session:
                store.record_deployment(session, name=deployment, target=spec,
                                        target_id=target.info.target_id,
                                        target_revision=target.info.revision,
                                        dtype=target.dtype_name, actor=actor,
                                        engine=engine, threads=threads)
            return
        except store.Conflict:
            if attempt:
                raise
