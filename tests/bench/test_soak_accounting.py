"""The soak's accounting on hand-made outcomes and rows: failures by kind and which a
replica kill explains, responses from a version that was not live, rows against answers,
memory growth after warm-up, the verdict."""

from __future__ import annotations

from autospec.bench.soak import accounting as acc
from autospec.bench.soak.config import SHORT_SCHEDULE, SoakConfig, policy_yaml
from autospec.bench.soak.faults import FAULTS
from autospec.bench.soak.load import Outcome
from autospec.bench.soak.storeview import Row


def _o(n: int, start: float, end: float, kind: str = "answered",
       version: str | None = "builtin-ngram", domain: str = "support") -> Outcome:
    return Outcome(n=n, domain=domain, stream=False, hang_up=False, start=start, end=end,
                   kind=kind, version=version if kind == "answered" else None)


def test_a_failure_in_flight_at_a_replica_kill_is_explained_and_no_other() -> None:
    outcomes = [_o(0, 0, 1), _o(1, 9, 12, "connection"), _o(2, 20, 21, "http_5xx"),
                _o(3, 30, 31, "overload_503"), _o(4, 40, 40.3, "disconnected")]
    got = acc.counts(outcomes, kills=[10.0])
    assert got["sent"] == 5 and got["answered"] == 1 and got["disconnected_on_purpose"] == 1
    assert got["failed"] == 3 and got["failed_explained_by_replica_kill"] == 1
    assert got["failed_unexplained"] == 1  # the 503 with Retry-After is declared overload
    assert got["failed_by_kind"]["overload_503"] == 1
    assert [e["n"] for e in got["unexplained_examples"]] == [2]


def test_a_version_is_allowed_from_its_move_and_a_refused_one_never() -> None:
    moves = [{"at": 100.0, "version": "v1"}, {"at": 200.0, "version": "bad"},
             {"at": 210.0, "version": "v1"}]
    timeline = acc.allowed_timeline(moves, refused={"bad"})
    assert [v for _, v in timeline] == ["builtin-ngram", "v1", "v1", "v1"]
    outcomes = [_o(0, 50, 51), _o(1, 105, 106, version="builtin-ngram"),  # within the grace
                _o(2, 150, 151, version="builtin-ngram"),  # long after the move: not live
                _o(3, 205, 206, version="v1"), _o(4, 206, 207, version="bad"),
                _o(5, 90, 101, version="v1")]  # moved while it decoded
    bad = acc.not_live(outcomes, {None: timeline}, swap_grace_s=15.0)
    assert [b["n"] for b in bad] == [2, 4]


def test_a_version_live_on_a_segments_pointer_is_live() -> None:
    """The native 2-hour soak's "1211 responses from a version that was not live": the
    controller promoted per segment (support, json) and the soak read every pointer move as
    the deployment's, so the deployment's own version, still serving the other segments,
    counted as not live. Each pointer now has its own timeline."""
    moves = [{"at": 100.0, "version": "e1", "details": {}},
             {"at": 200.0, "version": "e2", "details": {"segment": "support"}},
             {"at": 300.0, "version": "s3", "details": {"segment": "json"}},
             {"at": 400.0, "version": "e4", "details": {}}]
    timelines = acc.allowed_timelines(moves, refused=())
    assert [v for _, v in timelines["support"]] == [None, "e2"]
    assert [v for _, v in timelines[None]] == ["builtin-ngram", "e1", "e4"]
    outcomes = [_o(0, 250, 251, version="e1"),  # the deployment's, other segments
                _o(1, 350, 351, version="s3", domain="json"), _o(2, 350, 351, version="e2"),
                _o(3, 450, 451, version="e1"),  # replaced by e4 50 s before: not live
                _o(4, 150, 151, version="e2")]  # before support's move: not live
    bad = acc.not_live(outcomes, timelines, swap_grace_s=15.0)
    assert [b["n"] for b in bad] == [3, 4]
    # one timeline, as the soak read them before: the deployment's version "not live"
    merged = acc.allowed_timeline(moves, refused=())
    assert [b["n"] for b in acc.not_live(outcomes, {None: merged}, 15.0)] == [0, 2, 3, 4]


