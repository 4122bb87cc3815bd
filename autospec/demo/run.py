"""The demo run: serve, send domain-A traffic, let the controller retrain and promote, shift
to domain B, watch live τ drop, the drift trigger, the retrain and the recovery.

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
   on the recovered version, then a last watch;
3. per phase measures, from the responses: live τ (the ``autospec`` objects), output
   tokens/s per request, and — on every ``baseline_every``-th prompt, sent to both apps
   back to back — the **speedup over target-only** on the same prompts; and, after the
   phase, the **shadow τ** of the version that served it, replayed from the logged
   requests (:func:`autospec.evaluate.replay.replay`), which should agree with live τ.

Every figure is measured in this run; nothing is assumed. Decisions and reasons come from
the controller's results and the store's audit log. Progress goes to a ``Reporter``.

A run that ends early — Ctrl-C (``KeyboardInterrupt``) or an exception at any stage — first
shuts Serve and Ray down, then raises :class:`DemoStopped` carrying the partial
:class:`DemoResult`: the phases finished so far (a phase counts once its figures are
measured), every response sent, the decisions taken, and ``partial`` = what ended the run
and where ("interrupted (Ctrl-C) during phase B1"). The CLI writes that as the report.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests as http

from autospec.demo.plan import DemoPlan, demo_policy, drift_requests
from autospec.demo.speed_checks import speed_checks
from autospec.loadgen.client import Driver, Result
from autospec.loadgen.runner import tau as tau_of
from autospec.loadgen.source import DomainSource, Prompt
from autospec.settings import api_key

log = logging.getLogger(__name__)

DEPLOYMENT = "default"
#: seconds the demo waits for the replica to serve a promoted version (native: a load; vLLM:
#: an engine start, 20-130 s on 2 cores, more under load)
SWAP_TIMEOUT_S, VLLM_SWAP_TIMEOUT_S = 60.0, 600.0
#: vLLM engine arguments of the demo's replicas: a short context (demo requests are short)
#: and a small KV cache (two apps, and a third engine during a swap, share the machine)
VLLM_OPTIONS = {"max_model_len": 1024, "kv_cache_memory_bytes": 128 << 20}


@dataclass
class Sample:
    """One response on the demo's timeline (``t`` seconds since the demo started)."""

    t: float
    phase: str
    app: str  # "live" or "target"
    segment: str
    ok: bool
    version: str | None
    tau: float | None
    tokens: int
    latency_s: float


@dataclass
class PhaseFigures:
    name: str
    title: str
    domain: str
    start_t: float
    end_t: float = 0.0
    requests: int = 0
    errors: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    tau_live: float | None = None
    tau_shadow: float | None = None
    tokens_per_s: float | None = None
    paired_prompts: int = 0
    paired_spec_tokens_per_s: float | None = None
    target_tokens_per_s: float | None = None
    speedup: float | None = None

    @property
    def live_version(self) -> str | None:
        return max(self.versions, key=self.versions.get) if self.versions else None  # type: ignore[arg-type]


@dataclass
class DecisionNote:
    """A controller decision as the demo saw it."""

    t: float
    after_phase: str
    kind: str  # cycle, canary, drift, watch
    outcome: str
    version: str | None
    reasons: list[str]
    # a promotion's speedup over target-only as the gate saw it (measured, estimated)
    gate_speedup: dict[str, float | None] | None = None


@dataclass
class DemoResult:
    plan: dict[str, Any]
    target: str
    data_dir: str
    took_s: float
    phases: list[PhaseFigures]
    decisions: list[DecisionNote]
    samples: list[Sample]
    events: list[dict[str, Any]]
    partial: str | None = None  # why the run ended early; None: it ran to the end
    base: str | None = None  # the base eagle3 head the candidates warm-started from

    def as_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "target": self.target, "data_dir": self.data_dir,
                "took_s": self.took_s, "complete": self.partial is None,
                "partial": self.partial, "base": self.base,
                "phases": [dict(asdict(p), live_version=p.live_version) for p in self.phases],
                "decisions": [asdict(d) for d in self.decisions],
                "speed_checks": speed_checks(self),
                "events": self.events, "samples": [asdict(s) for s in self.samples]}


