"""The frames an answer travels on, from the worker to the request that waits: one subscription
per bridge, demultiplexed by request (`demux.py`), a stream whose worker fell silent ended
rather than left hanging (`losses.py`), or gone on on the worker its request went to next
(`continuation.py`)."""
