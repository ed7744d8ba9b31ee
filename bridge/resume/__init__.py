"""Resumable streams (`--resume-window-s`): a client that comes back with `Last-Event-ID` gets
every event after it, once. In the order a resume meets them: the routes' side (`routes.py`), the
relay between bridge replicas (`relay.py`), the window that keeps a left stream (`window.py`),
the numbered events themselves (`replay.py`)."""
