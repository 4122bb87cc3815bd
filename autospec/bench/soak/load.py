"""The soak's load: requests at a constant rate (open loop: a slow answer never delays the
next send), chat prompts of the workload domains in a mix that shifts part-way, streamed and
not, some clients hanging up mid-request on purpose.

Every request carries ``seed = its number`` (greedy decoding ignores it; the store keeps it in
the row's ``sampling``), so each traffic row is matched to the request that caused it. Each
request ends as one :class:`Outcome` whose ``kind`` says how:

- ``answered``: a 200 with the whole answer (a stream: through ``data: [DONE]``);
- ``disconnected``: the soak hung up on purpose (a stream after its first chunk, a plain
  request after a short read timeout) — not a failure;
- ``connection``: no HTTP answer (refused, reset, the connection cut);
- ``stream_cut``: a 200 stream that ended without ``[DONE]`` or with an error event;
- ``timeout``: no answer within the client's timeout;
- ``overload_503``: a 503 with ``Retry-After`` (declared overload);
- ``http_5xx``, ``http_4xx``: any other error status.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import requests as http

from autospec.workloads import domain_prompts

FAILURE_KINDS = ("connection", "stream_cut", "timeout", "overload_503", "http_5xx", "http_4xx")
#: seed of the soak's prompts: not the demo's or loadgen's default
PROMPT_SEED = 2801
PROMPTS_PER_DOMAIN = 200


@dataclass
class Outcome:
    """One request, from send to end (epoch seconds)."""

    n: int
    domain: str
    stream: bool
    hang_up: bool
    start: float
    end: float = 0.0
    kind: str = "pending"
    status: int | None = None
    version: str | None = None
    retry_after: str | None = None
    error: str = ""

    @property
    def latency_s(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadPlan:
    """What to send: rate, mix before and after the shift, shares of streams and hang-ups."""

    base_url: str
    model: str
    api_key: str | None
    rate: float
    max_tokens: int
    shift_at_s: float
    mix_before: dict[str, float] = field(
        default_factory=lambda: {"support": 0.6, "coding": 0.3, "json": 0.1})
    mix_after: dict[str, float] = field(
        default_factory=lambda: {"support": 0.1, "coding": 0.3, "json": 0.6})
    stream_share: float = 0.3
    hang_up_share: float = 0.05
    timeout_s: float = 180.0
    hang_up_after_s: float = 0.3
    seed: int = 0


class LoadGenerator:
    """Sends :class:`LoadPlan`'s requests from a thread until :meth:`stop`."""

    def __init__(self, plan: LoadPlan) -> None:
        self.plan = plan
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rng = random.Random(plan.seed)
        self._prompts = {d: domain_prompts(d, PROMPTS_PER_DOMAIN, seed=PROMPT_SEED)
                         for d in set(plan.mix_before) | set(plan.mix_after)}
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="soak-client")
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)
        self.started = 0.0

    def start(self) -> None:
        self.started = time.time()
        self._thread.start()

    def stop(self, drain_s: float = 120.0) -> None:
        """Stop sending; wait up to ``drain_s`` for the requests in flight."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + drain_s
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.2)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for o in self.outcomes if o.kind == "pending")

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def _run(self) -> None:
        t0 = time.monotonic()
        n = 0
        while not self._stop.is_set():
            due = t0 + n / self.plan.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            outcome = self._next(n, time.monotonic() - t0)
            with self._lock:
                self.outcomes.append(outcome)
            self._pool.submit(self._send, outcome)
            n += 1

    def _next(self, n: int, elapsed_s: float) -> Outcome:
        mix = self.plan.mix_before if elapsed_s < self.plan.shift_at_s else self.plan.mix_after
        domain = self._rng.choices(list(mix), weights=list(mix.values()))[0]
        return Outcome(n=n, domain=domain, stream=self._rng.random() < self.plan.stream_share,
                       hang_up=self._rng.random() < self.plan.hang_up_share, start=time.time())

    def _send(self, o: Outcome) -> None:
        try:
            send(self.plan, o, self._prompts[o.domain][o.n % PROMPTS_PER_DOMAIN])
        except Exception as exc:  # a client bug must show in the figures, not vanish
            o.kind, o.error = "connection", f"client error: {exc!r}"
        finally:
            o.end = time.time()


def send(plan: LoadPlan, o: Outcome, messages: list[dict[str, str]]) -> None:
    """Send one request and fill ``o`` (all but ``end``)."""
    body = {"model": plan.model, "messages": messages, "max_tokens": plan.max_tokens,
            "temperature": 0, "seed": o.n, "stream": o.stream}
    headers = {"x-autospec-segment": o.domain}
    if plan.api_key:
        headers["Authorization"] = f"Bearer {plan.api_key}"
    read_s = plan.hang_up_after_s if o.hang_up and not o.stream else plan.timeout_s
    try:
        with http.post(f"{plan.base_url}/v1/chat/completions", json=body, headers=headers,
                       stream=o.stream, timeout=(10.0, read_s)) as r:
            o.status = r.status_code
            o.version = r.headers.get("x-autospec-speculator")
            o.retry_after = r.headers.get("retry-after")
            if r.status_code != 200:
                o.kind, o.error = _error_kind(r.status_code, o.retry_after), r.text[:300]
            elif o.stream:
                _read_stream(r, o)
            else:
                r.json()
                o.kind = "answered"
    except http.exceptions.ReadTimeout:
        o.kind = "disconnected" if o.hang_up and not o.stream else "timeout"
    except (http.exceptions.ConnectionError, http.exceptions.ChunkedEncodingError) as exc:
        o.kind, o.error = "connection", repr(exc)[:300]
    except ValueError as exc:  # a 200 whose body is not JSON
        o.kind, o.error = "http_5xx", f"unreadable body: {exc}"[:300]


def _error_kind(status: int, retry_after: str | None) -> str:
    if status == 503 and retry_after:
        return "overload_503"
    return "http_5xx" if status >= 500 else "http_4xx"


def _read_stream(r: http.Response, o: Outcome) -> None:
    for line in r.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if o.hang_up:
            o.kind = "disconnected"
            return  # the with-block closes the connection mid-answer
        if data == "[DONE]":
            o.kind = "answered"
            return
        chunk = json.loads(data)
        if "error" in chunk:
            o.kind, o.error = "stream_cut", json.dumps(chunk["error"])[:300]
            return
    o.kind, o.error = "stream_cut", "the stream ended without [DONE]"
