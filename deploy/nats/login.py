"""Entrypoint of docker-compose.yml's Laneway containers: `laneway ARGS...` logged in to NATS as
the role whose login.json (written by deploy/nats/compose_auth.py) is the first argument.

    python login.py /run/laneway/nats/login.json broker --nats-url ...

The password reaches `laneway` through its environment (LANEWAY_NATS_USER, LANEWAY_NATS_PASSWORD,
and the role's other secrets in the login's `env`), never the command line, and `laneway` replaces this process, so it gets SIGTERM directly.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: login.py LOGIN_JSON LANEWAY_ARGS...")
    with open(argv[0]) as f:
        login = json.load(f)
    os.environ["LANEWAY_NATS_USER"], os.environ["LANEWAY_NATS_PASSWORD"] = login["user"], login["password"]
    os.environ.update(login.get("env", {}))
    os.execvp("laneway", ["laneway", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
