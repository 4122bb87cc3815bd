"""``autospec bench swap``: in-place swaps inside a running vLLM engine under constant load.

One vLLM engine serves the target with a speculator; ``clients`` concurrent clients keep
sending requests; every ``interval_s`` the benchmark loads another version into the running
engine exactly as a replica does on a pointer move
(:func:`autospec.engine.vllm.swap.load_in_place`),
alternating between two versions (a swap, then its rollback). Two ``suffix`` indexes (the
target's own answers to two domains' prompts), or two random-init ``eagle3`` heads of the same
shapes. It reports, per swap, the load's time and two times from the swap's start: to the
first response that names the new version among those that drafted it (a request in flight
at the load, finished after it: its ``drafted_by`` names both, as a served response's does),
and to the first response drafted only by the new version (a request admitted after the
load, finished); the requests answered and failed; and the resident memory of the process
tree (this process and vLLM's engine process), peak during the swaps over the level before
the first one. With ``side_by_side`` it then starts a second engine beside the first, as a
swap did before in-place loads, and reports its start time and the memory of two engines,
in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.text import Text

from autospec.speculators.registry import vllm_seeded

_console = Console(stderr=True, soft_wrap=True)


def say(line: str) -> None:
    """One progress line on stderr (the figures go to stdout or ``--json``)."""
    _console.print(Text(f"[bench swap] {line}"))


@dataclass
class SwapBench:
    kind: str
    clients: int
    segments: bool = False
    swaps: list[dict[str, float]] = field(default_factory=list)
    answered: int = 0
    failed: list[str] = field(default_factory=list)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    side_by_side: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        loads = [s["load_s"] for s in self.swaps]
        return {"kind": self.kind, "clients": self.clients, "segments": self.segments,
                "swaps": self.swaps,
                "load_s_median": statistics.median(loads) if loads else None,
                **self._spread("first_named_s"), **self._spread("first_response_s"),
                "answered": self.answered, "failed": len(self.failed),
                "failures": self.failed[:10], "rss_before_mb": self.rss_before_mb,
                "rss_peak_mb": self.rss_peak_mb,
                "rss_peak_ratio": self.rss_peak_mb / self.rss_before_mb
                if self.rss_before_mb else None, "side_by_side": self.side_by_side}

    def _spread(self, key: str) -> dict[str, float | None]:
        seen = [s[key] for s in self.swaps if s[key] >= 0]
        return {f"{key}_max": max(seen) if seen else None,
                f"{key}_median": statistics.median(seen) if seen else None}


def tree_rss_mb() -> float:
    """Resident memory of this process and its children (vLLM's engine process)."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


class _Sampler(threading.Thread):
    """Peak resident memory over a window: sampled every 0.2 s, and at its start and end (the
    memory the engine hands back during the window must not leave its peak under its start)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="autospec-rss")
        self.peak, self._halt = tree_rss_mb(), threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.2):
            self.peak = max(self.peak, tree_rss_mb())

    def stop(self) -> float:
        self._halt.set()
        self.join()
        self.peak = max(self.peak, tree_rss_mb())
        return self.peak


def _versions(target: Any, kind: str, k: int, out: Path, answers: list[Any]) -> list[Any]:
    """Two exports of ``kind`` with the same shapes (see the module doc)."""
    from autospec.interop.export import export_speculator

    specs = []
    if kind == "suffix":
        from autospec.speculators.config import SuffixConfig
        from autospec.speculators.suffix import suffix_from_documents

        half = len(answers) // 2
        cfg = SuffixConfig.for_target(target.info)
        specs = [suffix_from_documents(cfg, answers[:half]),
                 suffix_from_documents(cfg, answers[half:])]
    else:
        import torch

        from autospec.speculators.registry import new_speculator

        for seed in (1, 2):
            torch.manual_seed(seed)
            spec = new_speculator("eagle3", target, tree_nodes=0, suffix_threshold=None)
            with torch.no_grad():
                for p in spec.head.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            specs.append(spec)
    return [export_speculator(s, target, out / f"v{i}", k=k) for i, s in enumerate(specs)]


def run_swap_bench(*, target_name: str, dtype: str, kind: str, swaps: int, clients: int,
                   k: int, max_tokens: int, interval_s: float, side_by_side: bool,
                   workdir: Path, segments: bool = False) -> SwapBench:
    from autospec.engine.target import load_target
    from autospec.engine.vllm.engine import VllmEngine
    from autospec.engine.vllm.swap import draft_shape, load_in_place
    from autospec.interop.export import target_dir
    from autospec.workloads import domain_prompts

    target = load_target(target_name, dtype=dtype, device="cpu")
    prompts = [target.encode_chat(c) for c in
               domain_prompts("support", 24, 0) + domain_prompts("json", 24, 0)]
    opts = {"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}

    def start(exported: Any) -> Any:
        engine = VllmEngine(target_dir(target), dtype=target.dtype_name,
                            speculative_config=exported.speculative_config,
                            max_model_len=1024, options=opts)
        engine.shape = draft_shape(exported.speculative_config, exported.out)
        return engine

    say(f"generating the {kind} versions' material with vLLM (48 prompts, greedy)")
    from autospec.interop.export import export_speculator
    from autospec.speculators.config import SuffixConfig
    from autospec.speculators.suffix import suffix_from_documents

    empty = export_speculator(suffix_from_documents(SuffixConfig.for_target(target.info), []),
                              target, workdir / "empty", k=k)
    seed_engine = start(empty) if vllm_seeded(kind) else None
    answers: list[Any] = []
    if seed_engine is not None:
        load_in_place(seed_engine, seed_engine.shape, empty.out, "empty")
        answers = list(zip(prompts, _decode_all(seed_engine, prompts, max_tokens), strict=True))
        seed_engine.close()
    versions = _versions(target, kind, k, workdir, answers)
    say("starting the vLLM engine")
    engine = start(versions[0])
    if vllm_seeded(kind):
        load_in_place(engine, engine.shape, versions[0].out, "v0")
    engine.loaded.append("v0")
    bench = SwapBench(kind=kind, clients=clients, segments=segments)
    _decode_all(engine, prompts[:clients], max_tokens)  # warm
    slots = _Slots(engine, versions) if segments else None
    sampler = _Sampler()
    bench.rss_before_mb = sampler.peak
    sampler.start()
    swap = slots.swap if slots is not None else (
        lambda i: load_in_place(engine, engine.shape, versions[i % 2].out, f"v{i % 2}"))
    asyncio.run(_load(engine, prompts, bench, swaps, clients, max_tokens, interval_s, swap,
                      slots))
    bench.rss_peak_mb = sampler.stop()
    if side_by_side:
        bench.side_by_side = _second_engine(start, versions[1], kind)
    engine.close()
    return bench


def _second_engine(start: Any, version: Any, kind: str) -> dict[str, float]:
    """Start a second engine beside the first, as a swap did before in-place loads: its
    start time and the memory of both."""
    from autospec.engine.vllm.swap import load_in_place

    say("side by side: starting a second engine beside the first (the old swap)")
    sampler = _Sampler()
    sampler.start()
    started = time.perf_counter()
    second = start(version)
    if vllm_seeded(kind):
        load_in_place(second, second.shape, version.out, "v1")
    figures = {"start_s": time.perf_counter() - started,
               "rss_peak_mb": sampler.stop()}
    second.close()
    return figures


class _Slots:
    """``--segments``: each swap loads the other version into a new slot of the running
    engine's proposer (a segment's version, as a replica loads a segment pointer's), then
    drops the slot before; the odd clients' requests name the newest slot, as a segment's requests
    do, the even ones none (the deployment's index drafts them)."""

    def __init__(self, engine: Any, versions: list[Any]) -> None:
        from autospec.engine.vllm.swap import load_slot

        self.engine, self.versions = engine, versions
        load_slot(engine, versions[0].out, "slot0")
        self.current: str = "slot0"

    def slot_for(self, client: int) -> str | None:
        return self.current if client % 2 else None

    def swap(self, n: int) -> dict[str, Any]:
        from autospec.engine.vllm.swap import drop_slot, load_slot

        name, before = f"slot{n}", self.current  # a name per load: no answer is ambiguous
        report = load_slot(self.engine, self.versions[n % 2].out, name)
        self.current = name
        drop_slot(self.engine, before)  # its requests in flight keep it to their end
        return report


def _drafted_by(finished: list[tuple[float, float, str | None]],
                slot: str | None) -> list[tuple[float, float]]:
    """(admitted, finished) of the answers a swap's new version may have drafted: every one
    after an in-place load (``slot`` None), those naming the new slot after a slot load."""
    return [(a, f) for a, f, named in finished if slot in (None, named)]


def _decode_all(engine: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from autospec.engine.sampling import SamplingParams

    async def one(i: int, prompt: list[int]) -> list[int]:
        last = None
        async for out in engine.generate(prompt, SamplingParams(max_new_tokens=max_tokens),
                                         f"seed-{i}-{time.monotonic_ns()}"):
            last = out
        return list(last.outputs[0].token_ids)

    async def run() -> list[list[int]]:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    return asyncio.run(run())


async def _load(engine: Any, prompts: list[list[int]], bench: SwapBench, swaps: int,
                clients: int, max_tokens: int, interval_s: float, swap: Any,
                slots: _Slots | None = None) -> None:
    """``clients`` request loops while ``swaps`` in-place loads happen every ``interval_s``
    (with ``slots``: slot loads, and only the requests naming the new slot count as drafted
    by the new version)."""
    from autospec.engine.sampling import SamplingParams

    done = asyncio.Event()
    finished: list[tuple[float, float, str | None]] = []  # (admitted, finished, slot)

    async def client(c: int) -> None:
        i = c
        while not done.is_set():
            admitted = time.perf_counter()
            slot = slots.slot_for(c) if slots is not None else None
            try:
                async for _ in engine.generate(prompts[i % len(prompts)],
                                               SamplingParams(max_new_tokens=max_tokens),
                                               f"c{c}-{i}", slot=slot):
                    pass
                bench.answered += 1
                finished.append((admitted, time.perf_counter(), slot))
            except Exception as exc:  # counted, never hidden
                bench.failed.append(f"{type(exc).__name__}: {exc}")
            i += clients

    tasks = [asyncio.ensure_future(client(c)) for c in range(clients)]
    for n in range(1, swaps + 1):
        await asyncio.sleep(interval_s)
        begun = time.perf_counter()
        report = await asyncio.to_thread(swap, n)
        loaded = time.perf_counter()
        new = slots.current if slots is not None else None
        while (not any(a >= loaded for a, _ in _drafted_by(finished, new))
               and loaded + 120 > time.perf_counter()):
            await asyncio.sleep(0.02)
        mine = _drafted_by(finished, new)
        named = min((f for _, f in mine if f >= loaded), default=begun - 1) - begun
        first = min((f for a, f in mine if a >= loaded), default=begun - 1) - begun
        bench.swaps.append({"load_s": report["seconds"], "first_named_s": named,
                            "first_response_s": first})
        say(f"swap {n}/{swaps}: loaded in {report['seconds']:.2f}s; after the swap began, "
            f"the first response naming the new version came at {named:.2f}s, the first "
            f"drafted only by it at {first:.2f}s; {bench.answered} answered, "
            f"{len(bench.failed)} failed")
    done.set()
    await asyncio.gather(*tasks)
