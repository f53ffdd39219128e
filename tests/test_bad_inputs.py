"""The bad-input corpus: scenario files, traces, command-line options and manager API calls.

Every case goes through the real entry point (``kvsim.cli.main`` for files and options, the
manager's public API for calls) in a temporary workspace, under a time limit, and asserts:
the exit status (2 for bad input, 0 where the input is valid), that the message names the file
and line (or the option) with the rule that was broken, that no traceback escaped, and that
nothing in the workspace was deleted or changed. ``python -m pytest tests/test_bad_inputs.py``
runs it; the counts per category are in :data:`CATEGORY_COUNTS`.
"""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_snapshot as _snapshot

from kvsim.cli import main
from kvsim.errors import KvsimError
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.manager.fingerprint import fingerprint

TIME_LIMIT_S = 20  # a hang (an alias bomb, a runaway size) fails the case instead of the suite

BASE = """\
name: tiny
executor: sim
hardware: h100-pcie
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [1 KiB, 1 KiB]
  levels:
    - {name: gpu, quota_bytes: 64 KiB}
    - {name: host, quota_bytes: 256 KiB}
workload:
  kind: burst_resize
  history_tokens: 40
  capacity_tokens: 48
  gpu_fill_fraction: 0.5
  filler_requests: 2
"""
# line numbers in BASE: 1 name, 2 executor, 3 hardware, 5 tokens_per_block, 7 slot_bytes,
# 9 gpu level, 10 host level, 12 kind, 13 history, 14 capacity, 15 fill, 16 fillers

PROBE = """\
name: probe
executor: sim
hardware: h100-pcie
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [1 KiB, 1 KiB]
  levels:
    - {name: gpu, quota_bytes: 64 KiB}
    - {name: host, quota_bytes: 256 KiB}
workload:
  kind: concurrent_probe
  background: {history_tokens: 40, capacity_tokens: 48, filler_requests: 2}
  probe_threads: 2
  probes_per_thread: 3
"""

MOONCAKE_OK = ('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}\n'
               '{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [1, 3]}\n')
OP_OK = ('{"t": 0, "thread": "a", "op": "create_kv_cache", "cache": "c"}\n'
         '{"t": 0.001, "thread": "a", "op": "resume", "cache": "c"}\n')


