"""The SIMULATED engine: vLLM's scheduling over a GPU roofline, for load tests without a GPU."""
