"""Upper bounds on sizes, checked wherever a size enters kvsim (scenario files, traces, command
options, the manager's own API) so that an absurd value is an error naming it, not a
``MemoryError`` from numpy minutes into a run.

Each bound is far above what a real deployment uses and below what the page table and slot
arrays can hold on one machine:

* :data:`MAX_TOKENS_PER_BLOCK`: 65,536 (KVCM2 configurations use 16-128; Mooncake's trace blocks
  are 512).
* :data:`MAX_SEQUENCE_TOKENS`: 67,108,864 tokens (2**26) in one cache or one trace request: over
  six times the longest context window published (10M tokens); a cache of that many tokens keeps
  256 MiB of token ids.
* :data:`MAX_SLOTS`: 134,217,728 pages (2**27) per cache level and pool group: 2 TiB of 16 KiB
  pages; the slot arrays of such a level take 1 GiB.
* :data:`MAX_LAYERS`: 4,096 layers (the largest published models have under 200).
* :data:`MAX_SLOT_BYTES`: 1 GiB per slot.
"""

from __future__ import annotations

MAX_TOKENS_PER_BLOCK = 1 << 16
MAX_SEQUENCE_TOKENS = 1 << 26
MAX_SLOTS = 1 << 27
MAX_LAYERS = 1 << 12
MAX_SLOT_BYTES = 1 << 30
