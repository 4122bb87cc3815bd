"""Does the gate's speedup hold? Estimated, measured and realised speedup in one run.

On the default target: greedy traffic of one domain (``autospec bench train``'s cached
traffic), a candidate per kind built on its train part, then on its held-out part:

- **estimated** and **measured** speedup of each candidate and of ``builtin-ngram`` from
  :func:`autospec.evaluate.run.evaluate_versions` (what the controller's gate sees;
  measured = interleaved target-only vs speculative decodes, median of per-round ratios);
- **realised** speedup as ``autospec bench decode`` measures it
  (:func:`autospec.bench.decode.engine_run`): every held-out prompt decoded target-only,
  then every prompt with each version, tokens/s over tokens/s.

Prints a table and the load averages before and after (``/proc/loadavg``); ``--json``
writes the figures.

    python scripts/speed_check.py --kinds suffix --requests 120 --eval-requests 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _load() -> str:
    return Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--domain", default="support")
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per logged request")
    p.add_argument("--kinds", default="suffix")
    p.add_argument("--epochs", type=int, default=4, help="eagle3 / draft epochs")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--eval-requests", type=int, default=16,
                   help="held-out prompts the realised (bench decode) figure decodes")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    from autospec import store
    from autospec.bench.decode import engine_run
    from autospec.bench.traffic import ensure_traffic
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.target import load_target
    from autospec.evaluate.run import evaluate_versions
    from autospec.evaluate.speed_settings import SpeedSettings
    from autospec.train.data import WindowSpec
    from autospec.train.run import TrainRequest, train_candidate
    from autospec.versions import BUILTIN_VERSION, load_speculator_version

    report: dict = {"load_before": _load(), "args": {k: str(v) for k, v in vars(args).items()},
                    "threads": os.environ.get("OMP_NUM_THREADS")}
    started = time.perf_counter()
    target = load_target(args.target, dtype=args.dtype)
    report["dtype"] = str(target.dtype)
    url = ensure_traffic(target, domain=args.domain, requests=args.requests,
                         max_new=args.max_tokens)
    work = Path(tempfile.mkdtemp(prefix="autospec-speed-check-"))
    shutil.copy(url.removeprefix("sqlite:///"), work / "traffic.db")
    db = store.open_store(f"sqlite:///{work / 'traffic.db'}", upgrade=True)
    window = WindowSpec(heldout_fraction=0.2, greedy_only=True)
    versions = []
    for kind in args.kinds.split(","):
        req = TrainRequest(kind=kind, window=window, epochs=args.epochs, from_scratch=True,
                           artifact_dir=work / "artifacts")
        versions.append(train_candidate(req, engine=db, target=target).version)
        say(f"trained {kind}: {versions[-1]}")
    with store.session_scope(db, readonly=True) as session:
        heldout = store.traffic_window(session, heldout_fraction=0.2).heldout
    report["heldout_requests"] = len(heldout)
    figures: dict = {}
    for version in versions:  # as the controller does: each candidate vs the incumbent
        ev = evaluate_versions(db=db, target=target, versions=[version, BUILTIN_VERSION],
                               examples=heldout, k=args.k, record=False,
                               speed=SpeedSettings()).evaluation
        assert ev.measured is not None
        for v in ev.versions:
            figures.setdefault(v, {}).update(
                tau=ev.tau[v], estimated=ev.speedup[v], measured=ev.measured.speedup[v],
                measured_iqr=ev.measured.spread[v])
        report.setdefault("measurement", {})[version] = {
            "rounds": ev.measured.rounds, "ratios": ev.measured.ratios,
            "tokens_per_s": ev.measured.tokens_per_s}
        say(f"evaluated {version}: " + ", ".join(
            f"{v} est {ev.speedup[v]:.2f}× measured {ev.measured.speedup[v]:.2f}×"
            for v in ev.versions))
    report["load_mid"] = _load()
    prompts = [ex.prompt_ids for ex in heldout[: args.eval_requests]]
    base = engine_run("target-only", SpeculativeEngine(target), prompts, args.max_tokens)
    for v in figures:
        spec = load_speculator_version(db, target, v)[1]
        run = engine_run(v, SpeculativeEngine(target, spec, args.k), prompts, args.max_tokens)
        figures[v]["realised"] = run.tokens_per_s / base.tokens_per_s
        figures[v]["realised_tau"] = run.tau
    report.update(figures=figures, target_only_tokens_per_s=base.tokens_per_s,
                  load_after=_load(), wall_s=time.perf_counter() - started)
    _say(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


def _say(report: dict) -> None:
    say(f"\nheld-out requests {report['heldout_requests']}, {report['dtype']}, "
          f"target-only {report['target_only_tokens_per_s']:.1f} tokens/s (bench decode)")
    say(f"{'version':30} {'τ shadow':>8} {'estimated':>9} {'measured [IQR]':>20} "
          f"{'realised':>8} {'est/real':>8} {'meas/real':>9}")
    for v, f in report["figures"].items():
        iqr = f"[{f['measured_iqr'][0]:.2f}, {f['measured_iqr'][1]:.2f}]"
        say(f"{v:30} {f['tau']:8.2f} {f['estimated']:8.2f}× {f['measured']:6.2f}× {iqr:>12} "
              f"{f['realised']:7.2f}× {f['estimated'] / f['realised']:8.2f} "
              f"{f['measured'] / f['realised']:9.2f}")
    say(f"load (1/5/15 min) before: {report['load_before']}; after the evaluation: "
          f"{report['load_mid']}; after: {report['load_after']}; {report['wall_s']:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
