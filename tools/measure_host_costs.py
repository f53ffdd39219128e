"""Measure host-side unit costs that the CPU cost presets cite, on the machine it runs on.

What it times (time.perf_counter around many repetitions, median of 7 rounds):
* ``sha256_block_us``: one radix-tree block key, hashlib.sha256(32-byte previous key + 32 tokens
  as 4-byte little-endian).digest() -- the C (OpenSSL) hash plus Python's call overhead;
* ``dict_lookup_us``: one lookup of a 32-byte key in a dict of 100,000 keys;
* ``python_call_us``: one call of a bound Python method that returns at once (what entering
  and leaving a binding costs on the Python side, at least).

Usage: python tools/measure_host_costs.py OUT.json
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone


def _median_us(fn, n: int, rounds: int = 7) -> tuple[float, list[float]]:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(n)
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples), samples


def main(out: str) -> None:
    prev = hashlib.sha256(b"x").digest()
    block = bytes(range(128))
    keys = [hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(100_000)]
    table = dict.fromkeys(keys, 1)

    def hash_loop(n: int) -> None:
        h = hashlib.sha256
        for _ in range(n):
            h(prev + block).digest()

    def lookup_loop(n: int) -> None:
        get = table.get
        k = keys[12345]
        for _ in range(n):
            get(k)

    class Binding:
        def call(self) -> None:
            return None

    b = Binding()

    def call_loop(n: int) -> None:
        f = b.call
        for _ in range(n):
            f()

    def empty_loop(n: int) -> None:
        for _ in range(n):
            pass

    empty, _ = _median_us(empty_loop, 1_000_000)
    result = {
        "what": "host unit costs for CPU cost presets (see tools/measure_host_costs.py)",
        "timing": "perf_counter around N repetitions, median of 7 rounds; the empty-loop cost "
                  "is subtracted from each figure",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": {"processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "empty_loop_us": empty,
    }
    for name, fn, n in (("sha256_block_us", hash_loop, 200_000),
                        ("dict_lookup_us", lookup_loop, 1_000_000),
                        ("python_call_us", call_loop, 1_000_000)):
        median, samples = _median_us(fn, n)
        result[name] = round(median - empty, 4)
        result[name + "_samples"] = samples
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("samples")}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
