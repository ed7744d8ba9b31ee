"""Entries → what the client reads: OpenAI JSON and SSE bytes for chat and completions
(`chat.py`), embeddings, the Responses API's events (`responses.py`) and what of them is stored
(`stored.py`); `respond.py` writes them out, streamed or whole."""
