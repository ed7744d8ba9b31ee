"""What `laneway up` prints once the stack is ready: where it serves, the key, how to call it
and how to operate it."""

from __future__ import annotations

import sys
from pathlib import Path

from laneway.nats_config import UpAuth


def nats_lines(nats_url: str, auth: UpAuth | None, data_dir: Path) -> str:
    if auth is None:
        return "  NATS auth   off (--no-nats-auth): any local process can read every subject\n"
    ops_user, ops_password = auth.services["ops"]
    tenant_users = ", ".join(f"{t} as {user}" for t, (user, _) in auth.tenants.items())
    return (
        f"  NATS users  one per service and tenant ({tenant_users}); passwords in\n"
        f"              {auth.credentials_file} (0600)\n"
        f"\nOperate it live (laneway classes|tenants|routing|usage) as the ops user: on this machine\n"
        f"  laneway classes --data-dir {data_dir} list\n"
        f"(no export needed here: the data dir, default ./.laneway, says where it runs); elsewhere:\n"
        f"  export LANEWAY_NATS_URL={nats_url} LANEWAY_NATS_USER={ops_user} "
        f"LANEWAY_NATS_PASSWORD={ops_password}\n"
    )


def banner(
    url: str,
    api_key: str,
    model: str,
    key_note: str,
    nats_url: str,
    logs: Path,
    auth: UpAuth | None,
    counts: dict[str, int],
    pii_stages: dict[str, int],
    scrape_file: Path,
    every_process: bool = True,
) -> str:
    """`logs` is the data dir's `logs/`."""
    pii = ", ".join(PII_LINES.get(stage, stage) for stage in sorted(pii_stages)) or "unknown"
    # A key from the environment in the shell example is one from the environment in Python's.
    py_key = f"__import__('os').environ['{api_key[1:]}']" if api_key.startswith("$") else f"'{api_key}'"
    shell_key = f'"{api_key}"' if api_key.startswith("$") else api_key  # `export KEY="$LANEWAY_KEY"`
    python = sys.executable  # the interpreter Laneway (and so openai) is installed in
    return f"""
Laneway is up: {url}
  NATS        {nats_url}
  API key     {api_key}{key_note}
  model       {model}
  processes   {", ".join(f"{n} {role}{'s' if n > 1 else ''}" for role, n in counts.items())}
  PII         {pii}
  logs        {logs}/
  metrics     {"every process's endpoint" if every_process else "the bridge's alone (--no-metrics)"} in {scrape_file}
              (a Prometheus scrape config); watch them live: laneway top
{nats_lines(nats_url, auth, logs.parent)}
Stream a reply with curl:
  export KEY={shell_key}
  curl -N {url}/v1/chat/completions \\
    -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "stream": true, "messages": [{{"role": "user", "content": "Hello!"}}]}}'

Or with the openai client (installed with Laneway):
  {python} -c "from openai import OpenAI
c = OpenAI(base_url='{url}/v1', api_key={py_key})
for ch in c.chat.completions.create(model='{model}', stream=True,
        messages=[{{'role': 'user', 'content': 'Hello!'}}]):
    print(ch.choices[0].delta.content or '' if ch.choices else '', end='', flush=True)"

Ctrl-C stops everything.
"""


PII_LINES = {
    "ner": "on (Presidio, with spaCy's NER for names)",
    "regex": "on (Presidio's pattern recognizers)",
    "off": "OFF (--pii off): no tenant's PII policy is enforced",
    "missing": "NOT RUNNING: tenants whose policy asks for PII handling get 503",
}