def test_another_segments_version_is_not_live_and_an_unpinned_one_stops_being() -> None:
    """Each request names its segment (``x-autospec-segment``): it may be drafted by its own
    segment's version or the deployment's, never by another segment's (a replica that
    drafted json with support's version served the wrong one). After ``rollback --segment
    --unpin`` the segment's old version is no longer its own."""
    moves = [{"at": 100.0, "kind": "promotion", "version": "d1", "details": {}},
             {"at": 200.0, "kind": "override", "version": "s2", "details": {"segment": "support"}},
             {"at": 300.0, "kind": "unpin", "version": "d1", "details": {"segment": "support"}}]
    timelines = acc.allowed_timelines(moves, refused=())
    assert [v for _, v in timelines["support"]] == [None, "s2", None]
    outcomes = [_o(0, 250, 251, version="s2"),  # support, on its own version
                _o(1, 250, 251, version="s2", domain="json"),  # json on support's: wrong
                _o(2, 250, 251, version="d1", domain="json"),  # json on the deployment's
                _o(3, 350, 351, version="s2"),  # support 50 s after its unpin: not live
                _o(4, 305, 306, version="s2"),  # within the grace of the unpin
                _o(5, 350, 351, version="d1")]  # support on the deployment's again
    bad = acc.not_live(outcomes, timelines, swap_grace_s=15.0)
    assert [(b["n"], b["segment"]) for b in bad] == [(1, "json"), (3, "support")]


def test_a_version_refused_for_a_segment_only_is_still_the_deployments() -> None:
    """A vLLM replica refuses a segment version it cannot draft per request (another kind
    than the deployment's suffix version): the segment keeps what it had, while the same
    version moved to the deployment's pointer is served there."""
    moves = [{"at": 100.0, "version": "e1", "details": {"segment": "json"}},
             {"at": 200.0, "version": "e1", "details": {}}]
    timelines = acc.allowed_timelines(moves, refused=(), refused_by_segment={"json": {"e1"}})
    assert [v for _, v in timelines["json"]] == [None, None]
    assert [v for _, v in timelines[None]] == ["builtin-ngram", "e1"]
    outcomes = [_o(0, 150, 151, version="e1", domain="json"),  # refused there: not live
                _o(1, 250, 251, version="e1", domain="json")]  # the deployment's since 200
    assert [b["n"] for b in acc.not_live(outcomes, timelines, 15.0)] == [0]


def test_the_version_before_is_allowed_until_a_new_engine_swap_is_done() -> None:
    # vLLM: a change of kind starts a second engine; the old one serves until it is up
    timeline = acc.allowed_timeline([{"at": 100.0, "version": "v1"},
                                     {"at": 200.0, "version": "builtin-ngram"}], refused=())
    swaps = [{"at": 130.0, "version": "v1", "details": {"mode": "new engine"}},
             {"at": 205.0, "version": "builtin-ngram", "details": {"mode": "in-place"}}]
    starts = acc.engine_starts(timeline, swaps)
    assert starts == [(100.0, 130.0, "builtin-ngram")]
    outcomes = [_o(0, 125, 126, version="builtin-ngram"),  # the new engine not up yet
                _o(1, 150, 151, version="builtin-ngram"),  # after the swap: not live
                _o(2, 230, 231, version="v1")]  # an in-place swap gets no more than the grace
    assert [b["n"] for b in acc.not_live(outcomes, {None: timeline}, 15.0, starts)] == [1, 2]
    assert [b["n"] for b in acc.not_live(outcomes, {None: timeline}, 15.0)] == [0, 1, 2]


