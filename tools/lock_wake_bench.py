"""The hardware executor's lock (hw.rwlock.ThreadedSharedMutex) timed on its own: the source of
the CPU preset's optional lock terms (reports/validation-h200/concurrency/PROTOCOL-3.md).

Python threads only (no GPU, no manager); every time is the lock's own log (``Acquisition``
request, grant and release, ``time.perf_counter`` relative to the lock's ``t0``) or
``time.perf_counter`` around a call.

* ``free`` (one thread, nothing else running): ``n`` exclusive acquisitions of a free lock, each
  released at once. Per acquisition the lock log's wait (grant - request: the Python of
  ``_request``, the test and ``_grant`` inside ``with self._cond``) and the duration of the
  ``release()`` call (``with self._cond``, ``_release`` and ``notify_all`` with no waiter).
  Medians: ``lock_test_us`` and ``lock_release_us``.
* ``first`` (``--first-n``, default 300): a fresh thread's first acquisitions. The lock is warmed
  by the main thread first (as the judged runs' lock is by their earlier calls); then, ``n``
  times, a new thread acquires it exclusively and releases it twice in a row, sleeps 500 us,
  does it a third time, and is joined. Per thread the lock log's wait of each of the three.
  Median of the first: ``lock_first_test_us`` (a one-call writer thread's test of a free lock).
  With ``--first-busy K[,K...]``, again with K background threads running meanwhile, never
  touching the lock: a pure-Python spin (``--first-busy-work spin``) or a shipped scenario's
  manager probe in a closed loop (``pdr``, ``seed``), as the judged closed loops' probe threads
  run (call 8: free-lock writers waited 0.0105-0.0163 ms in the closed loops, 0.0080-0.0096 in
  the loops that sleep; reports/validation-h200/concurrency/README.md, "Call 8").
* ``handover`` for each waiter count k (``--waiters``, default 0,1,3,7): a holder thread holds
  the lock exclusively; a writer thread and k reader threads request it and block (writer
  preference, so the readers stay queued behind the writer); once all k+1 wait (the Condition's
  waiter list says so) and 200 us more, the holder releases. ``notify_all`` wakes all k+1; the
  writer wins the test (first writer queued), holds for nothing and releases; the readers then
  enter and leave. Per repetition the writer's grant less the holder's release (lock log).
  Medians per k; ``lock_wake_us`` = the median at k = 0 less ``lock_test_us`` (the re-test the
  woken writer pays, as the simulator prices it).
* ``drain`` (recorded, no term; the contended drain, for designs): ``--drain-readers`` reader
  threads in a closed loop under reader preference, each holding the lock shared for one of
  ``--drain-work-us`` (a list) of pure Python, for ``--drain-s`` seconds, with W writer threads
  (W in ``--drain-writers``) queued the whole time (starved: every release wakes them to
  re-test). Per W: reader acquisitions per second, and the medians and 90th percentiles of the
  readers' hold (lock log), of their ``acquire()`` and ``release()`` calls (which include waiting
  for the Condition's mutex) and the share of releases over 100 us. ``--drain-probes`` repeats
  it with a shipped scenario's manager probe inside the lock instead of the spin (``pdr``:
  probe_during_resize's, ``seed``: seed_concurrency_tests's; ``work_us`` is then the probe alone).
* ``sleep`` (``--sleeps-us``): a lone thread's ``time.sleep(S)``, ``--sleep-n`` times per S: how
  much longer than S it lasted (quantiles, the form of the CPU preset's ``sleep_overshoot_us``).

    python3 tools/lock_wake_bench.py OUT.json [--n 2000] [--first-n 300] [--reps 300] [--waiters 0,1,3,7]
        [--drain-readers 8] [--drain-writers 0,1,2] [--drain-work-us 40,125] [--drain-s 0.5]
        [--drain-probes pdr,seed] [--sleeps-us 500,2000] [--sleep-n 1000]
        [--first-busy 0,4,8] [--first-busy-work spin|pdr|seed]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hw.rwlock import ThreadedSharedMutex  # noqa: E402
from kvsim.runtime.apis import LockMode  # noqa: E402


def _q(values: list[float]) -> dict:
    a = np.asarray(values) * 1e6
    return {"n": int(a.size), "median_us": round(float(np.median(a)), 3),
            "p10_us": round(float(np.quantile(a, 0.1)), 3),
            "p90_us": round(float(np.quantile(a, 0.9)), 3)}


def free(n: int) -> dict:
    lock = ThreadedSharedMutex("writer")
    waits, releases = [], []
    for i in range(n + 200):  # the first 200 warm up
        acq = lock.acquire("w", LockMode.EXCLUSIVE, "bench")
        t = time.perf_counter()
        lock.release("w")
        r = time.perf_counter() - t
        if i >= 200:
            waits.append(acq.granted - acq.requested)
            releases.append(r)
        lock.log.clear()
    return {"lock_log_wait": _q(waits), "release_call": _q(releases)}


def first(n: int, busy: int = 0, work=None) -> dict:
    """The ``first`` condition; ``busy`` background threads call ``work`` (default: a spin) in
    a closed loop meanwhile, without the lock."""
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            work() if work is not None else _spin(2000)

    threads = [threading.Thread(target=background, daemon=True) for _ in range(busy)]
    for t in threads:
        t.start()
    try:
        return _first(n)
    finally:
        stop.set()
        for t in threads:
            t.join()


def _first(n: int) -> dict:
    lock = ThreadedSharedMutex("writer")
    for _ in range(200):  # warm, as the judged runs' lock is
        lock.acquire("main", LockMode.EXCLUSIVE, "bench")
        lock.release("main")
    lock.log.clear()
    firsts, seconds, after_sleep = [], [], []

    def one(name: str) -> None:
        for record in (firsts, seconds, after_sleep):
            if record is after_sleep:
                time.sleep(500e-6)
            acq = lock.acquire(name, LockMode.EXCLUSIVE, "bench")
            lock.release(name)
            record.append(acq.granted - acq.requested)

    for i in range(n):
        t = threading.Thread(target=one, args=(f"t{i}",))
        t.start()
        t.join()
        lock.log.clear()
    return {"first_lock_log_wait": _q(firsts), "second_lock_log_wait": _q(seconds),
            "after_500us_sleep_lock_log_wait": _q(after_sleep)}


def _waiting(lock: ThreadedSharedMutex) -> int:
    with lock._cond:
        return len(lock._cond._waiters)


def handover(k: int, reps: int) -> dict:
    lock = ThreadedSharedMutex("writer")
    latencies: list[float] = []
    for _ in range(reps):
        lock.log.clear()
        lock.acquire("holder", LockMode.EXCLUSIVE, "bench")
        workers = [threading.Thread(target=lambda: (lock.acquire("writer", LockMode.EXCLUSIVE, "bench"),
                                                    lock.release("writer")))]
        for j in range(k):
            name = f"reader{j}"
            workers.append(threading.Thread(
                target=lambda name=name: (lock.acquire(name, LockMode.SHARED, "bench"),
                                          lock.release(name))))
        workers[0].start()
        while _waiting(lock) < 1:
            time.sleep(20e-6)
        for w in workers[1:]:
            w.start()
        deadline = time.perf_counter() + 5.0
        while _waiting(lock) < k + 1 and time.perf_counter() < deadline:
            time.sleep(20e-6)
        time.sleep(200e-6)
        lock.release("holder")
        for w in workers:
            w.join()
        held = next(a for a in lock.log if a.thread == "holder")
        writer = next(a for a in lock.log if a.thread == "writer")
        latencies.append(writer.granted - held.released)
    return {"waiters_woken": k + 1, "grant_after_release": _q(latencies)}


def _spin(n: int) -> int:
    x = 0
    for i in range(n):
        x += i
    return x


def _spin_count(work_us: float) -> int:
    n = 1000
    while True:
        t = time.perf_counter()
        _spin(n)
        dt = time.perf_counter() - t
        if dt > 2e-3:
            return max(int(n * work_us * 1e-6 / dt), 1)
        n *= 2


def drain(readers: int, writers: int, work_us: float, seconds: float, n: int,
          work=None, kind: str = "spin") -> dict:
    """``n``: the spin count that takes ``work_us`` alone (:func:`_spin_count`); ``work``: a
    zero-argument callable run inside the lock instead of the spin (``kind`` names it)."""
    lock = ThreadedSharedMutex("reader")
    inside = work if work is not None else (lambda: _spin(n))
    stop = threading.Event()
    acq_s: list[float] = []
    rel_s: list[float] = []

    def reader(name: str) -> None:
        mine_a, mine_r = [], []
        while not stop.is_set():
            t = time.perf_counter()
            lock.acquire(name, LockMode.SHARED, "bench")
            t1 = time.perf_counter()
            inside()
            t2 = time.perf_counter()
            lock.release(name)
            mine_a.append(t1 - t)
            mine_r.append(time.perf_counter() - t2)
        acq_s.extend(mine_a)
        rel_s.extend(mine_r)

    def writer(name: str) -> None:
        lock.acquire(name, LockMode.EXCLUSIVE, "bench")
        lock.release(name)

    rs = [threading.Thread(target=reader, args=(f"reader{i}",)) for i in range(readers)]
    for r in rs:
        r.start()
    time.sleep(0.02)
    ws = [threading.Thread(target=writer, args=(f"writer{i}",)) for i in range(writers)]
    for w in ws:
        w.start()
    time.sleep(0.01)
    t0 = time.perf_counter() - lock.t0
    time.sleep(seconds)
    t1 = time.perf_counter() - lock.t0
    stop.set()
    for t in rs + ws:
        t.join()
    holds = [a.released - a.granted for a in lock.log if a.mode == "shared"
             and a.granted is not None and a.released is not None and t0 <= a.granted <= t1]
    return {"kind": kind, "readers": readers, "writers_waiting": writers, "work_us": work_us,
            "spins": n,
            "reader_acquisitions_per_s": round(len(holds) / (t1 - t0), 1),
            "hold": _q(holds), "acquire_call": _q(acq_s), "release_call": _q(rel_s),
            "release_over_100us_share": round(sum(r > 1e-4 for r in rel_s) / max(len(rel_s), 1), 4)}


PROBES = {"pdr": "scenarios/concurrency/probe_during_resize.yaml",
          "seed": "scenarios/bugs/seed_concurrency_tests.yaml"}


def probe_work(kind: str):
    """The manager probe of a shipped scenario (tools/probe_after_sleep.py's), warmed up, and
    its median time alone in us."""
    sys.path.insert(0, str(ROOT / "tools"))
    from probe_after_sleep import probe_call

    probe, keep = probe_call(PROBES[kind])
    times = []
    for _ in range(300):
        t = time.perf_counter()
        probe()
        times.append(time.perf_counter() - t)
    return probe, keep, float(np.median(times[100:])) * 1e6


def sleeps(sleeps_us: list[float], n: int) -> list[dict]:
    """A lone thread's ``time.sleep(S)``: how much longer than S it took, per S."""
    out = []
    for s_us in sleeps_us:
        extra = []
        for _ in range(n):
            t = time.perf_counter()
            time.sleep(s_us * 1e-6)
            extra.append(time.perf_counter() - t - s_us * 1e-6)
        probs = [0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0]
        out.append({"sleep_us": s_us, "n": n, "overshoot": _q(extra),
                    "overshoot_quantiles_us": {"probs": probs, "quantiles_us": [
                        round(float(np.quantile(np.asarray(extra) * 1e6, p)), 2) for p in probs]}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--first-n", type=int, default=300)
    ap.add_argument("--waiters", default="0,1,3,7")
    ap.add_argument("--drain-readers", type=int, default=8)
    ap.add_argument("--drain-writers", default="0,1,2")
    ap.add_argument("--drain-work-us", default="40", help="comma-separated list")
    ap.add_argument("--drain-s", type=float, default=0.5)
    ap.add_argument("--drain-probes", default="", help="also drain with these manager probes "
                    "inside the lock: pdr, seed (comma-separated)")
    ap.add_argument("--sleeps-us", default="", help="also time a lone time.sleep of these us")
    ap.add_argument("--sleep-n", type=int, default=1000)
    ap.add_argument("--first-busy", default="", help="also the first condition with these many "
                    "background threads running (comma-separated, e.g. 0,4,8)")
    ap.add_argument("--first-busy-work", default="spin", choices=("spin", *PROBES),
                    help="what the background threads run: a pure-Python spin or a scenario's "
                         "manager probe")
    a = ap.parse_args(argv)
    busy = [int(k) for k in a.first_busy.split(",") if k]
    if any(k < 0 for k in busy):
        ap.error(f"--first-busy: thread counts must be >= 0, got {a.first_busy!r}")
    t0 = time.perf_counter()
    out: dict = {"what": "tools/lock_wake_bench.py: hw.rwlock.ThreadedSharedMutex timed alone",
                 "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                 "python": sys.version, "machine": platform.node(), "n": a.n, "reps": a.reps}
    out["free"] = free(a.n)
    out["first"] = first(a.first_n)
    if busy:
        work = keep = None  # keep: what the probe needs alive
        if a.first_busy_work != "spin":
            work, keep, _alone_us = probe_work(a.first_busy_work)
        out["first_busy"] = [{"busy_threads": k, "work": a.first_busy_work,
                              **first(a.first_n, k, work)} for k in busy]
    out["handover"] = [handover(int(k), a.reps) for k in a.waiters.split(",")]
    out["drain"] = []
    for work in (float(x) for x in a.drain_work_us.split(",")):
        spins = _spin_count(work)
        out["drain"] += [drain(a.drain_readers, int(w), work, a.drain_s, spins)
                         for w in a.drain_writers.split(",")]
    for kind in [k for k in a.drain_probes.split(",") if k]:
        probe, _keep, alone_us = probe_work(kind)
        out["drain"] += [drain(a.drain_readers, int(w), round(alone_us, 2), a.drain_s, 0,
                               probe, f"probe:{kind}")
                         for w in a.drain_writers.split(",")]
    if a.sleeps_us:
        out["sleep"] = sleeps([float(x) for x in a.sleeps_us.split(",")], a.sleep_n)
    test = out["free"]["lock_log_wait"]["median_us"]
    k0 = next(h for h in out["handover"] if h["waiters_woken"] == 1)
    out["derived"] = {
        "lock_test_us": test,
        "lock_release_us": out["free"]["release_call"]["median_us"],
        "lock_wake_us": round(max(k0["grant_after_release"]["median_us"] - test, 0.0), 3),
        "lock_first_test_us": out["first"]["first_lock_log_wait"]["median_us"],
        "rule": "lock_test_us: free.lock_log_wait median; lock_release_us: free.release_call "
                "median; lock_wake_us: handover with 1 waiter woken, grant_after_release median "
                "less lock_test_us (floored at 0); lock_first_test_us: first."
                "first_lock_log_wait median"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["derived"]), f"({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
