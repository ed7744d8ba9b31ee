"""Adaptive routing: rule sets (versioned in KV), pool health, the intent classifier and the eval
gate; the bridge's admin API (`bridge/admin.py`) changes rules behind that gate."""
