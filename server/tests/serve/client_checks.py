"""What the client scripts beside this file share: running their checks and
asking the OpenAI route for the answer to compare with."""

import json
import sys
import urllib.request


def openai_chat(base, key, body):
    """The OpenAI route's answer to `body`, without an SDK."""
    data = json.dumps(body).encode()
    h = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(base + "/v1/chat/completions", data=data, headers=h)
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read().decode())


def run(name, checks):
    """Runs every check, prints a line for each, and exits non-zero if any failed."""
    failed = 0
    for check in checks:
        try:
            check()
            print(f"ok   {check.__name__}")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failed += 1
            print(f"FAIL {check.__name__}: {e!r}")
    print(f"{name} client: {len(checks) - failed} of {len(checks)} checks passed")
    sys.exit(1 if failed else 0)