def sub(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def mooncake_scenario(trace: str = "t.jsonl") -> str:
    return (BASE.split("workload:")[0] + f"workload:\n  kind: mooncake\n  trace: {trace}\n"
            "  decode_step_tokens: 4\n")


def op_scenario(trace: str = "t.jsonl") -> str:
    return BASE.split("workload:")[0] + f"workload:\n  kind: op_trace\n  trace: {trace}\n"


@dataclass(frozen=True)
class Case:
    id: str
    category: str  # scenario, option, trace, api (api cases are in API_CASES below)
    argv: tuple[str, ...]
    files: dict = field(default_factory=dict)  # name -> str or bytes, written first
    rc: int = 2
    message: str = ""  # a regular expression the error output must match
    hang_guard: bool = True


def scen(id: str, text: str, message: str, rc: int = 2, cmd: str = "validate-scenario",
         extra: tuple[str, ...] = (), files: dict | None = None) -> Case:
    return Case(id, "scenario", (cmd, "s.yaml", *extra), {"s.yaml": text, **(files or {})}, rc,
                message)


def opt(id: str, argv: list[str], message: str, rc: int = 2, files: dict | None = None) -> Case:
    return Case(id, "option", tuple(argv), {"s.yaml": BASE, **(files or {})}, rc, message)


def trace(id: str, argv: list[str], files: dict, message: str, rc: int = 2) -> Case:
    return Case(id, "trace", tuple(argv), files, rc, message)


def mooncake(id: str, body: str | bytes, message: str, rc: int = 2) -> Case:
    return trace(id, ["replay-cache", "t.jsonl", "--capacity-tokens", "4k", "--quiet"],
                 {"t.jsonl": body}, message, rc)


def optrace(id: str, body: str | bytes, message: str, rc: int = 2) -> Case:
    return trace(id, ["validate-scenario", "s.yaml"], {"s.yaml": op_scenario(), "t.jsonl": body},
                 message, rc)


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

CASES: list[Case] = [
    # -- scenario files: the file itself ---------------------------------------------------------
    scen("not-utf8", b"name: tiny\ndescription: caf\xe9\n", r"s\.yaml:2: not UTF-8 text"),
    scen("deep-nesting", "name: x\nd: " + "[" * 5000 + "]" * 5000 + "\n",
         r"s\.yaml:2: nested more than 32 levels deep"),
    scen("alias-bomb", BOMB, r"s\.yaml:\d+: its aliases expand to more than 100000 values"),
    scen("empty-file", "", r"s\.yaml: the file is empty"),
    scen("malformed-yaml", "name: x\n  - : [\n", r"s\.yaml:2: malformed YAML"),
    scen("not-a-mapping", "- a\n- b\n", r"s\.yaml:1: <top level>: must be a mapping"),
    scen("duplicate-key", BASE + "name: again\n", r"s\.yaml:17: name: duplicate key"),
    scen("unknown-top-key", BASE + "colour: red\n", r"s\.yaml:17: colour: unknown key"),
    scen("two-documents", BASE + "---\nname: b\n", r"s\.yaml:\d+: malformed YAML"),
    Case("directory-as-file", "scenario", ("validate-scenario", "d"), {"d/x": "x"}, 2,
         r"d: is a directory"),
    Case("missing-file", "scenario", ("validate-scenario", "nope.yaml"), {}, 2,
         r"nope\.yaml: cannot read"),
    # -- scenario files: names -------------------------------------------------------------------
    scen("name-dotdot", sub(BASE, "name: tiny", "name: '..'"), r"s\.yaml:1: name: must be"),
    scen("name-dot", sub(BASE, "name: tiny", "name: '.'"), r"s\.yaml:1: name: must be"),
    scen("name-slash", sub(BASE, "name: tiny", "name: a/b"), r"s\.yaml:1: name: must be"),
    scen("name-number", sub(BASE, "name: tiny", "name: 12"), r"s\.yaml:1: name: must be a string"),
    scen("name-missing", sub(BASE, "name: tiny\n", ""), r"s\.yaml:1: name: required field"),
    # -- scenario files: manager -----------------------------------------------------------------
    scen("tpb-zero", sub(BASE, "tokens_per_block: 4", "tokens_per_block: 0"),
         r"s\.yaml:5: manager\.tokens_per_block: must be in \[1, 65536\]"),
    scen("tpb-huge", sub(BASE, "tokens_per_block: 4", "tokens_per_block: 1000000000000"),
         r"s\.yaml:5: manager\.tokens_per_block: must be in \[1, 65536\]"),
    scen("tpb-string", sub(BASE, "tokens_per_block: 4", "tokens_per_block: four"),
         r"s\.yaml:5: manager\.tokens_per_block: must be an integer"),
    scen("tpb-bool", sub(BASE, "tokens_per_block: 4", "tokens_per_block: true"),
         r"s\.yaml:5: manager\.tokens_per_block: must be an integer"),
    scen("slot-zero", sub(BASE, "[1 KiB, 1 KiB]", "[0, 1 KiB]"),
         r"s\.yaml:7: manager\.layers\.0\.slot_bytes\.0: must be 1 to 1073741824 bytes, got 0"),
    scen("slot-huge", sub(BASE, "[1 KiB, 1 KiB]", "[2 GiB]"),
         r"s\.yaml:7: manager\.layers\.0\.slot_bytes\.0: must be 1 to 1073741824 bytes, got 2147"),
    scen("slot-unit", sub(BASE, "[1 KiB, 1 KiB]", "[1 KiBB]"),
         r"s\.yaml:7: manager\.layers\.0\.slot_bytes\.0: must be a byte count"),
    scen("slot-fraction", sub(BASE, "[1 KiB, 1 KiB]", "[1.5 B]"),
         r"s\.yaml:7: manager\.layers\.0\.slot_bytes\.0: '1\.5 B' is not a whole number"),
    scen("slots-empty", sub(BASE, "[1 KiB, 1 KiB]", "[]"),
         r"s\.yaml:7: manager\.layers\.0\.slot_bytes: must be a non-empty list"),
    scen("layers-empty", sub(BASE, "    - slot_bytes: [1 KiB, 1 KiB]\n", "    []\n")
         .replace("  layers:\n    []", "  layers: []"),
         r"s\.yaml:6: manager\.layers: must be a non-empty list"),
    scen("layer-count-huge", sub(BASE, "[1 KiB, 1 KiB]", "[1 KiB, 1 KiB]\n      count: 1000000000"),
         r"s\.yaml:8: manager\.layers\.0\.count: must be in \[1, 4096\]"),
    scen("window-zero", sub(BASE, "[1 KiB, 1 KiB]", "[1 KiB, 1 KiB]\n      window_tokens: 0"),
         r"s\.yaml:8: manager\.layers\.0\.window_tokens: must be in \[1, 67108864\]"),
    scen("sinks-without-window", sub(BASE, "[1 KiB, 1 KiB]", "[1 KiB, 1 KiB]\n      sink_tokens: 4"),
         r"s\.yaml:8: manager\.layers\.0\.sink_tokens: only sliding-window layers"),
    scen("quota-negative", sub(BASE, "quota_bytes: 64 KiB", "quota_bytes: -1"),
         r"s\.yaml:9: manager\.levels\.0\.quota_bytes: must be >= 0"),
    scen("quota-2-70", sub(BASE, "quota_bytes: 64 KiB", f"quota_bytes: {2**70}"),
         r"s\.yaml:9: manager\.levels\.0\.quota_bytes: must be at most 2\*\*62 bytes"),
    scen("quota-huge-unit", sub(BASE, "quota_bytes: 64 KiB", "quota_bytes: 1000000000000 TiB"),
         r"s\.yaml:9: manager\.levels\.0\.quota_bytes: must be at most 2\*\*62 bytes"),
    scen("quota-too-many-pages", sub(BASE, "quota_bytes: 64 KiB", "quota_bytes: 1 PB"),
         r"s\.yaml:\d+: manager\.levels: quota for level 'gpu' gives pool group 0 \d+ pages; at most"),
    scen("gpu-holds-no-page", sub(BASE, "quota_bytes: 64 KiB", "quota_bytes: 1 KiB"),
         r"s\.yaml:9: manager\.levels\.0\.quota_bytes: level 'gpu' holds no page"),
    scen("host-zero-bytes", sub(BASE, "quota_bytes: 256 KiB", "quota_bytes: 0"),
         r"s\.yaml:10: manager\.levels\.1\.quota_bytes: level 'host' holds no page"),
    scen("level-names-duplicate", sub(BASE, "name: host", "name: gpu"),
         r"s\.yaml:8: manager\.levels: level names must be unique"),
    scen("four-levels", sub(BASE, "    - {name: host, quota_bytes: 256 KiB}\n",
                            "    - {name: h1, quota_bytes: 256 KiB}\n"
                            "    - {name: h2, quota_bytes: 256 KiB}\n"
                            "    - {name: h3, quota_bytes: 256 KiB}\n"),
         r"s\.yaml:8: manager\.levels: at most 3 levels"),
    scen("level-unknown-key", sub(BASE, "{name: host, quota_bytes: 256 KiB}",
                                  "{name: host, quota: 256 KiB}"),
         r"s\.yaml:10: manager\.levels\.1\.quota: unknown key"),
    scen("max-util-nan", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                             "max_util_for_resume: .nan"),
         r"s\.yaml:6: manager\.max_util_for_resume: must be a finite number"),
    scen("max-util-zero", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                              "max_util_for_resume: 0"),
         r"s\.yaml:6: manager\.max_util_for_resume: must be in \(0\.0, 1\.0\]"),
    scen("priority-101", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                             "default_priority: 101"),
         r"s\.yaml:6: manager\.default_priority: must be in \[0, 100\]"),
    scen("stats-commit-bad", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                                 "stats_commit: sometimes"),
         r"s\.yaml:6: manager\.stats_commit: must be one of per_batch, per_page"),
    # reuse scopes need no declaration (KVCM2 has none): the old key is an unknown one
    scen("reuse-scopes-gone", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                                  "reuse_scopes: [1]"),
         r"s\.yaml:6: manager\.reuse_scopes: unknown key \(allowed: .*reuse_match_backoff"),
    scen("backoff-negative", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                                 "reuse_match_backoff: -1"),
         r"s\.yaml:6: manager\.reuse_match_backoff: must be in \[0, 67108864\]"),
    scen("backoff-bool", sub(BASE, "  tokens_per_block: 4", "  tokens_per_block: 4\n  "
                             "reuse_match_backoff: true"),
         r"s\.yaml:6: manager\.reuse_match_backoff: must be an integer"),
    # -- scenario files: workloads ---------------------------------------------------------------
    scen("workload-kind-unknown", sub(BASE, "kind: burst_resize", "kind: burst"),
         r"s\.yaml:12: workload\.kind: must be one of"),
    scen("history-huge", sub(BASE, "history_tokens: 40", "history_tokens: 1000000000000000000"),
         r"s\.yaml:13: workload\.history_tokens: must be in \[0, 67108864\]"),
    scen("capacity-below-history", sub(BASE, "capacity_tokens: 48", "capacity_tokens: 8"),
         r"s\.yaml:14: workload\.capacity_tokens: must be >= history_tokens"),
    scen("capacity-beyond-gpu", sub(BASE, "capacity_tokens: 48", "capacity_tokens: 4000"),
         r"s\.yaml:14: workload\.capacity_tokens: a cache of 4000 tokens .* the growth cannot "
         r"succeed"),
    scen("fill-nan", sub(BASE, "gpu_fill_fraction: 0.5", "gpu_fill_fraction: .nan"),
         r"s\.yaml:15: workload\.gpu_fill_fraction: must be a finite number"),
    scen("fill-above-1", sub(BASE, "gpu_fill_fraction: 0.5", "gpu_fill_fraction: 1.5"),
         r"s\.yaml:15: workload\.gpu_fill_fraction: must be in \[0\.0, 1\.0\]"),
    scen("too-many-fillers", sub(BASE, "filler_requests: 2", "filler_requests: 200"),
         r"s\.yaml:16: workload\.filler_requests: 200 fillers cannot share the 16 blocks"),
    scen("growth-steps-zero", BASE + "  growth_steps: 0\n",
         r"s\.yaml:17: workload\.growth_steps: must be in \[1, 100000\]"),
    scen("probe-key-in-burst", BASE + "  probe_threads: 3\n",
         r"s\.yaml:17: workload\.probe_threads: unknown key"),
    scen("probe-threads-huge", sub(PROBE, "probe_threads: 2", "probe_threads: 1000000"),
         r"s\.yaml:14: workload\.probe_threads: must be in \[1, 1024\]"),
    scen("probe-background-missing", sub(PROBE, "  background: {history_tokens: 40, "
                                         "capacity_tokens: 48, filler_requests: 2}\n", ""),
         r"s\.yaml:11: workload\.background: required field is missing"),
    scen("probe-interval-inf", PROBE + "  probe_interval_us: .inf\n",
         r"s\.yaml:16: workload\.probe_interval_us: must be a finite number"),
    scen("probe-tokens-zero", PROBE + "  probe_tokens: 0\n",
         r"s\.yaml:16: workload\.probe_tokens: must be in \[1, 67108864\]"),
    scen("trace-missing", mooncake_scenario("gone.jsonl"),
         r"s\.yaml:13: workload\.trace: no such file: .*gone\.jsonl"),
    scen("trace-is-directory", mooncake_scenario("d"), r"s\.yaml:13: workload\.trace: not a file",
         files={"d/x": "x"}),
    scen("mooncake-bad-line-at-load", mooncake_scenario(),
         r"s\.yaml:13: workload\.trace: .*t\.jsonl:2: input_length: must be <= 67108864",
         files={"t.jsonl": MOONCAKE_OK.split("\n")[0] + "\n" + json.dumps(
             {"timestamp": 9, "input_length": 10**12, "output_length": 1, "hash_ids": []}) + "\n"}),
    scen("mooncake-time-scale-negative", mooncake_scenario() + "  time_scale: -1\n",
         r"s\.yaml:15: workload\.time_scale: must be in \[0\.0", files={"t.jsonl": MOONCAKE_OK}),
    # -- scenario files: executors, presets, sim and hw options ------------------------------------
    scen("executor-unknown", sub(BASE, "executor: sim", "executor: gpu"),
         r"s\.yaml:2: executor: must be one of plan, sim, hw"),
    scen("hardware-missing", sub(BASE, "hardware: h100-pcie\n", ""),
         r"s\.yaml:\d+: hardware: the sim executor needs a hardware preset"),
    scen("hardware-unknown-preset", sub(BASE, "hardware: h100-pcie", "hardware: gh-200"),
         r"s\.yaml:3: hardware: .*gh-200"),
    scen("hardware-file-missing", sub(BASE, "hardware: h100-pcie", "hardware: mine.json"),
         r"s\.yaml:3: hardware: .*mine\.json"),
    scen("hardware-file-bad", sub(BASE, "hardware: h100-pcie", "hardware: mine.json"),
         r"s\.yaml:3: hardware: .*mine\.json", files={"mine.json": "{not json"}),
    scen("cpu-model-unknown", sub(BASE, "hardware: h100-pcie", "hardware: h100-pcie\n"
                                  "cpu_model: kvcm2-rust"),
         r"s\.yaml:4: cpu_model: .*kvcm2-rust"),
    scen("jitter-nan", BASE + "sim: {jitter: .nan}\n",
         r"s\.yaml:17: sim\.jitter: must be a finite number"),
    scen("jitter-one", BASE + "sim: {jitter: 1.0}\n", r"s\.yaml:17: sim\.jitter: must be in"),
    scen("lock-policy-bad", BASE + "sim: {lock_policy: fair}\n",
         r"s\.yaml:17: sim\.lock_policy: must be one of reader, writer"),
    scen("copy-path-bad", BASE + "sim: {copy_path: dma}\n",
         r"s\.yaml:17: sim\.copy_path: must be one of"),
    scen("ctas-zero", BASE + "sim: {kernel_ctas: 0}\n",
         r"s\.yaml:17: sim\.kernel_ctas: must be in \[1, 65536\]"),
    scen("gil-release-unknown-api", BASE + "sim: {gil_release: {KvCache.grow: true}}\n",
         r"s\.yaml:17: sim\.gil_release\.KvCache\.grow: unknown API 'KvCache\.grow'"),
    scen("sim-unknown-key", BASE + "sim: {speed: 2}\n", r"s\.yaml:17: sim\.speed: unknown key"),
    scen("seed-negative", BASE + "seed: -1\n", r"s\.yaml:17: seed: must be >= 0"),
    scen("seed-huge", BASE + f"seed: {2**64}\n", r"s\.yaml:17: seed: must be in \[0, "),
    scen("hw-copier-bad", BASE + "hw: {copier: dma}\n",
         r"s\.yaml:17: hw\.copier: must be one of cuda, none"),
    scen("hw-without-cupy", sub(BASE, "executor: sim", "executor: hw"),
         r"s\.yaml: valid, but cannot run on this machine: .*CuPy.*pip install -e '\.\[hw\]'"),
    scen("hw-without-cupy-run", sub(BASE, "executor: sim", "executor: hw"),
         r"s\.yaml: executor hw with hw\.copier cuda needs CuPy.*pip install", cmd="run",
         extra=("--out", "o")),
    scen("expect-failures-unknown-api", BASE + "expect_failures: [KvCache.grow]\n",
         r"s\.yaml:17: expect_failures\.0: unknown API 'KvCache\.grow'"),
    # -- scenario files: variants ----------------------------------------------------------------
    scen("variant-bad-value", BASE + "variants:\n  v1:\n    set: {sim.jitter: 5}\n",
         r"s\.yaml:19: variant 'v1': sim\.jitter: must be in \[0\.0, 0\.99\]"),
    scen("variant-bad-field", BASE + "variants:\n  v1:\n    set: {manager.levles.0.x: 1}\n",
         r"s\.yaml:19: variant 'v1': manager\.levles: unknown key"),
    scen("variant-bad-index", BASE + "variants:\n  v1:\n    set: {manager.levels.7.quota_bytes: 1}\n",
         r"s\.yaml:19: variants\.v1\.set\.manager\.levels\.7\.quota_bytes: no such field"),
    scen("variant-unknown-preset", BASE + "variants:\n  v1:\n    set: {hardware: gh-200}\n",
         r"s\.yaml:19: variant 'v1': hardware: .*gh-200"),
    scen("variant-name-unsafe", BASE + "variants:\n  ../x:\n    set: {seed: 1}\n",
         r"s\.yaml:18: variants\.\.\./x: must be 1-100 letters.* got '\.\./x'"),
    scen("variant-reference-nan", BASE + "variants:\n  v1:\n    reference: {resize_p50_ms: .nan, "
         "source: x}\n", r"s\.yaml:19: variants\.v1\.reference\.resize_p50_ms: must be a finite"),
    scen("variant-bad-fails-before-base-run", BASE + "variants:\n  v1:\n    set: {sim.jitter: 5}\n",
         r"s\.yaml:19: variant 'v1': sim\.jitter", cmd="run", extra=("--out", "o")),
    # -- valid scenario files (must succeed) -----------------------------------------------------
    scen("valid-base", BASE, r"s\.yaml: ok: tiny", rc=0),
    scen("valid-aliases", BASE + "description: &d short\nvariants:\n  v1:\n    set: {seed: 1}\n",
         r"s\.yaml: ok: tiny", rc=0),
    scen("valid-run", BASE, r"tiny \(sim executor\)", rc=0, cmd="run", extra=("--out", "o")),
    # -- command-line options --------------------------------------------------------------------
    opt("set-bad-value", ["validate-scenario", "s.yaml", "--set", "seed=abc"],
        r"--set seed=abc: seed: must be an integer"),
    opt("set-list-index-by-name", ["validate-scenario", "s.yaml", "--set", "manager.levels.x=1"],
        r"--set manager\.levels\.x=1: manager\.levels is a list of 2; 'x' is not an index"),
    opt("set-index-out-of-range", ["validate-scenario", "s.yaml", "--set",
                                   "manager.levels.5.quota_bytes=1"],
        r"--set manager\.levels\.5\.quota_bytes=1: manager\.levels is a list of 2"),
    opt("set-into-a-value", ["validate-scenario", "s.yaml", "--set", "seed.x=1"],
        r"--set seed\.x=1: the scenario has no field 'seed'"),
    opt("set-no-equals", ["validate-scenario", "s.yaml", "--set", "seed"],
        r"--set seed: expected KEY=VALUE"),
    opt("set-empty-key", ["validate-scenario", "s.yaml", "--set", "=3"],
        r"--set =3: '' is not a dotted field name"),
    opt("set-unknown-top", ["validate-scenario", "s.yaml", "--set", "colour=red"],
        r"--set colour=red: colour: unknown key"),
    opt("set-mapping-value", ["validate-scenario", "s.yaml", "--set", "seed={a: 1}"],
        r"--set seed=\{a: 1\}: the value must be a single value"),
    opt("set-nan", ["validate-scenario", "s.yaml", "--set", "workload.gpu_fill_fraction=.nan"],
        r"--set workload\.gpu_fill_fraction=\.nan: workload\.gpu_fill_fraction: must be a finite"),
    opt("set-unknown-preset", ["validate-scenario", "s.yaml", "--set", "hardware=gh-200"],
        r"--set hardware=gh-200: hardware: .*gh-200"),
    opt("set-name-unsafe", ["run", "s.yaml", "--set", "name=..", "--out", "o"],
        r"--set name=\.\.: name: must be"),
    opt("set-valid", ["validate-scenario", "s.yaml", "--set", "sim.jitter=0.2"],
        r"s\.yaml: ok: tiny", rc=0),
    opt("run-unknown-option", ["run", "s.yaml", "--outt", "x"], r"usage: kvsim run"),
    opt("replay-capacity-1000G", ["replay-cache", "t.jsonl", "--capacity-tokens", "1000G",
                                  "--quiet"],
        r"--capacity-tokens 1000000000000: .* blocks of 512 tokens; at most",
        files={"t.jsonl": MOONCAKE_OK}),
    opt("replay-capacity-garbage", ["replay-cache", "t.jsonl", "--capacity-tokens", "lots"],
        r"capacity 'lots': expected a token count", files={"t.jsonl": MOONCAKE_OK}),
    opt("replay-capacity-zero", ["replay-cache", "t.jsonl", "--capacity-tokens", "0"],
        r"capacity '0': must be a whole number of tokens >= 1", files={"t.jsonl": MOONCAKE_OK}),
    opt("replay-tpb-zero", ["replay-cache", "t.jsonl", "--capacity-tokens", "4k",
                            "--tokens-per-block", "0"],
        r"--tokens-per-block 0: must be in \[1, 65536\]", files={"t.jsonl": MOONCAKE_OK}),
    opt("replay-tpb-huge", ["replay-cache", "t.jsonl", "--capacity-tokens", "4k",
                            "--tokens-per-block", "1000000"],
        r"--tokens-per-block 1000000: must be in \[1, 65536\]", files={"t.jsonl": MOONCAKE_OK}),
    opt("replay-valid", ["replay-cache", "t.jsonl", "--capacity-tokens", "4k", "--quiet"],
        r"^$|", rc=0, files={"t.jsonl": MOONCAKE_OK}),
    opt("explore-schedules-zero", ["explore", "s.yaml", "--schedules", "0"],
        r"--schedules 0: must be in \[1, 100000\]"),
    opt("explore-seed-negative", ["explore", "s.yaml", "--seed", "-5"],
        r"--seed -5: must be in \[0, 2\*\*63\)"),
    opt("explore-plan-executor", ["explore", "s.yaml", "--set", "executor=plan"],
        r"explore needs executor: sim"),
    opt("sweep-workers-zero", ["sweep", "s.yaml", "--param", "seed=1,2", "--workers", "0"],
        r"--workers must be >= 1"),
    opt("sweep-bad-param", ["sweep", "s.yaml", "--param", "seed"],
        r"--param 'seed': expected KEY=V1,V2"),
    opt("report-missing-dir", ["report", "nowhere"], r"nowhere"),
    opt("copy-model-bad-pages", ["copy-model", "--hardware", "h200-sxm", "--path", "kernel",
                                 "--direction", "offload", "--page-bytes", "16384",
                                 "--pages", "-3", "--json"], r"pages"),
    opt("copy-model-unknown-preset", ["copy-model", "--hardware", "h2000", "--path", "kernel",
                                      "--direction", "offload", "--page-bytes", "16384",
                                      "--pages", "10", "--json"], r"h2000"),
    opt("bench-unknown", ["bench", "nothing"], r"unknown benchmark 'nothing'"),
    # -- traces: Mooncake, through kvsim replay-cache ----------------------------------------------
    mooncake("mooncake-valid", MOONCAKE_OK, r"", rc=0),
    mooncake("mooncake-not-utf8", MOONCAKE_OK.encode() + b'{"timestamp": 9, "x": "\xff"}\n',
             r"t\.jsonl:3: not UTF-8 text"),
    mooncake("mooncake-not-json", MOONCAKE_OK + "{timestamp: 9}\n", r"t\.jsonl:3: malformed JSON"),
    mooncake("mooncake-truncated", MOONCAKE_OK + '{"timestamp": 9, "inp', r"t\.jsonl:3: truncated"),
    mooncake("mooncake-empty", "", r"t\.jsonl: empty trace"),
    mooncake("mooncake-missing-field", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n',
             r"t\.jsonl:1: hash_ids: required field is missing"),
    mooncake("mooncake-input-huge", json.dumps({"timestamp": 0, "input_length": 10**12,
                                                "output_length": 1, "hash_ids": []}) + "\n",
             r"t\.jsonl:1: input_length: must be <= 67108864"),
    mooncake("mooncake-output-huge", json.dumps({"timestamp": 0, "input_length": 5,
                                                 "output_length": 10**15, "hash_ids": []}) + "\n",
             r"t\.jsonl:1: output_length: must be <= 67108864"),
    mooncake("mooncake-time-backwards", MOONCAKE_OK + json.dumps(
        {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [4]}) + "\n",
             r"t\.jsonl:3: timestamp: goes backwards"),
    mooncake("mooncake-timestamp-nan", '{"timestamp": NaN, "input_length": 5, "output_length": 1, '
             '"hash_ids": []}\n', r"t\.jsonl:1: timestamp: must be finite"),
    mooncake("mooncake-too-many-ids", json.dumps({"timestamp": 0, "input_length": 5,
                                                  "output_length": 1, "hash_ids": [1, 2]}) + "\n",
             r"t\.jsonl:1: hash_ids: 2 ids for input_length 5"),
    mooncake("mooncake-id-bool", json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1,
                                             "hash_ids": [True]}) + "\n",
             r"t\.jsonl:1: hash_ids\[0\]: must be an integer"),
    mooncake("mooncake-not-object", "[1, 2]\n", r"t\.jsonl:1: each line must be a JSON object"),
    # -- traces: op traces, through a scenario (kvsim validate-scenario) -----------------------------
    optrace("op-valid", OP_OK, r"s\.yaml: ok", rc=0),
    optrace("op-unknown-op", OP_OK + '{"t": 1, "thread": "a", "op": "grow", "cache": "c"}\n',
            r"s\.yaml:13: workload\.trace: .*t\.jsonl:3: op: must be one of create_kv_cache"),
    optrace("op-unknown-key", OP_OK + '{"t": 1, "thread": "a", "op": "close", "cache": "c", '
            '"force": true}\n', r"t\.jsonl:3: force: unknown key"),
    optrace("op-token-count-huge", OP_OK + json.dumps({"t": 1, "thread": "a", "op": "commit",
                                                      "cache": "c", "token_count": 10**12}) + "\n",
            r"t\.jsonl:3: token_count: must be in \[0, 67108864\], got 1000000000000"),
    optrace("op-capacity-huge", OP_OK + json.dumps({"t": 1, "thread": "a", "op": "resize",
                                                   "cache": "c", "capacity": 2**63}) + "\n",
            r"t\.jsonl:3: capacity: must be in \[0, 67108864\], got 9223372036854775808"),
    optrace("op-cache-missing", OP_OK + '{"t": 1, "thread": "a", "op": "resume"}\n',
            r"t\.jsonl:3: cache: required field is missing"),
    optrace("op-time-backwards", OP_OK + '{"t": 0.0001, "thread": "a", "op": "suspend", '
            '"cache": "c"}\n', r"t\.jsonl:3: t: goes backwards on thread 'a'"),
    optrace("op-token-out-of-range", OP_OK + '{"t": 1, "thread": "a", "op": "commit", '
            '"cache": "c", "tokens": [4294967296]}\n',
            r"t\.jsonl:3: tokens\.0: must be an integer in \[0, 2\*\*32\)"),
    optrace("op-scope-bool", OP_OK + '{"t": 1, "thread": "a", "op": "probe_reuse", '
            '"tokens": [1], "scope": true}\n', r"t\.jsonl:3: scope: must be an integer or a string"),
    optrace("op-not-utf8", OP_OK.encode() + b'{"t": 1, "thread": "\xff"}\n',
            r"t\.jsonl:3: not UTF-8 text"),
]


