"""Refitting the copy model to the fit set of the plan-shaped batches (``hw.bench_plan_batches``).

Which batches are read is :func:`refit`'s ``roles``: ``("fit",)`` (PROTOCOL.md: the layout
sweep's scattered 2 x 8 KiB, 1 x 64 KiB and 1 x 1 MiB batches, both directions) or None, every
batch of the file (PROTOCOL-2.md: the whole 2026-12-03 file is the fit set and a new measurement
the judged one; the presets use this). Each rule below names what it fits and from which points
(:data:`FIT_RULES`); every other figure stays as the hardware spec given has it.

Host time (median host enqueue time of the end-to-end samples), by non-negative, robust least
squares of the log error (:func:`robust_linear`: soft-L1 loss, 5 % scale; the host's speed moves
in phases of seconds during a run, and such a fit follows the typical point, not the phases):

* ``copy_engine.per_call_host_us`` and ``copier.submit_copy_engine_host_us``: per-page copies of
  pages below 64 KiB, host time on (1, ``cudaMemcpyAsync`` calls). Larger pages are left out:
  there the device is the slower stage and the host waits for room in the driver's queue.
* ``copy_engine.batch_call_host_us``, ``batch_descriptor_host_us`` per direction and
  ``batch_small_copy_host_us_per_kib`` per direction: ``cudaMemcpyBatchAsync`` host time on
  (1, descriptors, KiB of descriptors below ``batch_small_copy_max_bytes``) per direction, each
  row weighed by its measured value (relative errors: small batches count as much as large).
  ``batch_small_copy_max_bytes`` is 64 KiB: the fit set's smallest page (8 KiB) costs the host
  more per descriptor onboard, its 64 KiB and 1 MiB pages do not.
* ``copier.submit_batch_host_us``, ``submit_page_host_us``: kernel points, host time less one
  ``kernel.launch_host_us`` per launch, on (1, pages).
* ``copy_engine.batch_lead_descriptors`` (after the host terms): how many descriptors the
  ``cudaMemcpyBatchAsync`` call takes before the device starts, by a grid search on the
  end-to-end times of the batched points (large batches show the device starting while the
  host still builds the call: 20,000 descriptors of 64 KiB end 30 % before host + device).

End-to-end time (median ``cuda_events_issue``: submission start to last byte), per direction,
minimising a robust sum of squared log errors of
:attr:`kvsim.model.copy_paths.CopyEstimate.end_to_end_seconds` (``scipy.optimize.least_squares``,
soft-L1 loss, 5 % scale):

* ``copy_engine.per_copy_device_us``: per-page copy points;
* ``kernel.latency_us``, ``per_cta_max_gbps``, ``page_latency_us``, ``knee_p``, ``plateau_gbps``
  and ``copier.submit_after_launch_host_us`` (the part of the copier's per-batch host time after
  the launch, which the kernel runs beside; at most that per-batch time): kernel points at every
  CTA count measured; then ``copier.batch_device_us``, the device time before the first launch
  runs, as the median of the gated (device-only) time less the modelled kernels.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from kvsim.calibration.cpu_fit import relative_nnls
from kvsim.calibration.plan_batches import measured_points, role
from kvsim.hardware.spec import DIRECTIONS, HardwareSpec, PerDirection
from kvsim.model.copy_select import CopySelector

SMALL_COPY_MAX_BYTES = 64 * 1024
HOST_FIT = "non-negative, robust least squares of log error (soft-L1, 5 % scale)"
FIT_RULES = {
    "copy_engine.per_call_host_us, copier.submit_copy_engine_host_us":
        f"per-page copies of pages < 64 KiB: host enqueue time on (1, calls), {HOST_FIT}",
    "copy_engine.batch_call_host_us, batch_descriptor_host_us, batch_small_copy_host_us_per_kib":
        "cudaMemcpyBatchAsync host enqueue time on (1, descriptors, KiB of descriptors < 64 KiB) per "
        f"direction, {HOST_FIT}",
    "copy_engine.batch_small_copy_max_bytes": "64 KiB: 4, 8 and 16 KiB pages cost the host more "
                                              "per descriptor onboard, 64 KiB and larger pages do not",
    "copy_engine.batch_lead_descriptors":
        "cudaMemcpyBatchAsync points: end-to-end time, the grid value (0, 1000-40000 by 500) of "
        "least robust log loss: the device starts once the call has taken this many descriptors",
    "copier.submit_batch_host_us, submit_page_host_us": "kernel points: host enqueue time less one "
                                                        f"launch_host_us per launch, on (1, pages), "
                                                        f"{HOST_FIT}",
    "copy_engine.per_copy_device_us": "per-page copy points: end-to-end time, robust least squares "
                                      "of log error",
    "kernel.latency_us, per_cta_max_gbps, page_latency_us, knee_p, plateau_gbps, "
    "copier.submit_after_launch_host_us":
        "kernel points, every CTA count: end-to-end time, robust least squares of log error",
    "copier.batch_device_us": "kernel points, every CTA count: median of (gated device time - "
                              "modelled kernel time), at least 0",
}
KERNEL_FIELDS = ("latency_us", "per_cta_max_gbps", "page_latency_us", "knee_p", "plateau_gbps")
KERNEL_BOUNDS = {"latency_us": (0.05, 50.0), "per_cta_max_gbps": (0.5, 500.0),
                 "page_latency_us": (0.0, 5.0), "knee_p": (0.5, 30.0), "plateau_gbps": (10.0, 200.0),
                 "submit_after_launch_host_us": (0.0, 1000.0)}


@dataclass(frozen=True)
class Point:
    """One measured (batch, path, CTAs) of the fit set: medians in seconds."""

    batch: str
    direction: str
    pool_slot_bytes: tuple[int, ...]
    pages: int
    path: str
    ctas: int | None
    issue_s: float | None
    host_s: float | None
    gated_s: float | None = None

    @property
    def copies(self) -> int:
        return self.pages * len(self.pool_slot_bytes)


def fit_points(measurement: dict, roles: tuple[str, ...] | None = ("fit",)) -> list[Point]:
    """The fixed-path points of the measurement's batches whose pre-registered role is one of
    ``roles`` (None: every batch of the file)."""
    measured, _ = measured_points(measurement)
    points = []
    for b in measurement["batches"]:
        if roles is not None and role(b) not in roles:
            continue
        for key, m in sorted(measured.get(b["id"], {}).items()):
            path, _, c = key.partition(":")
            if path not in ("ce-page", "ce-batch", "kernel"):
                continue
            points.append(Point(b["id"], b["direction"], tuple(int(x) for x in b["pool_slot_bytes"]),
                                int(b["pages"]), path, int(c) if c else None, m.get("issue"),
                                m.get("host"), m.get("gated")))
    return points


def _set(hw: HardwareSpec, section: str, field: str, value, direction: str | None = None) -> HardwareSpec:
    part = getattr(hw, section)
    if direction is not None:
        old = getattr(part, field)
        value = PerDirection(**{d: (value if d == direction else old[d]) for d in DIRECTIONS})
    return replace(hw, **{section: replace(part, **{field: value})})


def _selector(hw: HardwareSpec) -> CopySelector:
    """A selector on ``hw``, the last one made again while ``hw`` is the same object (a fit
    prices every point on one spec per evaluation: one selector each, not one per point)."""
    last = _selector.last
    if last is None or last[0] is not hw:
        last = _selector.last = (hw, CopySelector(hw))
    return last[1]


_selector.last = None


def _e2e(hw: HardwareSpec, p: Point) -> float:
    """The point's predicted end-to-end seconds on ``hw``."""
    return _selector(hw).price(p.path, p.direction, p.pool_slot_bytes, p.pages, True,
                               p.ctas).end_to_end_seconds


