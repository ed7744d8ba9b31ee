"""The Batch API: a file of requests answered within a completion window, in the `batch` class.

`api.py` serves the routes, `store.py` keeps records and finished lines in JetStream, `runner.py`
decides which bridge runs which batch, `run.py` runs one, `lines.py` reads and writes the JSONL."""
