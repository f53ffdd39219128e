"""Model architectures as data (:mod:`kvsim.llm.architectures`)."""