def _device(hw: HardwareSpec, p: Point) -> float:
    """The point's predicted device seconds on ``hw`` (what its gated time measures)."""
    return _selector(hw).price(p.path, p.direction, p.pool_slot_bytes, p.pages, True,
                               p.ctas).seconds


def _robust_fit(hw: HardwareSpec, points: list[Point], names: list[tuple[str, str]], direction: str,
                bounds: list[tuple[float, float]]) -> HardwareSpec:
    """The figures ``names`` of ``direction`` that fit the points' end-to-end times best
    (robust least squares of log error, soft-L1 at 5 % scale)."""
    return _robust_fit_to(hw, points, names, direction, bounds, _e2e, lambda p: p.issue_s)


def robust_linear(rows: list[list[float]], y: list[float],
                  offset: list[float] | None = None) -> np.ndarray:
    """Non-negative coefficients ``c`` minimising a robust sum of squared log errors of
    ``offset + rows @ c`` against ``y`` (soft-L1 loss, 5 % scale), started from the non-negative
    least squares of relative error: a few phases of a slower or faster host (see the
    plan-batches README) move such a fit less than they move a least-squares one."""
    from scipy.optimize import least_squares

    a = np.asarray(rows, dtype=float)
    yv = np.asarray(y, dtype=float)
    off = np.zeros(len(yv)) if offset is None else np.asarray(offset, dtype=float)
    x0 = np.maximum(np.asarray(relative_nnls(rows, list(yv - off), list(yv)), dtype=float), 0.0)
    scale = np.maximum(np.abs(x0), 1e-3)

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(off + a @ (z * scale), 1e-12) / yv)

    res = least_squares(residuals, x0 / scale, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.05)
    return res.x * scale


