"""The intent classifier's trainer and its labelled prompts; it writes `core/routing/intent_model.json`."""
