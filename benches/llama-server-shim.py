#!/usr/bin/env python3
"""`llama-server` as llama.cpp's server tests start it, run as `lamina serve`.

The suite (tools/server/tests/utils.py) starts LLAMA_SERVER_BIN_PATH with
llama-server's flags and a model from Hugging Face. This maps the model
source (--hf-repo, --hf-file, --model-url, --model, -hf, -m) to the one
local file in LAMINA_SUITE_MODEL and passes every other flag to
`lamina serve` unchanged: Lamina reads llama-server's spellings itself.

A flag Lamina refuses (a llama-server feature it does not implement, or, in
an older build, a spelling it did not know) would stop the server before
any test ran, and the suite's warm-up of every preset with it. So the shim
first has Lamina parse the arguments alone (a dry start on port 0 and a
missing model, which fails at load once parsing passed), drops each refused flag
with a line on stderr, and then becomes `lamina serve` (exec, so the
suite's SIGTERM reaches the server). The tests of that feature then fail
on what the server answers, which is what they measure.

With PEER_BIN set (benches/server-suite.sh's PEER=llama-server), the shim
starts that binary instead, llama.cpp's own llama-server: the same model
mapping to the same local file, and every other flag passed as it came,
none dropped, so the two servers run the same suite on the same model.
"""

import os
import re
import subprocess
import sys

PEER = os.environ.get("PEER_BIN")
LAMINA = os.environ.get("LAMINA_BIN", "")
MODEL = os.environ["LAMINA_SUITE_MODEL"]

# llama-server flags that name where the model comes from.
MODEL_FLAGS = {"--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-url", "-mu", "--model", "-m"}

# The flag named in a refusal: clap's "unexpected argument '--x' found" and
# Lamina's "llama-server's --x is not implemented".
REFUSED = [
    re.compile(r"unexpected argument '(-[^' ]+)"),
    re.compile(r"llama-server's (-[\w-]+)(?: \([^)]*\))? is not implemented"),
    re.compile(r"invalid value '[^']*' for '(-[^' <]+)"),
]


def without_model(args):
    out, i = [], 0
    while i < len(args):
        if args[i] in MODEL_FLAGS:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def drop(args, flag):
    """`args` less `flag` and, when it has one, its value."""
    if not any(a == flag or a.startswith(flag + "=") for a in args):
        # clap names the first letter of a single-dash long flag it cannot
        # read (`-f` for `-fa`): drop the argument it came from.
        flag = next((a for a in args if a.startswith(flag) and not a.startswith("--")), flag)
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a == flag or a.startswith(flag + "="):
            takes_value = a == flag and i + 1 < len(args) and not args[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        out.append(a)
        i += 1
    return out


def refused(args):
    """The first flag Lamina refuses in `args`, or None."""
    # Port 0 and a missing model: a parse that passes fails at load instead,
    # without taking the suite's port.
    probe = list(args)
    for i, a in enumerate(probe[:-1]):
        if a == "--port":
            probe[i + 1] = "0"
    cmd = [LAMINA, "serve", "-m", os.path.join(os.sep, "nonexistent", "model.gguf"), *probe]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    for pat in REFUSED:
        m = pat.search(r.stderr)
        if m:
            return m.group(1)
    return None


def main():
    args = without_model(sys.argv[1:])
    if PEER:
        os.execv(PEER, [PEER, "-m", MODEL, *args])
    for _ in range(64):
        flag = refused(args)
        if flag is None:
            break
        print(f"server-suite: lamina refuses {flag}; dropping it", file=sys.stderr, flush=True)
        nxt = drop(args, flag)
        if nxt == args:
            break
        args = nxt
    os.execv(LAMINA, [LAMINA, "serve", "-m", MODEL, *args])


if __name__ == "__main__":
    main()
