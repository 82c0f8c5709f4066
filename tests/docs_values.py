#!/usr/bin/env python3
"""The values the docs give for the public API and the tools are the code's.

tests/docs_refs.py checks that the names the docs give exist; this checks what they say about
them, where the code holds the answer in a form a script can read:

  coeffs    docs/config.md's Newton-Schulz coefficient tables give kernels/ns_coeffs.c's triples;
  defaults  each row of docs/config.md's key table gives the key's default as
            SHARDOPT_CONFIG_INIT (include/shardopt.h) sets it, its type as the key table's
            (runtime/config/config_keys.c) and, in the accepted column, the key's range: both
            bounds of an integer key, the interval of a number key with its open or closed ends,
            exactly the names of an enum key, true/false for a bool;
  fields    every field of the public structs is named in the doc that documents it:
            shardopt_config_t in docs/config.md, the descriptor, step arguments, stats, per-
            parameter stats and groups in docs/api.md; every status code of shardopt_status.h
            in docs/api.md; docs/config.md's table of the variables that are no config keys
            lists exactly base/env.c's; docs/checkpoint.md's Fault injection names every site of
            base/fault.c's list;
  options   every --option the docs give after a tool's name (on the same line: a command, or
            prose such as "shardopt-plan --teams") is an option that tool's sources parse, and
            every `make TARGET` a target of the Makefile;
  headers   the installed headers (CMakeLists.txt's install(FILES)) name no file or folder of
            the tree, no doc page and no issue: their users have only the headers.

Usage: docs_values.py ROOT, or docs_values.py --self-test ROOT, which first checks that a wrong
default, a wrong range, a missing field, a missing status code, an unknown option and a doc cited
in a header, planted in memory, are each caught.
"""
import os
import re
import sys

from docs_common import parse_args

# a tool's name as the docs write it -> the files whose "--option" strings it parses
TOOLS = {
    'shardopt-plan': ['bench/shardopt_plan.c', 'bench/plan_model.c', 'bench/plan_machine.c'],
    'shardopt-bench': ['bench/step_bench.c'],
    'step_bench': ['bench/step_bench.c'],
    'ckpt_bench': ['bench/ckpt_bench.c'],
    'ckpt_index_bench': ['bench/ckpt_index_bench.c'],
    'plan-world-sim': ['bench/plan_world_sim.c'],
    'ns_bench': ['bench/ns_bench.c'],
    'ns_bench_cuda': ['bench/ns_bench_cuda_main.c'],
    'ns_floor': ['bench/ns_floor.c'],
    'elementwise_bench': ['bench/elementwise_bench.c'],
    'pingpong': ['bench/pingpong.c'],
    'compare_driver': ['bench/compare_driver.c'],
    'compare_torch.py': ['bench/compare_torch.py'],
    'plot_scaling.py': ['bench/plot_scaling.py'],
    'moe_train': ['examples/moe_train/main.c'],
}
# options every MPI tool takes through tools/cli.h
COMMON_OPTS = {'--help'}

HEADER = 'include/shardopt.h'


def read(root, rel):
    with open(os.path.join(root, rel), encoding='utf-8') as f:
        return f.read()


def num(text):
    """A number as the docs write it: 1e6, 2^20, 2^64, 128, -1."""
    text = text.strip().replace('−', '-')
    m = re.fullmatch(r'(-?)2\^(\d+)', text)
    if m:
        return -(2 ** int(m.group(2))) if m.group(1) else 2 ** int(m.group(2))
    try:
        return float(text)
    except ValueError:
        return None


DEFINES = {}  # runtime/config/config_keys.h's numeric #defines, read in main


def c_num(text):
    """A bound or default as config_keys.c or the header writes it: 1 << 20, 128ull << 20,
    SHARDOPT_NS_MAX_STEPS, 1e-3."""
    text = text.strip()
    m = re.fullmatch(r'(\d+)(?:u?ll|u)?\s*<<\s*(\d+)', text)
    if m:
        return int(m.group(1)) << int(m.group(2))
    if text == 'SHARDOPT_NS_MAX_STEPS':
        return 16
    if text in DEFINES:  # a bound config_keys.h names (CONFIG_EPS_MIN)
        return float(DEFINES[text])
    return float(text)


def enums(header):
    """Every enumerator of the public headers -> its value."""
    vals = {}
    for body in re.findall(r'typedef enum \w+ \{(.*?)\}', header, re.S):
        for name, val in re.findall(r'\b(SHARDOPT_[A-Z0-9_]+)\s*=\s*(-?\d+)', body):
            vals[name] = int(val)
    return vals


