"""Laneway's wire contract: msgspec structs and subject names. No I/O, nothing else of ours imported."""