def _fit_copy_engine_host(hw: HardwareSpec, pts: list[Point], speed
                          ) -> tuple[HardwareSpec, list[Point]]:
    """The copy engines' host figures, by :func:`robust_linear` on the points' host times
    divided by ``speed(point)`` (the host speed the point ran at; 1.0 for the fit host): the
    per-page calls (pages < 64 KiB), then ``cudaMemcpyBatchAsync``. Returns the spec and the
    batched points."""
    page = [p for p in pts if p.path == "ce-page" and p.host_s
            and max(p.pool_slot_bytes) < SMALL_COPY_MAX_BYTES]
    x = robust_linear([[1.0, float(p.copies)] for p in page],
                      [p.host_s * 1e6 / speed(p) for p in page])
    hw = _set(hw, "copy_engine", "per_call_host_us", float(x[1]))
    hw = replace(hw, copier=replace(hw.copier, submit_copy_engine_host_us=float(x[0])))
    batch = [p for p in pts if p.path == "ce-batch" and p.host_s]
    rows = []
    for p in batch:
        off = p.direction == "offload"
        small_kib = sum(p.pages * sb / 1024 for sb in p.pool_slot_bytes if sb < SMALL_COPY_MAX_BYTES)
        rows.append([1.0, p.copies if off else 0.0, 0.0 if off else p.copies,
                     small_kib if off else 0.0, 0.0 if off else small_kib])
    x = robust_linear(rows, [p.host_s * 1e6 / speed(p) for p in batch])
    hw = replace(hw, copy_engine=replace(
        hw.copy_engine, batch_call_host_us=float(x[0]),
        batch_descriptor_host_us=PerDirection(offload=float(x[1]), onboard=float(x[2])),
        batch_small_copy_host_us_per_kib=PerDirection(offload=float(x[3]), onboard=float(x[4])),
        batch_small_copy_max_bytes=SMALL_COPY_MAX_BYTES))
    return hw, batch


def refit(hw: HardwareSpec, measurement: dict,
          roles: tuple[str, ...] | None = ("fit",)) -> tuple[HardwareSpec, dict]:
    """``(refitted spec, report)``: the report holds each fitted figure and the fit points'
    errors. ``roles``: the batches fitted, by pre-registered role (None: every batch of the
    file, the rule since PROTOCOL-2.md)."""
    pts = [p for p in fit_points(measurement, roles) if p.issue_s]
    if not pts:
        raise ValueError(f"the measurement holds no points of roles {roles}")
    report: dict = {"points": len(pts), "roles": list(roles) if roles else "all", "rules": FIT_RULES}

    # Host: per-page calls (pages < 64 KiB), then cudaMemcpyBatchAsync
    hw, batch = _fit_copy_engine_host(hw, pts, lambda p: 1.0)

    # Host: the copier's kernel submission
    kern = [p for p in pts if p.path == "kernel" and p.host_s]
    launch = hw.kernel.launch_host_us
    x = robust_linear([[1.0, float(p.pages)] for p in kern],
                      [p.host_s * 1e6 for p in kern],
                      offset=[len(p.pool_slot_bytes) * launch for p in kern])
    hw = replace(hw, copier=replace(hw.copier, submit_batch_host_us=float(x[0]),
                                    submit_page_host_us=float(x[1])))

    # cudaMemcpyBatchAsync: after how many descriptors the device starts (grid search)
    batch = [p for p in pts if p.path == "ce-batch"]
    if batch:
        hw, report["batch_lead_search"] = _fit_batch_lead(hw, batch)

    # End to end, per direction
    for d in DIRECTIONS:
        page = [p for p in pts if p.path == "ce-page" and p.direction == d]
        if page:
            hw = _robust_fit(hw, page, [("copy_engine", "per_copy_device_us")], d, [(0.0, 50.0)])
        kern = [p for p in pts if p.path == "kernel" and p.direction == d]
        if kern:
            names = [("kernel", f) for f in KERNEL_FIELDS] + [("copier", "submit_after_launch_host_us")]
            bounds = [KERNEL_BOUNDS[f] for _, f in names]
            bounds[-1] = (0.0, hw.copier.submit_batch_host_us)  # a part of the per-batch host time
            hw = _set(hw, "copier", "batch_device_us", 0.0, d)
            hw = _robust_fit(hw, kern, names, d, bounds)
            # Device time before the first launch runs: what the gated (device-only) times leave
            # over the modelled kernels, median over the direction's kernel points.
            gated = [p for p in kern if p.gated_s]
            extra = statistics.median(p.gated_s - _device(hw, p) for p in gated)
            hw = _set(hw, "copier", "batch_device_us", max(0.0, extra * 1e6), d)

    errors: dict = {}
    for path in ("ce-page", "ce-batch", "kernel"):
        apes = [abs(_e2e(hw, p) / p.issue_s - 1) * 100 for p in pts if p.path == path]
        if apes:
            errors[path] = {"points": len(apes), "median_ape_pct": statistics.median(apes),
                            "worst_ape_pct": max(apes)}
    report["fit_errors"] = errors
    report["figures"] = figures(hw)
    return hw, report


