"""The fluid link model and the copy-path formulas, against hand-computed answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import simpy

from kvsim.errors import ConfigError
from kvsim.hardware import load_hardware
from kvsim.model.copy_paths import (
    CopyRequest,
    batch_curve_gbps,
    estimate,
    grid_ctas,
    kernel_rate_gbps,
    tiling_efficiency,
)
from kvsim.model.link_share import max_min_share
from kvsim.sim.link import Link

TOY = Path(__file__).parent / "data" / "toy-hardware.json"


@pytest.fixture
def toy():
    return load_hardware(TOY)


def finish_times(toy, transfers):
    env = simpy.Environment()
    link = Link.of_hardware(env, toy)
    done = {}

    def go(name, start, nbytes, direction, cap):
        yield env.timeout(start)
        yield link.transfer(nbytes, direction, cap)
        done[name] = env.now

    for t in transfers:
        env.process(go(*t))
    env.run()
    return done, link


def test_one_transfer_runs_at_its_cap_or_the_link(toy):
    done, link = finish_times(toy, [("a", 0, 50e9, "offload", 1000.0)])
    assert done["a"] == pytest.approx(0.5)  # 50 GB at the 100 GB/s link
    done, _ = finish_times(toy, [("a", 0, 10e9, "offload", 20.0)])
    assert done["a"] == pytest.approx(0.5)  # capped at 20 GB/s
    assert link.stats.bytes["offload"] == 50e9


def test_same_direction_transfers_share_max_min_fairly(toy):
    # a (cap 20) and b (uncapped) together: a 20, b 80 GB/s.
    done, _ = finish_times(toy, [("a", 0, 10e9, "offload", 20.0), ("b", 0, 40e9, "offload", 999.0)])
    assert done["a"] == pytest.approx(0.5)
    assert done["b"] == pytest.approx(0.5)
    assert max_min_share(100.0, [20.0, 999.0, 999.0]) == [20.0, 40.0, 40.0]


def test_both_directions_at_once_pay_the_bidirectional_factor(toy):
    # Alone 100 GB/s each; together 50 GB/s each (factor 0.5) until the shorter one ends.
    done, _ = finish_times(toy, [("off", 0, 25e9, "offload", 999.0), ("on", 0, 50e9, "onboard", 999.0)])
    assert done["off"] == pytest.approx(0.5)
    assert done["on"] == pytest.approx(0.5 + 25e9 / 100e9)


def test_grid_policy_picks_kvcm2s_ctas_on_gh200():
    gh = load_hardware("gh200")
    assert (grid_ctas(gh, "offload"), grid_ctas(gh, "onboard")) == (8, 12)
    off = kernel_rate_gbps(gh, "offload", 8) / gh.kernel.plateau_gbps.offload
    on = kernel_rate_gbps(gh, "onboard", 12) / gh.kernel.plateau_gbps.onboard
    assert off == pytest.approx(0.97, abs=0.01)
    assert on == pytest.approx(0.94, abs=0.015)


def test_kernel_littles_law_and_plateau(toy):
    assert kernel_rate_gbps(toy, "offload", 3) == pytest.approx(30.0)
    assert kernel_rate_gbps(toy, "offload", 10) == pytest.approx(60.0)  # hard clamp
    assert kernel_rate_gbps(toy, "offload", 3, inflight_bytes=16384) == pytest.approx(15.0)
    soft = kernel_rate_gbps(toy, "onboard", 6)  # p = 2: 60 * (1 - e^-1)^(1/2)
    assert soft == pytest.approx(60.0 * math.sqrt(1 - math.exp(-1)))
    # Per-page latency (toy offload: one more round trip per page a 32 KiB window spans).
    assert kernel_rate_gbps(toy, "offload", 3, page_bytes=32768) == pytest.approx(15.0)
    assert kernel_rate_gbps(toy, "offload", 3, page_bytes=16384) == pytest.approx(10.0)
    assert kernel_rate_gbps(toy, "offload", 3, page_bytes=1 << 30) == pytest.approx(30.0, rel=1e-4)
    # toy policy: cap 0.8 * 100 = 80 GB/s / 10 per CTA = 8 -> offload 8, onboard 12
    assert grid_ctas(toy, "offload") == 8 and grid_ctas(toy, "onboard") == 12


def test_tiling_efficiency_and_batch_curve(toy):
    assert tiling_efficiency(toy, 4096) == 1.0
    assert tiling_efficiency(toy, 3000) == pytest.approx(3000 / 4096)
    assert tiling_efficiency(toy, 6144) == pytest.approx(6144 / 8192)
    assert batch_curve_gbps(toy, "offload", 2048) == 10.0
    assert batch_curve_gbps(toy, "offload", 16384) == pytest.approx(30.0)  # halfway in log2
    assert batch_curve_gbps(toy, "offload", 1 << 30) == 50.0


def test_estimates_per_path(toy):
    page = estimate(toy, CopyRequest("ce-page", "offload", 65536, 100))
    assert page.seconds == pytest.approx(100 * 2e-6 + 6553600 / 50e9)
    assert page.host_seconds == pytest.approx(100e-6)
    batch = estimate(toy, CopyRequest("ce-batch", "offload", 65536, 100))
    assert batch.seconds == pytest.approx(6553600 / 50e9)
    assert batch.host_seconds == pytest.approx(5e-6 + 50e-6)
    kern = estimate(toy, CopyRequest("kernel", "offload", 65536, 100, ctas=4))
    # 64 KiB pages: a 32 KiB window spans half a page -> 1.5 round trips -> 20/3 GB/s per CTA
    assert kern.rate_gbps == pytest.approx(4 * 32768 / 4.9152e-6 / 1e9)
    assert kern.ctas == 4 and kern.sms == 4 and kern.fixed_seconds == 0.0
    assert kern.host_seconds == pytest.approx(4e-6)
    # Through this project's copier: the batch's index upload on the device, its submission on
    # the host (20 us + 0.5 us per page besides the launch).
    ours = estimate(toy, CopyRequest("kernel", "offload", 65536, 100, ctas=4, via_copier=True))
    assert ours.fixed_seconds == pytest.approx(100e-6)
    assert ours.seconds == pytest.approx(kern.seconds + 100e-6)
    assert ours.host_seconds == pytest.approx(4e-6 + 20e-6 + 100 * 0.5e-6)
    slow = estimate(toy, CopyRequest("kernel", "offload", 65536, 100, ctas=4, aligned=False))
    assert slow.rate_gbps == pytest.approx(kern.rate_gbps * 0.5)
    both = estimate(toy, CopyRequest("ce-page", "onboard", 1 << 30, 1, bidirectional=True))
    assert both.rate_gbps == pytest.approx(50.0)  # 100 * 0.5 < 80 plateau
    with pytest.raises(ValueError, match="path must be"):
        CopyRequest("dma", "offload", 1, 1)
    with pytest.raises(ValueError, match="pages must be"):
        CopyRequest("kernel", "offload", 1, 0)


def test_every_preset_loads_and_every_number_names_its_source(tmp_path):
    from kvsim.hardware.spec import preset_names

    names = preset_names()
    assert {"h100-pcie", "h200-sxm", "gh200", "gb200", "b200"} <= set(names)
    for name in names:
        hw = load_hardware(name)
        assert hw.sources and all(s.strip() for s in hw.sources.values())
    data = json.loads(TOY.read_text())
    data["link"]["bidirectional_factor"] = 0.5  # a bare number, no source
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="link.bidirectional_factor: the number 0.5 names no source"):
        load_hardware(bad)
    with pytest.raises(ConfigError, match="unknown hardware preset"):
        load_hardware("h900")


def test_a_copier_batch_after_an_idle_spell_waits_the_wake_up_time(toy):
    """Toy copier: 300 us of wake-up for a batch starting after >= 20 ms of stream idleness."""
    import numpy as np

    from kvsim.manager.plan import CopyBatch
    from kvsim.sim.stream import CopyStream

    env = simpy.Environment()
    stream = CopyStream(env, "s", Link.of_hardware(env, toy), toy, {"offload": "select"}, None, None, True)
    batch = CopyBatch(0, 1, 0, np.arange(64, dtype=np.int32), np.arange(64, dtype=np.int32),
                      (32768, 32768))
    took = []

    def go():
        for gap in (0.0, 0.001, 0.050):  # idle since the start, 1 ms, 50 ms
            yield env.timeout(gap)
            t0 = env.now
            yield stream.submit(batch, "t", "api")
            took.append(env.now - t0)

    env.process(go())
    env.run()
    first, warm, woken = took
    assert warm < first and first - warm == pytest.approx(300e-6)
    assert woken == pytest.approx(first)


def _sequence(toy, fast: bool):
    """Back-to-back transfers of one queue (odd sizes and caps, both directions, a pause and a
    fixed delay between some), each through Link.transfer, or all but the last through
    Link.alone with the caller waiting: the clock and every statistic must come out the same."""
    env = simpy.Environment()
    link = Link.of_hardware(env, toy)
    reqs = [(123_457, "offload", 7.3, 0.0), (9_999_991, "offload", 300.0, 1.7e-6),
            (1, "onboard", 0.01, 0.0), (0, "onboard", 5.0, 0.0), (77_777_777, "onboard", 11.1, 3e-7),
            (5_000_003, "offload", 25.0, 0.0)]
    seen = []

    def queue():
        yield env.timeout(0.0123)
        for i, (nbytes, direction, cap, fixed) in enumerate(reqs):
            if fixed:
                yield env.timeout(fixed)
            if fast and i < len(reqs) - 1:
                yield env.timeout(link.alone(nbytes, direction, cap, cap_both_gbps=cap / 2))
            else:
                yield link.transfer(nbytes, direction, cap, cap_both_gbps=cap / 2)
            seen.append(env.now)

    env.process(queue())
    env.run()
    s = link.stats
    return seen, dict(s.bytes), dict(s.transfers), [tuple(vars(g).values()) for g in s.segments]


def test_a_transfer_booked_alone_leaves_the_clock_and_the_statistics_as_transfer_does(toy):
    slow, fast = _sequence(toy, False), _sequence(toy, True)
    assert fast == slow  # exact floats: the same instants, bytes, counts and segments
    assert len(slow[3]) == 5  # one segment per transfer that moved bytes


def test_alone_refuses_a_busy_link(toy):
    env = simpy.Environment()
    link = Link.of_hardware(env, toy)
    link.transfer(1_000_000, "offload", 10.0)
    with pytest.raises(RuntimeError, match="busy"):
        link.alone(1_000, "onboard", 10.0)


def _stream_run(toy, monkeypatch, book_alone: bool, disk: bool = False):
    """Copy batches of 1, 2 and 4 pools through the select path (one request per pool), after
    idle spells and back to back, both directions (with ``disk``, batches to and from a disk
    level between them, some in the disk queue): every record's times and the links'
    statistics."""
    import numpy as np

    from kvsim.hardware.disk import load_disk
    from kvsim.manager.plan import CopyBatch
    from kvsim.sim.stream import CopyStream

    monkeypatch.setattr(CopyStream, "book_alone", book_alone)
    env = simpy.Environment()
    link = Link.of_hardware(env, toy)
    stream = CopyStream(env, "s", link, toy, {"offload": "select", "onboard": "select"}, None,
                        None, True, load_disk("micron-9550-gen5") if disk else None)
    batches = [CopyBatch(0, 1, 0, np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32),
                         pools) for n, pools in ((64, (32768,) * 4), (3, (4096, 8192)),
                                                 (1000, (16384,)), (777, (2048,) * 4))]
    batches += [CopyBatch(1, 0, 0, b.dst_slots, b.src_slots, b.pool_slot_bytes) for b in batches]
    if disk:  # host -> disk (disk queue), disk -> GPU and GPU -> disk (stream), interleaved
        batches = [x for i, b in enumerate(batches) for x in
                   (b, CopyBatch(*((1, 2), (2, 0), (0, 2))[i % 3], 0, b.src_slots, b.dst_slots,
                                 b.pool_slot_bytes))]

    def go():
        for i, b in enumerate(batches):
            yield env.timeout((0.0, 0.03, 1e-6)[i % 3])
            events = [stream.submit(b, "t", "api")]
            if i % 2:
                events.append(stream.submit(b, "t", "api"))  # queued behind it
            yield env.all_of(events)

    env.process(go())
    env.run()
    records = [(r.started, r.finished, r.path, r.ctas) for r in stream.records]
    stats = [link.stats] + ([stream.disk_link.stats] if disk else [])
    return records, [(dict(s.bytes), dict(s.transfers), [tuple(vars(g).values()) for g in
                                                          s.segments]) for s in stats]


@pytest.mark.parametrize("disk", [False, True])
def test_a_batch_booked_alone_gives_the_same_times_and_statistics(toy, monkeypatch, disk):
    per_request = _stream_run(toy, monkeypatch, False, disk)
    assert _stream_run(toy, monkeypatch, True, disk) == per_request
    records, ((_, transfers, _), *on_disk) = per_request
    assert len(records) == (24 if disk else 12) and sum(transfers.values()) > 12  # several a batch
    assert not disk or sum(on_disk[0][1].values()) == 16  # each disk batch (odd: sent twice)


def test_the_wait_falls_back_to_the_chain_where_one_timeout_would_miss_the_instant():
    from kvsim.sim.stream import CopyStream

    waits = [1.199927165880924, 0.4141626556763889, 4.51380569232544]
    start = 0.00039673755205482664
    end = start
    for w in waits:
        end = end + w
    assert start + (end - start) != end  # one timeout would land elsewhere
    env = simpy.Environment()
    stream = CopyStream.__new__(CopyStream)
    stream.env = env
    reached = []

    def go():
        yield env.timeout(start)
        yield from stream._wait(waits)
        reached.append(env.now)

    env.process(go())
    env.run()
    assert reached == [end]


def test_a_transfer_while_the_link_is_booked_alone_is_refused(toy):
    """alone() promises its caller is the link's only user: a transfer inside a booked span
    would not share the link with it, so it is an error, not a wrong answer."""
    env = simpy.Environment()
    link = Link.of_hardware(env, toy)
    seconds = link.alone(10_000_000, "offload", 10.0)
    assert seconds > 0
    with pytest.raises(RuntimeError, match="booked alone"):
        link.transfer(1_000, "onboard", 10.0)
    with pytest.raises(RuntimeError, match="booked alone"):
        link.alone(1_000, "onboard", 10.0, at=seconds / 2)
    assert link.alone(1_000, "onboard", 10.0, at=seconds) > 0  # right after it: fine
    seconds = link._booked_until
    env.run(until=seconds)
    assert link.transfer(1_000, "onboard", 10.0) is not None  # after the span: fine
