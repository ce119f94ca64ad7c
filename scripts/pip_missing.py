"""Prints each of the given PyPI requirements that this interpreter lacks, one a line (setup.sh installs them).

A requirement is a name, or name==version (pinned: another installed version counts as missing). One
interpreter for every check: a `pip show` per package takes a second each.
"""
import sys
from importlib.metadata import PackageNotFoundError, version


def missing(specs):
    for spec in specs:
        name, _, want = spec.partition("==")
        try:
            have = version(name)  # looked up for every requirement: a package not installed raises
        except PackageNotFoundError:
            yield spec
            continue
        if want and have != want:
            yield spec


if __name__ == "__main__":
    for spec in missing(sys.argv[1:]):
        print(spec)
