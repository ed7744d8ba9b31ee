"""Regenerate `intents.jsonl`: labelled prompts for the intent classifier (deterministic).

    python tools/routing/data/make_intents.py

Each line: {"text", "label", "group"}. `group` names the template a prompt came from (or
`hand-<n>` for a hand-written one); the train script holds out whole groups, so the reported
accuracy is on phrasings the model never saw, not on re-filled copies of training templates.
Labels: `simple` (one-step facts, lookups, small talk: the fast tier can answer), `complex`
(multi-step reasoning, analysis, long-form writing, planning: the quality tier), `code`.

The words, the templates per label and the hand-written prompts are data, kept beside this
script in `intent_templates.json`: {"slots": slot → fillers, "templates": label → templates
with `{slot}`s, "hand": label → prompts}; this script fills and labels them.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

PER_TEMPLATE = 6

# The script's data, beside it: it runs from a checkout (tools/ is never installed).
DATA = json.loads(Path(__file__).with_name("intent_templates.json").read_text(encoding="utf-8"))
S: dict[str, list[str]] = DATA["slots"]
SIMPLE: list[str] = DATA["templates"]["simple"]
COMPLEX: list[str] = DATA["templates"]["complex"]
CODE: list[str] = DATA["templates"]["code"]
HAND: dict[str, list[str]] = DATA["hand"]


def _fill(template: str, rng: random.Random) -> str:
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    return template.format(**{name: rng.choice(S[name]) for name in names})


def build() -> list[dict[str, str]]:
    rng = random.Random(7)
    rows: list[dict[str, str]] = []
    for label, templates in (("simple", SIMPLE), ("complex", COMPLEX), ("code", CODE)):
        for t, template in enumerate(templates):
            seen: set[str] = set()
            for _ in range(PER_TEMPLATE * 8):
                if len(seen) == PER_TEMPLATE:
                    break
                text = _fill(template, rng)
                if text not in seen:
                    seen.add(text)
                    rows.append({"text": text, "label": label, "group": f"{label}-t{t}"})
    n = 0
    for label, texts in HAND.items():
        for text in texts:
            rows.append({"text": text, "label": label, "group": f"hand-{n}"})
            n += 1
    return rows


def main() -> None:
    out = Path(__file__).with_name("intents.jsonl")
    rows = build()
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {label: sum(r["label"] == label for r in rows) for label in ("simple", "complex", "code")}
    print(f"wrote {len(rows)} prompts to {out}: {counts}")


if __name__ == "__main__":
    main()
