"""The openai engine: a hosted OpenAI-compatible API as a pool, behind a circuit breaker."""
