#!/usr/bin/env python3
"""check-includes.py: the include graph of kvserve's modules, checked (the ctest test include_graph).

Derives from the sources, with no build:
  1. the arrows between modules: a file of module A that includes a header of module B is an arrow A -> B. The
     modules are the top-level folders (common, cache, engine, cuda, template, grammar, server, tools) and
     server's subfolders (server/http, server/api, server/sched, server/obs), whose parent `server` is then only
     serve.c, config.c and server.h. A circle among them fails.
  2. server's folders: each has one public header named after it (server/api/api.h ...); every other header of
     the folder is private, named *_internal.h, and included only by the folder's own files (and by tests/,
     fuzz/ and bench/, which test internals).
  3. inside server/api/: the arrows between its files, file A -> file B when A calls (or names) a function that B
     defines and exports. A circle among them fails: routes depend downward only, onto the two low-level files
     (api_call.c, api_base.c) that every route uses.
  4. server's names (docs/DEVELOPERS.md): a function that server/<folder>/<name>.c exports is named
     srv_<name>_* (or srv_<name> itself); a file named <folder>_<part>.c (api/api_parse.c, sched/sched_core.c) is
     a part of the folder's own object and exports srv_<folder>_* or, to its folder only, <folder>_*. At the top
     of server/, config.c exports srv_config_* and serve.c srv_main.
Prints the module arrows and exits 0 when everything holds; otherwise prints each failure and exits 1.
-v also prints the file arrows of every server folder (circles outside server/api/ are reported, not failed).
"""
import argparse
import os
import re
import sys

MODULES = ["common", "cache", "engine", "cuda", "template", "grammar", "server", "tools"]
SERVER_FOLDERS = ["http", "api", "sched", "obs"]
EXEMPT = ["tests", "fuzz", "bench"]  # white-box tests may include private headers
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cpp")
STRICT_UNIT_FOLDERS = ["server/api"]  # folders whose file graph must have no circle

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sources(root, top):
    out = []
    base = os.path.join(root, top)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in ("node_modules",) and not d.startswith("build"))
        for f in sorted(filenames):
            if f.endswith(SOURCE_EXT):
                out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return out


def module_of(path):
    parts = path.split("/")
    if parts[0] not in MODULES:
        return None
    if parts[0] == "server" and len(parts) > 2 and parts[1] in SERVER_FOLDERS:
        return "server/" + parts[1]
    return parts[0]


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    out = []
    for m in INCLUDE_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((m.group(1), line))
    return out


