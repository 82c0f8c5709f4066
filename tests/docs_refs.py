#!/usr/bin/env python3
"""The docs name only what exists (docs/design.md, Layers).

README.md and docs/*.md name tests, files, config keys, API functions, environment variables and
C functions; a rename or a removal in the code leaves such a name behind, and a newcomer walking
the house from the docs then looks for something that is not there. This script checks, from the
tree and the build directory's CTest registry:

  tests     every test reference `ctest_name` / `function`, ... names a registered CTest (or one
            tests/CMakeLists.txt registers in another build: CUDA, sanitizers) and functions
            declared in that test's sources (or in the file named after the " / "): TEST(name)
            in C, def name / case_name / test_name in Python; `test_x_np2`, `_np4` and
            `test_x_np*` forms are expanded; a CTest named alone is registered;
  paths     every repository path (first component a top-level entry of the tree: runtime/...,
            tests/..., bench/...; or a tail of one: cpu/ns_blas.c), every file name (ns_gram.c),
            every markdown link and its #heading, and every build/ output (a target of the
            build) exists;
  sections  every docs/<page>.md, "Section" cited in the docs or the sources is a heading (or a
            bold paragraph lead) of that page;
  config    docs/config.md's key table and runtime/config/config_keys.c's list the same keys;
  api       every function include/shardopt.h declares is in docs/api.md, and every shardopt_*
            name the docs give exists (the header, a CMake target, the Python package);
  env       every variable of base/env.c's table is documented, and every SHARDOPT_* name the
            docs give is in that table, is a config key's variable (SHARDOPT_<KEY>), a header
            macro, a CMake variable, or a knob the tests, examples, benchmarks or tools read;
  symbols   every backticked lower-case identifier with an underscore (`groups_agree`, a key, a
            field, a test) and every name( outside code blocks is a word of some file of the tree
            outside the docs (or the tail of one: `from_env`); `name` in path.c: the file has it.

Usage: docs_refs.py ROOT BUILD_DIR [CTEST], or docs_refs.py --self-test ROOT BUILD_DIR [CTEST],
which first checks that a stale reference of each kind, planted in the docs' text in memory, is
caught. CTEST is the ctest program that lists BUILD_DIR's tests (default: ctest on the PATH).
"""
import fnmatch
import os
import re
import sys

from docs_common import parse_args
from docs_refs_tree import (CTEST, Tree, anchors, cmake_targets, config_keys, header_words, memo,
                            read, sections)


def line_of(text, pos):
    return text.count('\n', 0, pos) + 1


# A test reference: CTest names (full, `_np4` suffixes, `*` patterns, parenthesized notes
# between them), " / ", then maybe the test's file (`test_safety.py`), then the functions, comma
# separated; "; `function`" after it, no " / " following, adds one more.
TESTREF = re.compile(
    r'((?:`[A-Za-z0-9_*]+`(?:\s*\([^()]*(?:\([^()]*\)[^()]*)*\))?(?:,\s*|\s+and\s+)?)+)'
    r'\s+/\s+(?:`([A-Za-z0-9_./-]+\.(?:py|sh|c))`\s*)?((?:`[A-Za-z0-9_]+`(?:,\s*(?=`))?)*)'
    r'((?:;\s*`[a-z0-9_]+`(?!\s*(?:/|,\s*`_)))*)')


