"""One engine family per package behind the `Engine` contract (`workers/engine.py`): `sim/` (a
SIMULATED GPU), `vllm/` (vLLM in process), `openai/` (a hosted OpenAI-compatible API);
`openai_wire.py` is the OpenAI request and response shapes the vLLM and openai engines share."""
