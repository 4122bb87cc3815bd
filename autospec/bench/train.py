"""``autospec bench train``: log domain traffic, train each kind on it, measure on held-out.

The settings are one :class:`~autospec.bench.train_request.TrainBenchRequest`.

1. **Traffic** (:mod:`autospec.bench.traffic`). The default target answers ``--requests``
   prompts of one domain (:mod:`autospec.workloads`) greedily, logged into a SQLite
   database cached under ``<cache dir>/bench-traffic/``, so reruns skip this step.
2. **Training.** :func:`autospec.train.run.train_candidate` trains ``eagle3`` and
   ``draft`` and builds ``suffix`` on the train part of the window (the newest
   ``heldout_fraction`` is never trained on), registering candidates in a scratch store.
3. **Measurement**, side by side in one process on the held-out requests: the engine
   target-only, and with ngram / suffix / draft / eagle3 at ``k`` drafts (greedy, so
   every output must equal target-only): τ (None for a method that took no step), tokens/s,
   speedup; plus the cost of one
   draft step of each kind and of a target verify of ``n`` tokens against a 1-token step.
   ``eagle3`` is the registered artifact (head + suffix index over the window, drafting
   trees for these greedy requests); ``eagle3-chain`` the same drafting chains of k;
   ``eagle3-head`` the head with its index dropped (trees).
4. **eagle3 variants** (``--variants``; :mod:`autospec.bench.train_variants`): the base head
   and synthetic data beside today's from-scratch head, decoded in the same run on the same
   held-out requests, reported as ratios to ``scratch`` (``by_variant``).
5. **Another domain** (``--other-domain``): every method but the head's decompositions on
   prompts of a domain no traffic was logged or trained on, with τ against ngram's there.

The tables are :mod:`autospec.bench.train_print`'s.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from sqlalchemy import Engine

from autospec.bench.progress import BenchProgress
from autospec.bench.traffic import ensure_traffic
from autospec.bench.train_print import print_report, tau_text
from autospec.bench.train_request import TrainBenchRequest
from autospec.engine.clock import clock
from autospec.engine.stats import tau
from autospec.engine.target import Target
from autospec.settings import get_settings

log = logging.getLogger(__name__)


# -- the benchmark ----------------------------------------------------------------------------
class TimedSpeculator:
    """Forwards to a speculator and adds up the seconds spent in it (draft-side cost)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.feature_layers = inner.feature_layers
        self.seconds = 0.0
        self.proposals = 0
        self.device = getattr(inner, "device", None)  # weightless kinds: nothing to wait for

    def _timed(self, fn, *args):
        started = clock(self.device)
        try:
            return fn(*args)
        finally:
            self.seconds += clock(self.device) - started  # its kernels ran, not just launched

    def begin(self, prompt_ids, features) -> None:
        self._timed(self.inner.begin, prompt_ids, features)

    def commit(self, tokens, features) -> None:
        self._timed(self.inner.commit, tokens, features)

    def propose(self, k, sampling, generator):
        self.proposals += 1
        return self._timed(self.inner.propose, k, sampling, generator)


def _measure(target: Target, specs: dict, prompts: list[list[int]], max_new: int,
             k: int, progress: BenchProgress | None = None,
             what: str = "held-out") -> dict[str, dict]:
    """Every method on every prompt, interleaved (prompt by prompt) to share the noise."""
    from autospec.engine.generate import SpeculativeEngine
    from autospec.engine.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=max_new)
    timed = {name: (TimedSpeculator(s) if s is not None else None) for name, s in specs.items()}
    engines = {name: SpeculativeEngine(target, t, k) for name, t in timed.items()}
    acc = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "accepted": 0, "outputs": []}
           for name in specs}
    for prompt in prompts:
        for name, engine in engines.items():
            res = engine.generate(prompt, params)
            a = acc[name]
            a["tokens"] += res.stats.output_tokens
            a["seconds"] += res.stats.total_s - res.stats.ttft_s  # decode only
            a["steps"] += res.stats.num_drafts
            a["accepted"] += res.stats.num_accepted_tokens
            a["outputs"].append(res.token_ids)
        if progress is not None:
            done = len(acc["target-only"]["outputs"])
            progress.report["eval_prompts_done"] = done
            progress.done(f"{what} prompt {done}/{len(prompts)} decoded by "
                          f"{len(engines)} methods")
    base = acc["target-only"]
    out = {}
    for name, a in acc.items():
        t = timed[name]
        same = sum(x == y for x, y in zip(a["outputs"], base["outputs"], strict=True))
        out[name] = {
            "tau": tau(a["accepted"], a["steps"]),  # None: no step (no prompt decoded)
            "tokens_per_s": a["tokens"] / a["seconds"],
            "speedup": (a["tokens"] / a["seconds"]) / (base["tokens"] / base["seconds"]),
            "identical_outputs": f"{same}/{len(prompts)}",
            "draft_ms_per_step": 1000 * t.seconds / max(1, a["steps"]) if t else 0.0,
            "step_ms": 1000 * a["seconds"] / max(1, a["steps"]),
        }
    return out


