#!/usr/bin/env python3
"""Compare two top-k logprob files of the shape scripts/exact-reference.py and
benches/llama-logprobs.cpp write:

    {"arch": ..., "sequences": [{"tokens": [...], "n_prompt": N,
                                 "top": [[[id, logprob], ...] per position]}]}

Per sequence it prints the largest |logprob A - logprob B| over the ids both
files list at a position (every position both files have), where it
happens, and the overall largest; exit status 1 when that is above --tol, 2
when the files disagree on the tokens evaluated.

Usage:
    python3 scripts/compare-logprobs.py ref.json llama.json --tol 1e-3
"""

from __future__ import annotations

import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tol", type=float, default=1e-3, help="largest |delta logprob| allowed (nats)")
    args = p.parse_args()
    with open(args.a) as f:
        A = json.load(f)
    with open(args.b) as f:
        B = json.load(f)

    if len(A["sequences"]) != len(B["sequences"]):
        print(f"{len(A['sequences'])} sequences against {len(B['sequences'])}")
        return 2
    worst = 0.0
    for n, (sa, sb) in enumerate(zip(A["sequences"], B["sequences"])):
        m = min(len(sa["tokens"]), len(sb["tokens"]))
        if sa["tokens"][:m] != sb["tokens"][:m]:
            print(f"sequence {n}: the token lists differ")
            return 2
        seq_max, where, shared = 0.0, None, 0
        for pos, (ta, tb) in enumerate(zip(sa["top"], sb["top"])):
            la, lb = dict((int(i), lp) for i, lp in ta), dict((int(i), lp) for i, lp in tb)
            # the ids both list; at least the best of each is normally in the other's top-k
            for i in la.keys() & lb.keys():
                d = abs(la[i] - lb[i])
                shared += 1
                if d > seq_max:
                    seq_max, where = d, (pos, i)
            top_a, top_b = ta[0][0], tb[0][0]
            if top_a not in lb or top_b not in la:
                print(f"sequence {n} position {pos}: best ids {top_a} / {top_b} not in the other's list")
        at = f" at position {where[0]} (id {where[1]})" if where else ""
        print(f"sequence {n}: {len(sa['top'])} positions, {shared} shared ids, max |dlogprob| {seq_max:.3g}{at}")
        worst = max(worst, seq_max)
    ok = worst <= args.tol
    print(f"overall max |dlogprob| {worst:.3g} ({'within' if ok else 'ABOVE'} tol {args.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