LEAD_GRID = (0,) + tuple(range(1000, 40001, 500))


def _fit_batch_lead(hw: HardwareSpec, batch: list[Point]) -> tuple[HardwareSpec, dict]:
    """``copy_engine.batch_lead_descriptors``: the value of :data:`LEAD_GRID` whose end-to-end
    times of the ``cudaMemcpyBatchAsync`` points have the least robust log loss (soft-L1, 5 %
    scale, as the other end-to-end fits); ties keep the smaller value (0: the whole call)."""
    meas = np.array([p.issue_s for p in batch])

    def loss(spec: HardwareSpec) -> float:
        z = (np.log(np.array([_e2e(spec, p) for p in batch]) / meas) / 0.05) ** 2
        return float(np.sum(2 * (np.sqrt(1 + z) - 1)))

    best = None
    for lead in LEAD_GRID:
        spec = replace(hw, copy_engine=replace(hw.copy_engine, batch_lead_descriptors=float(lead)))
        cost = loss(spec)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, lead, spec)
    assert best is not None
    return best[2], {"grid": [LEAD_GRID[0], LEAD_GRID[1], LEAD_GRID[-1]], "best": best[1],
                     "loss": best[0]}


def figures(hw: HardwareSpec) -> dict:
    """The figures :func:`refit` sets, as plain numbers (``{section: {field: value}}``)."""
    ce, k, c = hw.copy_engine, hw.kernel, hw.copier

    def pd(v) -> dict:
        return {d: v[d] for d in DIRECTIONS}

    return {
        "copy_engine": {"per_call_host_us": ce.per_call_host_us,
                        "per_copy_device_us": pd(ce.per_copy_device_us),
                        "batch_call_host_us": ce.batch_call_host_us,
                        "batch_descriptor_host_us": pd(ce.batch_descriptor_host_us),
                        "batch_small_copy_host_us_per_kib": pd(ce.batch_small_copy_host_us_per_kib),
                        "batch_small_copy_max_bytes": ce.batch_small_copy_max_bytes,
                        "batch_lead_descriptors": ce.batch_lead_descriptors},
        "kernel": {f: pd(getattr(k, f)) for f in KERNEL_FIELDS},
        "copier": {"batch_device_us": pd(c.batch_device_us), "submit_batch_host_us": c.submit_batch_host_us,
                   "submit_page_host_us": c.submit_page_host_us,
                   "submit_copy_engine_host_us": c.submit_copy_engine_host_us,
                   "submit_after_launch_host_us": pd(c.submit_after_launch_host_us)},
    }


# ---------------------------------------------------------------------------- PROTOCOL-3.md
# Copy model 3: the fit and the judged batches in one run, the host's speed measured per batch.