class DemoStopped(Exception):
    """The demo ended early (``interrupted``: Ctrl-C; else a failure, the ``__cause__``);
    ``result`` is the partial result (``result.partial`` says why and where). Serve and Ray
    are already shut down when this is raised."""

    def __init__(self, result: DemoResult, *, interrupted: bool) -> None:
        super().__init__(result.partial)
        self.result, self.interrupted = result, interrupted


class Reporter:
    """Progress callbacks; the CLI draws them with rich. The default logs."""

    def say(self, message: str) -> None:
        log.info("%s", message)

    def request(self, phase: PhaseFigures, sample: Sample) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Demo:
    """One demo run; :meth:`run` returns the measured :class:`DemoResult`."""

    def __init__(self, plan: DemoPlan, *, data_dir: Path, target: str = "smollm2-135m",
                 dtype: str = "auto", reporter: Reporter | None = None, base: str = "auto",
                 base_store: str | None = None) -> None:
        self.plan, self.data_dir, self.target_spec, self.dtype = plan, data_dir, target, dtype
        self.base, self.base_store = base, base_store  # which base head, and where to look
        self.base_version: str | None = None
        self.say = (reporter or Reporter()).say
        self.reporter = reporter or Reporter()
        self.db_url = f"sqlite:///{data_dir / 'autospec.db'}"
        self.t0 = time.perf_counter()
        self.samples: list[Sample] = []
        self.phases: list[PhaseFigures] = []  # finished phases (figures measured)
        self.decisions: list[DecisionNote] = []
        self.source = DomainSource(seed=plan.seed)
        self.logged = 0  # live requests the store should hold
        self.engine: Any = None
        self.stage = "setting up"  # what the run is doing, for a partial report

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Name what runs inside; on an exception the name stays (the partial report's)."""
        before, self.stage = self.stage, name
        yield
        self.stage = before

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # -- set-up -------------------------------------------------------------------------
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

        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.environ["AUTOSPEC_DATA_DIR"] = str(self.data_dir)  # artifacts: driver and replicas
        from autospec.settings import get_settings

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
            self._phases()
        finally:
            self._stop_serving()

    def _result(self, partial: str | None = None) -> DemoResult:
        return DemoResult(plan=asdict(self.plan), target=self.target_spec,
                          data_dir=str(self.data_dir), took_s=self.now(),
                          phases=list(self.phases), decisions=list(self.decisions),
                          samples=list(self.samples), events=self._events(strict=not partial),
                          partial=partial, base=self.base_version)

    def _start_serving(self) -> None:
        import ray
        from ray import serve

        from autospec.serve.app import build_app

        self.say("starting a local Ray and two Serve applications (live, target-only) on the "
                 f"{self.plan.engine} engine...")
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
                 namespace=f"autospec-demo-{uuid.uuid4().hex[:8]}", configure_logging=False)
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        env = {"AUTOSPEC_DATA_DIR": str(self.data_dir)}
        common = {"target": self.target_spec, "dtype": self.dtype, "model_name": "demo",
                  "database_url": self.db_url, "speculator_k": self.plan.k,
                  "engine": self.plan.engine, "vllm_options": VLLM_OPTIONS,
                  "deployment": DEPLOYMENT, "poll_interval_s": 0.5,
                  "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": env}},
                  "api_key": api_key()}  # AUTOSPEC_API_KEY: the Drivers below send it
        self.base_url = f"http://127.0.0.1:{port}"
        for name, extra in (("live", {}), ("target", {"speculation": "off",
                                                     "log_traffic": False})):
            serve.run(build_app({**common, **extra}), name=name, route_prefix=f"/{name}")
        kw = {"max_tokens": self.plan.max_tokens, "temperature": 0.0, "timeout_s": 600.0,
              "model": "demo"}
        self.live = Driver(f"{self.base_url}/live", **kw)
        self.baseline = Driver(f"{self.base_url}/target", **kw)
        self.say(f"serving at {self.base_url}/live (and /target) after {self.now():.0f}s")

    def _stop_serving(self) -> None:
        import ray
        from ray import serve

        if ray.is_initialized():
            try:
                serve.shutdown()
            except Exception as exc:  # Ray goes down below all the same
                log.warning("Serve did not shut down cleanly: %s", exc)
            finally:
                ray.shutdown()

    def _load_target(self) -> None:
        from autospec.engine.target import load_target

        self.target = load_target(self.target_spec, dtype=self.dtype, device="cpu")

    def _adopt_base(self) -> None:
        """Register the user's base eagle3 head in this run's store (see demo/base.py)."""
        from autospec import store
        from autospec.demo.base import AUTO, NONE, adopt_base, find_base, pretrain_hint
        from autospec.store.db import describe

        if "eagle3" not in self.plan.kinds:
            return
        if self.base == NONE or self.base_store is None:
            why = "--base none" if self.base == NONE else "no store to look in"
            self.say(f"eagle3 candidates start from scratch ({why})")
            return
        try:
            found = find_base(self.base_store, self.target, self.base)
        except store.StoreError as exc:
            if self.base != AUTO:
                raise
            self.say(f"no base head read ({str(exc).splitlines()[0]}): eagle3 candidates "
                     f"start from scratch")
            return
        if found is None:
            hint = pretrain_hint(self.target_spec, self.target.dtype_name)
            self.say(f"no base eagle3 head for {self.target.info.target_id} "
                     f"({self.target.dtype_name}) in {describe(self.base_store)}: eagle3 "
                     f"candidates start from scratch; `{hint}` builds one (~15 minutes on 2 "
                     f"CPU cores)")
            return
        self.base_version = adopt_base(self.engine, found, self.target)
        sequences = found.meta.get("synthetic_sequences", "?")
        self.say(f"eagle3 candidates warm-start from base {found.version} ({sequences} "
                 f"synthetic sequences; from {found.source})")

    def _controller(self, drift_window_s: float = 3600.0) -> Any:
        from autospec.controller.cycle import Controller

        policy = demo_policy(self.plan, drift_window_s=drift_window_s)
        return Controller(self.engine, policy, self.target, holder="demo-controller")

    # -- the story ----------------------------------------------------------------------
    def _phases(self) -> None:
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
            self._phase("B2", f"{b} traffic, after the drift retrain", b, n)
        else:  # the next scheduled cycle does what the drift trigger would have
            self._cycle("B1")
            self._phase("B2", f"{b} traffic, after the scheduled cycle", b, n)
        self._watch("B2", window)

    def _phase(self, name: str, title: str, domain: str, n: int,
               stop_when: Callable[[int], bool] | None = None) -> PhaseFigures:
        with self._stage(f"phase {name}"):
            return self._run_phase(name, title, domain, n, stop_when)

    def _run_phase(self, name: str, title: str, domain: str, n: int,
                   stop_when: Callable[[int], bool] | None) -> PhaseFigures:
        phase = PhaseFigures(name=name, title=title, domain=domain, start_t=self.now())
        self.say(f"[bold]phase {name}[/]: {title} — {n} requests of {domain}, "
                 f"{self.plan.max_tokens} tokens each")
        paired: list[tuple[Result, Result]] = []
        results: list[Result] = []
        for i in range(n):
            prompt = self.source.next(domain)
            live = self._send(self.live, prompt, phase, "live")
            results.append(live)
            if i % self.plan.baseline_every == 0:
                paired.append((live, self._send(self.baseline, prompt, phase, "target")))
            if stop_when is not None and stop_when(i + 1):
                break
        self._close_phase(phase, results, paired)
        self.phases.append(phase)  # finished: its figures are measured
        return phase

    def _send(self, driver: Driver, prompt: Prompt, phase: PhaseFigures, app: str) -> Result:
        t = self.now()
        result = driver.send(prompt, start_s=t)
        sample = Sample(t=t + result.latency_s, phase=phase.name, app=app,
                        segment=prompt.segment, ok=result.ok, version=result.version,
                        tau=result.tau, tokens=result.completion_tokens,
                        latency_s=result.latency_s)
        self.samples.append(sample)
        if app == "live":
            phase.requests += 1
            phase.errors += 0 if result.ok else 1
            if result.ok and result.version:
                phase.versions[result.version] = phase.versions.get(result.version, 0) + 1
                self.logged += 1
            self.reporter.request(phase, sample)
        elif not result.ok:
            log.warning("target-only request failed: %s", result.error)
        return result

    def _close_phase(self, phase: PhaseFigures, results: list[Result],
                     paired: list[tuple[Result, Result]]) -> None:
        ok = [r for r in results if r.ok]
        phase.end_t = self.now()
        phase.tau_live = tau_of(ok)
        phase.tokens_per_s = _rate(ok)
        both = [(s, t) for s, t in paired if s.ok and t.ok]
        phase.paired_prompts = len(both)
        if both:
            phase.paired_spec_tokens_per_s = _rate([s for s, _ in both])
            phase.target_tokens_per_s = _rate([t for _, t in both])
            if phase.paired_spec_tokens_per_s and phase.target_tokens_per_s:
                phase.speedup = phase.paired_spec_tokens_per_s / phase.target_tokens_per_s
        phase.tau_shadow = self._shadow_tau(phase, len(ok))
        self.say(f"phase {phase.name} done in {phase.end_t - phase.start_t:.0f}s: version "
                 f"{phase.live_version}, τ live {_f(phase.tau_live)} / shadow "
                 f"{_f(phase.tau_shadow)}, {_f(phase.tokens_per_s, '.1f')} tok/s, speedup "
                 f"{_f(phase.speedup, '.2f')}× over target-only ({phase.paired_prompts} "
                 f"paired prompts)")

    def _shadow_tau(self, phase: PhaseFigures, n: int) -> float | None:
        """τ of the phase's version replayed on the phase's logged requests."""
        from autospec.evaluate.replay import replay
        from autospec.evaluate.run import select_requests, to_replay_request
        from autospec.versions import load_speculator_version

        version = phase.live_version
        if version is None or n == 0:
            return None
        self._wait_logged()
        examples = [ex for ex in select_requests(self.engine, last=n, deployment=DEPLOYMENT)
                    if ex.speculator_version == version][-self.plan.shadow_sample:]
        if not examples:
            return None
        _, spec = load_speculator_version(self.engine, self.target, version)
        stats = replay(self.target, {version: spec}, [to_replay_request(e) for e in examples],
                       self.plan.k)[version]
        steps = sum(s.steps for s in stats)
        return (sum(s.accepted for s in stats) + steps) / steps if steps else None

    def _wait_logged(self, timeout_s: float = 30.0) -> None:
        from autospec import store

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with store.session_scope(self.engine, readonly=True) as session:
                if store.request_counts(session).get(None, 0) >= self.logged:
                    return
            time.sleep(0.2)
        log.warning("the store holds fewer requests than were answered after %.0fs", timeout_s)

    def _shift_phase(self, domain: str, n: int, window_s: float) -> bool:
        """Phase B1, the controller watching every ``watch_every`` requests; whether drift
        triggered a retrain."""
        plan = self.plan
        fired: list[bool] = []

        def watch_tick(done: int) -> bool:
            if done < drift_requests(plan) or done % plan.watch_every:
                return False
            self._wait_logged()
            result = self._watch("B1", window_s, quiet=True)
            if result.action == "drift":
                fired.append(True)
                return True
            return False

        self._phase("B1", f"traffic shifts to {domain}; watch every {plan.watch_every} "
                    f"requests", domain, 2 * n, stop_when=watch_tick)
        if not fired:
            self.say("[yellow]no drift trigger within the shift phase's requests: the "
                     "scheduled cycle runs instead[/]")
        return bool(fired)

    # -- the controller -----------------------------------------------------------------
    def _cycle(self, after: str) -> None:
        with self._stage(f"the controller cycle after {after}"):
            self._wait_logged()
            self.say("controller: scheduled cycle (train candidates, shadow-evaluate, gate)...")
            started = self.now()
            result = self._controller().run_cycle(trigger="schedule")
            self._note_cycle(after, result, started)

    def _note_cycle(self, after: str, result: Any, started: float) -> None:
        self.decisions.append(DecisionNote(self.now(), after, "cycle", result.outcome,
                                           result.promoted, list(result.reasons),
                                           result.promoted_speedup))
        colour = "green" if result.outcome == "promoted" else "yellow"
        named = f" {result.promoted}" if result.promoted else ""
        self.say(f"controller: cycle [{colour}]{result.outcome}[/]{named} "
                 f"after {self.now() - started:.0f}s — "
                 + "; ".join(_headline_reasons(result.reasons, result.promoted)))
        if result.promoted:
            self._wait_for_version(result.promoted)

    def _watch(self, after: str, window_s: float, *, quiet: bool = False) -> Any:
        from autospec.controller.watch import Watcher

        started = self.now()
        with self._stage(f"the controller watch after {after}"):
            result = Watcher(self._controller(window_s)).run()
        if result.action in ("none", "canary_pending") and quiet:
            return result
        self.decisions.append(DecisionNote(self.now(), after, result.action, result.action,
                                           result.version, list(result.reasons)))
        named = f" {result.version}" if result.version else ""
        self.say(f"controller watch: [bold]{result.action}[/]{named} — "
                 + "; ".join(result.reasons))
        if result.cycle is not None:
            self._note_cycle(after, result.cycle, started)
        elif result.action == "rolled_back":
            self._wait_for_version(None)
        return result

    def _wait_for_version(self, version: str | None, timeout_s: float | None = None) -> None:
        """Until the live app's replica reports the pointer's version (hot-swap; on vLLM the
        replica starts an engine for it first)."""
        timeout_s = timeout_s or (SWAP_TIMEOUT_S if self.plan.engine == "native" else
                                  VLLM_SWAP_TIMEOUT_S)
        from autospec import store
        from autospec.versions import BUILTIN_VERSION

        if version is None:
            with store.session_scope(self.engine, readonly=True) as session:
                pointer = store.get_live(session, deployment=DEPLOYMENT)
                version = pointer.version if pointer else BUILTIN_VERSION
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            try:
                got = http.get(f"{self.live.url}/health", timeout=10).json().get("version")
            except (http.RequestException, ValueError):
                got = None
            if got == version:
                self.say(f"replica serves {version} "
                         f"{time.monotonic() - started:.1f}s after the pointer moved")
                return
            time.sleep(0.2)
        log.warning("the replica did not report %s within %.0fs", version, timeout_s)

    def _events(self, *, strict: bool = True) -> list[dict[str, Any]]:
        """The audit log; for a partial report (``strict=False``) none if unreadable."""
        from autospec import store

        if self.engine is None:
            return []
        try:
            with store.session_scope(self.engine, readonly=True) as session:
                rows = store.list_events(session, deployment=DEPLOYMENT, limit=200)
                return [{"kind": e.kind, "version": e.version, "actor": e.actor,
                         "reason": e.reason, "at": e.created_at.isoformat(),
                         "from_version": e.from_version, "details": e.details or {}}
                        for e in reversed(rows)]
        except Exception as exc:
            if strict:
                raise
            log.warning("the audit log could not be read for the partial report: %s", exc)
            return []


def _rate(results: list[Result]) -> float | None:
    busy = sum(r.latency_s for r in results)
    return sum(r.completion_tokens for r in results) / busy if busy > 0 else None


def _f(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _headline_reasons(reasons: list[str], promoted: str | None) -> list[str]:
    """The promoted candidate's reasons (each reads ``<version>: why``, or ``<version> (base):
    why`` for a base evaluated beside its fine-tune), else the last three."""
    mine = [r for r in reasons
            if promoted and r.startswith((f"{promoted}: ", f"{promoted} (base): "))]
    return mine or reasons[-3:]


def run_demo(plan: DemoPlan, *, data_dir: Path, target: str = "smollm2-135m",
             dtype: str = "auto", reporter: Reporter | None = None, base: str = "auto",
             base_store: str | None = None) -> DemoResult:
    """Run the demo (see the module docstring) and return what it measured; ``base``: the
    base eagle3 head (``auto``, ``none`` or a version) looked up in ``base_store``."""
    return Demo(plan, data_dir=data_dir, target=target, dtype=dtype, reporter=reporter,
                base=base, base_store=base_store).run()


__all__ = ["DecisionNote", "Demo", "DemoResult", "DemoStopped", "PhaseFigures", "Reporter",
           "Sample", "run_demo"]
