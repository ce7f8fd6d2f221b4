#!/usr/bin/env python3
"""long_functions.py [--max N] [DIR]: the functions of DIR (default src/) longer than N lines.

Scans the C and CUDA files (.c .h .cu .cuh) of DIR by matching braces, after
blanking comments, string and character literals and preprocessor lines. A
top-level `{` opens a function when the text before it (back to the previous
`;`, `}` or `{`) ends in `)` (optionally followed by qualifiers such as
`const` or `noexcept`) and is not an initializer (`=`), a struct/union/enum
or an `extern "C"` / `namespace` block (those are looked through). A
function's length counts its lines from the one holding its name to the one
holding its closing brace. Prints one line per function over N lines (default
120), longest first, "FILE:LINE NAME LINES", then a count; the exit status is
1 when there is any, so the issue-13 acceptance ("no function over ~120 lines
in src/") is `python3 scripts/long_functions.py`.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


def blank(text):
    """text with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in ' \t':
            out.append(c)
            i += 1
            continue
        if line_start and c == '#':
            # a preprocessor line, with its backslash continuations
            while i < n and text[i] != '\n':
                if text[i] == '\\' and i + 1 < n and text[i + 1] == '\n':
                    out.append(' \n')
                    i += 2
                    continue
                out.append(' ')
                i += 1
            continue
        line_start = False
        if text.startswith('//', i):
            while i < n and text[i] != '\n':
                out.append(' ')
                i += 1
            continue
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
            continue
        if c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * (j - i - 2) + c if j - i >= 2 else ' ' * (j - i))
            i = j
            continue
        if c == '\n':
            line_start = True
        out.append(c)
        i += 1
    return ''.join(out)


QUAL = re.compile(r'\)\s*(const|noexcept|override|final|\s)*$')
ATTR = re.compile(r'__launch_bounds__\s*\([^)]*\)|__attribute__\s*\(\([^)]*\)\)')
NAME = re.compile(r'([A-Za-z_~][A-Za-z_0-9:<>~]*)\s*\($')


def drop_template(head):
    """head without a leading C++ `template <...>` clause (its default arguments' `=` are not an initializer)."""
    m = re.search(r'\btemplate\s*<', head)
    if not m:
        return head
    depth = 0
    for i in range(m.end() - 1, len(head)):
        if head[i] == '<':
            depth += 1
        elif head[i] == '>':
            depth -= 1
            if depth == 0:
                return head[:m.start()] + ' ' * (i + 1 - m.start()) + head[i + 1:]
    return head


def functions(path):
    """(name, first line, last line) for every function body in the file at path."""
    text = blank(open(path, encoding='utf-8', errors='replace').read())
    found, depth, body, head_at = [], 0, None, 0
    transparent = 0          # open extern "C" / namespace blocks, looked through
    stack = []               # what each open top-level brace is: 'fn', 'other', 'block'
    for i, c in enumerate(text):
        if c == '{':
            if depth == 0:
                head = text[head_at:i]
                if re.search(r'(extern\s+"\s*"|namespace\b[^;]*)\s*$', head):
                    stack.append('block')
                    transparent += 1
                    head_at = i + 1
                    continue
                kind = 'other'
                sig = drop_template(head).split('(')[0]
                if QUAL.search(head) and '=' not in sig \
                        and not re.search(r'\b(struct|union|enum)\b[^()]*$', sig):
                    kind = 'fn'
                    body = (head, head_at, i)
                stack.append(kind)
            depth += 1
        elif c == '}':
            if depth == 0:
                if stack and stack[-1] == 'block':
                    stack.pop()
                    transparent -= 1
                head_at = i + 1
                continue
            depth -= 1
            if depth == 0:
                kind = stack.pop() if stack else 'other'
                if kind == 'fn' and body:
                    head, start, _ = body
                    head = ATTR.sub(lambda a: ' ' * len(a.group(0)), head)
                    paren = head.find('(')
                    m = NAME.search(head[:paren + 1].rstrip()) if paren >= 0 else None
                    name = m.group(1) if m else '?'
                    name_at = start + (m.start(1) if m else len(head) - len(head.lstrip()))
                    first = text.count('\n', 0, name_at) + 1
                    last = text.count('\n', 0, i) + 1
                    found.append((name, first, last))
                    body = None
                head_at = i + 1
        elif c == ';' and depth == 0:
            head_at = i + 1
    return found


def main():
    args = sys.argv[1:]
    limit = 120
    if len(args) >= 2 and args[0] == '--max':
        limit = int(args[1])
        args = args[2:]
    top = args[0] if args else os.path.join(ROOT, 'src')
    rows = []
    for d, _, names in os.walk(top):
        for nm in sorted(names):
            if nm.endswith(('.c', '.h', '.cu', '.cuh')):
                p = os.path.join(d, nm)
                for name, first, last in functions(p):
                    if last - first + 1 > limit:
                        rows.append((last - first + 1, os.path.relpath(p, top), first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for n, p, first, name in rows:
        print(f'{p}:{first} {name} {n}')
    print(f'{len(rows)} function(s) over {limit} lines')
    return 1 if rows else 0


if __name__ == '__main__':
    sys.exit(main())