def check_tests(t, errs):
    names = t.ctest()
    words, globs = t.cmake_only_names()
    elsewhere = set(words)
    for g in globs:
        # a foreach's names (test_x_np${n}): where this build registers some of them it
        # registers all, so the glob stands in only for a block this build leaves out
        if not any(fnmatch.fnmatchcase(n, g) for n in names):
            elsewhere.add(g)
    count = 0
    unregistered_ok = set()

    def resolve(tok, first):
        """The CTest names a token stands for, [] when none."""
        if tok.startswith('_'):
            # `test_x_np2`, `_np4`: the suffix replaces the end of the name before it
            cands = [first[:i] + tok for i in range(len(first or '')) if first[i] == '_']
            return ([c for c in reversed(cands) if c in names] or
                    [c for c in reversed(cands) if resolve(c, None)])[:1]
        if '*' in tok:
            return ([n for n in names if fnmatch.fnmatchcase(n, tok)] or
                    [n for n in elsewhere if fnmatch.fnmatchcase(n, tok)])
        if tok in names:
            return [tok]
        if tok in elsewhere or any('*' in g and fnmatch.fnmatchcase(tok, g)
                                   for g in elsewhere):
            unregistered_ok.add(tok)
            return [tok]
        return []

    def is_test_name(tok):
        return (tok.startswith(('test_', 'python_')) or re.search(r'_np[0-9*]+$', tok)
                or tok in names)

    for doc in t.docs:
        text = t.text[doc]
        for m in TESTREF.finditer(text):
            left = re.sub(r'\([^()]*(?:\([^()]*\)[^()]*)*\)', '', m.group(1))
            toks = re.findall(r'`([A-Za-z0-9_*]+)`', left)
            fns = re.findall(r'`([A-Za-z0-9_]+)`', m.group(3))
            fns += [f for f in re.findall(r'`([a-z0-9_]+)`', m.group(4)) if not is_test_name(f)]
            if not toks or not is_test_name(toks[0]) or not (fns or m.group(2)):
                continue
            # `test_a` / `test_b`: two tests side by side, not a test and its function
            if all(is_test_name(f) and resolve(f, None) for f in fns):
                continue
            ln = line_of(text, m.start())
            first = None
            srcs = set()
            for tok in toks:
                count += 1
                got = resolve(tok, first)
                if first is None and not tok.startswith('_'):
                    first = tok
                if not got:
                    errs.append('%s:%d: test `%s` is not a registered CTest' % (doc, ln, tok))
                for n in got:
                    srcs.update(t.test_sources(n))
            if m.group(2):  # the file named: one of the test's sources, or a file of tests/
                count += 1
                f = m.group(2)
                named = [x for x in (srcs or t.files) if x == f or x.endswith('/' + f)]
                if not named:
                    errs.append('%s:%d: `%s` is not a source of %s (%s)' %
                                (doc, ln, f, ', '.join(toks), ', '.join(sorted(srcs))))
                srcs = set(named) or srcs
            if not srcs:
                continue
            have = t.functions_in(srcs)
            for fn in fns:
                count += 1
                if fn not in have:
                    errs.append('%s:%d: `%s` is not a test function of %s (%s)' %
                                (doc, ln, fn, ', '.join(toks), ', '.join(sorted(srcs))))
        # a CTest named alone in backticks (`launch_dry_run`, `test_config`): registered
        for m in re.finditer(r'`((?:test|python)_[a-z0-9_*]+|[a-z0-9_]*_np[0-9*]+)`', text):
            tok = m.group(1)
            prev = None
            if tok.startswith('_'):  # a suffix: of the last full name on its line
                before = text[text.rfind('\n', 0, m.start()) + 1:m.start()]
                full = re.findall(r'`((?:test|python)_[a-z0-9_]+|[a-z][a-z0-9_]*_np[0-9]+)`',
                                  before)
                prev = full[-1] if full else ''
            if resolve(tok, prev):
                count += 1
                continue
            # a test function, a test source's stem or a Python test's module named alone
            if tok in t.all_test_functions() or tok in t.test_stems():
                continue
            count += 1
            errs.append('%s:%d: `%s` is neither a registered CTest nor a test function' %
                        (doc, line_of(text, m.start()), tok))
        # CTest `floors`, CTest env_gateway: registered
        for m in re.finditer(r'\bCTest `?([a-z][a-z0-9_]*)(?![a-z0-9_])', text):
            if m.group(1) in ('and', 'label', 'name', 'program', 'suite', 'timeout'):
                continue  # prose: "CTest label", "CTest name / test function"
            count += 1
            if not resolve(m.group(1), None):
                errs.append('%s:%d: CTest `%s` is not registered' %
                            (doc, line_of(text, m.start()), m.group(1)))
    # reliability.md's Test column, notes in parentheses aside: each name is a CTest, a test
    # function or program, or a word of the tests (test_ckpt's modes `crash`, `resume`)
    text = t.text.get('docs/reliability.md', '')
    for ln, line in enumerate(text.split('\n'), 1):
        cells = line.strip().strip('|').split(' | ')
        if not line.startswith('| ') or len(cells) < 4:
            continue
        cell = cells[-1]
        while re.search(r'\([^()]*\)', cell):
            cell = re.sub(r'\([^()]*\)', '', cell)
        for tok in re.findall(r'`([a-z][a-z0-9_*]*)`', cell):
            count += 1
            if not (resolve(tok, None) or tok in t.all_test_functions() or
                    tok in t.test_words()):
                errs.append('docs/reliability.md:%d: `%s` in the Test column is no CTest, test '
                            'function or word of the tests' % (ln, tok))
    return count, sorted(unregistered_ok), {w for w in elsewhere if '*' not in w}