def config_init(header):
    macro = re.search(r'#define SHARDOPT_CONFIG_INIT(.*?)\n\n', header, re.S).group(1)
    macro = macro.replace('\\\n', ' ')
    return dict(re.findall(r'\.([a-z0-9_]+)\s*=\s*((?:\{\{0\}\})|[^,}]+)', macro))


def key_table(src):
    """runtime/config/config_keys.c's keys: name -> (type, enum names, lo, hi, lo_open,
    hi_open, special or None)."""
    names = {n: re.findall(r'"([a-z0-9_]+)"', body) for n, body in re.findall(
        r'static const char \*const (\w+)\[\] = \{(.*?)\};', src, re.S)}
    body = src.split('config_keys[] = {', 1)[1].split('\n};', 1)[0]
    body = re.sub(r'/\*.*?\*/', '', body, flags=re.S)
    keys = {}
    for m in re.finditer(r'DBL\((\w+),\s*([^,]+),\s*([^,]+),\s*(\d),\s*(\d),', body):
        keys[m.group(1)] = ('number', None, c_num(m.group(2)), c_num(m.group(3)),
                            int(m.group(4)), int(m.group(5)), None)
    for m in re.finditer(r'INT\((\w+),\s*([^,]+),\s*([^,]+),', body):
        keys[m.group(1)] = ('integer', None, c_num(m.group(2)), c_num(m.group(3)), 0, 0, None)
    for m in re.finditer(r'ENUM\((\w+),\s*(\w+),', body):
        keys[m.group(1)] = ('string', names[m.group(2)], None, None, 0, 0, None)
    for m in re.finditer(r'\{"(\w+)",\s*CFG_(\w+),\s*OFF\(\w+\),\s*\w+,\s*([^,]+),\s*([^,]+),'
                         r'\s*(\d),\s*(\d),\s*(\d),\s*([^,]+),', body):
        kind = {'BOOL': 'bool', 'U64': 'integer', 'DOUBLE': 'number', 'INT': 'integer',
                'STRING': 'string', 'COEFFS': 'array'}[m.group(2)]
        lo, hi = c_num(m.group(3)), c_num(m.group(4))
        special = c_num(m.group(8)) if m.group(7) == '1' else None
        keys[m.group(1)] = (kind, None, lo, hi, int(m.group(5)), int(m.group(6)), special)
    return keys


def enum_name(value, names, vals):
    """SHARDOPT_NS_QUINTIC -> quintic, through the enumerator's value and the key's names."""
    if value in vals and names:
        return names[vals[value]]
    if value.isdigit() and names:
        return names[int(value)]
    return None


