"""PII analysis: Presidio's recognizers and spaCy's NER in a pool of processes, behind the gate's
PII stage (`broker/gate/pii/`), which decides what to do with what is found.

- `pool.py`: the pool the broker's event loop talks to (spawned, warmed, fed balanced pieces of
  text, each tenant within its share of the processes).
- `worker.py`: the process side; with `recognize.py` (patterns) and `ner.py` (names, places)
  the only code that touches Presidio or spaCy.
- `plan.py`: what a worker looks for, derived once per policy; `spacy_model.py`: which model,
  and whether it is installed.
"""