def test_rows_are_matched_to_answers_by_request_number() -> None:
    outcomes = [_o(0, 0, 1), _o(1, 1, 2), _o(2, 2, 3, "disconnected"), _o(3, 3, 4)]
    rows = [Row(0, "builtin-ngram", 1, 5, 3), Row(1, "v1", 2, 5, 3), Row(1, "v1", 2, 5, 3),
            Row(2, "builtin-ngram", 3, 1, 0), Row(None, "x", 3, 0, 0)]
    got = acc.rows_vs_answers(outcomes, rows)
    assert got["answered"] == 3 and got["answered_without_row"] == 1
    assert got["missing_examples"] == [3] and got["duplicate_rows"] == 1
    assert got["rows_without_answer_by_client_outcome"] == {"disconnected": 1}
    assert got["row_version_differs_from_header"] == 2  # request 1's two rows say v1
    assert got["other_rows"] == 1


def test_a_row_lost_with_a_killed_replica_is_explained_and_no_other() -> None:
    """The short soak of 2026-12-05: request 29 was answered 29.1 s into the run, as its
    replica was SIGKILLed, and its row, still in the traffic writer's queue, died with it.
    A row missing for an answer that ended long before any kill stays unexplained."""
    outcomes = [_o(0, 0, 1), _o(1, 27.0, 29.07), _o(2, 10, 11), _o(3, 40, 41)]
    rows = [Row(0, "builtin-ngram", 1, 5, 3), Row(3, "builtin-ngram", 41, 5, 3)]
    got = acc.rows_vs_answers(outcomes, rows, kills=[29.1])
    assert got["row_lost_at_replica_kill"] == 1 and got["lost_examples"] == [1]
    assert got["answered_without_row"] == 1 and got["missing_examples"] == [2]
    assert acc.rows_vs_answers(outcomes, rows)["answered_without_row"] == 2  # no kill


def test_per_minute_latency_and_tau_and_memory_growth_after_warmup() -> None:
    outcomes = [_o(i, i * 6.0, i * 6.0 + 0.5 + i / 10) for i in range(20)]
    rows = [Row(i, "builtin-ngram", i * 6.0, 4, 2) for i in range(20)]
    minutes = acc.per_minute(outcomes, rows, t0=0.0)
    assert [m["answered"] for m in minutes] == [10, 10]
    assert minutes[0]["tau"] == 1.5 and minutes[0]["p50_s"] == 0.9
    leak = [(m * 60.0, "replica[1]", (100 + 10 * m) << 20) for m in range(8)]
    saw = [(m * 60.0, "controller[2]", (500 if m % 2 else 1500) << 20) for m in range(8)]
    late = [(m * 60.0, "replica[3]", (100 if m < 5 else 200) << 20) for m in range(4, 12)]
    mem = acc.memory(leak + saw + late, t0=0.0, warmup_s=120.0)
    assert mem["replica[1]"]["growth_after_warmup_pct"] == 33.3  # floor 120 → 160 MiB
    assert mem["controller[2]"]["growth_after_warmup_pct"] == 0.0  # a saw-tooth, no leak
    assert mem["replica[3]"]["growth_after_warmup_pct"] == 0.0  # its rise was its warm-up
    # a controller loads its target at its first cycle (minute 4) and keeps it: from there on
    kept = [(m * 60.0, "controller[4]", (500 if m < 4 else 1500) << 20) for m in range(12)]
    assert acc.memory(kept, t0=0.0, warmup_s=120.0)["controller[4]"][
        "growth_after_warmup_pct"] == 200.0
    mem = acc.memory(kept, t0=0.0, warmup_s=120.0, warm_from={"controller[4]": 230.0})
    assert mem["controller[4]"]["growth_after_warmup_pct"] == 0.0


