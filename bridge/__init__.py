"""The HTTP edge: OpenAI-compatible routes, SSE rendering, key → tenant, frame demux, cancels."""
