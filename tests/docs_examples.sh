#!/usr/bin/env bash
# The examples in the docs run, so they stay true: every ```python block of docs/python.md under
# mpiexec with 2 ranks (the binding on this build's library), and every ```c block of README.md
# and docs/*.md compiled with mpicc against include/ and this build's library and run on one
# rank, in a scratch directory.
#   docs_examples.sh MPIEXEC LIBSHARDOPT
set -euo pipefail
mpiexec=$1 lib=$2
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/shardopt_docs_XXXXXX)
trap 'rm -rf "$work"' EXIT
py=$(python3 -c 'import sys; print(sys.executable)')
"$py" - "$root/docs/python.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"```python\n(.*?)```", text, re.S)
assert blocks, "no python example in docs/python.md"
for i, b in enumerate(blocks):
    open(f"{sys.argv[2]}/example_{i}.py", "w").write(b)
print(f"docs_examples: {len(blocks)} python example(s)")
PY
"$py" - "$work" "$root/README.md" "$root"/docs/*.md <<'PY'
import re, sys
n = 0
for path in sys.argv[2:]:
    for b in re.findall(r"```c\n(.*?)```", open(path).read(), re.S):
        open(f"{sys.argv[1]}/example_c_{n}.c", "w").write(b)
        n += 1
assert n, "no C example in README.md or docs/"
print(f"docs_examples: {n} C example(s)")
PY
cd "$work"
for f in example_*.py; do
    PYTHONPATH="$root/python" SHARDOPT_LIBRARY=$lib "$mpiexec" -n 2 --oversubscribe "$py" "$f"
done
libdir=$(dirname "$lib")
for f in example_c_*.c; do
    mpicc -std=c11 -Wall -Wextra -Werror -I"$root/include" "$f" -o "${f%.c}" -L"$libdir" \
        -lshardopt -Wl,-rpath,"$libdir"
    "$mpiexec" -n 1 --oversubscribe "./${f%.c}"
done
echo "docs_examples: ok"