PATH = re.compile(r'(?<![A-Za-z0-9_.:/<>*$~{-])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]*)')


def check_sections(t, errs):
    """docs/x.md, "Section" in the docs and the sources: the page has that section."""
    count = 0
    srcs = memo(('cites', t.root), lambda: [
        f for f in t.scan if f.endswith(('.c', '.h', '.cu', '.py', '.sh', 'CMakeLists.txt')) and
        '.md' in read(os.path.join(t.root, f))])
    for f in t.docs + srcs:
        text = t.text.get(f) or read(os.path.join(t.root, f))
        for m in re.finditer(r'\b([a-z_]+\.md|README\.md)\]?(?:\([^)]*\))?,? '
                             r'"([^"\n]{3,80})"', text):
            page = m.group(1) if m.group(1) == 'README.md' else 'docs/' + m.group(1)
            if page not in t.text:
                continue  # reported by the paths check where it is a path
            count += 1
            want = m.group(2).strip().lower()
            if not any(h == want or h.startswith(want) for h in sections(t, page)):
                errs.append('%s:%d: %s has no section "%s"' %
                            (f, line_of(text, m.start()), page, m.group(2)))
        # unquoted, docs/design.md, Layers: where the words run on into the sentence, the
        # longest run of them a section starts with, at least the first word
        for m in re.finditer(r'\b([a-z_]+\.md|README\.md),? ([A-Z][A-Za-z0-9\'-]*'
                             r'(?: [A-Za-z0-9\'-]+)*)', text):
            page = m.group(1) if m.group(1) == 'README.md' else 'docs/' + m.group(1)
            if page not in t.text:
                continue
            count += 1
            first = m.group(2).split()[0].lower()
            if not any(h.startswith(first) for h in sections(t, page)):
                errs.append('%s:%d: %s has no section "%s..."' %
                            (f, line_of(text, m.start()), page, m.group(2).split()[0]))
    return count


def check_paths(t, errs):
    count = 0
    for doc in t.docs:
        text = t.text[doc]
        # markdown links to files, relative to the doc, and to their headings (#anchor)
        for m in re.finditer(r'\]\(([^)#\s]*)(?:#([^)\s]*))?\)', text):
            target, anchor = m.group(1), m.group(2)
            if re.match(r'[a-z]+:', target) or not (target or anchor):
                continue
            count += 1
            rel = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
            if not t.exists(rel):
                errs.append('%s:%d: link to %s: no such file' % (doc, line_of(text, m.start()),
                                                                  target))
            elif anchor and rel.endswith('.md') and anchor not in anchors(t, rel):
                errs.append('%s:%d: link to %s#%s: %s has no such heading' %
                            (doc, line_of(text, m.start()), target, anchor, rel))
        for m in PATH.finditer(text):
            p = m.group(1)
            end = m.end(1)
            nxt = text[end:end + 1]
            if nxt in ('<', '*', '{', '$', '%'):
                continue  # a pattern: bench/results/<date>.md, tests/mpi/*.c
            if p.split('/')[0] not in t.top:  # not the tree's: tmp/x.json, ckpt/step-1
                continue
            p = p.rstrip('.,')
            count += 1
            # a module named without its extension (runtime/comm/comm_wait), or a program the
            # build makes (bench/shardopt-bench)
            if not (t.exists(p) or t.exists(p + '.c') or t.exists(p + '.h') or
                    os.path.exists(os.path.join(t.build, p))):
                errs.append('%s:%d: %s: no such file or directory' %
                            (doc, line_of(text, m.start()), p))
    return count


