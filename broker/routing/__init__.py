"""Adaptive routing: rule sets (versioned in KV), the intent classifier, the cascade policy and
the admin API that changes rules behind the eval gate."""
