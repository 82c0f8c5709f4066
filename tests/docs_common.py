"""What the docs checks (docs_map.py, docs_values.py, docs_refs.py) share: their command line.

Each takes [--self-test] then its own arguments; a wrong count prints the script's usage (its
module docstring) and exits 1.
"""
import sys


def parse_args(usage, counts):
    """(self_test, args) from sys.argv: whether --self-test came first, and the arguments after
    it, whose number must be one of counts (else exit with usage)."""
    args = sys.argv[1:]
    test = bool(args) and args[0] == '--self-test'
    if test:
        args = args[1:]
    if len(args) not in counts:
        sys.exit(usage)
    return test, args