SRC_EXT = ('.c', '.h', '.cu', '.cuh', '.py', '.sh')
# files of the reader's own the docs name: README.md's trainer built against the install
USER_FILES = {'train.c'}


def check_more_paths(t, errs):
    """Paths the main check leaves: build outputs (build/bench/shardopt-bench), paths below a
    top-level folder (cpu/ns_blas.c for kernels/cpu/ns_blas.c) and backticked file names."""
    targets = cmake_targets(t)
    bases = {os.path.basename(f) for f in t.files}
    count = 0
    for doc in t.docs:
        text = t.text[doc]
        for m in re.finditer(r'(?<![A-Za-z0-9_./~$-])build/((?:[A-Za-z0-9_.-]+/)*)'
                             r'([A-Za-z0-9_.-]*[A-Za-z0-9_])(?![A-Za-z0-9_/<*$-])', text):
            count += 1
            base = m.group(2)
            stem = re.sub(r'^lib|\.(so|a)$', '', base)
            if not (base in targets or stem in targets or
                    os.path.exists(os.path.join(t.build, m.group(1) + base))):
                errs.append('%s:%d: build/%s%s: no target of the build makes it' %
                            (doc, line_of(text, m.start()), m.group(1), base))
        for m in re.finditer(r'(?<![A-Za-z0-9_./~$<-])([a-z][a-z0-9_]*(?:/[A-Za-z0-9_.-]+)+)'
                             r'(?![A-Za-z0-9_/<*$-])', text):
            p = m.group(1).rstrip('.')
            if p.split('/')[0] in t.top or p.split('/')[0] == 'build' or \
                    not p.endswith(SRC_EXT):
                continue
            count += 1
            if not any(f.endswith('/' + p) for f in t.files):
                errs.append('%s:%d: %s: no file of the tree ends so' %
                            (doc, line_of(text, m.start()), p))
        for m in re.finditer(r'`([A-Za-z0-9_.-]+\.(?:c|h|cu|cuh|py|sh|md))`'
                             r'|(?<![A-Za-z0-9_./`-])([a-z][a-z0-9_]*\.(?:c|h|cu|cuh|py|sh))'
                             r'(?![A-Za-z0-9_/-]|\.[A-Za-z0-9])', text):
            b = m.group(1) or m.group(2)
            count += 1
            if b in USER_FILES:
                continue
            if b in bases or b in ('mpi.h', 'cblas.h', 'omp.h', 'nccl.h', 'cublas_v2.h',
                                   'cuda_runtime.h', 'cJSON.h', 'dnnl.h') or \
                    os.path.exists('/usr/include/' + b):
                continue
            errs.append('%s:%d: `%s`: no file of the tree has that name' %
                        (doc, line_of(text, m.start()), b))
    return count


def check_config(t, errs):
    code = config_keys(t)
    if len(code) < 10:
        errs.append('runtime/config/config_keys.c: found only %d keys: has the table moved?' %
                    len(code))
    doc = t.text['docs/config.md']
    sect = doc.split('| key | type | default |', 1)
    if len(sect) < 2:
        errs.append('docs/config.md: no key table (| key | type | default | ...)')
        return 0
    table = sect[1].split('\n\n', 1)[0]
    documented = set(re.findall(r'^\| `([a-z0-9_]+)` \|', table, re.M))
    for k in sorted(documented - code):
        errs.append('docs/config.md: key `%s` is not in runtime/config/config_keys.c' % k)
    for k in sorted(code - documented):
        errs.append('runtime/config/config_keys.c: key `%s` has no row in docs/config.md' % k)
    return len(documented | code)