def run_train_bench(bench: TrainBenchRequest) -> dict:
    """Traffic -> train each kind (and eagle3 variant) -> measure on held-out; the figures
    (also as JSON at ``bench.json_path``, written as each stage finishes)."""
    from autospec import store
    from autospec.engine.target import load_target

    report: dict = {"target": bench.target, "domain": bench.domain,
                    "requests": bench.requests, "max_new_tokens": bench.max_new_tokens,
                    "k": bench.k, "epochs": bench.epochs, "draft_epochs": bench.draft_epochs,
                    "seed": bench.seed, "draft_vocab_size": bench.draft_vocab_size,
                    "ttt_steps": bench.ttt_steps, "feature_noise": bench.feature_noise,
                    "threads": torch.get_num_threads(), "variants": list(bench.variants),
                    "training": {}}
    progress = BenchProgress("bench train", report, bench.json_path)
    with progress.stage(f"loading {bench.target} ({bench.dtype})"):
        target = load_target(bench.target, dtype=bench.dtype)
    report.update(target=target.info.target_id, dtype=str(target.dtype))
    with progress.stage(f"traffic: {bench.requests} {bench.domain} requests (cached after "
                        f"the first run)"):
        url = ensure_traffic(target, domain=bench.domain, requests=bench.requests,
                             max_new=bench.max_new_tokens, seed=bench.seed)
    work = _workdir(bench.workdir, url, bench.reuse)
    engine = store.open_store(f"sqlite:///{work / 'traffic.db'}", upgrade=True)
    specs, prompts = _train_all(bench, report, engine, target, progress, work)
    with progress.stage(f"decoding {len(prompts)} held-out prompts with {len(specs)} methods"):
        report["methods"] = _measure(target, specs, prompts, bench.max_new_tokens, bench.k,
                                     progress)
    _report_methods(progress, report["methods"], "")
    if bench.other_domain is not None:
        _measure_other(target, specs, bench.other_domain, bench.eval_requests, bench.seed,
                       bench.max_new_tokens, bench.k, progress,
                       engine if "heldout_prompts_in_synthetic" in report else None)
    _variant_figures(report)
    _verify_cost(target, bench.k, report, progress)
    engine.dispose()
    progress.finish()
    print_report(report)
    return report


def _train_all(bench: TrainBenchRequest, report: dict, engine: Engine, target: Target,
               progress: BenchProgress, work: Path) -> tuple[dict, list[list[int]]]:
    """Every kind and eagle3 variant trained (or reused) on the window's train part: the
    speculators by method name, and the held-out prompts they are measured on."""
    from autospec.bench.train_variants import VARIANT_KIND
    from autospec.speculators.registry import new_speculator
    from autospec.train.data import WindowSpec

    kinds, variants, reuse = bench.kinds, bench.variants, bench.reuse
    window = WindowSpec(heldout_fraction=bench.heldout_fraction, greedy_only=True)
    specs: dict = {"target-only": None, "ngram": new_speculator("ngram", target)}
    for kind in kinds:
        if kind == VARIANT_KIND and "scratch" not in variants:
            continue
        specs.update(_train_kind(kind, _request(kind, report, window, work), engine, target,
                                 progress, reuse))
    if VARIANT_KIND in kinds and variants != ("scratch",):
        specs.update(_train_variants(variants, _request(VARIANT_KIND, report, window, work),
                                     engine, target, progress, reuse, bench.synthetic_share,
                                     bench.synthetic_count, bench.base))
    prompts = _heldout_prompts(engine, window, bench.eval_requests, report)
    if {"synthetic", "base", "base+finetune"} & set(variants) and bench.base is None:
        from autospec.bench.train_variants import prompts_in_synthetic

        report["heldout_prompts_in_synthetic"] = prompts_in_synthetic(engine, target,
                                                                              prompts)
    return specs, prompts


def _workdir(workdir: Path | None, url: str, reuse: bool) -> Path:
    """The scratch directory, holding a copy of the cached traffic as its store."""
    import shutil
    import tempfile

    work = Path(workdir or tempfile.mkdtemp(prefix="autospec-bench-train-"))
    work.mkdir(parents=True, exist_ok=True)
    db_file = work / "traffic.db"
    if not (reuse and db_file.exists()):
        shutil.copy(url.removeprefix("sqlite:///"), db_file)
    return work