def test_a_controllers_warm_up_ends_with_its_first_cycle_that_trained() -> None:
    from autospec.bench.soak.figures import controller_warm

    def note(at: float, actor: str, outcome: str) -> dict[str, object]:
        return {"kind": "note", "at": at, "actor": actor,
                "details": {"type": "cycle", "outcome": outcome}}

    events = [note(50.0, "vm:7:ab", "nothing_to_do"), note(90.0, "vm:7:ab", "promoted"),
              note(300.0, "vm:7:ab", "rejected"), note(120.0, "vm:8:cd", "interrupted"),
              {"kind": "promotion", "at": 91.0, "actor": "vm:9:ef", "details": {}}]
    assert controller_warm(events) == {"controller[7]": 90.0}


def test_a_controller_killed_inside_a_cycle_is_judged_up_to_its_last_finished_cycle() -> None:
    """The second vLLM soak's case: a controller's floor between cycles flat, then killed in
    a cycle holding twice as much (minutes 9-11) — not a leak. A controller alive to the end
    is judged to the end; one killed before it finished a cycle is not judged at all."""
    from autospec.bench.soak.figures import controller_killed_until, judge_memory

    def note(at: float, actor: str, outcome: str) -> dict[str, object]:
        return {"kind": "note", "at": at, "actor": actor,
                "details": {"type": "cycle", "outcome": outcome}}

    killed = [(m * 60.0, "controller[4]", (1000 if m < 9 else 2000) << 20) for m in range(12)]
    alive = [(m * 60.0, "controller[5]", (1000 if m < 9 else 2000) << 20) for m in range(20)]
    early = [(m * 60.0, "controller[6]", (100 if m < 2 else 1000) << 20) for m in range(8)]
    samples = killed + alive + early
    events = [note(130.0, "vm:4:ab", "promoted"), note(500.0, "vm:4:ab", "rejected"),
              note(130.0, "vm:5:cd", "promoted"), note(700.0, "vm:5:cd", "interrupted")]
    assert controller_killed_until(events, samples) == {"controller[4]": 500.0,
                                                        "controller[6]": -120.0}
    mem = judge_memory(samples, events, t0=0.0, warmup_s=120.0)
    assert mem["controller[4]"]["growth_after_warmup_pct"] == 0.0  # minutes 3-8 only
    assert mem["controller[4]"]["judged_until_minute"] == 8
    assert mem["controller[5]"]["growth_after_warmup_pct"] == 100.0  # alive: to the end
    assert mem["controller[6]"]["growth_after_warmup_pct"] is None
    # the rule before: the killed one's last third was its cycle
    assert acc.memory(killed, t0=0.0, warmup_s=120.0)["controller[4]"][
        "growth_after_warmup_pct"] == 100.0


def test_the_schedule_names_known_faults_and_the_policy_parses() -> None:
    from autospec.controller.policy import parse_policy

    assert {name for _, name, _ in SHORT_SCHEDULE} <= set(FAULTS)
    cfg = SoakConfig(short=True, faults=["db_locked"])
    assert [name for _, name, _ in cfg.schedule()] == ["db_locked"]
    policy = parse_policy(policy_yaml(SoakConfig(cycle_interval_s=45)), source="soak.yaml")
    assert policy.schedule.interval is not None
    assert policy.schedule.interval.total_seconds() == 45


def test_an_operator_move_too_late_to_be_seen_is_skipped_not_failed() -> None:
    """Near the end of a run there is no traffic left to show the two swaps: the fault says
    so instead of failing (and moves no pointer)."""
    import time
    from types import SimpleNamespace

    from autospec.bench.soak.operator_faults import OPERATOR_WINDOW_S, operator_promote_rollback

    ctx = SimpleNamespace(deadline=time.time() + OPERATOR_WINDOW_S / 4)
    rec = operator_promote_rollback(ctx)  # type: ignore[arg-type]
    assert not rec.ok and "s of traffic left" in rec.skipped and rec.at == 0.0