KNEE_LOSS = "linear"
PROBE_PATHS = {"ce-page": "ce-page", "ce-batch": "ce-batch", "kernel": "kernel:8"}
FIT3_RULES = {
    "host speed": "per batch and path: the median of the host probes recorded for the batch "
                  "(before each pass over its points and after the last; hw.bench_plan_batches) "
                  "over the reference, the median of that figure over the fit-role batches",
    "host figures": "the fit-role points' host enqueue times divided by their batch's host "
                    f"speed, by the rules of FIT_RULES ({HOST_FIT}), except that the kernel "
                    "points' host time is fitted on (1, pages, pools), the pools' coefficient "
                    "being kernel.launch_host_us (one launch per pool); "
                    "copier.submit_after_launch_host_us keeps its share of submit_batch_host_us",
    "kernel device figures": "kernel.latency_us, per_cta_max_gbps, page_latency_us, knee_p, "
                             "plateau_gbps and copier.batch_device_us per direction, knee_form "
                             "'hyperbolic': the fit-role kernel points' gated (device) times, robust "
                             "least squares of log error (soft-L1, 5 % scale)",
    "copy_engine.per_copy_device_us": "per direction, the fit-role per-page copy points' gated "
                                      "(device) times, robust least squares of log error",
    "copier.submit_after_launch_host_us": "per direction, the fit-role kernel points' end-to-end "
                                          "times at their batch's host speed, robust least squares "
                                          "of log error, at most submit_batch_host_us",
    "every other figure": "the hardware spec given (the h200-sxm preset: copy model 2)",
}


def probe_speeds(measurement: dict, roles: tuple[str, ...] = ("fit",)
                 ) -> tuple[dict[str, dict[str, float]], dict]:
    """``({batch id: {path: host speed}}, reference)`` from the measurement's ``host_probes``:
    a batch's probe figure per path is the median of its probes' medians; the reference per path
    is the median of that figure over the batches whose role is one of ``roles``; a batch's host
    speed is its figure over the reference (1.0 = the fit batches' typical host). A batch
    without probes is left out (its speed is 1.0 where used)."""
    probes = measurement.get("host_probes") or []
    if not probes:
        raise ValueError("the measurement has no host_probes (hw.bench_plan_batches without "
                         "--no-host-probe records them)")
    per: dict[str, dict[str, list[float]]] = {}
    for p in probes:
        for path, key in PROBE_PATHS.items():
            if key in p["ms"]:
                per.setdefault(p["batch"], {}).setdefault(path, []).append(float(p["ms"][key]))
    fig = {b: {path: statistics.median(v) for path, v in d.items()} for b, d in per.items()}
    roles_of = {b["id"]: role(b) for b in measurement["batches"]}
    ref = {}
    for path in PROBE_PATHS:
        vals = [d[path] for b, d in fig.items() if roles_of.get(b) in roles and path in d]
        if not vals:
            raise ValueError(f"no host probes of {path} on batches of roles {roles}")
        ref[path] = statistics.median(vals)
    speeds = {b: {path: v / ref[path] for path, v in d.items()} for b, d in fig.items()}
    return speeds, {"reference_ms": ref, "roles": list(roles), "probes": len(probes)}


