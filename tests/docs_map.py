#!/usr/bin/env python3
"""docs/design.md's source map lists every source file, and only files that exist.

The source map is the fenced block of docs/design.md, Layers, whose first line is
`include/shardopt.h ...`: a newcomer looking for where something lives reads it first, so a file
added without a line there is one nobody finds, and a line left for a removed file sends the
reader looking for it. An entry is a line whose first column (up to two spaces) names files or a
folder; lines indented under a folder entry (`kernels/`) name files relative to it, continuation
lines (deeper indentation) carry on the entry's description.

Checks, for every tracked .c, .h, .cu, .cuh, .py and .sh file under base/ kernels/ sharding/
offload/ runtime/ python/ tools/ bench/:
  listed    the map names it with its extension: as an entry, or in the description of the
            entry of its folder or of a file of its folder (`cpu/ns_bf16_run.c` under kernels/);
            a header X.h is covered by its X.c or X.cu beside it (the header is that file's
            interface);
  exists    every file name the map gives (word.c, cpu/word.h, runtime/step/word.c) and every
            folder entry names a file or folder of the tree;
  readme    README.md's Layout block names every top-level folder and every docs/ page, and its
            "Where to start" table links every page.

Usage: docs_map.py ROOT, or docs_map.py --self-test ROOT, which first checks that a file missing
from the map and a map line for a file that does not exist are each caught.
"""
import os
import re
import subprocess
import sys

from docs_common import parse_args

FOLDERS = ('base/', 'kernels/', 'sharding/', 'offload/', 'runtime/', 'python/', 'tools/', 'bench/')
EXTS = ('.c', '.h', '.cu', '.cuh', '.py', '.sh')
FILE = re.compile(r'(?<![A-Za-z0-9_./-])((?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+\.(?:c|h|cu|cuh|py|sh))'
                  r'(?![A-Za-z0-9_])')


def tree_files(root):
    out = subprocess.run(['git', '-C', root, 'ls-files', '--cached', '--others',
                          '--exclude-standard'], capture_output=True, text=True)
    files = [f for f in out.stdout.splitlines() if f]
    if out.returncode != 0 or not files:
        sys.exit('docs_map: git ls-files failed in %s: %s' % (root, out.stderr))
    return files


def source_map(design):
    """The map's lines: the fenced block whose first line starts with include/shardopt.h."""
    for block in re.findall(r'^```\n(.*?)^```', design, re.M | re.S):
        if re.match(r'include/shardopt\.h\s{2,}', block):
            return block.split('\n')
    return None


def entries(lines):
    """(the entry's names as paths, the folder they resolve in, its description) per entry."""
    out = []
    ctx = ''
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(' '))
        if indent <= 2:
            # names separated by ", ", then the description (one space after a long name)
            m = re.match(r'\s*([^\s,]+(?:, [^\s,]+)*)(?:\s+(.*))?$', line)
            left, desc = m.group(1), m.group(2) or ''
            names = [n.strip() for n in left.split(',')]
            if indent == 0:
                base = ''
                ctx = names[0] if names[0].endswith('/') else ''
            else:
                base = ctx
            paths = [base + n for n in names]
            folder = paths[0] if paths[0].endswith('/') else os.path.dirname(paths[0]) + '/'
            out.append([paths, folder, base, desc])
        elif out:
            out[-1][3] += ' ' + line.strip()
    return out


def check(root, design, files):
    errs = []
    lines = source_map(design)
    if lines is None:
        return ['docs/design.md: no source map (a fenced block starting with include/shardopt.h)']
    fileset = set(files)
    dirs = {os.path.dirname(f) + '/' for f in files}
    dirs |= {'/'.join(f.split('/')[:i]) + '/' for f in files for i in range(1, f.count('/') + 1)}
    listed = set()
    for paths, folder, base, desc in entries(lines):
        for p in paths:
            if p.endswith('/'):
                if p not in dirs:
                    errs.append('docs/design.md source map: folder %s does not exist' % p)
            elif p in fileset:
                listed.add(p)
            else:
                errs.append('docs/design.md source map: %s does not exist' % p)
        for m in FILE.finditer(desc):
            name = m.group(1)
            # a full path, or relative to the entry's folder, its parent folder entry's, or an
            # ancestor's (cpu/ns_bf16_run.c in kernels/cpu/ns_bf16.c's line)
            cands = [name, folder + name, base + name]
            d = folder.rstrip('/')
            while d:
                d = os.path.dirname(d)
                cands.append((d + '/' if d else '') + name)
            hit = [c for c in cands if c in fileset]
            if hit:
                listed.add(hit[0])
            elif name.split('/')[0] + '/' in FOLDERS or '/' not in name:
                errs.append('docs/design.md source map: %s (in the line of %s) does not exist' %
                            (name, ', '.join(paths)))
    for f in files:
        if not f.startswith(FOLDERS) or not f.endswith(EXTS) or f in listed:
            continue
        stem = os.path.splitext(f)[0]
        if f.endswith('.h') and (stem + '.c' in listed or stem + '.cu' in listed):
            continue
        errs.append('docs/design.md source map: %s is not listed' % f)
    return errs


