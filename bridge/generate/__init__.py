"""Generation: `POST /v1/chat/completions`, `/v1/completions` and `/v1/embeddings` (`routes.py`),
and the one path every generation takes, the Responses API's and a batch line's too: the body →
`GenerateRequest` (`translate.py`), the edge's stream limit (`admission.py`), the publish."""