def check_defaults(root, config_md, header):
    errs = []
    init = config_init(header)
    vals = enums(header + read(root, 'include/shardopt_types.h'))
    DEFINES.update(re.findall(r'#define (CONFIG_[A-Z0-9_]+) ([-0-9.e]+)\n',
                              read(root, 'runtime/config/config_keys.h')))
    keys = key_table(read(root, 'runtime/config/config_keys.c'))
    table = config_md.split('| key | type | default |', 1)[1].split('\n\n', 1)[0]
    for line in table.split('\n'):
        cells = [c.strip() for c in re.split(r'(?<!\\)\|', line)[1:-1]]
        m = re.fullmatch(r'`([a-z0-9_]+)`', cells[0]) if cells else None
        if not m or m.group(1) not in keys:
            continue  # the header row; a key not in the code is docs_refs' to report
        key = m.group(1)
        kind, names, lo, hi, lo_open, hi_open, special = keys[key]
        dtype, default, accepted = cells[1], cells[2], cells[3]
        where = 'docs/config.md: `%s`' % key
        if not dtype.startswith(kind):
            errs.append('%s: type "%s", the key table\'s is %s' % (where, dtype, kind))
        # the default
        # a field the initializer leaves out is zero, as C's designated initializers give
        code = init.get(key, '0')
        if kind == 'string' and names:
            want = enum_name(code.strip(), names, vals)
            got = re.match(r'`([^`]+)`', default)
            if not got or got.group(1) != want:
                errs.append('%s: default %s, SHARDOPT_CONFIG_INIT gives `%s`' %
                            (where, default, want))
        elif kind == 'string':
            want = re.search(r'#define %s "([^"]*)"' % re.escape(code.strip()), header)
            got = re.match(r'`([^`]+)`', default)
            if not want or not got or got.group(1) != want.group(1):
                errs.append('%s: default %s, SHARDOPT_CONFIG_INIT gives "%s"' %
                            (where, default, want.group(1) if want else code))
        elif kind == 'bool':
            if default not in ('false', 'true') or int(c_num(code)) != (default == 'true'):
                errs.append('%s: default %s, SHARDOPT_CONFIG_INIT gives %s' %
                            (where, default, code.strip()))
        elif kind != 'array':
            got = num(default.split(' ')[0])
            if got is None or abs(got - c_num(code)) > 1e-12 * max(1, abs(got)):
                errs.append('%s: default %s, SHARDOPT_CONFIG_INIT gives %s' %
                            (where, default, code.strip()))
        # the range
        if kind == 'string' and names:
            got = set(re.findall(r'`([a-z0-9_]+)`', accepted.split(';')[0]))
            if got != set(names):
                errs.append('%s: accepted %s, the key takes %s' %
                            (where, ', '.join(sorted(got)), ', '.join(names)))
        elif kind == 'bool':
            if not accepted.startswith('true/false'):
                errs.append('%s: accepted "%s", a bool takes true/false' % (where, accepted))
        elif kind == 'integer' and hi != 0:
            nums = {num(x) for x in re.findall(r'-?\d+(?:\^\d+|(?:\.\d+)?(?:e-?\d+)?)',
                                               accepted)}
            for bound in (lo, hi) + ((special,) if special is not None else ()):
                if bound not in nums:
                    errs.append('%s: accepted "%s" does not give %g (the key table\'s range '
                                '%g..%g)' % (where, accepted, bound, lo, hi))
        elif kind == 'number':
            want = ('(' if lo_open else '[', lo, hi, ')' if hi_open else ']')
            ivals = [(a, num(b), num(c), d) for a, b, c, d in
                     re.findall(r'([\[(])\s*([-0-9.e^]+)\s*,\s*([-0-9.e^]+)\s*([\])])',
                                accepted)]
            if want not in ivals:
                errs.append('%s: accepted "%s" does not give %s%g, %g%s (the key table\'s)' %
                            (where, accepted, want[0], lo, hi, want[3]))
            if special is not None and not re.match(r'%g\b' % special, accepted):
                errs.append('%s: accepted "%s" does not start with %g, which the key also '
                            'takes' % (where, accepted, special))
    return errs


def check_coeffs(root, config_md):
    """docs/config.md's Newton-Schulz coefficient tables give kernels/ns_coeffs.c's triples."""
    errs = []
    src = read(root, 'kernels/ns_coeffs.c')
    code = {n: [float(x) for x in re.findall(r'-?\d+\.\d+', body)] for n, body in
            re.findall(r'static const double (\w+)\[\d+\]\[3\] = \{(.*?)\};', src, re.S)}
    sect = config_md.split('### Newton-Schulz coefficient tables', 1)[-1].split('\n\n', 2)[1]
    rows = {m.group(1): m.group(2) for m in
            re.finditer(r'^\| `([a-z_]+)`(?: \(default\))? \| (.*) \|$', sect, re.M)}
    for name, values in code.items():
        if name not in rows:
            errs.append('docs/config.md: coefficient table `%s` (kernels/ns_coeffs.c) has no row'
                        % name)
            continue
        triples = re.findall(r'\(([^()]*)\)', rows[name].split(':')[0])
        doc = [float(x.replace('−', '-')) for t in triples for x in t.split(',')]
        if doc != values:
            errs.append('docs/config.md: coefficient table `%s` gives %s, kernels/ns_coeffs.c %s'
                        % (name, doc, values))
    return errs


def struct_fields(header, name):
    body = re.search(r'typedef struct %s \{(.*?)\n\} %s_t;' % (name, name), header, re.S)
    body = re.sub(r'/\*.*?\*/', '', body.group(1), flags=re.S)
    return [m for m in re.findall(r'\b([a-z_][a-z0-9_]*)\s*(?:\[[^\]]*\])*\s*;', body)]


