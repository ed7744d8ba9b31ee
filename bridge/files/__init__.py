"""The Files API: the routes (`routes.py`), the store (`store.py`: metadata in KV, bytes in the
object store, each tenant's own), and uploads streamed to it (`upload.py`)."""
