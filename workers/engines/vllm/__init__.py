"""The vLLM engine: an in-process AsyncLLM behind the Engine contract."""
