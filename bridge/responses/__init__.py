"""The Responses API: the endpoint (`routes.py`), a Responses body → a chat generation and back
(`translate.py`), and what is stored (`stored/`: responses, their input items, background runs
and their takeover, conversations)."""
