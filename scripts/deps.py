#!/usr/bin/env python3
"""deps.py [BUILD]: the dependency graph of src/ by module, and its loops.

A module is a header and its source (src/d/x.h + src/d/x.c = "d/x"); the CPU
kernels (src/cpu/kernels.h, src/cpu/*) are one module "cpu" and the CUDA backend
(src/cuda/*) one module "cuda". Module A depends on B when a file of A
#includes a header of B, or (with BUILD, a build folder of the Makefile) when
an object of A calls or reads a symbol that an object of B defines (`nm`).
Prints one line per module ("a -> b c") and then the loops (strongly
connected components of more than one module), "loops: none" if there are
none; the exit status is 1 when there is a loop. docs/architecture.md shows
the picture this prints.
"""
import collections
import os
import re
import subprocess
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'src')


def module(path):
    rel = os.path.relpath(path, SRC)
    if rel.startswith('cpu' + os.sep):
        return 'cpu'
    if rel.startswith('cuda' + os.sep):
        return 'cuda'
    return os.path.splitext(rel)[0]


def files():
    for root, _, names in os.walk(SRC):
        for n in names:
            if n.endswith(('.c', '.h', '.cu', '.cuh')):
                yield os.path.join(root, n)


def include_edges(g):
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for f in files():
        text = open(f, encoding='utf-8', errors='replace').read()
        for h in inc.findall(text):
            for base in (os.path.dirname(f), SRC):
                p = os.path.normpath(os.path.join(base, h))
                if os.path.exists(p):
                    if module(p) != module(f):
                        g[module(f)].add(module(p))
                    break


def symbol_edges(g, build):
    defs, uses = {}, collections.defaultdict(set)
    root = os.path.join(build, 'src')
    for d, _, names in os.walk(root):
        for n in names:
            if not n.endswith('.o'):
                continue
            o = os.path.join(d, n)
            m = module(os.path.join(SRC, os.path.relpath(o, root)))
            out = subprocess.run(['nm', o], capture_output=True, text=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) == 3 and p[1] in 'TDBRV':
                    defs[p[2]] = m
                elif len(p) == 2 and p[0] == 'U':
                    uses[m].add(p[1])
    for m, us in uses.items():
        for u in us:
            if u in defs and defs[u] != m:
                g[m].add(defs[u])


def loops(g):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main():
    g = collections.defaultdict(set)
    include_edges(g)
    if len(sys.argv) > 1:
        symbol_edges(g, sys.argv[1])
    for m in sorted(g):
        print(f'{m} -> {" ".join(sorted(g[m]))}')
    found = loops(g)
    print('loops:', '; '.join(' <-> '.join(c) for c in found) if found else 'none')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