def check_fields(root, docs, header):
    errs = []
    where = {'shardopt_config': 'docs/config.md', 'shardopt_param_desc': 'docs/api.md',
             'shardopt_step_args': 'docs/api.md', 'shardopt_stats': 'docs/api.md',
             'shardopt_param_stats': 'docs/api.md', 'shardopt_groups': 'docs/api.md'}
    for struct, doc in where.items():
        text = docs[doc]
        for f in struct_fields(header, struct):
            if f in ('size', 'version'):
                continue
            if not re.search(r'(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])' % re.escape(f), text):
                errs.append('%s: %s_t.%s is not named' % (doc, struct, f))
    # docs/config.md's table of the variables that are no config keys: base/env.c's table
    env = set(re.findall(r'^\s*\{"(SHARDOPT_[A-Z0-9_]+)"', read(root, 'base/env.c'), re.M))
    sect = docs['docs/config.md'].split('### Environment variables that are not config keys', 1)
    rows = set(re.findall(r'^\| `(SHARDOPT_[A-Z0-9_]+)` \|', sect[-1].split('\n## ', 1)[0], re.M))
    for v in sorted(env - rows):
        errs.append('docs/config.md: %s (base/env.c\'s table) has no row in "Environment '
                    'variables that are not config keys"' % v)
    for v in sorted(rows - env):
        errs.append('docs/config.md: %s has a row in "Environment variables that are not config '
                    'keys" but is not in base/env.c\'s table' % v)
    # docs/checkpoint.md's Fault injection names every site of base/fault.c's list
    body = read(root, 'base/fault.c').split('fault_sites[] = {', 1)[-1].split('};', 1)[0]
    sect = docs['docs/checkpoint.md'].split('## Fault injection', 1)[-1].split('\n## ', 1)[0]
    for site in re.findall(r'"([a-z0-9_.]+)"', body):
        if not re.search(r'`(?:kill@|hang@)?%s(?::<n>)?`' % re.escape(site), sect):
            errs.append('docs/checkpoint.md: fault site `%s` (base/fault.c) is not in its Fault '
                        'injection section' % site)
    status = read(root, 'include/shardopt_status.h')
    for code in re.findall(r'\bSHARDOPT_(OK|ERR_[A-Z_]+)\s*=', status):
        if not re.search(r'`(?:SHARDOPT_)?%s`' % code, docs['docs/api.md']):
            errs.append('docs/api.md: status code SHARDOPT_%s is not named' % code)
    return errs


def tool_options(root):
    opts = {}
    for tool, files in TOOLS.items():
        text = '\n'.join(read(root, f) for f in files if os.path.exists(os.path.join(root, f)))
        # "--x" in C, '--x' in argparse's add_argument
        opts[tool] = set(re.findall(r'(--[a-z][a-z0-9-]*)', text)) | COMMON_OPTS
    return opts


def doc_lines(docs):
    """(doc, line number, line, whether it is inside a fenced code block) for every line of
    every doc but the fences themselves."""
    for doc, text in docs.items():
        code = False
        for ln, line in enumerate(text.split('\n'), 1):
            if line.startswith('```'):
                code = not code
                continue
            yield doc, ln, line, code


def check_options(root, docs):
    errs = []
    opts = tool_options(root)
    names = sorted(TOOLS, key=len, reverse=True)
    pat = re.compile(r'(?<![A-Za-z0-9_-])(?:[A-Za-z0-9_./]*/)?(%s)(?![A-Za-z0-9_-])' %
                     '|'.join(re.escape(n) for n in names))
    for doc, ln, line, code in doc_lines(docs):
        hits = list(pat.finditer(line))
        for i, m in enumerate(hits):
            tool = m.group(1)
            end = hits[i + 1].start() if i + 1 < len(hits) else len(line)
            # the options up to the next tool and the end of the command: in a code block a
            # pipe, && or a comment; in prose the end of the backticked span or the clause
            # (a list of tools, then options of some of them, names no option of the first)
            cut = r'\s(?:\||&&|;|#)\s' if code else r'[`,;()]|\.\s'
            seg = re.split(cut, line[m.end():end])[0]
            for o in re.findall(r'(?<![A-Za-z0-9_-])(--[a-z][a-z0-9-]*)', seg):
                if o not in opts[tool]:
                    errs.append('%s:%d: %s %s: the tool parses no such option' %
                                (doc, ln, tool, o))
    return errs


def check_headers(root, texts):
    """The installed headers' comments stand alone: an installed header has no repository
    beside it, so it names none of the tree's files or folders, no doc page and no issue."""
    errs = []
    bad = re.compile(r'(?<![A-Za-z0-9_])(?:\.\./)?(?:docs|tests|runtime|kernels|sharding|offload|base|'
                     r'bench|tools|examples|shared)/|[A-Za-z0-9_]\.md\b|\bissue \d+')
    for h, text in texts.items():
        for ln, line in enumerate(text.split('\n'), 1):
            m = bad.search(line)
            if m and not line.lstrip().startswith('#include'):
                errs.append('%s:%d: "%s": an installed header names what its users do not have' %
                            (h, ln, m.group(0)))
    return errs


def installed_headers(root):
    cm = read(root, 'CMakeLists.txt')
    return sorted(set(re.findall(r'\b(include/[a-z_]+\.h)\b', ' '.join(
        re.findall(r'install\(FILES([^)]*)\)', cm)))))


