#!/usr/bin/env python3
"""Compares the cases a real server passed in a `ggml-rpc conformance` table with the table
README.md shows for it (the code block after `<!-- conformance-table TAG -->`).

usage: kit_check.py README.md TAG TABLE.txt   (exit 1 on a difference or an incomplete table)
"""
import re
import sys

SUMMARY = re.compile(r"^\d+ cases: ")


def results(lines):
    """case -> result class of every table row (the first column, then the result)."""
    out = {}
    for line in lines:
        words = line.split()
        if len(words) >= 2 and "/" in words[0]:
            out[words[0]] = words[1]
    return out


def readme_table(path, tag):
    lines = open(path, encoding="utf-8").read().splitlines()
    marker = f"<!-- conformance-table {tag} -->"
    if marker not in lines:
        sys.exit(f"{path}: no {marker}")
    start = lines.index(marker) + 1
    while not lines[start].startswith("```"):
        start += 1
    end = start + 1
    while not lines[end].startswith("```"):
        end += 1
    return lines[start + 1:end]


def main():
    readme, tag, table = sys.argv[1:4]
    got_lines = open(table, encoding="utf-8").read().splitlines()
    if not any(SUMMARY.match(line) for line in got_lines):
        print(f"{tag}: the table in {table} has no summary line (the run did not finish)")
        return 1
    want = results(readme_table(readme, tag))
    got = results(got_lines)
    passed_want = {case for case, result in want.items() if result == "passed"}
    passed_got = {case for case, result in got.items() if result == "passed"}
    if passed_want == passed_got and want.keys() == got.keys():
        return 0
    for case in sorted(passed_want - passed_got):
        print(f"{tag}: {case}: README says passed, now {got.get(case, 'not run')}")
    for case in sorted(passed_got - passed_want):
        print(f"{tag}: {case}: passes now, README says {want.get(case, 'nothing')}")
    for case in sorted(want.keys() ^ got.keys()):
        print(f"{tag}: {case}: in only one of README.md and the run")
    return 1


if __name__ == "__main__":
    sys.exit(main())