def check_readme(readme, files):
    """README.md's Layout block names every top-level folder of the tree, its docs/ line every
    page, and its "Where to start" table links every page: a page or folder missing from them is
    one a newcomer does not know to look for."""
    errs = []
    m = re.search(r'^## Layout\n+```\n(.*?)^```', readme, re.M | re.S)
    if not m:
        return ['README.md: no "## Layout" block']
    layout = m.group(1)
    tops = sorted({f.split('/')[0] for f in files if '/' in f and not f.startswith('.')})
    for t in tops:
        if not re.search(r'^%s/' % re.escape(t), layout, re.M) and \
                not re.search(r'(?<![A-Za-z0-9_/])%s/' % re.escape(t), layout):
            errs.append('README.md: the Layout block does not name the folder %s/' % t)
    pages = sorted(f for f in files if f.startswith('docs/') and f.endswith('.md'))
    docs_line = re.search(r'^docs/\s+(.*(?:\n\s{20,}.*)*)', layout, re.M)
    start = readme.split('## Where to start', 1)[-1].split('\n## ', 1)[0]
    for p in pages:
        base = p[len('docs/'):]
        if not docs_line or not re.search(r'\b%s\b' % re.escape(base), docs_line.group(1)):
            errs.append('README.md: the Layout block\'s docs/ line does not name %s' % base)
        if '(%s)' % p not in start:
            errs.append('README.md: "Where to start" does not link %s' % p)
    return errs


def self_test(root, design, files):
    base = set(check(root, design, files))
    plants = [
        ('a new file', design, files + ['runtime/step/planted_new.c'],
         'runtime/step/planted_new.c is not listed'),
        ('a removed file', design.replace('\nbase/fault.c ', '\nbase/gone.c   a removed file\n'
                                          'base/fault.c ', 1), files, 'base/gone.c does not'),
        ('a removed file named in a line', design.replace('sharding/layout.c          shard',
                                                          'sharding/layout.c          gone.c, '
                                                          'shard', 1), files, 'gone.c (in the'),
    ]
    for what, text, fl, needle in plants:
        new = [e for e in check(root, text, fl) if e not in base and needle in e]
        if not new:
            sys.exit('docs_map: self-test: %s was not caught (%s)' % (what, needle))
        print('docs_map: self-test: %s is caught: %s' % (what, new[0]))
    readme = read_readme(root)
    base = set(check_readme(readme, files))
    for what, fl, needle in [('a new page', files + ['docs/planted.md'], 'planted.md'),
                             ('a new folder', files + ['planted/x.c'], 'planted/')]:
        new = [e for e in check_readme(readme, fl) if e not in base and needle in e]
        if not new:
            sys.exit('docs_map: self-test: %s was not caught (%s)' % (what, needle))
        print('docs_map: self-test: %s is caught: %s' % (what, new[0]))


def read_readme(root):
    with open(os.path.join(root, 'README.md'), encoding='utf-8') as f:
        return f.read()


def main():
    test, args = parse_args(__doc__, (1,))
    root = os.path.realpath(args[0])
    with open(os.path.join(root, 'docs/design.md'), encoding='utf-8') as f:
        design = f.read()
    files = tree_files(root)
    if test:
        self_test(root, design, files)
    errs = check(root, design, files) + check_readme(read_readme(root), files)
    for e in errs:
        print('docs_map: ' + e)
    if errs:
        sys.exit('docs_map: %d problems in docs/design.md\'s source map' % len(errs))
    n = sum(1 for f in files if f.startswith(FOLDERS) and f.endswith(EXTS))
    print('docs_map: the source map lists all %d source files and no file that does not exist' % n)


if __name__ == '__main__':
    main()
