"""``autospec bench train``: log domain traffic, train each kind on it, measure on held-out.

1. **Traffic.** The default target answers ``--requests`` prompts of one domain
   (:mod:`autospec.workloads`) greedily; the rows go through the store's
   :class:`~autospec.store.TrafficWriter` into a SQLite database cached under
   ``<cache dir>/bench-traffic/`` (keyed by target revision, domain, count, length,
   seed), so reruns skip this step. Prompts are answered in left-padded batches with
   Hugging Face ``generate`` (greedy, the target's own numerics): ~2× the throughput of
   one-at-a-time decoding on two cores. Every row is what the target said.
2. **Training.** :func:`autospec.train.run.train_candidate` trains ``eagle3`` and
   ``draft`` and builds ``suffix`` on the train part of the window (the newest
   ``heldout_fraction`` is never trained on), registering candidates in a scratch store.
3. **Measurement**, side by side in one process on the held-out requests: the engine
   target-only, and with ngram / suffix / draft / eagle3 at ``k`` drafts (greedy, so
   every output must equal target-only): τ, tokens/s, speedup; plus the cost of one
   draft step of each kind and of a target verify of ``n`` tokens against a 1-token step.
   ``eagle3`` is the registered artifact (head + suffix index over the window, drafting
   trees for these greedy requests); ``eagle3-chain`` the same drafting chains of k;
   ``eagle3-head`` the head with its index dropped (trees).
4. **eagle3 variants** (``--variants``; :mod:`autospec.bench.train_variants`): the base head
   and synthetic data beside today's from-scratch head, decoded in the same run on the same
   held-out requests, reported as ratios to ``scratch`` (``by_variant``).
5. **Another domain** (``--other-domain``): every method but the head's decompositions on
   prompts of a domain no traffic was logged or trained on, with τ against ngram's there.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import torch

from autospec.bench.progress import BenchProgress
from autospec.engine.clock import clock
from autospec.engine.target import Target
from autospec.settings import get_settings

log = logging.getLogger(__name__)


def traffic_db_path(target: Target, domain: str, requests: int, max_new: int,
                    seed: int) -> Path:
    """Where the cached traffic database of these settings lives."""
    key = f"{target.info.target_id}:{target.info.revision}:{target.dtype}:{domain}:" \
          f"{requests}:{max_new}:{seed}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return get_settings().cache_dir / "bench-traffic" / f"{domain}-{requests}-{digest}.db"


@torch.inference_mode()
def generate_traffic(target: Target, url: str, *, domain: str, requests: int, max_new: int,
                     seed: int = 0, batch_size: int = 16) -> int:
    """Answer ``requests`` prompts of ``domain`` greedily and log them at ``url``; rows."""
    from rich.console import Console
    from rich.progress import Progress

    from autospec.store import TrafficWriter, open_store
    from autospec.workloads import domain_prompts

    tok = target.tokenizer
    chats = domain_prompts(domain, requests, seed)
    prompts = [target.encode_chat(m) for m in chats]
    eos = set(target.info.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.info.eos_token_ids[0]
    engine = open_store(url, upgrade=True)
    written, tokens, began = 0, 0, time.perf_counter()
    console = Console(stderr=True)
    with TrafficWriter(engine) as writer, Progress(console=console) as progress:
        task = progress.add_task(f"logging {domain} traffic", total=requests)
        for start in range(0, requests, batch_size):
            batch = prompts[start : start + batch_size]
            started = time.perf_counter()
            outputs = _greedy_batch(target, batch, max_new, pad)
            ms = (time.perf_counter() - started) * 1000 / len(batch)
            for chat, ids, out in zip(chats[start:], batch, outputs, strict=False):
                out = _cut_at_eos(out, eos)
                writer.record(prompt_text=chat[-1]["content"], prompt_ids=ids,
                              output_ids=out, output_text=target.decode(out), segment=domain,
                              temperature=0.0, latency_ms=ms,
                              finish_reason="stop" if out and out[-1] in eos else "length")
                written, tokens = written + 1, tokens + len(out)
            progress.advance(task, len(batch))
            if not console.is_terminal:  # a log file gets a line per batch instead of a bar
                rate = tokens / (time.perf_counter() - began)
                console.print(f"  {written}/{requests} {domain} requests logged "
                              f"({rate:.0f} tokens/s)", highlight=False)
        writer.flush()
    engine.dispose()
    return written


def _greedy_batch(target: Target, prompts: list[list[int]], max_new: int,
                  pad: int) -> list[list[int]]:
    """Greedy continuations of left-padded ``prompts`` (each up to ``max_new`` tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    out = target.model.generate(input_ids=ids.to(target.device),
                                attention_mask=mask.to(target.device),
                                max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    return [row[width:].tolist() for row in out]


def _cut_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[: i + 1]
    return ids


def ensure_traffic(target: Target, *, domain: str, requests: int, max_new: int,
                   seed: int = 0) -> str:
    """The URL of a cached traffic database with these settings (generated once)."""
    path = traffic_db_path(target, domain, requests, max_new, seed)
    url = f"sqlite:///{path}"
    if path.exists():
        log.info("using cached traffic %s", path)
        return url
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial.db")
    for stale in path.parent.glob(tmp.name + "*"):
        stale.unlink()
    started = time.perf_counter()
    generate_traffic(target, f"sqlite:///{tmp}", domain=domain, requests=requests,
                     max_new=max_new, seed=seed)
    tmp.rename(path)
    log.info("logged %d requests in %.0fs into %s", requests, time.perf_counter() - started,
             path)
    return url


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
            "tau": (a["accepted"] + a["steps"]) / a["steps"] if a["steps"] else 1.0,
            "tokens_per_s": a["tokens"] / a["seconds"],
            "speedup": (a["tokens"] / a["seconds"]) / (base["tokens"] / base["seconds"]),
            "identical_outputs": f"{same}/{len(prompts)}",
            "draft_ms_per_step": 1000 * t.seconds / max(1, a["steps"]) if t else 0.0,
            "step_ms": 1000 * a["seconds"] / max(1, a["steps"]),
        }
    return out


def run_train_bench(*, target_spec: str = "smollm2-135m", dtype: str = "bfloat16",
                    domain: str = "support", requests: int = 300, max_new: int = 128,
                    kinds: tuple[str, ...] = ("eagle3", "suffix", "draft"), k: int = 5,
                    epochs: int = 16, eval_requests: int = 24, heldout_fraction: float = 0.1,
                    draft_vocab_size: int = 4096, ttt_steps: int = 3, seed: int = 0,
                    draft_epochs: int = 2, feature_noise: float = 0.2,
                    reuse: bool = False, variants: tuple[str, ...] = ("scratch",),
                    synthetic_share: float = 0.3, synthetic_count: int = 64,
                    base_dir: Path | None = None, other_domain: str | None = None,
                    workdir: Path | None = None, json_path: Path | None = None) -> dict:
    """Traffic -> train each kind (and eagle3 variant) -> measure on held-out; the figures
    (also as JSON, written as each stage finishes)."""
    from autospec import store
    from autospec.engine.target import load_target
    from autospec.speculators.registry import new_speculator
    from autospec.train import WindowSpec

    check_bench_input(domain=domain, kinds=kinds, variants=variants, other_domain=other_domain,
                      synthetic_share=synthetic_share)
    report: dict = {"target": target_spec, "domain": domain, "requests": requests,
                    "max_new_tokens": max_new, "k": k, "epochs": epochs,
                    "draft_epochs": draft_epochs, "seed": seed,
                    "draft_vocab_size": draft_vocab_size, "ttt_steps": ttt_steps,
                    "feature_noise": feature_noise, "threads": torch.get_num_threads(),
                    "variants": list(variants), "training": {}}
    progress = BenchProgress("bench train", report, json_path)
    with progress.stage(f"loading {target_spec} ({dtype})"):
        target = load_target(target_spec, dtype=dtype)
    report.update(target=target.info.target_id, dtype=str(target.dtype))
    with progress.stage(f"traffic: {requests} {domain} requests (cached after the first run)"):
        url = ensure_traffic(target, domain=domain, requests=requests, max_new=max_new,
                             seed=seed)
    work = _workdir(workdir, url, reuse)
    engine = store.open_store(f"sqlite:///{work / 'traffic.db'}", upgrade=True)
    window = WindowSpec(heldout_fraction=heldout_fraction, greedy_only=True)
    specs: dict = {"target-only": None, "ngram": new_speculator("ngram", target)}
    for kind in kinds:
        if kind == "eagle3" and "scratch" not in variants:
            continue
        specs.update(_train_kind(kind, _request(kind, report, window, work), engine, target,
                                 progress, reuse))
    if "eagle3" in kinds and variants != ("scratch",):
        specs.update(_train_variants(variants, _request("eagle3", report, window, work),
                                     engine, target, progress, reuse, synthetic_share,
                                     synthetic_count, base_dir))
    prompts = _heldout_prompts(engine, window, eval_requests, report)
    if {"synthetic", "base", "base+finetune"} & set(variants) and base_dir is None:
        from autospec.bench.train_variants import prompts_in_synthetic

        report["heldout_prompts_in_synthetic"] = prompts_in_synthetic(engine, target,
                                                                              prompts)
    with progress.stage(f"decoding {len(prompts)} held-out prompts with {len(specs)} methods"):
        report["methods"] = _measure(target, specs, prompts, max_new, k, progress)
    _report_methods(progress, report["methods"], "")
    if other_domain is not None:
        _measure_other(target, specs, other_domain, eval_requests, seed, max_new, k, progress,
                       engine if "heldout_prompts_in_synthetic" in report else None)
    _variant_figures(report)
    _verify_cost(target, k, report, progress)
    engine.dispose()
    progress.finish()
    _print(report)
    return report


def check_bench_input(*, domain: str, kinds: tuple[str, ...], variants: tuple[str, ...],
                      other_domain: str | None, synthetic_share: float) -> None:
    """ValueError naming the first bad setting (before anything is loaded)."""
    from autospec.bench.train_variants import check_variants
    from autospec.workloads import DOMAINS

    for name in (domain, other_domain):
        if name is not None and name not in DOMAINS:
            raise ValueError(f"unknown domain {name!r}; known domains: "
                             f"{', '.join(sorted(DOMAINS))}")
    if other_domain == domain:
        raise ValueError(f"--other-domain must differ from --domain ({domain})")
    check_variants(variants)
    if variants != ("scratch",) and "eagle3" not in kinds:
        raise ValueError(f"variants {list(variants)} are eagle3 heads: add eagle3 to --kinds")
    if not 0.0 < synthetic_share < 1.0 and "synthetic" in variants:
        raise ValueError(f"--synthetic-share must be in (0, 1), got {synthetic_share}")


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
    from autospec.train import TrainRequest

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
    from autospec.train import train_candidate

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
        progress.done(f"{where}{name}: τ {figures['tau']:.2f}, {figures['tokens_per_s']:.1f} "
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
            row.update(tau_vs_scratch=r["tau"] / scratch["tau"],
                       speedup_vs_scratch=r["speedup"] / scratch["speedup"])
        if method in other:
            row.update(other_tau=other[method]["tau"], other_speedup=other[method]["speedup"],
                       other_tau_vs_ngram=other[method]["tau"] / other["ngram"]["tau"])
        rows[variant] = row
    report["by_variant"] = rows


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


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"held-out {report['domain']} requests ({report['eval_requests']}, "
                        f"greedy, k={report['k']}, {report['dtype']}), side by side")
    for col in ("method", "τ", "tokens/s", "speedup", "identical", "draft ms/step",
                "step ms"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, r in report["methods"].items():
        table.add_row(name, f"{r['tau']:.2f}", f"{r['tokens_per_s']:.1f}",
                      f"{r['speedup']:.2f}×", r["identical_outputs"],
                      f"{r['draft_ms_per_step']:.1f}", f"{r['step_ms']:.1f}")
    console.print(table)
    train = Table(title="training (one run each; from scratch except eagle3-base+finetune)")
    for col in ("kind", "wall s", "features s", "train s", "examples", "held-out top-1 before → "
                "after (per TTT step)"):
        train.add_column(col)
    for kind, t in report["training"].items():
        before, after = t.get("heldout_before"), t.get("heldout_after")
        acc = "—"
        if before and after:
            acc = " ".join(f"{b:.2f}→{a:.2f}" for b, a in zip(before["accuracy"],
                                                             after["accuracy"], strict=True))
        elif t.get("replay_tau"):
            acc = f"replay τ {t['replay_tau']:.2f}"
        train.add_row(kind, f"{t['wall_s']:.0f}", f"{t['feature_s'] or 0:.0f}",
                      f"{t['train_s'] or 0:.0f}", str(t["examples_seen"]), acc)
    console.print(train)
    if len(report.get("by_variant", {})) > 1 or "other_domain" in report:
        console.print(_variant_table(report))
    console.print("target forward of n tokens vs 1: " + ", ".join(
        f"n={n}: {ms:.1f} ms ({report['verify_ratio'][n]:.2f}×)"
        for n, ms in report["verify_ms"].items()))


def _variant_table(report: dict):  # type: ignore[no-untyped-def]
    """The eagle3 variants side by side: in-domain τ and speedup, ratios to scratch, and τ on
    the other domain against ngram's there."""
    from rich.table import Table

    other = report.get("other_domain")
    title = f"eagle3 variants on held-out {report['domain']} requests"
    if other:
        ngram = other["methods"]["ngram"]["tau"]
        title += f"; {other['domain']} ({other['eval_requests']} prompts, ngram τ {ngram:.2f})"
    table = Table(title=title)
    cols = ["variant", "τ", "speedup", "τ / scratch", "speed / scratch"]
    if other:
        cols += [f"τ {other['domain']}", f"τ / ngram {other['domain']}"]
    for col in cols:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for variant, r in report["by_variant"].items():
        row = [variant, f"{r['tau']:.2f}", f"{r['speedup']:.2f}×",
               _ratio(r.get("tau_vs_scratch")), _ratio(r.get("speedup_vs_scratch"))]
        if other:
            row += [f"{r['other_tau']:.2f}", _ratio(r.get("other_tau_vs_ngram"))]
        table.add_row(*row)
    return table


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"