def refit_probe(hw: HardwareSpec, measurement: dict, roles: tuple[str, ...] = ("fit",),
                device_from: list[dict] | None = None
                ) -> tuple[HardwareSpec, dict[str, dict[str, float]], dict]:
    """Copy model 3 (PROTOCOL-3.md; :data:`FIT3_RULES`): ``(spec, host speed per batch and
    path, report)``. Host figures are fitted on the points of the batches of ``measurement``
    whose pre-registered role is one of ``roles``; device figures on the gated times of every
    batch of the measurements ``device_from`` (None: the same points as the host figures). Price
    a batch ``b`` with ``CopySelector(spec, host_speed=speeds[b])``."""
    from kvsim.model.copy_paths import with_host_speed

    speeds, ref = probe_speeds(measurement, roles)
    pts = [p for p in fit_points(measurement, roles) if p.issue_s]
    if not pts:
        raise ValueError(f"the measurement holds no points of roles {roles}")
    report: dict = {"points": len(pts), "roles": list(roles), "rules": FIT3_RULES, "host_probe": ref}

    def sp(p: Point) -> float:
        return speeds.get(p.batch, {}).get(p.path, 1.0)

    # host figures, on host times brought to the reference host
    hw, batch = _fit_copy_engine_host(hw, pts, sp)
    kern = [p for p in pts if p.path == "kernel" and p.host_s]
    x = robust_linear([[1.0, float(p.pages), float(len(p.pool_slot_bytes))] for p in kern],
                      [p.host_s * 1e6 / sp(p) for p in kern])
    hw = replace(hw, kernel=replace(hw.kernel, launch_host_us=float(x[2])))
    old = hw.copier.submit_batch_host_us
    share = {d: (hw.copier.submit_after_launch_host_us[d] / old if old else 0.0) for d in DIRECTIONS}
    hw = replace(hw, copier=replace(
        hw.copier, submit_batch_host_us=float(x[0]), submit_page_host_us=float(x[1]),
        submit_after_launch_host_us=PerDirection(**{d: share[d] * float(x[0]) for d in DIRECTIONS})))

    # device figures: on the gated (device-only) times of dev_pts
    dev_pts = pts if device_from is None else [p for m in device_from for p in fit_points(m, None)
                                               if p.gated_s]
    report["device_points"] = len([p for p in dev_pts if p.gated_s])
    # per-page copies' device time per copy
    for d in DIRECTIONS:
        gated = [p for p in dev_pts if p.path == "ce-page" and p.direction == d and p.gated_s]
        if gated:
            hw = _robust_fit_to(hw, gated, [("copy_engine", "per_copy_device_us")], d, [(0.0, 50.0)],
                                _device, lambda p: p.gated_s)
    # kernel device figures on the gated times, hyperbolic knee
    hw = replace(hw, kernel=replace(hw.kernel, knee_form="hyperbolic"))
    names = [("kernel", f) for f in KERNEL_FIELDS] + [("copier", "batch_device_us")]
    for d in DIRECTIONS:
        gated = [p for p in dev_pts if p.path == "kernel" and p.direction == d and p.gated_s]
        if gated:
            bounds = [KERNEL_BOUNDS[f] for _, f in names[:-1]] + [(0.0, 200.0)]
            hw = _robust_fit_to(hw, gated, names, d, bounds, _device, lambda p: p.gated_s,
                                KNEE_LOSS)
        kern = [p for p in pts if p.path == "kernel" and p.direction == d]
        if kern:
            hw = _robust_fit_to(hw, kern, [("copier", "submit_after_launch_host_us")], d,
                                [(0.0, hw.copier.submit_batch_host_us)],
                                lambda s, p: CopySelector(s, host_speed=sp(p)).price(
                                    p.path, p.direction, p.pool_slot_bytes, p.pages, True,
                                    p.ctas).end_to_end_seconds, lambda p: p.issue_s)
    errors: dict = {}
    for path in ("ce-page", "ce-batch", "kernel"):
        apes = [abs(CopySelector(with_host_speed(hw, speeds.get(p.batch, {}))).price(
            p.path, p.direction, p.pool_slot_bytes, p.pages, True, p.ctas).end_to_end_seconds
            / p.issue_s - 1) * 100 for p in pts if p.path == path]
        if apes:
            errors[path] = {"points": len(apes), "median_ape_pct": statistics.median(apes),
                            "worst_ape_pct": max(apes)}
    report["fit_errors"] = errors
    report["figures"] = figures(hw)
    return hw, speeds, report


def _robust_fit_to(hw: HardwareSpec, points: list[Point], names: list[tuple[str, str]],
                   direction: str, bounds: list[tuple[float, float]], predict, measured,
                   loss: str = "soft_l1") -> HardwareSpec:
    """The figures ``names`` of ``direction``, within ``bounds``, for which ``predict(spec,
    point)`` fits ``measured(point)`` best: least squares of log error with ``loss`` (soft-L1 at
    5 % scale, or "linear": plain least squares)."""
    from scipy.optimize import least_squares

    def spec(x: np.ndarray) -> HardwareSpec:
        out = hw
        for (section, field), v in zip(names, x):
            out = _set(out, section, field, float(v), direction)
        return out

    meas = np.array([measured(p) for p in points])

    def residuals(x: np.ndarray) -> np.ndarray:
        s = spec(x)
        return np.log(np.array([predict(s, p) for p in points]) / meas)

    lo = np.array([b[0] for b in bounds])
    hi = np.array([b[1] for b in bounds])
    x0 = np.clip(np.array([float(getattr(getattr(hw, s), f)[direction] or 0.0) for s, f in names]), lo, hi)
    res = least_squares(residuals, x0, bounds=(lo, hi), loss=loss, f_scale=0.05)
    return spec(res.x)
