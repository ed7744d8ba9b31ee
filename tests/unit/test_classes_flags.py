"""`laneway classes set` applies its flags to the class's document, the shares included: an
operator tunes what a tenant may hold of a worker live, without writing JSON."""

from __future__ import annotations

import argparse
import json

from core.policy import classes
from laneway.ops_config import _document, _validate, configure_classes


def test_the_share_flags_land_in_a_document_the_broker_accepts():
    parser = argparse.ArgumentParser()
    configure_classes(parser)
    args = parser.parse_args(
        [
            "set",
            "interactive",
            "--max-tenant-share",
            "0.8",
            "--max-tenant-step-share",
            "0.4",
            "--max-prefill-share",
            "0.6",
        ]
    )
    current = json.loads(classes.encode(next(c for c in classes.DEFAULT_CLASSES if c.name == "interactive")))
    name, raw = _document(args, current)
    policy = classes.decode(name, _validate("classes", name, raw))
    assert (policy.max_tenant_share, policy.max_tenant_step_share, policy.max_prefill_share) == (0.8, 0.4, 0.6)
    assert policy.tenant_step_share == 0.4 and policy.rank == 0  # the rest kept
