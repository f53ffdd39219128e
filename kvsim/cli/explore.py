"""``kvsim explore``: a scenario under many seeded schedules, and every schedule with a finding."""

from __future__ import annotations

import argparse
import json
import sys

from kvsim.errors import KvsimError


def add_parser(sub) -> None:
    p = sub.add_parser("explore", help="re-run a scenario under many seeded schedules")
    p.add_argument("scenario", help="scenario YAML file (executor: sim)")
    p.add_argument("--schedules", type=int, default=200,
                   help="how many seeded schedules to run per variant (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the schedule seeds (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. --set sim.jitter=0.2")
    p.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvsim.scenario.explore import explore
    from kvsim.scenario.load import load_scenario_file

    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim explore: {m}", file=sys.stderr))
    try:
        if not 1 <= args.schedules <= 100_000:
            raise KvsimError(f"--schedules {args.schedules}: must be in [1, 100000]")
        if not 0 <= args.seed < 2**63:
            raise KvsimError(f"--seed {args.seed}: must be in [0, 2**63)")
        result = explore(load_scenario_file(args.scenario, args.set), args.schedules, args.seed,
                         progress=say)
    except KvsimError as e:
        print(f"kvsim explore: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name, v in result["variants"].items():
            print(f"{name}: {v['failing']} of {v['schedules']} schedules failing")
            for f in v["failing_schedules"][:20]:
                print(f"  seed {f['schedule_seed']}: {', '.join(f['findings'])} -- reproduce: "
                      f"kvsim run {args.scenario} --set sim.schedule_seed={f['schedule_seed']}")
    return 0