def check_api(t, errs):
    fns, hwords = header_words(t)
    api = t.text['docs/api.md']
    count = 0
    for f in sorted(fns):
        count += 1
        if not re.search(r'\b%s\b' % f, api):
            errs.append('include/shardopt.h: %s is not in docs/api.md' % f)

    def names():  # other shardopt_* names: CMake targets, the Python package's names, files
        other = set()
        for f in t.scan:
            if f.endswith(('CMakeLists.txt', '.cmake', '.py', '.c', '.in')):
                other.update(re.findall(r'\bshardopt_[a-z0-9_]+\b', read(os.path.join(t.root, f))))
            other.add(os.path.splitext(os.path.basename(f))[0])
        return other
    other = memo(('shardopt_names', t.root), names)
    for doc in t.docs:
        text = t.text[doc]
        for m in re.finditer(r'\bshardopt_[a-z0-9_]*[a-z0-9]\b(?![*<])', text):
            w = m.group(0)
            count += 1
            if w in hwords:
                continue
            if text[m.end():m.end() + 1] == '(' or w not in other:
                errs.append('%s:%d: %s is not in include/shardopt.h%s' %
                            (doc, line_of(text, m.start()), w,
                             '' if w in other else ' nor anywhere in the tree'))
    return count


def check_env(t, errs, notes):
    env = read(os.path.join(t.root, 'base/env.c'))
    table = set(re.findall(r'^\s*\{"(SHARDOPT_[A-Z0-9_]+)"', env, re.M))
    if not table:
        errs.append('base/env.c: no env_vars table found')
    alldocs = '\n'.join(t.text.values())
    count = 0
    for v in sorted(table):
        count += 1
        if not re.search(r'\b%s\b' % v, alldocs):
            errs.append('base/env.c: %s is in the table but no doc names it' % v)
    keyvars = {'SHARDOPT_' + k.upper() for k in config_keys(t)}
    # step arguments a variable may be mistaken for (config.c warns about SHARDOPT_LR and kin)
    config_c = read(os.path.join(t.root, 'runtime/config/config.c'))
    keyvars.update('SHARDOPT_' + a.upper()
                   for a in re.findall(r'shardopt_step_args_t ([a-z_, ]+)\)', config_c)
                   for a in re.split(r'[, ]+', a) if a)
    _, hwords = header_words(t)

    def variables():
        cmake, knobs = set(), {}
        for f in t.scan:
            words = set(re.findall(r'\bSHARDOPT_[A-Z0-9_]+\b', read(os.path.join(t.root, f))))
            if f.endswith(('CMakeLists.txt', '.cmake', '.in')):
                cmake |= words
            elif f.startswith(('tests/', 'examples/', 'bench/', 'tools/', 'python/', 'Makefile')):
                for w in words:
                    knobs.setdefault(w, f.split('/')[0])
        return cmake, knobs
    cmake, knobs = memo(('variables', t.root), variables)
    for doc in t.docs:
        text = t.text[doc]
        for m in re.finditer(r'\bSHARDOPT_[A-Z0-9_]*[A-Z0-9]\b(?![<*])', text):
            v = m.group(0)
            count += 1
            if v in table or v in keyvars or v in hwords or v in cmake:
                continue
            if v in knobs:
                notes.add('%s (read in %s/)' % (v, knobs[v]))
                continue
            errs.append('%s:%d: %s is not in base/env.c\'s table, not a config key\'s variable, '
                        'not in include/shardopt.h, CMake or any test, example or tool' %
                        (doc, line_of(text, m.start()), v))
    return count


