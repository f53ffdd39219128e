"""CPU cost of the manager's bookkeeping, priced from the counts in each plan.

``seconds(plan) = per_call + sum(unit_cost[k] * counts[k])`` over the plan's
:class:`~kvsim.manager.plan.WorkCounts`. A change in the manager's structure (one statistics
commit per batch instead of per page) changes the counts and therefore the predicted time; no
variant has constants of its own.

Presets live in ``kvsim/hardware/cpu/*.json``; every unit cost names its source. A preset with
``includes_copy_submission`` true was fitted to end-to-end host times that already contain the
submission of the copies, so the executor does not add the copy path's host cost on top.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.hardware.spec import load_preset_json
from kvsim.manager import KVCacheManager  # noqa: F401 - defines the public calls CALL_NAMES lists
from kvsim.manager.calls import CALL_NAMES
from kvsim.manager.plan import WorkCounts
from kvsim.model.handover import Handover

CPU_PRESET_DIR = Path(__file__).resolve().parents[1] / "hardware" / "cpu"
UNITS = tuple(f.name for f in fields(WorkCounts))


def cpu_preset_names() -> list[str]:
    return sorted(p.stem for p in CPU_PRESET_DIR.glob("*.json"))


@dataclass(frozen=True)
class CpuCostModel:
    name: str
    description: str
    per_call_us: float
    unit_us: dict[str, float]
    callback_us: float  # Python work per priority-callback or event-sink call (holds the GIL)
    python_call_us: float  # Python-side cost of entering and leaving a binding (holds the GIL)
    includes_copy_submission: bool
    # True for a manager written in Python: its CPU work runs holding the GIL, so concurrent
    # Python threads queue for it (False for KVCM2's C++, which runs with the GIL released).
    holds_gil: bool = False
    # CPython's sys.getswitchinterval() default: a waiter asks the holder to drop the GIL after it.
    gil_switch_interval_us: float = 5000.0
    # Host work of a workload thread's first call runs this many times slower (a thread that has
    # just started: fresh malloc arena, another core's caches); 1.0 where not measured.
    first_call_factor: float = 1.0
    # Measured GIL hand-over (kvsim.sim.gil.Handover, from kvsim calibrate); None: CPython's
    # switch-interval rule alone.
    gil_handover: Handover | None = None
    # Host time of threading.Thread.start() on the thread that starts the workload threads. With
    # a Python manager and a value > 0 the simulator starts the threads as the hardware executor
    # does: one at a time, from a main thread that needs the GIL for each; 0: all at time 0.
    thread_start_us: float = 0.0
    # The host speed the costs above were stretched by when loaded (they include it already).
    host_speed_factor: float = 1.0
    # Extra host time of a thread's first Python after it slept for t: ((t_us, extra_us), ...)
    # ascending, interpolated linearly (0 extra at t = 0), flat beyond the last point; empty: none.
    after_sleep_us: tuple[tuple[float, float], ...] = ()
    # How many times slower every host cost of a thread's next call runs after it slept for t
    # (from the sleep's end to the call's end: the probe, its lock tests, its Python edges):
    # ((t_us, factor), ...) ascending, interpolated linearly (1 at t = 0), flat beyond the last
    # point; empty: none. A woken thread finds its caches cold (measured in the judged runs:
    # manager CPU, lock test and Python edges all about twice the closed loops'). With a C++
    # manager (holds_gil false) only the Python edges are stretched.
    after_sleep_factor: tuple[tuple[float, float], ...] = ()
    # A Python manager's lock (hw.rwlock, a threading.Condition), 0 where not measured: host time
    # (holding the GIL) of one test of the lock's condition, between the lock log's request and
    # its grant; the first test is moved out of python_call_us (which includes the uncontended
    # acquire), each re-test after a wake-up is extra.
    lock_test_us: float = 0.0
    # A Python manager's lock, 0 where not measured: time a waiter woken by a release takes to
    # run again (without the GIL) before it queues for the GIL to re-test.
    lock_wake_us: float = 0.0
    # A Python manager's lock, off where not measured: model the threading.Condition's own mutex
    # (an RLock) that every acquire, release and woken re-test of hw.rwlock holds. A thread that
    # finds it held blocks without the GIL; woken by its release (lock_wake_us later) it takes the
    # mutex and only then queues for the GIL, holding it: under a busy GIL the lock's operations
    # form a convoy (kvsim.sim.rwlock.CondMutex).
    lock_mutex: bool = False
    # With lock_mutex, 0 where not measured: host time (holding the GIL and the mutex) of a
    # release (hw.rwlock's release and notify_all), taken out of python_call_us as the first test is.
    lock_release_us: float = 0.0
    # Off where not measured: a thread's sleep ends only when it holds the GIL again (time.sleep
    # re-takes it before returning), so the wait for the GIL after a sleep lies before the next
    # call's start, as on real threads, not inside the call.
    sleep_retakes_gil: bool = False
    # A Python manager's lock, 0 where not measured (then lock_test_us): host time (holding the
    # GIL) of a woken waiter's re-test, when it differs from the first test's (a herd of woken
    # waiters costs more per waiter than one test: tools/lock_wake_bench.py's handover slope).
    lock_retest_us: float = 0.0
    # A Python manager's lock, 0 where not measured (then lock_test_us): host time (holding the
    # GIL) of a thread's first test of the lock, when it differs from later ones (a thread's first
    # acquire runs cold: the judged runs' one-call writer threads wait 10-18 us for a free lock
    # where a loop of acquires tests in ~2.4 us).
    lock_first_test_us: float = 0.0
    # How much longer than asked a sleep lasts, as a distribution: ((prob, extra_us), ...) from
    # prob 0 to 1, drawn per sleep (seeded with the GIL's draws); empty: sleeps last as asked.
    sleep_overshoot_us: tuple[tuple[float, float], ...] = ()
    # How a manager call's CPU time spreads around the modelled one on the host, as ratios:
    # ((prob, ratio), ...) from prob 0 to 1, drawn per call (seeded with the GIL's draws) and
    # multiplying the call's modelled CPU seconds; empty: every call takes exactly the model's.
    # Measured as the GIL benchmark's probe latencies over their median (identical probes).
    call_cpu_spread: tuple[tuple[float, float], ...] = ()
    # A Python manager's copy submission, 0 where not measured: the share of its host time spent
    # in CUDA calls that release the GIL (launches, asynchronous copies); the rest is Python that
    # holds it. Other threads can run, and take the manager's lock's waiters' turn, meanwhile.
    copy_submit_gil_free: float = 0.0
    # A call's own fixed cost by the manager method it ran (the plan's API: a capacity setter
    # runs KvCache.resize), in place of per_call_us; an API not listed takes per_call_us. One
    # intercept for every call misprices small calls: per_call_us is fitted where big bursts
    # and probes dominate, while a resume, close or churning resize costs 2-7x it on the hosts
    # measured (reports/validation-h200/concurrency/README.md, "After call 11").
    api_call_us: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def after_sleep_s(self, slept_s: float) -> float:
        """The extra host seconds of the first call after sleeping ``slept_s``."""
        return _interpolate(self.after_sleep_us, slept_s * 1e6, 0.0) * 1e-6

    def after_sleep_stretch(self, slept_s: float) -> float:
        """The factor on the host costs of the next call after sleeping ``slept_s``."""
        return _interpolate(self.after_sleep_factor, slept_s * 1e6, 1.0)

    def __post_init__(self) -> None:
        # The priced units, in unit_us's order, with their count readers: a call's price sums
        # these (the same terms in the same order as over every unit, skipping zero costs),
        # twice per call of a long replay. (unit_us is never changed in place.)
        priced = [(unit, cost) for unit, cost in self.unit_us.items() if cost]
        object.__setattr__(self, "_priced", tuple(priced))
        object.__setattr__(self, "_priced_counts",
                           operator.attrgetter(*(u for u, _ in priced)) if priced else None)

    def price(self, counts: WorkCounts, api: str | None = None) -> tuple[float, dict[str, float]]:
        """:meth:`seconds` and :meth:`terms_us` of one call, in one pass (an executor asks for
        both on every call)."""
        # the fixed cost of a call of the manager method ``api`` (a plan's API label), then
        # the priced units
        total = self.api_call_us.get(api, self.per_call_us) if api else self.per_call_us
        terms = {"per_call": total}
        get = self._priced_counts
        values = () if get is None else get(counts) if len(self._priced) > 1 else (get(counts),)
        for (unit, cost), n in zip(self._priced, values):
            total += cost * n
            if n:
                terms[unit] = cost * n
        return total * 1e-6, terms

    def seconds(self, counts: WorkCounts, api: str | None = None) -> float:
        """Host seconds of a call of ``api`` (the plan's API; None: per_call_us) with ``counts``."""
        return self.price(counts, api)[0]

    def terms_us(self, counts: WorkCounts, api: str | None = None) -> dict[str, float]:
        """Each unit's contribution, for reports that trace a time to its formula."""
        return self.price(counts, api)[1]


def load_cpu_model(name_or_path: str | Path) -> CpuCostModel:
    """A CPU preset by name, or a CPU preset JSON file by path."""
    path, data = load_preset_json(name_or_path, CPU_PRESET_DIR, "CPU cost")
    return cpu_model_from_dict(data, path)


def cpu_model_from_dict(data: dict, path: str | Path) -> CpuCostModel:
    """A CPU preset already parsed; ``path`` names it in errors."""
    path = Path(path)
    sources: dict[str, str] = {}

    def value(key: str, entry: object, signed: bool = False) -> float:
        if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
            raise ConfigError(f"{path}: {key}: write {{\"value\": ..., \"source\": \"...\"}}")
        sources[key] = str(entry["source"])
        v = entry["value"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (v < 0 and not signed):
            raise ConfigError(f"{path}: {key}: must be a number{'' if signed else ' >= 0'}, "
                              f"got {v!r}")
        return float(v)

    def optional(key: str, default: float = 0.0, signed: bool = False) -> float:
        return value(key, data[key], signed) if key in data else default

    units = data.get("unit_us", {})
    unknown = sorted(set(units) - set(UNITS))
    if unknown:
        raise ConfigError(f"{path}: unit_us.{unknown[0]}: not a plan count "
                          f"(known: {', '.join(UNITS)})")
    # How fast the host ran when the preset was used against when its costs were timed
    # (kvsim.calibration.host_speed): every host cost is stretched by it.
    speed = optional("host_speed_factor", 1.0)
    if speed <= 0:
        raise ConfigError(f"{path}: host_speed_factor: must be > 0, got {speed!r}")
    return CpuCostModel(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        per_call_us=value("per_call_us", data.get("per_call_us")) * speed,
        unit_us={k: value(f"unit_us.{k}", v) * speed for k, v in units.items()},
        callback_us=value("callback_us", data.get("callback_us")) * speed,
        python_call_us=value("python_call_us", data.get("python_call_us")) * speed,
        includes_copy_submission=bool(data.get("includes_copy_submission", False)),
        holds_gil=bool(data.get("holds_gil", False)),
        first_call_factor=optional("first_call_factor", 1.0),
        gil_handover=_handover(path, data, optional, sources),
        thread_start_us=optional("thread_start_us", 0.0) * speed,
        host_speed_factor=speed,
        after_sleep_us=_after_sleep(path, data, sources, speed),
        after_sleep_factor=_after_sleep_factor(path, data, sources),
        lock_test_us=optional("lock_test_us", 0.0) * speed,
        lock_wake_us=optional("lock_wake_us", 0.0) * speed,
        lock_mutex=_flag(path, data, "lock_mutex", sources),
        lock_release_us=optional("lock_release_us", 0.0) * speed,
        sleep_retakes_gil=_flag(path, data, "sleep_retakes_gil", sources),
        lock_retest_us=optional("lock_retest_us", 0.0) * speed,
        lock_first_test_us=optional("lock_first_test_us", 0.0) * speed,
        sleep_overshoot_us=_overshoot(path, data, sources),
        call_cpu_spread=_spread(path, data, sources),
        copy_submit_gil_free=_share(path, data, "copy_submit_gil_free", sources),
        api_call_us=_api_call_us(path, data, sources, speed),
        sources=sources,
    )


def _interpolate(pts: tuple[tuple[float, float], ...], t: float, at_zero: float) -> float:
    """``pts``' value at ``t``: linear between points, ``at_zero`` at t <= 0 (and from 0 to the
    first point), flat beyond the last; ``at_zero`` where there are no points."""
    if not pts or t <= 0:
        return at_zero
    prev_t, prev_x = 0.0, at_zero
    for pt, x in pts:
        if t <= pt:
            return prev_x + (x - prev_x) * (t - prev_t) / (pt - prev_t)
        prev_t, prev_x = pt, x
    return prev_x


def _field(data: dict, key: str) -> tuple[bool, object]:
    """(present, value) of an optional ``{"value": ..., "source": "..."}`` field: (False, None)
    when absent; a value of None when the field is not written that way, which each loader's
    check of the value then refuses with its own message (naming the file and the key). A
    loader notes ``data[key]["source"]`` once the value passed."""
    entry = data.get(key)
    if entry is None:
        return False, None
    shaped = isinstance(entry, dict) and set(entry) == {"value", "source"}
    return True, entry["value"] if shaped else None


def _overshoot(path: Path, data: dict, sources: dict[str, str]) -> tuple[tuple[float, float], ...]:
    """``sleep_overshoot_us``: {"value": {"probs": [0, ..., 1], "quantiles_us": [...]},
    "source"}, probs rising from 0 to 1, quantiles >= 0 not falling; absent: none."""
    return _distribution(path, data, "sleep_overshoot_us", "quantiles_us", 0.0, sources)


def _spread(path: Path, data: dict, sources: dict[str, str]) -> tuple[tuple[float, float], ...]:
    """``call_cpu_spread``: {"value": {"probs": [0, ..., 1], "ratios": [...]}, "source"}, probs
    rising from 0 to 1, ratios > 0 not falling; absent: none."""
    return _distribution(path, data, "call_cpu_spread", "ratios", None, sources)


def _distribution(path: Path, data: dict, key: str, column: str, least: float | None,
                  sources: dict[str, str]) -> tuple[tuple[float, float], ...]:
    """A distribution field as (prob, value) pairs: ``column``'s values at ``probs`` from 0 to 1,
    not falling, at least ``least`` (None: above 0); absent: ()."""
    present, v = _field(data, key)
    if not present:
        return ()
    probs = v.get("probs") if isinstance(v, dict) else None
    qs = v.get(column) if isinstance(v, dict) else None
    ok = (isinstance(probs, list) and isinstance(qs, list) and len(probs) == len(qs) >= 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in probs + qs))
    low_ok = ok and (qs[0] > 0 if least is None else qs[0] >= least)
    if not low_ok or probs[0] != 0 or probs[-1] != 1 or any(b <= a for a, b in zip(probs, probs[1:])) \
            or any(b < a for a, b in zip(qs, qs[1:])):
        bound = "> 0" if least is None else f">= {least:g}"
        raise ConfigError(f"{path}: {key}: write {{\"value\": {{\"probs\": [0, ..., 1], "
                          f"\"{column}\": [...]}}, \"source\": \"...\"}} (probs rising, {column} "
                          f"{bound} not falling)")
    sources[key] = str(data[key]["source"])
    return tuple((float(p), float(q)) for p, q in zip(probs, qs))


def _share(path: Path, data: dict, key: str, sources: dict[str, str]) -> float:
    """An optional share: {"value": 0 to 1, "source": "..."}; absent: 0."""
    present, v = _field(data, key)
    if not present:
        return 0.0
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
        raise ConfigError(f"{path}: {key}: write {{\"value\": a share from 0 to 1, "
                          "\"source\": \"...\"}}")
    sources[key] = str(data[key]["source"])
    return float(v)


def _api_call_us(path: Path, data: dict, sources: dict[str, str], speed: float) -> dict[str, float]:
    """Optional ``api_call_us``: {"value": {manager method label: us >= 0}, "source": "..."},
    stretched by the host speed like every host cost; absent: none. A label must name a method
    a plan reports (``KvCache.resize``, not the capacity setter that runs it)."""
    present, value = _field(data, "api_call_us")
    if not present:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: api_call_us: write {{\"value\": {{\"KvCache.resume\": us, "
                          "...}}, \"source\": \"...\"}}")
    out = {}
    for label, us in value.items():
        if label not in CALL_NAMES:
            raise ConfigError(f"{path}: api_call_us.{label}: not a manager method a plan reports "
                              f"(known: {', '.join(sorted(CALL_NAMES))})")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or us < 0:
            raise ConfigError(f"{path}: api_call_us.{label}: must be a number >= 0, got {us!r}")
        out[label] = float(us) * speed
    sources["api_call_us"] = str(data["api_call_us"]["source"])
    return out


def _flag(path: Path, data: dict, key: str, sources: dict[str, str]) -> bool:
    """An optional switch: {"value": true|false, "source": "..."}; absent: False."""
    present, value = _field(data, key)
    if not present:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: {key}: write {{\"value\": true or false, \"source\": \"...\"}}")
    sources[key] = str(data[key]["source"])
    return value


def _after_sleep(path: Path, data: dict, sources: dict[str, str],
                 speed: float) -> tuple[tuple[float, float], ...]:
    """``after_sleep_us``: {"value": [[sleep_us, extra_us], ...], "source"}, sleep times rising
    from > 0, extras >= 0 (host time: stretched by the host speed); absent: no extra."""
    pts = _sleep_points(path, data, "after_sleep_us", "extra_us", sources)
    if any(x < 0 for _, x in pts):
        raise ConfigError(f"{path}: after_sleep_us: extra_us must be >= 0")
    return tuple((t, x * speed) for t, x in pts)


def _after_sleep_factor(path: Path, data: dict,
                        sources: dict[str, str]) -> tuple[tuple[float, float], ...]:
    """``after_sleep_factor``: {"value": [[sleep_us, factor], ...], "source"}, sleep times rising
    from > 0, factors > 0 (a ratio of host times: not stretched by the host speed); absent: 1."""
    pts = _sleep_points(path, data, "after_sleep_factor", "factor", sources)
    if any(not x > 0 for _, x in pts):
        raise ConfigError(f"{path}: after_sleep_factor: factor must be > 0")
    return pts


def _sleep_points(path: Path, data: dict, key: str, column: str,
                  sources: dict[str, str]) -> tuple[tuple[float, float], ...]:
    """A field of points by sleep time: {"value": [[sleep_us, <column>], ...], "source"}, sleep
    times rising from > 0; absent: ()."""
    present, pts = _field(data, key)
    if not present:
        return ()
    ok = isinstance(pts, list) and pts and all(
        isinstance(p, list) and len(p) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p) for p in pts)
    if not ok or pts[0][0] <= 0 or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        raise ConfigError(f"{path}: {key}: write {{\"value\": [[sleep_us, {column}], ...], "
                          "\"source\": \"...\"}} with sleep_us rising from > 0")
    sources[key] = str(data[key]["source"])
    return tuple((float(t), float(x)) for t, x in pts)


def _handover(path: Path, data: dict, optional, sources: dict[str, str]) -> Handover | None:
    """The measured GIL hand-over: ``gil_hold_ms`` ({"value": {"probs": [...], "quantiles_ms":
    [...]}, "source"}) with ``gil_hold_waiter_exponent``, ``gil_recent_taker_share`` (0 to 1) and
    ``gil_starter_takeover_per_s``, each {"value", "source"}; absent: None."""
    key = "gil_hold_ms"
    present, value = _field(data, key)
    if not present:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key}: write {{\"value\": {{\"probs\": [...], "
                          f"\"quantiles_ms\": [...]}}, \"source\": \"...\"}}")
    probs, quantiles = value.get("probs"), value.get("quantiles_ms")
    ok = (isinstance(probs, list) and isinstance(quantiles, list) and len(probs) == len(quantiles)
          and len(probs) >= 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in probs + quantiles))
    if not ok or probs[0] != 0 or probs[-1] != 1 or any(b <= a for a, b in zip(probs, probs[1:])) \
            or quantiles[0] < 0 or any(b < a for a, b in zip(quantiles, quantiles[1:])):
        raise ConfigError(f"{path}: {key}: probs must rise from 0 to 1 and quantiles_ms (as many, "
                          ">= 0) must not fall")
    sources[key] = str(data[key]["source"])
    share = optional("gil_recent_taker_share")
    if share > 1:
        raise ConfigError(f"{path}: gil_recent_taker_share: a share, 0 to 1, got {share!r}")
    return Handover(hold=(tuple(float(p) for p in probs), tuple(float(q) * 1e-3 for q in quantiles)),
                    waiter_exponent=optional("gil_hold_waiter_exponent", signed=True),
                    recent_taker_share=share,
                    starter_takeover_per_s=optional("gil_starter_takeover_per_s"))
