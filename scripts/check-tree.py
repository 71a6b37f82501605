#!/usr/bin/env python3
"""The tree's shape, checked in CI (.ci/run) and by scripts/test.sh:

1. No import circle between the files of any crate: an edge a -> b when a
   file names `crate::b...` or `super::...` resolving to another file's
   module (test modules excluded). A circle means two files that cannot be
   read, changed or moved apart (docs/ARCHITECTURE.md, "Workspace layout").
2. No Rust file over 600 lines.
3. Every path docs/ARCHITECTURE.md and README.md name in backticks or in a
   layout tree exists, and every workspace member is in both layout trees.

Prints each problem and exits 1 if there is one.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 600


def members():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    m = re.search(r"members\s*=\s*\[([^\]]*)\]", text)
    return [x.strip().strip('"') for x in m.group(1).split(",") if x.strip()]


def module_of(src, path):
    parts = os.path.relpath(path, src)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def without_tests(text):
    text = re.sub(r"//[^\n]*", "", text)
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def import_graph(src):
    files = [f for f in glob.glob(os.path.join(src, "**", "*.rs"), recursive=True)
             if os.sep + "bin" + os.sep not in f]
    mods = {module_of(src, f): f for f in files}
    graph = {}
    for mod, path in mods.items():
        deps = set()
        for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", without_tests(open(path).read())):
            if m.group(1) == "crate":
                base = []
            else:
                base = list(mod[:-1])
            target = base + [x for x in m.group(2).split("::") if x]
            for k in range(len(target), 0, -1):
                t = tuple(target[:k])
                if t in mods:
                    if t != mod:
                        deps.add(t)
                    break
        graph[mod] = deps
    return graph


def circles(graph):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                found.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def check_imports(problems):
    for crate in members() + ["."]:
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        graph = import_graph(src)
        for comp in circles(graph):
            names = sorted("/".join(m) or "lib" for m in comp)
            edges = sorted(f"{'/'.join(a) or 'lib'} -> {'/'.join(b) or 'lib'}"
                           for a in comp for b in graph[a] if b in comp)
            problems.append(f"import circle in {crate}/src: {names}: {'; '.join(edges)}")


def check_lengths(problems):
    for path in glob.glob(os.path.join(ROOT, "**", "*.rs"), recursive=True):
        rel = os.path.relpath(path, ROOT)
        if rel.startswith(("target", ".git")):
            continue
        n = sum(1 for _ in open(path, encoding="utf-8", errors="replace"))
        if n > MAX_LINES:
            problems.append(f"{rel}: {n} lines (at most {MAX_LINES})")


PATH_RE = re.compile(r"`((?:[\w.-]+/)+[\w.{},*<>-]*)`")


def expand(path):
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    out = []
    for alt in m.group(1).split(","):
        out += expand(path[:m.start()] + alt.strip() + path[m.end():])
    return out


def fences(text):
    """The bodies of the text's fenced code blocks."""
    out, body = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body = []
            else:
                out.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return out


def exists(path):
    """A path from the root, or, written inside a crate's row, the tail of one."""
    if os.path.exists(os.path.join(ROOT, path)):
        return True
    if path.split("/")[0] in members() + ["src", "tests", "docs", "scripts", "deploy"]:
        return False
    tail = os.sep + path.rstrip("/")
    for dirpath, dirnames, filenames in os.walk(ROOT):
        if "/target" in dirpath or "/.git" in dirpath:
            continue
        for name in dirnames + filenames:
            if os.path.join(dirpath, name).endswith(tail):
                return True
    return False


def check_docs(problems):
    crates = members()
    for doc in ("docs/ARCHITECTURE.md", "README.md"):
        text = open(os.path.join(ROOT, doc)).read()
        for m in PATH_RE.finditer(text):
            raw = m.group(1)
            if "<" in raw or "*" in raw or raw.startswith(("http", "~", "/", "-")):
                continue
            for p in expand(raw):
                if not exists(p):
                    problems.append(f"{doc} names `{p}`, which does not exist")
        tree = "\n".join(f for f in fences(text) if "Cargo.toml" in f)
        for c in crates:
            if not re.search(rf"^{re.escape(c)}/", tree, flags=re.M):
                problems.append(f"{doc}'s layout tree does not list the crate {c}/")


def main():
    problems = []
    check_imports(problems)
    check_lengths(problems)
    check_docs(problems)
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"check-tree: {len(members())} crates: no import circle, no file over {MAX_LINES} lines, docs name real paths")


if __name__ == "__main__":
    main()