def test_short_lived_processes_are_one_row_per_kind_in_the_report() -> None:
    from autospec.bench.soak.report import _memory

    memory = {"replica[7]": {"rss_mib_per_minute": {"3": 1186.0, "30": 1389.0},
                             "growth_after_warmup_pct": 12.1},
              **{f"VLLM::EngineCore[{p}]": {"rss_mib_per_minute": {"12": 700.0 + p},
                                            "growth_after_warmup_pct": None}
                 for p in (1, 2, 3)},
              "mp-spawn[9]": {"rss_mib_per_minute": {"1": 20.0},
                              "growth_after_warmup_pct": None},
              "controller[8]": {"rss_mib_per_minute": {"14": 1437.0, "22": 2309.0},
                                "growth_after_warmup_pct": -0.7,
                                "between_cycles_mib_per_minute": {"14": 1437.0}}}
    rows = _memory({"memory": memory})[2:]
    assert rows == ["| replica[7] | 1186 → 1389 | +12.1 % |",
                    "| controller[8] | 1437 → 2309 | -0.7 % between cycles |",
                    "| VLLM::EngineCore ×3, each too short-lived to judge | largest 703 | — |"]


def test_python_helpers_are_named_by_what_they_run() -> None:
    from autospec.bench.soak.procs import _python_kind

    assert _python_kind(["-B", "-c", "from multiprocessing.resource_tracker import main"]) \
        == "mp-resource-tracker"
    assert _python_kind(["-B", "-s", "-c", "from multiprocessing.spawn import spawn_main"]) \
        == "mp-spawn"
    assert _python_kind(["-u", "/x/ray/dashboard/agent.py", "--x"]) == "agent"
    assert _python_kind(["-m", "ray.util.client.server"]) == "server"


def test_a_controller_is_judged_between_its_cycles() -> None:
    """The 30-minute native soak's case (2026-12-04): a controller's floor flat at 1437 MiB,
    its last judged minutes all inside a cycle at 2300-2600 MiB; by whole minutes it "grew"
    60 %. Judged on its samples between cycles it is flat; a floor that rises between
    cycles is still caught."""
    from autospec.bench.soak.figures import controller_busy, judge_memory

    def note(at: float, pid: int, type_: str, cycle_id: str, **details: object) -> dict:
        return {"kind": "note", "at": at, "actor": f"vm:{pid}:ab",
                "details": {"type": type_, "cycle_id": cycle_id, **details}}

    events = [note(100.0, 4, "cycle_start", "a"), note(170.0, 4, "cycle", "a",
                                                       outcome="promoted"),
              note(600.0, 4, "cycle_start", "b"),
              note(700.0, 5, "cycle", "b", outcome="interrupted"),  # another's record
              note(100.0, 6, "cycle_start", "c"), note(170.0, 6, "cycle", "c",
                                                       outcome="rejected")]
    assert controller_busy(events) == {"controller[4]": [(100.0, 170.0), (600.0, float("inf"))],
                                       "controller[6]": [(100.0, 170.0)]}

    def rss(pid: int, floor: float, step: float = 0.0) -> list[tuple[float, str, int]]:
        out = []
        for t in range(0, 900, 10):
            busy = 100 <= t <= 170 or (pid == 4 and t >= 600)
            mib = 2400 if busy else floor + (step if t > 300 else 0)
            out.append((float(t), f"controller[{pid}]", int(mib) << 20))
        return out

    samples = rss(4, 1437) + rss(6, 1437, step=300) + [(900.0, "controller[5]", 1 << 30)]
    mem = judge_memory(samples, events, t0=0.0, warmup_s=120.0)
    assert mem["controller[4]"]["growth_after_warmup_pct"] == 0.0
    assert mem["controller[4]"]["rss_mib_per_minute"]["12"] == 2400.0  # shown, not judged
    assert "12" not in mem["controller[4]"]["between_cycles_mib_per_minute"]
    assert mem["controller[6]"]["growth_after_warmup_pct"] == 20.9  # 1437 → 1737 MiB
