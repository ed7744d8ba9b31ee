"""The public-set report for the intent classifier (loadtest.intent_public): HumanEval loads from
the installed wheel, the views are built as documented, and the counts add up. It never asserts
the classifier's accuracy: that figure is reported, not a gate."""

from __future__ import annotations

import pytest

from core.routing.classifier import IntentModel, default_model
from core.routing.intent_eval import LABELS, Example
from loadtest import intent_public
from loadtest.intent_public import VIEWS, load, prose, score

SAMPLE = 20


@pytest.mark.parametrize("view", VIEWS)
def test_humaneval_loads_from_the_wheel_in_task_order(view: str) -> None:
    public = load(view, SAMPLE)
    assert [e.group for e in public.examples] == [f"HumanEval/{i}" for i in range(SAMPLE)]
    assert {e.label for e in public.examples} == {"code"}
    assert all(e.text.strip() for e in public.examples)
    assert public.version == "1.0.3" and "MIT" in public.licence  # the pin in pyproject's loadtest extra


def test_prose_view_is_the_entry_points_description_without_code() -> None:
    texts = [e.text for e in load("prose").examples]
    assert len(texts) == 164
    assert all(t and "\n" not in t and ">>>" not in t and "def " not in t for t in texts)
    prompt = (
        'def helper(s: str) -> bool:\n    """ Not this one. """\n\n\n'
        'def target(n: int) -> int:\n    """Return the n-th square.\n    Squares grow fast.\n'
        '    For example:\n    target(3) == 9\n    """\n'
    )
    assert prose(prompt, "target") == "Return the n-th square. Squares grow fast."
    assert prose(prompt.replace("    For example:\n", ""), "target") == "Return the n-th square. Squares grow fast."
    with pytest.raises(ValueError):
        prose("def other():\n    pass\n", "target")


@pytest.mark.parametrize("view", VIEWS)
def test_report_counts_add_up_on_a_sample(view: str) -> None:
    report = score(load(view, SAMPLE).examples, default_model())
    assert report.n == SAMPLE
    assert sum(sum(row.values()) for row in report.confusion.values()) == SAMPLE
    assert all(sum(report.confusion[label].values()) == 0 for label in ("simple", "complex"))
    assert sum(s.predicted for s in report.per_class.values()) == SAMPLE
    code = report.per_class["code"]
    assert code.support == SAMPLE and code.recall == report.accuracy == report.confusion["code"]["code"] / SAMPLE
    assert report.per_class["simple"].recall is None and report.per_class["complex"].recall is None


def test_precision_and_recall_on_a_known_model() -> None:
    # One word per class decides; no word scores a tie, which the first label (simple) wins.
    model = IntentModel(LABELS, {"w:def": (0.0, 0.0, 5.0), "w:why": (0.0, 5.0, 0.0)}, {})
    examples = [
        Example("def f", "code", "a"),
        Example("def g", "complex", "b"),
        Example("why so", "complex", "c"),
        Example("hello", "simple", "d"),
        Example("hi", "code", "e"),
    ]
    report = score(examples, model)
    assert report.accuracy == 3 / 5
    assert report.confusion["code"] == {"simple": 1, "complex": 0, "code": 1}
    assert report.per_class["code"].precision == 1 / 2 and report.per_class["code"].recall == 1 / 2
    assert report.per_class["complex"].precision == 1.0 and report.per_class["complex"].recall == 1 / 2
    assert report.per_class["simple"].precision == 1 / 2 and report.per_class["simple"].recall == 1.0


def test_main_prints_set_mapping_and_confusion(capsys: pytest.CaptureFixture[str]) -> None:
    assert intent_public.main(["--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("set: OpenAI HumanEval") == 2 and out.count("prompts: 5 ") == 2
    assert "mapping: every HumanEval problem -> code" in out and "confusion (rows: true" in out
