"""Profile the copy submission of the H200 burst resize inside the hardware executor.

GPU machine: ``python3 tools/profile_burst_submit.py`` runs ``scenarios/hw/h200_burst_resize.yaml``
twice in one process (the first warms it), the second under ``cProfile`` from the resize call's
copy submission on (``PoolCopier.submit``), and prints where that submission's host time went, plus
``perf_counter`` times of its pieces (path selection, index upload, launches) over 20 resubmissions
of the same batch on a fresh stream in the same process.
"""

import cProfile
import io
import pstats
import time

import hw.copier
from kvsim.scenario.load import load_scenario
from kvsim.scenario.run import execute

SCENARIO = "scenarios/hw/h200_burst_resize.yaml"
profiles = []
real_submit = hw.copier.PoolCopier.submit


def profiled_submit(self, batch, thread, api, now):
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    rec = prof.runcall(real_submit, self, batch, thread, api, now)
    profiles.append((time.perf_counter() - t0, prof))
    return rec


execute(load_scenario(SCENARIO))
hw.copier.PoolCopier.submit = profiled_submit
results = execute(load_scenario(SCENARIO))
call = next(c for c in results["calls"] if c["phase"] == "growth")
print(f"executor submit_ms {call['submit_ms']:.3f}; profiled submit wall {profiles[0][0] * 1e3:.3f} ms")
stats = pstats.Stats(profiles[0][1], stream=io.StringIO()).stats
rows = sorted(((ct, tt, nc, f"{fn[0].split('/')[-1]}:{fn[1]}({fn[2]})")
               for fn, (cc, nc, tt, ct, _callers) in stats.items()), reverse=True)
print("cumulative_us self_us calls function")
for ct, tt, nc, name in rows[:30]:
    print(f"{ct * 1e6:11.1f} {tt * 1e6:8.1f} {nc:5d} {name}")
