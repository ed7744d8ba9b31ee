"""The worker's redaction of model output (`workers/pii.py`): each text of each choice
through a stream redactor of its own, values split across engine outputs caught, what is held
released at the end, and no token ids passed on."""

from __future__ import annotations

from core.policy.pii import Action, TenantPiiPolicy, encode
from core.policy.pii.stream import STREAM_TYPES, redacts_output
from schemas.frames import ToolCallDelta
from workers.engine import EngineOutput
from workers.pii import OutputRedaction

EMAIL = "maria.garcia@example.com"


def redaction(policy: TenantPiiPolicy = TenantPiiPolicy()) -> OutputRedaction:
    found = OutputRedaction.for_dispatch(encode(policy).decode())
    assert found is not None
    return found


def streamed(r: OutputRedaction, outs: list[EngineOutput]) -> list[EngineOutput]:
    return [r.apply(o) for o in outs] + r.flush()


def content(outs: list[EngineOutput], choice: int = 0) -> str:
    return "".join(o.text for o in outs if o.index == choice)


def test_an_email_split_across_outputs_is_redacted_and_no_token_id_leaves() -> None:
    pieces = ["Write to ", "maria.gar", "cia@exam", "ple.com", " today."]
    outs = streamed(redaction(), [EngineOutput(p, token_ids=[7, 8]) for p in pieces])
    assert content(outs) == "Write to <EMAIL_ADDRESS> today."
    assert all(o.token_ids == [] for o in outs)


def test_choices_and_fields_are_redacted_apart() -> None:
    outs = streamed(
        redaction(),
        [
            EngineOutput("mail maria.garcia@", index=0),
            EngineOutput("call 415-555-", index=1),
            EngineOutput("", index=0, reasoning="the user is maria.garcia@example.com "),
            EngineOutput("example.com ok", index=0),
            EngineOutput("0132 now", index=1),
            EngineOutput("", index=1, tool_calls=[ToolCallDelta(0, "call_1", "lookup", '{"ip": "10.1.')]),
            EngineOutput("", index=1, tool_calls=[ToolCallDelta(0, arguments='2.3"}')]),
        ],
    )
    assert content(outs, 0) == "mail <EMAIL_ADDRESS> ok"
    assert content(outs, 1) == "call <PHONE_NUMBER> now"
    assert "".join(o.reasoning for o in outs) == "the user is <EMAIL_ADDRESS> "
    calls = [c for o in outs for c in o.tool_calls]
    assert (calls[0].id, calls[0].name) == ("call_1", "lookup")
    assert "".join(c.arguments for c in calls) == '{"ip": "<IP_ADDRESS>"}'


def test_what_the_policy_allows_passes_and_mask_masks() -> None:
    policy = TenantPiiPolicy(entities={"EMAIL_ADDRESS": Action.allow, "PHONE_NUMBER": Action.mask})
    outs = streamed(redaction(policy), [EngineOutput(f"{EMAIL} or 415-555-0132")])
    assert content(outs) == f"{EMAIL} or ***-***-0132"


def test_the_allow_list_holds_for_output_as_for_input() -> None:
    policy = TenantPiiPolicy(allow_list=["support@acme.example"])
    outs = streamed(redaction(policy), [EngineOutput(f"support@acme.example, not {EMAIL}")])
    assert content(outs) == "support@acme.example, not <EMAIL_ADDRESS>"


def test_no_policy_or_output_off_means_no_redaction() -> None:
    assert OutputRedaction.for_dispatch("") is None
    assert redacts_output(TenantPiiPolicy())
    assert not redacts_output(TenantPiiPolicy(output=False))
    assert not redacts_output(TenantPiiPolicy(enabled=False))
    # Only what NER finds is flagged: nothing output redaction could find, so nothing to hold back.
    names_only = {t: Action.allow for t in STREAM_TYPES}
    assert not redacts_output(TenantPiiPolicy(entities=names_only))
    assert OutputRedaction.for_dispatch(encode(TenantPiiPolicy(entities=names_only)).decode()) is None