def code_words(t, test_names):
    """The identifiers of the tree outside the docs, and their tails after an underscore."""
    words = set()
    for f in t.scan:
        if f.startswith('docs/') or f == 'README.md' or f.endswith(('.png', '.svg')):
            continue
        p = os.path.join(t.root, f)
        if os.path.getsize(p) > 4 << 20:
            continue
        words.update(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', read(p)))
    words |= test_names | t.all_test_functions()
    for h in ('stdlib.h', 'string.h', 'stdio.h'):  # aligned_alloc and kin
        if os.path.exists('/usr/include/' + h):
            words.update(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', read('/usr/include/' + h)))
    # a shorthand for a longer name: `from_env` for shardopt_config_from_env, `get_step`
    tails = {w[i + 1:] for w in words for i in range(len(w)) if w[i] == '_'}
    return words, tails


_WORDS = {}


def check_symbols(t, errs, test_names):
    if t.root not in _WORDS:
        _WORDS[t.root] = code_words(t, test_names)
    words, tails = _WORDS[t.root]
    count = 0
    for doc in t.docs:
        text = t.text[doc]
        # every backticked identifier with an underscore (a function, key, field, test, file
        # stem): a word of some file of the tree
        for m in re.finditer(r'`([a-z][a-z0-9]*_[A-Za-z0-9_]*[A-Za-z0-9])(?:\(\)?)?`',
                             text):
            w = m.group(1)
            count += 1
            if w not in words and w not in tails:
                errs.append('%s:%d: `%s` is in no file of the tree' %
                            (doc, line_of(text, m.start()), w))
        # name( in prose or code blocks: a C or Python call of the project or its libraries
        # (outside fenced blocks, whose formulas and trainer sketches call what they define)
        prose = re.sub(r'^```.*?^```', lambda b: '\n' * b.group(0).count('\n'), text,
                       flags=re.M | re.S)
        for m in re.finditer(r'(?<![A-Za-z0-9_.`])([a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9])\(', prose):
            w = m.group(1)
            count += 1
            if w not in words and w not in tails:
                errs.append('%s:%d: `%s(` is in no file of the tree' %
                            (doc, line_of(prose, m.start()), w))
        # `name` in `file.c` / `name` (file.c): the named file holds it
        for m in re.finditer(r'(?<![A-Za-z0-9_./-])`?([a-z][a-z0-9]*_[a-z0-9_]*)(?:\(\))?`?'
                             r'(?:\s+in|\s+\(|,)\s*`?((?:[a-z]+/)+[a-z0-9_]+\.(?:c|h|cu|py|sh))'
                             r'(?![A-Za-z0-9_/])`?', text):
            w, f = m.group(1), m.group(2)
            if not t.exists(f):
                continue  # reported by the paths check
            count += 1
            if not re.search(r'\b%s\b' % re.escape(w), read(os.path.join(t.root, f))):
                errs.append('%s:%d: `%s` is not in %s' % (doc, line_of(text, m.start()), w, f))
    return count


def run(root, build, quiet=False, planted=None, kind=None):
    """Every check, or the one kind the self-test planted a reference of."""
    t = Tree(root, build, planted)
    errs, notes = [], set()
    n = {}
    n['tests'], unreg, unreg_all = check_tests(t, [] if kind not in (None, 'tests') else errs)
    checks = [('paths', lambda: check_paths(t, errs) + check_more_paths(t, errs)),
              ('sections', lambda: check_sections(t, errs)),
              ('config', lambda: check_config(t, errs)),
              ('api', lambda: check_api(t, errs)),
              ('env', lambda: check_env(t, errs, notes)),
              ('symbols', lambda: check_symbols(t, errs, set(t.ctest()) | set(unreg_all)))]
    for name, check in checks:
        if kind in (None, name):
            n[name] = check()
    if not quiet:
        for e in errs:
            print('docs_refs: ' + e)
    return errs, n, unreg, sorted(notes)


def plant_key(text):
    """config.md with its key table's first key renamed."""
    return re.sub(r'(\| key \| type \| default \|[^\n]*\n[^\n]*\n)\| `[a-z0-9_]+` \|',
                  r'\1| `no_such_key` |', text, count=1)


def plant_api(text):
    """api.md without the first function the header declares."""
    first = sorted(PLANT_API)[0]
    return re.sub(r'\b%s\b' % first, 'shardopt_no_such_call', text)


PLANT_API = set()  # filled by self_test: the header's functions
# (kind, doc, the stale text appended to it or a function of its text, what the error names)
PLANTS = [
    ('tests', 'docs/reliability.md', '\n`test_config` / `no_such_test_function`\n',
     'no_such_test_function'),
    ('tests', 'docs/reliability.md', '\n`test_konfig` / `a_test_function`\n', 'test_konfig'),
    ('tests', 'docs/reliability.md', '\n`test_groups_np2`, `_np5` / `a_test_function`\n',
     '_np5'),
    ('tests', 'docs/reliability.md', '\nas `test_konfig` checks\n', 'test_konfig'),
    ('tests', 'docs/reliability.md', '\nas CTest `flors` checks\n', 'flors'),
    ('tests', 'docs/reliability.md', '\n| a | b | c | `flors` |\n', 'flors'),
    ('tests', 'docs/reliability.md', '\n`python_binding_safety_np1` / `test_safety.py` '
     '`no_such_case`\n', 'no_such_case'),
    ('tests', 'docs/reliability.md', '\n`python_binding_safety_np1` / `test_binding.py` '
     '`a_case`\n', 'test_binding.py` is not a source'),
    ('tests', 'docs/reliability.md', '\n`test_config` / `env_overlays_and_refuses`; '
     '`no_such_test_function` (one more)\n', 'no_such_test_function'),
    ('paths', 'docs/design.md', '\nSee `runtime/no_such_file.c`.\n', 'runtime/no_such_file.c'),
    ('paths', 'docs/design.md', '\nSee cpu/no_such_file.c.\n', 'cpu/no_such_file.c'),
    ('paths', 'docs/design.md', '\nSee no_such_file.c.\n', 'no_such_file.c'),
    ('paths', 'docs/design.md', '\nSee [this](no_such_page.md).\n', 'no_such_page.md'),
    ('paths', 'docs/design.md', '\nSee [Layers](#no-such-heading).\n', 'no-such-heading'),
    ('sections', 'docs/design.md', '\n(docs/config.md, "No such section")\n', 'No such'),
    ('sections', 'docs/design.md', '\n(docs/config.md, Nosuchsection)\n', 'Nosuchsection'),
    ('config', 'docs/config.md', plant_key, 'no_such_key'),
    ('config', 'docs/config.md', plant_key, 'has no row in docs/config.md'),
    ('api', 'docs/api.md', '\n`shardopt_no_such_call()`\n', 'shardopt_no_such_call'),
    ('api', 'docs/api.md', plant_api, 'is not in docs/api.md'),
    ('env', 'docs/config.md', '\n`SHARDOPT_NO_SUCH_VARIABLE`\n', 'SHARDOPT_NO_SUCH'),
    ('symbols', 'docs/design.md', '\n`no_such_function()`\n', '`no_such_function`'),
    ('symbols', 'docs/design.md', '\ncalls no_such_function(x)\n', 'no_such_function('),
    ('symbols', 'docs/design.md', '\n`groups_agree` in `base/log.c`\n', 'not in base/log.c'),
]


def self_test(root, build):
    """Each planted stale reference gives an error naming it that the docs as they are do not
    (the planted text replaces the doc's in memory; the tree is not touched)."""
    base, _, _, _ = run(root, build, quiet=True)
    PLANT_API.update(header_words(Tree(root, build))[0])
    for kind, doc, plant, needle in PLANTS:
        text = read(os.path.join(root, doc))
        planted = plant(text) if callable(plant) else text + plant
        errs, _, _, _ = run(root, build, quiet=True, planted={doc: planted}, kind=kind)
        new_errs = [e for e in errs if e not in base and needle in e]
        if not new_errs:
            sys.exit('docs_refs: self-test: a stale %s reference planted in %s (%s) was not '
                     'caught' % (kind, doc, needle))
        print('docs_refs: self-test: a planted %s reference is caught: %s' % (kind, new_errs[0]))


def main():
    test, args = parse_args(__doc__, (2, 3))
    if len(args) == 3:
        CTEST[0] = args[2]
    root, build = os.path.realpath(args[0]), os.path.realpath(args[1])
    if test:
        self_test(root, build)
    errs, n, unreg, notes = run(root, build)
    if unreg:
        print('docs_refs: named, test programs or tests of other builds (tests/CMakeLists.txt): ' +
              ', '.join(unreg))
    if notes:
        print('docs_refs: SHARDOPT_* names the docs give that only tests, examples or tools '
              'read: ' + ', '.join(notes))
    total = sum(n.values())
    if errs:
        print('docs_refs: %d stale of %d references' % (len(errs), total))
        sys.exit(1)
    print('docs_refs: all %d references in the docs exist (%s)' %
          (total, ', '.join('%s %d' % kv for kv in n.items())))


if __name__ == '__main__':
    main()
