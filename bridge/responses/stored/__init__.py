"""Stored responses: the store (`store.py`), items (`items.py`), the routes (`routes.py`), background runs."""
