#!/usr/bin/env python3
"""Recomputes detlogp's cross-rank fingerprints with the stock json and hashlib modules.

Usage: check_fingerprint.py <fingerprint_dump executable>

The executable prints one record per line: kind, fingerprint ("-" for capabilities) and the
to_json() text, tab-separated. For every record this checks that the JSON text is canonical
(byte-identical to json.dumps(..., sort_keys=True, separators=(",", ":"))), and for contracts
that the fingerprint equals SHA-256 of the canonical JSON without the rank-local sharding keys
(docs/contract.md). Also checks that the ranks of one invocation agree.
"""

import hashlib
import json
import subprocess
import sys

RANK_LOCAL_KEYS = ("tp_rank", "cp_rank", "local_vocab_start", "local_vocab_end")


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def fingerprint(contract_json):
    contract = json.loads(contract_json)
    for key in RANK_LOCAL_KEYS:
        del contract["sharding"][key]
    return hashlib.sha256(canonical(contract).encode("utf-8")).hexdigest()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = subprocess.run([sys.argv[1]], check=True, capture_output=True).stdout
    lines = out.decode("ascii").splitlines()  # canonical JSON is pure ASCII
    failures = []
    contracts = 0
    capabilities = 0
    first_four = []
    for line in lines:
        kind, fp, text = line.split("\t")
        if canonical(json.loads(text)) != text:
            failures.append(f"not canonical: {text}\n      python: {canonical(json.loads(text))}")
        if kind == "contract":
            contracts += 1
            expected = fingerprint(text)
            if fp != expected:
                failures.append(f"fingerprint {fp} != python {expected} for {text}")
            if len(first_four) < 4:
                first_four.append(fp)
        elif kind == "capability":
            capabilities += 1
        else:
            failures.append(f"unknown record kind {kind!r}")
    # The first four contracts are the four ranks of the Qwen3-8B TP2 x CP2 example.
    if len(set(first_four)) != 1:
        failures.append(f"ranks of one invocation disagree: {first_four}")
    if contracts < 10 or capabilities < 2:
        failures.append(f"too few records: {contracts} contracts, {capabilities} capabilities")
    for failure in failures:
        print("FAIL:", failure)
    print(f"checked {contracts} contracts and {capabilities} capabilities: "
          f"{'FAILED' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
