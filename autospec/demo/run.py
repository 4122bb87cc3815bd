"""The demo run: serve, send domain-A traffic, let the controller retrain and promote, shift
to domain B, watch live τ drop, the drift trigger, the retrain and the recovery; then mix
the two domains, each served by its segment's version.

:func:`run_demo` does, in a fresh data directory (SQLite store and artifacts):

1. starts a **new local Ray** (``address="local"``: never another user's cluster) and two
   Serve applications on the same target: ``live`` (follows the live pointer — the
   training-free ``builtin-ngram`` until a promotion — and logs traffic) and ``target``
   (speculation off, not logged: the target-only baseline);
   Where the candidates include eagle3, it first adopts a **base eagle3 head** from the
   user's store (``autospec pretrain``'s; :mod:`autospec.demo.base`), or says how to build
   one;
2. runs four **phases** of greedy chat requests through :mod:`autospec.loadgen`, one client:
   ``A1`` domain A on the built-in speculator; then a controller **cycle**
   (:meth:`Controller.run_cycle`: window → train → shadow-evaluate → gate → promote);
   ``A2`` domain A on the promoted version, then a **watch** (canary verdict); ``B1``
   domain B, with a watch every ``watch_every`` requests until the **drift** trigger fires
   and its early cycle promotes (or the phase's request budget runs out); ``B2`` domain B
   on the recovered version, then a watch; then **mixed traffic** (:mod:`autospec.demo.mix`):
   ``M1`` domains A and B alternating (each request's segment is its domain) on the one
   live version, a cycle whose per-segment promotion may give a segment its own version,
   and ``M2`` the same mix, each segment drafted by its own version — compared, per
   segment, with the one deployment-wide version on the same rows;
3. per phase measures, from the responses: live τ (the ``autospec`` objects), output
   tokens/s per request, and — on every ``baseline_every``-th prompt, sent to both apps
   back to back — the **speedup over target-only** on the same prompts; and, after the
   phase, the **shadow τ** of the version that served it, replayed from the logged
   requests (:func:`autospec.evaluate.replay.replay`), which should agree with live τ.

Every figure is measured in this run; nothing is assumed. Decisions and reasons come from
the controller's results and the store's audit log. Progress goes to a ``Reporter``.

:class:`Demo` sequences the steps; each is a unit of its own: serving
(:mod:`~autospec.demo.serving`), the base head (:func:`~autospec.demo.base.base_for_demo`),
a traffic phase and its figures (:mod:`~autospec.demo.phases`), the controller's cycles and
watches (:mod:`~autospec.demo.control`), and what is recorded (:mod:`~autospec.demo.record`).

A run that ends early — Ctrl-C (``KeyboardInterrupt``) or an exception at any stage — first
shuts Serve and Ray down, then raises :class:`DemoStopped` carrying the partial
:class:`DemoResult`: the phases finished so far (a phase counts once its figures are
measured), every response sent, the decisions taken, and ``partial`` = what ended the run
and where ("interrupted (Ctrl-C) during phase B1"). The CLI writes that as the report.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.text import Text

from autospec.demo.control import ControllerSteps, audit_events
from autospec.demo.mix import compare, read_pointers, segment_moves, segment_shadow
from autospec.demo.phases import TrafficPhase, shadow_tau, wait_logged
from autospec.demo.plan import DemoPlan, demo_policy, drift_requests, mix_sizes
from autospec.demo.record import (
    DecisionNote,
    DemoResult,
    DemoStopped,
    PhaseFigures,
    Reporter,
    Sample,
    Timeline,
    demo_ledger,
)
from autospec.demo.serving import (
    start_serving,
    stop_serving,
    swap_timeout,
    wait_for_segments,
    wait_for_version,
)
from autospec.loadgen.source import DomainSource


class Demo:
    """One demo run; :meth:`run` returns the measured :class:`DemoResult`.

    The seams a test replaces: ``_start_serving``/``_stop_serving`` (Ray and Serve),
    ``_load_target``, ``_controller``, ``_shadow_tau`` and ``_wait_logged`` (the store)."""

    def __init__(self, plan: DemoPlan, *, data_dir: Path, target: str = "smollm2-135m",
                 dtype: str = "auto", reporter: Reporter | None = None, base: str = "auto",
                 base_store: str | None = None) -> None:
        self.plan, self.data_dir, self.target_spec, self.dtype = plan, data_dir, target, dtype
        self.base, self.base_store = base, base_store  # which base head, and where to look
        self.base_version: str | None = None
        self.reporter = reporter or Reporter()
        self.say = self.reporter.say
        self.db_url = f"sqlite:///{data_dir / 'autospec.db'}"
        self.timeline = Timeline()
        self.source = DomainSource(seed=plan.seed)
        self.engine: Any = None  # the run's store
        self.target: Any = None
        self.live: Any = None  # the live and target-only apps' clients
        self.baseline: Any = None
        self.stage = "setting up"  # what the run is doing, for a partial report
        self.concurrency: dict[str, Any] | None = None  # vLLM: spec on/off per load, at the end
        self.mix: dict[str, Any] | None = None  # the mixed phase against one version
        self.control = ControllerSteps(
            timeline=self.timeline, say=self.say, controller=lambda w: self._controller(w),
            wait_logged=lambda: self._wait_logged(), stage=self._stage,
            wait_for_version=lambda v: wait_for_version(
                self.engine, self.live.url, v, swap_timeout(self.plan.engine), self.say))

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Name what runs inside; on an exception the name stays (the partial report's)."""
        before, self.stage = self.stage, name
        yield
        self.stage = before

    def now(self) -> float:
        return self.timeline.now()

    # -- the run ------------------------------------------------------------------------
    def run(self) -> DemoResult:
        """The whole demo; :class:`DemoStopped` (partial result) if it ends early."""
        try:
            self._run()
        except KeyboardInterrupt:
            raise DemoStopped(self._result(f"interrupted (Ctrl-C) during {self.stage}"),
                              interrupted=True) from None
        except Exception as exc:
            text = str(exc).strip().splitlines()
            raise DemoStopped(self._result(f"failed during {self.stage}: {type(exc).__name__}"
                                           + (f": {text[0]}" if text else "")),
                              interrupted=False) from exc
        return self._result()

    def _run(self) -> None:
        from autospec import store
        from autospec.settings import get_settings

        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.environ["AUTOSPEC_DATA_DIR"] = str(self.data_dir)  # artifacts: driver and replicas
        get_settings.cache_clear()
        with self._stage("opening the store"):
            self.engine = store.open_store(self.db_url, upgrade="embedded")
        try:
            with self._stage("starting Ray and Serve"):
                self._start_serving()
            with self._stage("loading the target"):
                self._load_target()
            with self._stage("looking for a base eagle3 head"):
                self._adopt_base()
            self._story()
        finally:
            self._stop_serving()

    def _result(self, partial: str | None = None) -> DemoResult:
        t = self.timeline
        return DemoResult(plan=asdict(self.plan), target=self.target_spec,
                          data_dir=str(self.data_dir), took_s=t.now(), phases=list(t.phases),
                          decisions=list(t.decisions), samples=list(t.samples),
                          events=audit_events(self.engine, strict=not partial),
                          partial=partial, base=self.base_version, concurrency=self.concurrency,
                          mix=self.mix,
                          ledger=demo_ledger(self.engine, took_s=t.now(), strict=not partial))

    # -- the story ----------------------------------------------------------------------
    def _story(self) -> None:
        """A1, a cycle, A2, a watch; B1 watched for drift; B2 on what recovered; a watch;
        the mixed phases (M1, a per-segment cycle, M2)."""
        plan = self.plan
        a, b = plan.domain_a, plan.domain_b
        n = plan.requests_per_phase
        self._phase("A1", f"{a} traffic, built-in speculator", a, n)
        self._cycle("A1")
        a2 = self._phase("A2", f"{a} traffic, after the controller's cycle", a, n)
        per_request = (a2.end_t - a2.start_t) / max(a2.requests, 1)
        window = per_request * (drift_requests(plan) + 2) * 1.5
        self.say(f"drift window for the watch: {window:.0f}s "
                 f"(~{drift_requests(plan) + 2} requests at the measured pace)")
        self._watch("A2", window)
        if self._shift_phase(b, n, window):
            self._phase("B2", f"{b} traffic, after the drift-triggered cycle", b, n)
        else:  # the next scheduled cycle does what the drift trigger would have
            self._cycle("B1")
            self._phase("B2", f"{b} traffic, after the scheduled cycle", b, n)
        self._watch("B2", window)
        self._mixed(a, b)
        if plan.engine == "vllm":  # the native replica decodes one request at a time
            with self._stage("the concurrency table"):
                self.concurrency = self._concurrency()

    def _mixed(self, a: str, b: str) -> None:
        """M1: both domains alternating on one version; a cycle that may give each segment
        its own; M2: the same mix on what serves each segment, compared "against one"."""
        before, after = mix_sizes(self.plan)
        self._phase("M1", f"{a} and {b} alternating, one live version", f"{a}+{b}", before,
                    mix=(a, b))
        cycle = self._cycle("M1")
        with self._stage("waiting for the segments' versions"):
            self._wait_for_segments()
        m2 = self._phase("M2", f"{a} and {b} alternating, per-segment versions", f"{a}+{b}",
                         after, mix=(a, b))
        with self._stage("the per-segment comparison"):
            live, pointers = read_pointers(self.engine)
            served = {s: list(dict.fromkeys(v for v in (f.served_by, live) if v))
                      for s, f in m2.segments.items()}
            self.mix = compare(m2, deployment_version=live, pointers=pointers,
                               moves=segment_moves(audit_events(self.engine)), cycle=cycle,
                               shadow=self._segment_shadow(m2, served))
        self.say(f"mixed traffic: {self.mix['note']}")

    def _phase(self, name: str, title: str, domain: str, n: int,
               stop_when: Callable[[int], bool] | None = None,
               mix: tuple[str, ...] = ()) -> PhaseFigures:
        """One traffic phase, measured and kept (a phase counts once its figures are)."""
        with self._stage(f"phase {name}"):
            figures = PhaseFigures(name=name, title=title, domain=domain,
                                   start_t=self.now())
            self.say(Text.assemble((f"phase {name}", "bold"), f": {title} — {n} requests of "
                                   f"{domain}, {self.plan.max_tokens} tokens each"))
            phase = TrafficPhase(figures, plan=self.plan, source=self.source, live=self.live,
                                 baseline=self.baseline, timeline=self.timeline,
                                 reporter=self.reporter, mix=mix)
            phase.send_all(n, stop_when)
            phase.measure(self._shadow_tau)
            self.timeline.phases.append(figures)
            return figures

    def _shift_phase(self, domain: str, n: int, window_s: float) -> bool:
        """Phase B1, the controller watching every ``watch_every`` requests; whether drift
        triggered a retrain."""
        plan = self.plan
        fired: list[bool] = []

        def watch_tick(done: int) -> bool:
            if done < drift_requests(plan) or done % plan.watch_every:
                return False
            self._wait_logged()
            if self._watch("B1", window_s, quiet=True).action == "drift":
                fired.append(True)
                return True
            return False

        self._phase("B1", f"traffic shifts to {domain}; watch every {plan.watch_every} "
                    f"requests", domain, 2 * n, stop_when=watch_tick)
        if not fired:
            self.say(Text("no drift trigger within the shift phase's requests: the scheduled "
                          "cycle runs instead", style="yellow"))
        return bool(fired)

    def _cycle(self, after: str) -> Any:
        return self.control.cycle(after)

    def _watch(self, after: str, window_s: float, *, quiet: bool = False) -> Any:
        return self.control.watch(after, window_s, quiet=quiet)

    # -- the seams ----------------------------------------------------------------------
    def _start_serving(self) -> None:
        self.say("starting a local Ray and two Serve applications (live, target-only) on the "
                 f"{self.plan.engine} engine...")
        apps = start_serving(self.plan, data_dir=self.data_dir, target=self.target_spec,
                             dtype=self.dtype, db_url=self.db_url)
        self.live, self.baseline = apps.live, apps.baseline
        self.say(f"serving at {apps.base_url}/live (and /target) after {self.now():.0f}s")

    def _stop_serving(self) -> None:
        stop_serving()

    def _concurrency(self) -> dict[str, Any]:
        from autospec.demo.concurrency import CLIENTS, ROUNDS, measure_concurrency

        return measure_concurrency(
            live_url=self.live.url, baseline_url=self.baseline.url, domain=self.plan.domain_b,
            clients=CLIENTS.get(self.plan.mode, CLIENTS["quick"]),
            rounds=ROUNDS.get(self.plan.mode, ROUNDS["quick"]),
            max_tokens=self.plan.max_tokens, model="demo", say=self.say)

    def _load_target(self) -> None:
        from autospec.engine.target import load_target

        self.target = load_target(self.target_spec, dtype=self.dtype, device="cpu")

    def _adopt_base(self) -> None:
        """Where the candidates include eagle3: the base head (see demo/base.py)."""
        from autospec.demo.base import base_for_demo

        if "eagle3" in self.plan.kinds:
            self.base_version = base_for_demo(
                self.engine, self.target, target_spec=self.target_spec, wanted=self.base,
                source_url=self.base_store, say=self.say)

    def _controller(self, drift_window_s: float = 3600.0) -> Any:
        from autospec.controller.cycle import Controller

        policy = demo_policy(self.plan, drift_window_s=drift_window_s)
        return Controller(self.engine, policy, self.target, holder="demo-controller")

    def _shadow_tau(self, phase: PhaseFigures, n: int) -> float | None:
        return shadow_tau(self.engine, self.target, self.plan, phase, n,
                          wait=lambda: self._wait_logged())

    def _segment_shadow(self, phase: PhaseFigures,
                        versions: dict[str, list[str]]) -> dict[str, Any]:
        return segment_shadow(self.engine, self.target, self.plan, phase, versions,
                              wait=lambda: self._wait_logged())

    def _wait_for_segments(self) -> None:
        wait_for_segments(self.engine, self.live.url, swap_timeout(self.plan.engine), self.say)

    def _wait_logged(self, timeout_s: float = 30.0) -> None:
        wait_logged(self.engine, self.timeline.logged, timeout_s)


def run_demo(plan: DemoPlan, *, data_dir: Path, target: str = "smollm2-135m",
             dtype: str = "auto", reporter: Reporter | None = None, base: str = "auto",
             base_store: str | None = None) -> DemoResult:
    """Run the demo (see the module docstring) and return what it measured; ``base``: the
    base eagle3 head (``auto``, ``none`` or a version) looked up in ``base_store``."""
    return Demo(plan, data_dir=data_dir, target=target, dtype=dtype, reporter=reporter,
                base=base, base_store=base_store).run()


__all__ = ["DecisionNote", "Demo", "DemoResult", "DemoStopped", "PhaseFigures", "Reporter",
           "Sample", "run_demo"]
