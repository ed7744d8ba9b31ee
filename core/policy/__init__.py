"""Policy documents (priority classes, tenants, quota, PII, the cascade) and their pure decisions:
no I/O, and nothing of the gate's imported, so every process can hold them without loading the
gate. `tests/unit/test_import_graph.py` keeps them pure."""
