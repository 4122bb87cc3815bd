"""``autospec bench soak``: one soak run from start to report.

Starts ``autospec serve`` and ``autospec controller run`` (subprocesses, a store and artifact
directory of their own under ``--out``), sends constant-rate traffic, injects the scheduled
faults one after another, samples memory, then stops everything (the serve command with
SIGTERM: none of its processes may be left) and writes the report. Only stable surfaces are
used: the CLI, the HTTP API and the store's tables.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests as http

from autospec.bench.soak import procs
from autospec.bench.soak.config import SoakConfig, policy_yaml
from autospec.bench.soak.fault_context import FaultContext, FaultRecord
from autospec.bench.soak.faults import FAULTS
from autospec.bench.soak.figures import figures
from autospec.bench.soak.load import LoadGenerator, LoadPlan
from autospec.bench.soak.report import write_report
from autospec.bench.soak.storeview import StoreView
from autospec.bench.soak.target import write_tiny_target
from autospec.ports import free_port

#: faults stop waiting for their moment this far before the end (fraction of the run)
FAULT_DEADLINE = 0.93
#: seconds the soak's controllers wait between a gate passed and its promotion: the moment
#: the "controller SIGKILL right after the gate passed" fault kills them in (a crash drill)
GATE_HOLD_S = 15.0
#: vLLM engine arguments of the soak's replica: short context, small KV cache, eager mode
VLLM_OPTIONS = ("max_model_len=1024", "kv_cache_memory_bytes=134217728", "enforce_eager=true")


class Soak:
    """One run; :meth:`run` returns its figures (also written under ``cfg.out``)."""

    def __init__(self, cfg: SoakConfig, say: Callable[[str], None]) -> None:
        self.cfg, self.say = cfg, say
        self.out = cfg.out.resolve()
        self.data = self.out / "data"
        self.db_path = self.data / "autospec.db"
        self.url = f"sqlite:///{self.db_path}"
        self.port = cfg.port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.key = secrets.token_hex(16)
        self.env = {"AUTOSPEC_DATA_DIR": str(self.data), "AUTOSPEC_DATABASE_URL": self.url,
                    "AUTOSPEC_API_KEY": self.key}
        self.faults: list[FaultRecord] = []
        self.controllers: list[procs.Child] = []
        self.loadavg: list[tuple[float, float]] = []
        self._stop = threading.Event()

    # -- start ----------------------------------------------------------------------------
    def _target(self) -> str:
        if self.cfg.target == "tiny":
            return str(write_tiny_target(self.out / "tiny-target"))
        return self.cfg.target

    def _start_serve(self, target: str) -> procs.Child:
        args = ["serve", "--target", target, "--engine", self.cfg.engine, "--port",
                str(self.port), "--dtype", self.cfg.dtype, "--speculator-k", str(self.cfg.k),
                "--startup-timeout", str(self.cfg.startup_timeout_s)]
        if self.cfg.engine == "vllm":
            for option in VLLM_OPTIONS:
                args += ["--vllm-option", option]
        return procs.start("serve", args, env=self.env, logs=self.out / "logs")

    def _start_controller(self, target: str) -> procs.Child:
        n = len(self.controllers) + 1
        args = ["controller", "run", "--policy", str(self.out / "policy.yaml"), "--target", target]
        if self.cfg.dtype != "auto":
            args += ["--dtype", self.cfg.dtype]
        env = {**self.env, "AUTOSPEC_CYCLE_HOLD_AFTER_GATE_S": str(GATE_HOLD_S)}
        child = procs.start(f"controller-{n}", args, env=env, logs=self.out / "logs")
        self.controllers.append(child)
        if hasattr(self, "sampler"):
            self.sampler.roots.append(child)
        self.say(f"controller {n} started (pid {child.pid})")
        return child

    def _model_name(self) -> str:
        got = http.get(f"{self.base_url}/v1/models", timeout=30,
                       headers={"Authorization": f"Bearer {self.key}"})
        got.raise_for_status()
        return got.json()["data"][0]["id"]

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.data.mkdir(parents=True, exist_ok=True)
        (self.out / "policy.yaml").write_text(policy_yaml(self.cfg))
        target = self._target()
        self.say(f"starting autospec serve ({self.cfg.engine}, {self.cfg.target}) on "
                 f"{self.base_url}")
        serve = self._start_serve(target)
        self.sampler = procs.MemorySampler([serve])
        self.sampler.start()
        try:
            startup_s = procs.wait_healthy(self.base_url, serve, self.cfg.startup_timeout_s)
        except RuntimeError:
            self._shutdown(serve)
            raise
        self.say(f"serving after {startup_s:.0f}s")
        view = StoreView(self.url)
        try:
            return self._traffic(serve, view, target, startup_s)
        finally:
            view.close()

    def _traffic(self, serve: procs.Child, view: StoreView, target: str,
                 startup_s: float) -> dict[str, Any]:
        plan = LoadPlan(base_url=self.base_url, model=self._model_name(), api_key=self.key,
                        rate=self.cfg.rate, max_tokens=self.cfg.max_tokens,
                        shift_at_s=self.cfg.duration_s / 2)
        load = LoadGenerator(plan)
        load.start()
        t0 = load.started
        ctx = FaultContext(base_url=self.base_url, env=self.env, logs=self.out / "logs",
                           serve=serve, load=load, view=view, data_dir=self.data,
                           db_path=self.db_path,
                           start_controller=lambda: self._start_controller(target),
                           say=self.say,
                           deadline=t0 + FAULT_DEADLINE * self.cfg.duration_s)
        ctx.controller = self._start_controller(target)
        threads = [threading.Thread(target=self._inject, args=(ctx, t0), daemon=True),
                   threading.Thread(target=self._progress, args=(load, view, t0), daemon=True)]
        for t in threads:
            t.start()
        self._stop.wait(max(0.0, t0 + self.cfg.duration_s - time.time()))
        self._stop.set()
        threads[0].join(timeout=180)
        self.say("stopping the load (waiting for requests in flight)...")
        load.stop()
        ended = time.time()
        shutdown = self._shutdown(serve)
        result = figures(cfg=self.cfg, t0=t0, ended=ended, startup_s=startup_s,
                         outcomes=load.snapshot(), view=view, faults=self.faults,
                         samples=self.sampler.samples, shutdown=shutdown,
                         controllers=len(self.controllers), loadavg=self.loadavg,
                         spill_files=_spill_files(self.data))
        write_report(result, self.out)
        _write_raw(self.out, load.snapshot(), self.sampler.samples)
        return result

    def _inject(self, ctx: FaultContext, t0: float) -> None:
        for fraction, name, kwargs in self.cfg.schedule():
            at = t0 + fraction * self.cfg.duration_s
            if self._stop.wait(max(0.0, at - time.time())):
                return
            self.say(f"fault: {name}...")
            try:
                record = FAULTS[name](ctx, **kwargs)
            except Exception as exc:  # a fault that broke is a finding: keep the soak going
                record = FaultRecord(name, at=time.time(), ok=False,
                                     skipped=f"the fault itself failed: {exc!r}")
            self.faults.append(record)
            self.say(_fault_line(record))

    def _progress(self, load: LoadGenerator, view: StoreView, t0: float) -> None:
        while not self._stop.wait(30.0):
            done = load.snapshot()
            answered = sum(1 for o in done if o.kind == "answered")
            failed = sum(1 for o in done if o.kind not in ("answered", "pending", "disconnected"))
            self.loadavg.append((time.time(), os.getloadavg()[0]))
            try:
                live = view.live() or "builtin-ngram"
            except Exception as exc:  # the store may be locked by a fault
                live = f"? ({type(exc).__name__})"
            self.say(f"[{(time.time() - t0) / 60:5.1f} min] sent {len(done)} answered "
                     f"{answered} failed {failed} in flight {load.in_flight()} live {live} "
                     f"load {os.getloadavg()[0]:.1f}")

    # -- stop -----------------------------------------------------------------------------
    def _shutdown(self, serve: procs.Child) -> dict[str, Any]:
        for c in self.controllers:
            procs.stop(c, timeout_s=60)
        self.say("stopping autospec serve with SIGTERM...")
        exit_s = procs.stop(serve, signal.SIGTERM, timeout_s=120)
        if exit_s is None:
            procs.stop(serve, signal.SIGKILL, timeout_s=10)
        time.sleep(3.0)
        self.sampler.stop()
        left = procs.leftovers(self.sampler.seen)
        how = f"after {exit_s:.1f}s" if exit_s is not None else "only when killed"
        self.say(f"serve exited {how}; processes left: {left or 'none'}")
        return {"serve_exit_s": exit_s, "serve_returncode": serve.popen.returncode,
                "processes_seen": len(self.sampler.seen), "left_running": left}


def _write_raw(out: Path, outcomes: list[Any], samples: list[tuple[float, str, int]]) -> None:
    """Every request's outcome and every memory sample, one JSON object a line."""
    with (out / "requests.jsonl").open("w") as f:
        f.writelines(json.dumps(o.as_dict()) + "\n" for o in outcomes)
    with (out / "memory.jsonl").open("w") as f:
        f.writelines(json.dumps({"t": t, "process": n, "rss": r}) + "\n" for t, n, r in samples)


def _spill_files(data: Path) -> int:
    spill = data / "spill"
    return sum(1 for p in spill.rglob("*") if p.is_file()) if spill.is_dir() else 0


def _fault_line(r: FaultRecord) -> str:
    if r.skipped:
        return f"fault {r.name}: skipped — {r.skipped}"
    rec = "never" if r.recovery_s is None else f"{r.recovery_s:.1f}s"
    return f"fault {r.name}: {'ok' if r.ok else 'NOT OK'}, recovery {rec}; {'; '.join(r.detail)}"
