"""The serving layer: an engine that schedules a trace's requests over the manager, and what it
measured (time to first token, GPU time, reuse by tier). See :mod:`kvsim.serving.engine`."""