def _request(kind: str, report: dict, window, work: Path):  # type: ignore[no-untyped-def]
    """The from-scratch training request of ``kind`` with the bench's settings."""
    from autospec.train.run import TrainRequest

    overrides = ({"draft_vocab_size": report["draft_vocab_size"],
                  "ttt_steps": report["ttt_steps"]} if kind == "eagle3" else {})
    return TrainRequest(kind=kind, window=window,
                        epochs=report["draft_epochs"] if kind == "draft" else report["epochs"],
                        from_scratch=True, overrides=overrides, seed=report["seed"],
                        feature_cache_dir=get_settings().cache_dir / "bench-features",
                        artifact_dir=work / "artifacts",  # candidates stay in work
                        feature_noise=report["feature_noise"])


def _train_kind(kind: str, request, engine, target: Target, progress: BenchProgress,  # type: ignore[no-untyped-def]
                reuse: bool) -> dict:
    """Train (or find, with ``reuse``) one kind; its speculator(s) by method name."""
    from autospec.bench.train_variants import reused_run
    from autospec.speculators.checkpoint import load_speculator
    from autospec.train.run import train_candidate

    started = time.perf_counter()
    outcome = reused_run(engine, kind) if reuse else None
    reused = outcome is not None
    if outcome is None:
        with progress.stage(f"training {kind}"):
            outcome = train_candidate(request, engine=engine, target=target)
    wall = outcome.metrics.get("wall_s") or time.perf_counter() - started
    entry = _training_entry(outcome.version, outcome.metrics, wall)
    progress.report["training"][kind] = entry
    log.debug("%s trained in %.0fs: %s", kind, wall, entry)
    progress.done(f"{kind} {'reused' if reused else 'trained'}: {outcome.version} in "
                  f"{wall:.0f} s, {_fit_figure(entry)}")
    specs = {kind: load_speculator(outcome.artifact, target)}  # the registered artifact
    if kind == "eagle3":
        specs.update(_eagle3_variants(outcome.artifact, target, specs[kind]))
    return specs


def _train_variants(variants: tuple[str, ...], template, engine, target: Target,  # type: ignore[no-untyped-def]
                    progress: BenchProgress, reuse: bool, share: float, count: int,
                    base_dir: Path | None) -> dict:
    """The non-scratch eagle3 variants (:mod:`autospec.bench.train_variants`) by method."""
    from autospec.bench.train_variants import VARIANTS, VariantPlan, build_variants
    from autospec.speculators.checkpoint import load_speculator

    plan = VariantPlan(template=template, max_new=progress.report["max_new_tokens"],
                       synthetic_share=share, synthetic_count=count, base_dir=base_dir,
                       reuse=reuse)
    specs: dict = {}

    def done(built) -> None:  # type: ignore[no-untyped-def]
        method = VARIANTS[built.variant]
        entry = _training_entry(built.version, built.metrics, built.wall_s)
        entry.update(variant=built.variant, synthetic_sequences=(
            built.metrics.get("window") or {}).get("synthetic_sequences"))
        progress.report["training"][method] = entry
        specs[method] = load_speculator(built.artifact, target)
        progress.done(f"{method} {'reused' if built.reused else 'trained'}: "
                      f"{built.version or built.artifact} in {built.wall_s:.0f} s, "
                      f"{entry['synthetic_sequences'] or 0} synthetic sequences, "
                      f"{_fit_figure(entry)}")

    with progress.stage(f"eagle3 variants {', '.join(v for v in variants if v != 'scratch')}"):
        build_variants(variants, plan, engine=engine, target=target, on_done=done)
    return specs


def _fit_figure(entry: dict) -> str:
    """How well a trained speculator fits its held-out set, in a few words."""
    after = entry.get("heldout_after")
    if after and after.get("accuracy"):
        return f"held-out top-1 {after['accuracy'][0]:.2f} (first step)"
    if entry.get("replay_tau"):
        return f"held-out replay τ {entry['replay_tau']:.2f}"
    return "no held-out figure"


def _training_entry(version: str | None, m: dict, wall: float) -> dict:
    return {"version": version, "wall_s": wall, "feature_s": m.get("feature_s"),
            "train_s": m.get("train_s"), "examples_seen": m.get("examples_seen"),
            "train_tokens": m.get("train_tokens") or m.get("corpus_tokens"),
            "heldout_before": m.get("heldout_before"), "heldout_after": m.get("heldout_after"),
            "loss_curve": m.get("loss_curve"), "replay_tau": m.get("heldout_replay_tau_k5")}


