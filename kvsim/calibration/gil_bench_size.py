"""The size of the GIL hand-over benchmark (:mod:`kvsim.calibration.gil_handover`), in a module
of its own: ``kvsim calibrate --help`` states the default without importing the benchmark."""

# The benchmark's shape: the probe is the CPU model's 4096-token fit probe, on the CPU fit's
# one-pool manager, run with 4 and with 12 threads (two thread counts tell how the hand-over
# depends on how many wait); the validation scenario it is judged on differs (8 probe threads
# and a resize holding the lock, two 8 KiB x2 pool groups with a sliding window). The rates
# depend on the call: 2048-token probes were taken over ~4x as often per second
# (tools/gil_handover_shapes.py).
BENCH_THREADS = 6
BENCH_THREAD_COUNTS = (4, 12)
# Each thread's probes must outlast the starter's waits (tens of ms each: the main thread waits
# for the GIL to start the next thread), or the threads hardly overlap and hold the GIL to the
# end of their work: nothing is taken over. 400 sufficed for the probe of 2026-12-04 (~0.28 ms on
# the H200 host); once the walk memo made it ~0.07 ms, concurrency call 4's 32 runs gave 274 holds,
# a thread's 400 probes in one streak, and a flat fit (reports/validation-h200/concurrency/
# README.md, call 4). At 4000 the 2-core development machine's threads take turns every 16-20
# probes; the H100 host's still rarely do (14 takeovers in two rounds, against 2 at 400: the same
# README, "After call 4"), where a holder keeps the GIL for 6-409 ms.
BENCH_PROBES = 4000
BENCH_PROBE_TOKENS = 4096