def _write(root: Path, files: dict) -> None:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body, encoding="utf-8")


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_clear_error(case, tmp_path, monkeypatch, capsys):
    ws = tmp_path / "ws"
    ws.mkdir()
    _write(ws, case.files)
    monkeypatch.chdir(ws)
    before = _snapshot(ws)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT_S)
    try:
        try:
            rc = main(list(case.argv))
        except SystemExit as e:  # argparse's own errors
            rc = e.code
        except _Hang:
            pytest.fail(f"{case.id}: no answer within {TIME_LIMIT_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = capsys.readouterr()
    text = out.err + out.out
    assert "Traceback" not in text
    assert rc == case.rc, text
    assert re.search(case.message, text, re.MULTILINE), text
    after = _snapshot(ws)
    # nothing that was there is gone or changed; only outputs a valid run wrote may be new
    assert {k: v for k, v in after.items() if k in before} == before
    if case.rc != 0:
        assert after == before, sorted(set(after) - set(before))


# -- manager API calls ---------------------------------------------------------------------------

def _manager() -> KVCacheManager:
    config = ManagerConfig(layers=(LayerConfig(slot_bytes=(1024, 1024)),),
                           levels=(LevelConfig("gpu", 64 * 2048), LevelConfig("host", 256 * 2048)),
                           tokens_per_block=4)
    return KVCacheManager(config)


def _active(m: KVCacheManager):
    c = m.create_kv_cache(cache_id="a")
    c.resume()
    c.resize(8)
    c.commit(np.arange(8))
    return c


def _stopped(m: KVCacheManager):
    c = _active(m)
    c.stop_committing()
    return c


# (name, set-up that succeeds and returns what the call needs, the failing call, message)
API_CASES = [
    ("create-unhashable-id", lambda m: m, lambda m: m.create_kv_cache(cache_id=["x"]),
     "must be hashable"),
    ("create-duplicate-id", _active, lambda c: c._manager.create_kv_cache(cache_id="a"),
     "already open"),
    ("create-2d-tokens", lambda m: m, lambda m: m.create_kv_cache(np.zeros((2, 2), dtype=int)),
     "1-D"),
    ("create-float-tokens", lambda m: m, lambda m: m.create_kv_cache([1.5, 2.0]),
     "integer token ids"),
    ("create-negative-token", lambda m: m, lambda m: m.create_kv_cache([-1]), r"\[0, 2\*\*32\)"),
    ("create-unhashable-scope", lambda m: m, lambda m: m.create_kv_cache([1], reuse_scope=[7]),
     "reuse_scope must be hashable"),
    ("create-expected-length-negative", lambda m: m,
     lambda m: m.create_kv_cache([1], expected_prompt_length=-1),
     r"expected_prompt_length must be in \[0, 67108864\]"),
    ("create-callback-not-callable", lambda m: m,
     lambda m: m.create_kv_cache(priority_callback=3), "must be callable"),
    ("resize-huge", _active, lambda c: c.resize(10**12), r"capacity must be in \[0, 67108864\]"),
    ("resize-2-63", _active, lambda c: c.resize(2**63), r"capacity must be in \[0, 67108864\]"),
    ("resize-negative", _active, lambda c: c.resize(-1), "capacity must be in"),
    ("resize-float", _active, lambda c: c.resize(8.0), "must be an integer"),
    ("resize-below-history", _active, lambda c: c.resize(4), "is below history_length"),
    ("resize-history-back", _active, lambda c: c.resize(8, 4), "may not decrease"),
    ("resize-suspended", lambda m: m.create_kv_cache(cache_id="s"), lambda c: c.resize(8),
     "needs a ACTIVE cache"),
    ("commit-over-capacity", _active, lambda c: c.commit(np.arange(4)), "above capacity"),
    ("commit-after-stop", _stopped, lambda c: c.commit([1]), "commit after stop_committing"),
    ("resume-twice", _active, lambda c: c.resume(), "needs a SUSPENDED cache"),
    ("drop-before-stop", _active, lambda c: c.plan_committed_block_drop(),
     "needs stop_committing"),
    ("manager-resize-2-70", lambda m: m, lambda m: m.resize(0, 2**70), "at most 134217728"),
    ("manager-resize-level", lambda m: m, lambda m: m.resize(5, 1024),
     "cache_level must be an integer in"),
    ("manager-resize-groups", lambda m: m, lambda m: m.resize(0, [1, 2, 3]), "lists 3 pool groups"),
    ("manager-resize-active", _active, lambda c: c._manager.resize(0, 2048),
     "needs every cache SUSPENDED"),
    ("stats-level-bool", lambda m: m, lambda m: m.get_storage_statistics(True),
     "cache_level must be"),
    ("shutdown-open", _active, lambda c: c._manager.shutdown(), "still open"),
    ("probe-unhashable-scope", lambda m: m, lambda m: m.probe_reuse([1, 2], {}),
     "reuse_scope must be hashable"),
    ("prefetch-active", _active, lambda c: c.prefetch(0), "needs a SUSPENDED cache"),
    ("prefetch-bad-level", lambda m: m.create_kv_cache(cache_id="p"), lambda c: c.prefetch(7),
     r"cache_level must be an integer in \[0, 2\)"),
]


@pytest.mark.parametrize("name, setup, call, message", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_argument_raises_a_documented_error_and_changes_nothing(name, setup, call,
                                                                       message):
    from kvsim.manager.invariants import find_violations

    m = _manager()
    target = setup(m)
    before = fingerprint(m)
    with pytest.raises(KvsimError, match=message):
        call(target)
    assert fingerprint(m) == before
    assert find_violations(m) == []


CATEGORY_COUNTS = Counter(c.category for c in CASES) + Counter({"api": len(API_CASES)})


def test_the_corpus_is_large_enough():
    assert sum(CATEGORY_COUNTS.values()) >= 100
    assert set(CATEGORY_COUNTS) == {"scenario", "option", "trace", "api"}