def _heldout_prompts(engine, window, eval_requests: int, report: dict) -> list[list[int]]:  # type: ignore[no-untyped-def]
    from autospec import store
    from autospec.train.data import load_training_data

    with store.session_scope(engine, readonly=True) as session:
        data = load_training_data(session, window)
    report["train_requests"], report["heldout_requests"] = len(data.train), len(data.heldout)
    prompts = [s.ids[: s.prompt_len] for s in data.heldout[:eval_requests]]
    report["eval_requests"] = len(prompts)
    return prompts


def _report_methods(progress: BenchProgress, methods: dict, where: str) -> None:
    for name, figures in methods.items():
        progress.done(f"{where}{name}: τ {tau_text(figures['tau'])}, {figures['tokens_per_s']:.1f} "
                      f"tokens/s, {figures['speedup']:.2f}× speed")


def _measure_other(target: Target, specs: dict, domain: str, n: int, seed: int, max_new: int,
                   k: int, progress: BenchProgress, synthetic_store=None) -> None:  # type: ignore[no-untyped-def]
    """τ and speed of every method but the eagle3 head's decompositions on ``n`` prompts of
    another domain (no traffic of it was logged or trained on); with ``synthetic_store``,
    how many of those prompts recur verbatim among its synthetic prompts."""
    from autospec.bench.train_variants import prompts_in_synthetic
    from autospec.workloads import domain_prompts

    prompts = [target.encode_chat(m) for m in domain_prompts(domain, n, seed)]
    names = [m for m in specs if m not in ("eagle3-chain", "eagle3-head")]
    other = {"domain": domain, "eval_requests": len(prompts), "methods": {}}
    if synthetic_store is not None:
        other["prompts_in_synthetic"] = prompts_in_synthetic(synthetic_store, target,
                                                                     prompts)
    progress.report["other_domain"] = other
    with progress.stage(f"decoding {len(prompts)} {domain} prompts with {len(names)} methods"):
        other["methods"] = _measure(target, {m: specs[m] for m in names}, prompts, max_new, k,
                                    progress, what=domain)
    _report_methods(progress, other["methods"], f"{domain}: ")


def _variant_figures(report: dict) -> None:
    """Each variant's τ and speedup, as ratios to scratch (in-domain) and to ngram (other
    domain): ``report["by_variant"]``."""
    from autospec.bench.train_variants import VARIANTS

    methods = report["methods"]
    other = (report.get("other_domain") or {}).get("methods", {})
    scratch = methods.get("eagle3") if "scratch" in report["variants"] else None
    rows = {}
    for variant in report["variants"]:
        method = VARIANTS[variant]
        if method not in methods:
            continue
        r = methods[method]
        row = {"method": method, "tau": r["tau"], "speedup": r["speedup"]}
        if scratch:
            row.update(tau_vs_scratch=_over(r["tau"], scratch["tau"]),
                       speedup_vs_scratch=r["speedup"] / scratch["speedup"])
        if method in other:
            row.update(other_tau=other[method]["tau"], other_speedup=other[method]["speedup"],
                       other_tau_vs_ngram=_over(other[method]["tau"], other["ngram"]["tau"]))
        rows[variant] = row
    report["by_variant"] = rows


def _over(tau_a: float | None, tau_b: float | None) -> float | None:
    """``tau_a / tau_b``; None where either τ was not measured (no drafting step)."""
    return None if tau_a is None or tau_b is None else tau_a / tau_b


def _verify_cost(target: Target, k: int, report: dict, progress: BenchProgress) -> None:
    from autospec.bench.decode import verify_cost

    with progress.stage("target forward cost of n tokens"):
        cost = verify_cost(target, sizes=(1, 2, 4, k + 1, 8, 12, 16), context=160)
    report["verify_ms"] = {n: s * 1000 for n, s in cost.items()}
    report["verify_ratio"] = {n: s / cost[1] for n, s in cost.items()}


def _eagle3_variants(artifact: Path, target: Target, full) -> dict:
    """The registered eagle3 artifact taken apart: drafting chains instead of trees
    (``eagle3-chain``) and its head alone, index dropped (``eagle3-head``)."""
    from autospec.speculators.checkpoint import load_speculator

    variants = {}
    if full.config.tree_nodes:
        chain = load_speculator(artifact, target)
        chain.config = chain.config.model_copy(update={"tree_nodes": 0})
        variants["eagle3-chain"] = chain
    if full.suffix is not None:
        head = load_speculator(artifact, target)
        head.attach_suffix(None)
        variants["eagle3-head"] = head
    return variants
