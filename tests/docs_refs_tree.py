"""The tree tests/docs_refs.py checks the docs against: its files, what the docs' text is, the
CTest registry of a build directory, which sources hold a test's functions, a page's sections
and heading anchors, the config keys, the public headers' functions and the build's targets."""
import json
import os
import re
import subprocess
import sys


def git_files(root):
    """Tracked and new files alike, not what .gitignore leaves out (build outputs)."""
    out = subprocess.run(['git', '-C', root, 'ls-files', '--cached', '--others',
                          '--exclude-standard'], capture_output=True, text=True)
    files = [f for f in out.stdout.splitlines() if f]
    if out.returncode != 0 or not files:  # a source tree without git: every file but builds'
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith('.') and
                       not os.path.exists(os.path.join(d, x, 'CMakeCache.txt'))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(files)


_READ = {}


def read(path):
    if path not in _READ:  # the self-test's runs read each file once
        with open(path, encoding='utf-8', errors='replace') as f:
            _READ[path] = f.read()
    return _READ[path]


CTEST = ['ctest']  # the third argument: CMake's own ctest (CMAKE_CTEST_COMMAND)
# what the self-test's runs would otherwise compute again for each planted doc
_CTEST = {}  # build dir -> {CTest name: command}
_SOURCES = {}  # (root, CTest name) -> the test's sources
_FUNCTIONS = {}  # (root, sources) -> the test functions they declare