def find_cycles(nodes, edges):
    """Strongly connected components with more than one node (or a self-loop), each as a sorted list."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


# ---- C text: comments and literals out, definitions and uses of functions --------------------------------------
def strip_c(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def defined_functions(code):
    """Names of the functions the file defines, as (name, exported) pairs (exported: not static)."""
    out = []
    depth, i, n = 0, 0, len(code)
    decl_start = 0
    # preprocessor lines do not define functions
    code = re.sub(r"^[ \t]*#.*?(?<!\\)$", lambda m: " " * len(m.group(0)), code, flags=re.M | re.S)
    while i < n:
        c = code[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                decl_start = i + 1
        elif c == ";" and depth == 0:
            decl_start = i + 1
        elif depth == 0 and (c.isalpha() or c == "_"):
            m = IDENT_RE.match(code, i)
            name = m.group(0)
            j = m.end()
            while j < n and code[j].isspace():
                j += 1
            if j < n and code[j] == "(":
                k, par = j, 0
                while k < n:
                    if code[k] == "(":
                        par += 1
                    elif code[k] == ")":
                        par -= 1
                        if par == 0:
                            break
                    k += 1
                k += 1
                while k < n and code[k].isspace():
                    k += 1
                if k < n and code[k] == "{":
                    prefix = code[decl_start:i]
                    out.append((name, not re.search(r"\bstatic\b", prefix)))
                    depth += 1
                    i = k + 1
                    continue
            i = j
            continue
        i += 1
    return out


def unit_graph(root, folder):
    """File arrows inside a folder: A -> B when A names a function B defines and exports."""
    files = [f for f in sources(root, folder) if f.endswith(".c") and os.path.dirname(f) == folder]
    code = {}
    exports = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            code[f] = strip_c(fh.read())
        for name, exported in defined_functions(code[f]):
            if exported:
                exports[name] = f
    edges = {f: {} for f in files}
    for f in files:
        for name in set(IDENT_RE.findall(code[f])):
            owner = exports.get(name)
            if owner and owner != f:
                edges[f].setdefault(owner, []).append(name)
    return files, edges


def name_ok(path, name):
    """Whether an exported function's name agrees with its file's name (check 4)."""
    parts = path.split("/")
    stem = os.path.splitext(parts[-1])[0]
    if len(parts) == 2:  # the top of server/
        return {"serve": name == "srv_main"}.get(stem, name.startswith("srv_%s_" % stem))
    prefixes = ["srv_%s_" % stem, "srv_%s" % stem]
    if stem.startswith(parts[1] + "_"):  # api/api_parse.c: a part of srv_api
        prefixes += ["srv_%s_" % parts[1], "%s_" % parts[1]]
    return any(name == pre or (pre.endswith("_") and name.startswith(pre)) for pre in prefixes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    root = args.root
    failures = []

    # 1. module arrows
    arrows = {}  # (A, B) -> first "file:line"
    files = [f for top in MODULES for f in sources(root, top)]
    exempt_files = [f for top in EXEMPT for f in sources(root, top)]
    existing = set(files) | set(exempt_files)
    for f in files:
        a = module_of(f)
        for inc, line in includes(root, f):
            if inc not in existing:
                continue
            b = module_of(inc)
            if b and b != a:
                arrows.setdefault((a, b), "%s:%d" % (f, line))
    nodes = {module_of(f) for f in files}
    edges = {}
    for (a, b) in arrows:
        edges.setdefault(a, set()).add(b)
    for comp in find_cycles(nodes, edges):
        lines = ["  %s -> %s (%s)" % (a, b, where) for (a, b), where in sorted(arrows.items())
                 if a in comp and b in comp]
        failures.append("a circle of includes between modules %s:\n%s" % (", ".join(comp), "\n".join(lines)))

    # 2. server's folders: one public header each, private headers named *_internal.h and kept inside
    for sub in SERVER_FOLDERS:
        folder = "server/" + sub
        headers = [f for f in sources(root, folder) if f.endswith(".h") and os.path.dirname(f) == folder]
        public = "%s/%s.h" % (folder, sub)
        if os.path.isdir(os.path.join(root, folder)) and public not in headers:
            failures.append("%s has no public header %s" % (folder, public))
        for h in headers:
            if h != public and not h.endswith("_internal.h"):
                failures.append("%s: a private header of %s must be named *_internal.h (the public one is %s)"
                                % (h, folder, public))
    for f in files + exempt_files:
        if f.split("/")[0] in EXEMPT:
            continue
        for inc, line in includes(root, f):
            parts = inc.split("/")
            if len(parts) == 3 and parts[0] == "server" and parts[1] in SERVER_FOLDERS and \
                    parts[2] != parts[1] + ".h" and not f.startswith("server/%s/" % parts[1]):
                failures.append("%s:%d includes %s, a private header of server/%s/" % (f, line, inc, parts[1]))

    # 3. file arrows inside server's folders
    for sub in SERVER_FOLDERS:
        folder = "server/" + sub
        if not os.path.isdir(os.path.join(root, folder)):
            continue
        ufiles, uedges = unit_graph(root, folder)
        cycles = find_cycles(set(ufiles), {a: set(b) for a, b in uedges.items()})
        for comp in cycles:
            lines = ["  %s -> %s (%s)" % (a, b, ", ".join(sorted(set(uedges[a][b]))[:4]))
                     for a in comp for b in sorted(uedges[a]) if b in comp]
            msg = "a circle between the files of %s: %s\n%s" % (folder, ", ".join(comp), "\n".join(lines))
            if folder in STRICT_UNIT_FOLDERS:
                failures.append(msg)
            elif args.verbose:
                print("note: " + msg)
        if args.verbose:
            print("%s:" % folder)
            for a in ufiles:
                if uedges[a]:
                    print("  %s -> %s" % (os.path.basename(a), ", ".join(os.path.basename(b) for b in sorted(uedges[a]))))

    # 4. server's names
    for f in sources(root, "server"):
        if not f.endswith(".c"):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            defs = defined_functions(strip_c(fh.read()))
        for name, exported in defs:
            if exported and not name_ok(f, name):
                failures.append("%s exports %s: a name that does not agree with the file's (docs/DEVELOPERS.md)"
                                % (f, name))

    print("module arrows:")
    for (a, b) in sorted(arrows):
        print("  %s -> %s" % (a, b))
    if failures:
        for msg in failures:
            print("FAIL: " + msg)
        return 1
    print("include graph: no circle between modules or inside server/api/; private headers stay in their folder; "
          "server's names agree with their files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
