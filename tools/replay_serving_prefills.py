"""Replay a serving run's prefills alone on the GPU: is their excess over the model the forward's
own, or the serving run's (copies, the manager, idle time)?

Reads a hardware serving run's results (``hw.forward.per_pass``: each pass's prefills and their
CUDA-event time), builds the same random-weight model (``hw.serving_forward.TorchForward``:
architecture and layers from the run's scenario), and runs the same passes' prefills in the same
order back to back, nothing else on the GPU; each pass timed by CUDA events around its
prefills, as in the run. Writes ``{"config", "passes": [{"prefills", "run_ms", "replay_ms",
"model_ms"}]}``. Run it once per allocator setting (``PYTORCH_CUDA_ALLOC_CONF`` is read when
PyTorch starts) and with ``--warm-max`` (one prefill at the run's longest prompt first, so the
caching allocator holds segments as large as any later pass needs).

``--engine-times FILE`` replays with another engine-times file than the run's (its
``prefill_attention`` and ``prefill_buckets`` change what runs: call 4's engine on call 3's
passes; ``model_ms`` is that file's price).

    python3 tools/replay_serving_prefills.py RESULTS.json[.xz] --out FILE.json [--warm-max]
        [--passes N] [--repeat K] [--engine-times FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/replay_serving_prefills.py")
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--warm-max", action="store_true")
    ap.add_argument("--passes", type=int, default=None, help="the first N passes only")
    ap.add_argument("--repeat", type=int, default=1,
                    help="replay the sequence this many times in one process (the later rounds "
                         "meet every shape a second time); each round's times are kept")
    ap.add_argument("--engine-times", default=None,
                    help="an engine-times file to run and price with instead of the run's")
    args = ap.parse_args(argv)

    import dataclasses

    import torch

    from hw.serving_forward import TorchForward
    from kvsim.calibration.packed import read_json
    from kvsim.llm.architectures import architecture
    from kvsim.llm.engine_time import load_engine_times

    res = read_json(args.results)
    w = res["resolved"]["workload"]
    arch = architecture(w["architecture"])
    if w.get("layers"):
        arch = dataclasses.replace(arch, layers=w["layers"])
    engine_times = args.engine_times or w.get("engine_times", "h200-sxm")
    times = load_engine_times(engine_times, arch)
    per_pass = res["hw"]["forward"]["per_pass"]
    passes = list(zip(per_pass["prefills"], per_pass["prefill_ms"]))[: args.passes]
    longest = res["hw"]["forward"]["buffer_tokens"]
    fwd = TorchForward(arch, times, "cuda:0", longest)
    fwd.warm_up()
    if args.warm_max:
        fwd._prefill(longest, 0)
        torch.cuda.synchronize()
    out = [{"prefills": prefills, "run_ms": run_ms, "replay_ms": None,
            "model_ms": sum(times.prefill_seconds(n, c) for n, c in prefills) * 1e3}
           for prefills, run_ms in passes]
    for round_ in range(args.repeat):
        for row in out:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for new, cached in row["prefills"]:
                fwd._prefill(new, cached)
            end.record()
            end.synchronize()
            key = "replay_ms" if round_ == 0 else f"replay_{round_ + 1}_ms"
            row[key] = start.elapsed_time(end)
    doc = {"config": {"results": args.results, "warm_max": args.warm_max,
                      "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                      "engine_times": engine_times, "prefill_attention": fwd.engine.prefill_kernel,
                      "buckets": len(times.prefill_buckets),
                      "warm_up_s": round(getattr(fwd, "warm_up_s", 0.0), 3),
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                      "timing": "CUDA events around each pass's prefills, passes back to back"},
           "passes": out}
    Path(args.out).write_text(json.dumps(doc) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