class Tree:
    def __init__(self, root, build, planted=None):
        self.root = root
        self.build = build
        self.files = git_files(root)
        self.fileset = set(self.files)
        # the files whose words count as the code's: not this script, whose self-test plants
        # and no binary file (images, checkpoints' tensors)
        self.scan = [f for f in self.files if f != 'tests/docs_refs.py' and
                     not f.endswith(('.png', '.svg', '.safetensors', '.crc32c'))]
        self.dirs = set()
        for f in self.files:
            parts = f.split('/')
            for i in range(1, len(parts)):
                self.dirs.add('/'.join(parts[:i]))
        self.top = {f.split('/')[0] for f in self.files}
        self.docs = ['README.md'] + sorted(f for f in self.files
                                           if f.startswith('docs/') and f.endswith('.md'))
        self.docs = [d for d in self.docs if os.path.exists(os.path.join(root, d))]
        self.text = {d: read(os.path.join(root, d)) for d in self.docs}
        self.text.update(planted or {})
        self._ctest = None

    def exists(self, rel):
        rel = rel.rstrip('/')
        return rel in self.fileset or rel in self.dirs or os.path.exists(
            os.path.join(self.root, rel))

    # --- the CTest registry -------------------------------------------------------------
    def ctest(self):
        if self._ctest is None and self.build in _CTEST:
            self._ctest = _CTEST[self.build]
        if self._ctest is None:
            out = subprocess.run([CTEST[0], '--test-dir', self.build, '--show-only=json-v1'],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit('docs_refs: ctest --show-only failed in %s: %s' % (self.build, out.stderr))
            tests = json.loads(out.stdout).get('tests', [])
            self._ctest = {t['name']: t.get('command', []) for t in tests}
            if not self._ctest:
                sys.exit('docs_refs: no tests registered in %s' % self.build)
            _CTEST[self.build] = self._ctest
        return self._ctest

    def cmake_only_names(self):
        """Tests and test programs tests/CMakeLists.txt makes in some build (CUDA, not
        sanitized, ...), this one or another: add_test names (a ${var} in one read as any
        text), the wrappers' first arguments, add_executable targets, foreach(t ...) items."""
        words, globs = set(), set()
        code = '\n'.join(l.split('#', 1)[0] for l in
                         read(os.path.join(self.root, 'tests/CMakeLists.txt')).splitlines())
        for n in re.findall(r'add_test\(\s*NAME\s+([A-Za-z0-9_${}]+)', code):
            if '$' not in n:
                words.add(n)
            elif not n.startswith('$'):  # ${name}_np${n}: the wrapper's names, below
                globs.add(re.sub(r'\$\{[^}]*\}', '*', n))
        words.update(re.findall(r'\bshardopt_[a-z_]*test\(\s*([A-Za-z0-9_]+)', code))
        words.update(re.findall(r'\badd_executable\(\s*([A-Za-z0-9_]+)', code))
        for items in re.findall(r'\bforeach\(\s*t\s+([^)]*)\)', code):
            words.update(w for w in items.split() if re.fullmatch(r'[A-Za-z0-9_]+', w))
        return words, globs

    def cmake_executables(self):
        """add_executable(target sources...) of tests/CMakeLists.txt: target -> its sources."""
        if not hasattr(self, '_exes'):
            self._exes = {}
            code = read(os.path.join(self.root, 'tests/CMakeLists.txt'))
            for target, args in re.findall(r'add_executable\(\s*([A-Za-z0-9_]+)\s+([^)]*)\)',
                                           code):
                for a in args.split():
                    a = 'tests/' + a
                    if a in self.fileset and a.endswith(('.c', '.cu')):
                        self._exes.setdefault(target, set()).add(a)
        return self._exes

    def test_sources(self, name):
        key = (self.root, name)
        if key not in _SOURCES:
            _SOURCES[key] = self._test_sources(name)
        return _SOURCES[key]

    def _test_sources(self, name):
        """The files a CTest's functions live in: the executable's source and its
        companions, the scripts it runs and the Python files those name."""
        cmd = self.ctest().get(name)
        srcs = set()
        by_base = {}
        for f in self.files:
            if f.startswith('tests/'):
                by_base.setdefault(os.path.basename(f), []).append(f)

        exes = self.cmake_executables()

        def add_exe(exe):
            if exe in exes:
                srcs.update(exes[exe])
                return
            for f in self.files:
                if f.startswith('tests/') and os.path.basename(f) == exe + '.c':
                    srcs.add(f)

        if not cmd:  # registered in another build only, or not built yet: the executable named
            # like the test
            add_exe(re.sub(r'_np\d+$', '', name))
            if name.startswith('test_cuda_') and not srcs:  # shardopt_device_sim_test's
                add_exe('test_device_sim')
            return sorted(srcs)
        rb = os.path.realpath(self.build)
        # the build's commands name the sources it was configured from: ROOT, or another
        # checkout of the tree
        home = re.search(r'^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$',
                         read(os.path.join(self.build, 'CMakeCache.txt')), re.M)
        home = os.path.realpath(home.group(1)) if home else os.path.realpath(self.root)
        for arg in cmd:
            # a relative argument is no path of the build: ctest runs the checker from the
            # build directory, where realpath('test_x.py') would look like a build output
            p = os.path.realpath(arg) if os.path.isabs(arg) else ''
            if p and p.startswith(rb + os.sep):
                add_exe(os.path.basename(p))
            elif p and p.startswith(home + os.sep) and os.path.relpath(p, home) in self.fileset:
                rel = os.path.relpath(p, home)
                srcs.add(rel)
                for ref in re.findall(r'[A-Za-z0-9_]+\.py', read(os.path.join(self.root, rel))):
                    srcs.update(by_base.get(ref, []))
            elif arg.endswith('.py'):
                srcs.update(by_base.get(os.path.basename(arg), []))
        # a Python test's cases module (tests/python/cases.py) is imported, not named
        for s in list(srcs):
            if s.endswith('.py'):
                for mod in re.findall(r'^\s*(?:from|import)\s+([A-Za-z0-9_]+)', read(
                        os.path.join(self.root, s)), re.M):
                    srcs.update(by_base.get(mod + '.py', []))
        return sorted(srcs)

    def functions_in(self, srcs):
        key = (self.root, tuple(sorted(srcs)))
        if key not in _FUNCTIONS:
            _FUNCTIONS[key] = self._functions_in(srcs)
        return _FUNCTIONS[key]

    def _functions_in(self, srcs):
        fns = set()
        for s in srcs:
            t = read(os.path.join(self.root, s))
            if s.endswith('.c'):
                fns.update(re.findall(r'^\s*TEST\(\s*([A-Za-z0-9_]+)\s*\)', t, re.M))
            elif s.endswith('.py'):
                for d in re.findall(r'^\s*def\s+([A-Za-z0-9_]+)', t, re.M):
                    fns.add(d)
                    for pre in ('case_', 'test_'):
                        if d.startswith(pre):
                            fns.add(d[len(pre):])
        return fns

    def all_test_functions(self):
        """Every test function of tests/, named alone in the docs."""
        if not hasattr(self, '_allfns'):
            self._allfns = self.functions_in([f for f in self.files if f.startswith('tests/') and
                                              f.endswith(('.c', '.py'))])
        return self._allfns

    def test_words(self):
        """The words of tests/ (headers, scripts, CMake): a mode or a program named there."""
        if not hasattr(self, '_twords'):
            self._twords = set()
            for f in self.scan:
                if f.startswith('tests/'):
                    self._twords.update(re.findall(r'[A-Za-z_][A-Za-z0-9_]*',
                                                   read(os.path.join(self.root, f))))
        return self._twords

    def test_stems(self):
        return {os.path.splitext(os.path.basename(f))[0] for f in self.files}


_MEMO = {}


def memo(key, fn):
    """What depends on the tree's sources alone, computed once for the self-test's runs."""
    if key not in _MEMO:
        _MEMO[key] = fn()
    return _MEMO[key]


def sections(t, doc):
    """A page's section names, lower case: its headings and its bold paragraph leads
    (**What a step costs in Python.**)."""
    text = re.sub(r'^```.*?^```', '', t.text.get(doc) or read(os.path.join(t.root, doc)),
                  flags=re.M | re.S)
    names = re.findall(r'^#{1,6}\s+(.*?)\s*$', text, re.M)
    names += re.findall(r'^\*\*([^*\n]+?)[.:]?\*\*', text, re.M)
    return {n.strip().lower() for n in names}


def anchors(t, doc):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to -,
    a repeated heading -1, -2, ..."""
    text = t.text.get(doc) or read(os.path.join(t.root, doc))
    text = re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)
    seen, out = {}, set()
    for h in re.findall(r'^#{1,6}\s+(.*?)\s*#*\s*$', text, re.M):
        a = re.sub(r'[^\w\- ]', '', h.strip().lower()).replace(' ', '-')
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else '%s-%d' % (a, n))
    return out


def config_keys(t):
    """The keys of runtime/config/config_keys.c's table: {"name", CFG_...} or DBL(name, ...)."""
    src = read(os.path.join(t.root, 'runtime/config/config_keys.c'))
    body = src.split('config_keys[] = {', 1)[-1].split('\n};', 1)[0]
    return {a or b for a, b in re.findall(
        r'^\s*(?:\{"([a-z0-9_]+)",\s*CFG_|[A-Z0-9]+\(([a-z0-9_]+),)', body, re.M)}


def cmake_targets(t):
    """What the build makes: add_executable / add_library names and OUTPUT_NAMEs."""
    names = set()
    for f in t.files:
        if f.endswith('CMakeLists.txt') or f.endswith('.cmake'):
            src = read(os.path.join(t.root, f))
            names.update(re.findall(r'add_(?:executable|library)\(\s*([A-Za-z0-9_.-]+)', src))
            names.update(re.findall(r'OUTPUT_NAME\s+"?([A-Za-z0-9_.-]+)', src))
    return names


def header_words(t):
    """The functions include/*.h declare (SHARDOPT_API), and every word of those headers."""
    h = '\n'.join(read(os.path.join(t.root, f)) for f in t.files
                  if f.startswith('include/') and f.endswith('.h'))
    fns = set(re.findall(r'SHARDOPT_API\b[^;(]*?\b(shardopt_[a-z0-9_]+)\s*\(', h))
    return fns, set(re.findall(r'\b[A-Za-z_][A-Za-z0-9_]*\b', h))
