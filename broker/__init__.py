"""The broker side: the HTTP edge (bridge), the admission gate, the lanes and the dispatcher."""