def check_make(root, docs):
    """Every `make TARGET` the docs give (a code block's line, or backticked in prose) is a
    target of the Makefile."""
    errs = []
    targets = set(re.findall(r'^([a-z][a-z0-9-]*):', read(root, 'Makefile'), re.M))
    for doc, ln, line, code in doc_lines(docs):
        found = re.findall(r'^\s*make\s+(?:[A-Z_]+=\S+\s+)*([a-z][a-z0-9-]*)', line) if code \
            else re.findall(r'`make\s+(?:[A-Z_]+=\S+\s+)*([a-z][a-z0-9-]*)', line)
        for t in found:
            if t not in targets:
                errs.append('%s:%d: make %s: the Makefile has no such target' % (doc, ln, t))
    return errs


def run(root, planted=None):
    docs = {d: read(root, d) for d in ['README.md'] + sorted(
        'docs/' + f for f in os.listdir(os.path.join(root, 'docs')) if f.endswith('.md'))}
    docs.update(planted or {})
    header = read(root, HEADER)
    headers = {h: (planted or {}).get(h) or read(root, h) for h in installed_headers(root)}
    return (check_defaults(root, docs['docs/config.md'], header) +
            check_coeffs(root, docs['docs/config.md']) +
            check_fields(root, docs, header) + check_options(root, docs) +
            check_make(root, docs) +
            check_headers(root, headers))


def self_test(root):
    base = set(run(root))
    cfg = read(root, 'docs/config.md')
    api = read(root, 'docs/api.md')
    plants = [
        ('a wrong default', 'docs/config.md',
         cfg.replace('| `momentum` | number | 0.95 |', '| `momentum` | number | 0.9 |', 1),
         '`momentum`: default 0.9'),
        ('a wrong range', 'docs/config.md',
         cfg.replace('| `ns_steps` | integer | 5 | 1–16', '| `ns_steps` | integer | 5 | 1–12', 1),
         '`ns_steps`: accepted'),
        ('a wrong enum', 'docs/config.md', cfg.replace('`fp32`, `bf16` | Muon momentum storage',
                                                       '`fp32` | Muon momentum storage', 1),
         '`momentum_dtype`: accepted'),
        ('a missing field', 'docs/api.md', api.replace('max_grad_norm', 'max_norm'),
         'shardopt_step_args_t.max_grad_norm'),
        ('a wrong coefficient', 'docs/config.md',
         cfg.replace('(3.4445, −4.7750, 2.0315) every step', '(3.4445, −4.7751, 2.0315) every step'),
         'coefficient table `jordan`'),
        ('a missing fault site', 'docs/checkpoint.md',
         read(root, 'docs/checkpoint.md').replace('`ckpt.prune`', 'ckpt.prune'),
         'fault site `ckpt.prune`'),
        ('a missing env variable row', 'docs/config.md',
         cfg.replace('| `SHARDOPT_FAULT_RANK` |', '| `SHARDOPT_FAULT_RANKS` |', 1),
         'SHARDOPT_FAULT_RANK (base/env.c'),
        ('a missing status code', 'docs/api.md', api.replace('`ERR_CORRUPT`', 'CORRUPT'),
         'SHARDOPT_ERR_CORRUPT'),
        ('an unknown option', 'docs/api.md', api + '\n`shardopt-plan --no-such-option`\n',
         '--no-such-option'),
        ('an unknown make target', 'docs/api.md', api + '\n`make no-such-target`\n',
         'make no-such-target'),
        ('a doc cited in a header', HEADER, read(root, HEADER) + '\n/* docs/config.md */\n',
         'docs/'),
    ]
    for what, doc, text, needle in plants:
        if text == read(root, doc):
            sys.exit('docs_values: self-test: could not plant %s in %s (the text moved?)' %
                     (what, doc))
        new = [e for e in run(root, {doc: text}) if e not in base and needle in e]
        if not new:
            sys.exit('docs_values: self-test: %s was not caught (%s)' % (what, needle))
        print('docs_values: self-test: %s is caught: %s' % (what, new[0]))


def main():
    test, args = parse_args(__doc__, (1,))
    root = os.path.realpath(args[0])
    if test:
        self_test(root)
    errs = run(root)
    for e in errs:
        print('docs_values: ' + e)
    if errs:
        sys.exit('docs_values: %d values in the docs differ from the code' % len(errs))
    print('docs_values: the docs\' defaults, ranges, fields, status codes and tool options are '
          'the code\'s')


if __name__ == '__main__':
    main()
