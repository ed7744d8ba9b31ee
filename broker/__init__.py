"""The broker process: the admission gate (`gate/`), the lanes and pools, the one schedule several
brokers share (`scheduler/`) and the loop that joins them to JetStream (`app.py`, `Broker`)."""
