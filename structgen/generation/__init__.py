"""Generation: model adapter, drafters, verify, the speculative loop and the Python API."""
