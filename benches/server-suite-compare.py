#!/usr/bin/env python3
"""Compares two runs of benches/server-suite.sh: Lamina's and llama-server's.

    benches/server-suite-compare.py            # the cache's junit.xml and junit-llama-server.xml
    benches/server-suite-compare.py LAMINA.xml PEER.xml [PEER2.xml ...]

Reads the JUnit XML each run writes (Lamina's first, then the peer's: more
than one when the peer ran the suite in parts) and prints each server's
counts, then the tests llama-server passes and Lamina does not (failed,
errored or skipped there), grouped by test file, and the reverse. A test
only one of the two ran is counted apart, in neither list. Exits 0 either
way: the list is the result.
"""

import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
CACHE = os.environ.get(
    "LAMINA_SUITE_CACHE", os.path.expanduser(f"~/.cache/lamina/server-suite-{VERSION}")
)


def outcomes(path):
    """{test id: "passed" | "failed" | "error" | "skipped"} from a JUnit file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        # classname "unit.test_basic", name "test_server_start_simple[x]".
        module = case.get("classname", "").replace(".", "/")
        test = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            result = "error"
        elif "failure" in kinds:
            result = "failed"
        elif "skipped" in kinds:
            result = "skipped"
        else:
            result = "passed"
        # A test that passed but errored in teardown appears twice: the worst stays.
        if out.get(test) not in ("error", "failed"):
            out[test] = result
    return out


def counts(results):
    c = defaultdict(int)
    for r in results.values():
        c[r] += 1
    return ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "error", "skipped"))


def main():
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if len(args) == 1:
        sys.exit("usage: server-suite-compare.py [LAMINA_JUNIT PEER_JUNIT...]")
    paths = args or [
        os.path.join(CACHE, "junit.xml"),
        os.path.join(CACHE, "junit-llama-server.xml"),
    ]
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"{p} is missing: run benches/server-suite.sh (and PEER=llama-server) first")
    lamina, peer = outcomes(paths[0]), {}
    for p in paths[1:]:
        peer.update(outcomes(p))
    print(f"lamina:       {counts(lamina)}")
    print(f"llama-server: {counts(peer)}")
    both = lamina.keys() & peer.keys()
    if len(both) < len(lamina.keys() | peer.keys()):
        print(f"run on one server only: {len(lamina.keys() - both)} on lamina, {len(peer.keys() - both)} on llama-server")
    only_peer = sorted(t for t in both if peer[t] == "passed" and lamina[t] != "passed")
    only_lamina = sorted(t for t in both if lamina[t] == "passed" and peer[t] != "passed")
    print(f"\npass on llama-server, not on lamina: {len(only_peer)}")
    by_file = defaultdict(list)
    for t in only_peer:
        by_file[t.split("::")[0]].append(t)
    for f in sorted(by_file):
        print(f"\n{f} ({len(by_file[f])})")
        for t in by_file[f]:
            print(f"  {lamina[t]:8} {t.split('::', 1)[1]}")
    print(f"\npass on lamina, not on llama-server: {len(only_lamina)}")
    for t in only_lamina:
        print(f"  {peer[t]:8} {t}")


if __name__ == "__main__":
    main()
