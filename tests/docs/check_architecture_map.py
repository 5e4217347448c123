#!/usr/bin/env python3
"""The docs test: docs/architecture.md is a map of the code, and stays one.

Fails (exit 1, each problem on a line of its own) when
  1. a path that docs/architecture.md, docs/fsd.md, docs/core.md or docs/glossary.md
     names in backticks does not exist (a repo path: its first component is a folder
     or file at the top of the repo; `a/{b,c}.cpp` is expanded; a bare file name
     such as `txn.cpp` in a table row is taken in the folder of the row's last path,
     elsewhere it must be the name of some file of the product folders);
  2. a product source file (every file git tracks under core/, remote/, fsd/,
     loader/, cli/, gui/ with a source suffix, SOURCE_EXT) is not named in the layout table
     (architecture.md, section "Layout");
  3. a thread the code starts is not in the threads table (architecture.md,
     section "Threads"), or a row of that table names a start that is not there.
     A start is a line of product code with `std::thread(`/`std::jthread(`, a
     `std::thread name(...)` local, `emplace_back(` on a vector of threads,
     `pthread_create(`, `std::async(` or `fuse_session_loop_mt(` (libfuse's
     workers). It is named by its file and a tag: the function a one-line lambda
     calls (`run_fetcher`), else the `&Class::method` it runs, else the variable or vector it is stored in
     (`m_trainer`, `redoers`), else the function that starts
     it. A row's "started in" cell holds the file and the tag in backticks;
  3b. a mutex declared with KCACHE_LEVEL(n) is not named (by itself or its class) in
     the row of level n of the locks table (architecture.md, section "Locks");
  4. a markdown link between the docs (README.md, docs/*.md, bench/README.md) points
     to a file or a #section that is not there, or a text anywhere in the tree says
     `architecture.md, "Section"` (or fsd.md, core.md, glossary.md) and that doc has
     no such heading (architecture.md's table "Moved" counts as headings).

Usage: check_architecture_map.py [REPO_ROOT]
"""

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
PRODUCT = ["core", "remote", "fsd", "loader", "cli", "gui"]
MAP_DOCS = ["docs/architecture.md", "docs/fsd.md", "docs/core.md", "docs/glossary.md"]
SOURCE_EXT = (".cpp", ".hpp", ".h", ".c", ".cc", ".cu", ".cuh", ".inl", ".in", ".txt")
SKIP_DIRS = {"build", ".git", "__pycache__", ".venv"}

problems = []


def problem(msg):
    problems.append(msg)


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def walk(folder):
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            out.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return out


def exists(rel):
    return os.path.exists(os.path.join(ROOT, rel.rstrip("/")))


_product = None


def product_files():
    """The product's source files: those git tracks (what a clone has; a file being
    written is checked once it is added), or every file on disk outside git."""
    global _product
    if _product is None:
        try:
            out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--"] + PRODUCT,
                                 capture_output=True, check=True).stdout.decode()
            candidates = [f for f in out.split("\0") if f and exists(f)]
        except (OSError, subprocess.CalledProcessError):
            candidates = [f for folder in PRODUCT for f in walk(folder)]
        _product = sorted(f for f in candidates if f.endswith(SOURCE_EXT)
                          and not os.path.basename(f).startswith("."))
    return _product


TOP = set(os.listdir(ROOT)) - SKIP_DIRS


def expand(token):
    """`a/{b,c}.cpp` -> [a/b.cpp, a/c.cpp]"""
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += expand(token[:m.start()] + alt + token[m.end():])
    return out


def backticked(text):
    return re.findall(r"`([^`\n]+)`", text)


def looks_like_path(tok):
    if re.search(r"[\s<>*$|\"']", tok) or tok.startswith(("/", "~", "-")):
        return False
    first = tok.split("/")[0]
    return "/" in tok and first in TOP


BARE = re.compile(r"^[\w.+-]+\.(cpp|hpp|h|c|cc|cu|py|sh|md|txt|in)$")
basenames = {}
for f in product_files():
    basenames.setdefault(os.path.basename(f), []).append(f)


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("|")]


def section(text, title, doc):
    """The text of the `## title...` section (to the next heading of its level)."""
    m = re.search(r"^(#+) " + re.escape(title) + r".*$", text, re.M)
    if not m:
        problem(f"{doc}: no section \"{title}\"")
        return ""
    level = len(m.group(1))
    rest = text[m.end():]
    end = re.search(r"^#{1,%d} " % level, rest, re.M)
    return rest[:end.start()] if end else rest


# 1. Every path a map doc names exists.
def check_paths(doc):
    text = read(doc)
    for line in text.splitlines():
        last_dir = None
        for tok in backticked(line):
            tok = tok.strip().rstrip(".,:;")
            tok = re.sub(r"\(\)$", "", tok)
            if looks_like_path(tok):
                for p in expand(tok):
                    if not exists(p):
                        problem(f"{doc}: names `{p}`, which does not exist")
                    last_dir = p.rstrip("/") if p.endswith("/") else os.path.dirname(p)
            elif BARE.match(tok) or (re.search(r"\{", tok) and BARE.match(expand(tok)[0])):
                for p in expand(tok):
                    if line.startswith("|") and last_dir is not None:
                        if not exists(os.path.join(last_dir, p)):
                            problem(f"{doc}: names `{p}` after `{last_dir}/`, and "
                                    f"{last_dir}/{p} does not exist")
                    elif p not in basenames and not exists(p) and not exists("docs/" + p):
                        problem(f"{doc}: names `{p}`, which is no file of the product")


# 2. Every product file is in the layout table.
def named_in(text):
    """Every path a block of table rows names, bare names resolved as in check_paths."""
    named = set()
    for line in table_rows(text):
        last_dir = None
        for tok in backticked(line):
            tok = tok.strip().rstrip(".,:;")
            if looks_like_path(tok):
                for p in expand(tok):
                    named.add(p.rstrip("/"))
                    last_dir = p.rstrip("/") if p.endswith("/") else os.path.dirname(p)
            elif last_dir is not None and (BARE.match(tok) or "{" in tok):
                for p in expand(tok):
                    named.add(os.path.normpath(os.path.join(last_dir, p)))
    return named


def check_layout(arch):
    layout = section(arch, "Layout", "docs/architecture.md")
    named = named_in(layout)
    for f in product_files():
        if f not in named:
            problem(f"docs/architecture.md, \"Layout\": {f} is not in the table")


# 3. Threads.
VECTOR_OF_THREADS = re.compile(r"std::vector<std::j?thread>\s+(\w+)")
STARTS = [
    re.compile(r"\bstd::j?thread\s*\("),
    re.compile(r"\bstd::j?thread\s+\w+\s*[({]"),
    re.compile(r"\bpthread_create\s*\("),
    re.compile(r"\bstd::async\s*\("),
    re.compile(r"\bfuse_session_loop_mt\s*\("),
]
ONE_LINE_BODY = re.compile(r"\{\s*(?:\w+(?:->|\.))?(\w+)\([^;{}]*\);\s*\}")
FUNCTION_START = re.compile(
    r"^(?!namespace\b|struct\b|class\b|enum\b|using\b|template\b|static_assert\b|"
    r"return\b|if\b|for\b|while\b|switch\b|//|#|\}|\{)"
    r"\S[^=;]*?([A-Za-z_~][\w:~]*)\s*\(")


def strip_comment(line):
    return re.sub(r"//.*$", "", line)


def thread_starts():
    files = [f for f in product_files() if f.endswith((".cpp", ".hpp", ".h", ".cc", ".cu"))]
    vectors = set()
    for f in files:
        vectors.update(VECTOR_OF_THREADS.findall(read(f)))
    starts = []  # (file, line number, tag)
    for f in files:
        lines = read(f).splitlines()
        for i, raw in enumerate(lines):
            line = strip_comment(raw)
            vec = re.search(r"\b(\w+)(?:\.|->)(?:emplace_back|push_back)\(", line)
            is_start = any(p.search(line) for p in STARTS) or (vec and vec.group(1) in vectors)
            if not is_start:
                continue
            if "fuse_session_loop_mt" in line:
                starts.append((f, i + 1, "fuse_session_loop_mt"))
                continue
            joined = line + " " + " ".join(strip_comment(x).strip() for x in lines[i + 1:i + 2])
            body = ONE_LINE_BODY.search(line)
            assigned = re.search(r"(?:\b|->|\.)(\w+)\s*=\s*std::j?thread\b", line)
            local = re.search(r"\bstd::j?thread\s+(\w+)\s*[({]", line)
            member = re.search(r"&(\w+(?:::\w+)+)", joined)
            if body:
                tag = body.group(1)
            elif member:
                tag = member.group(1)
            elif assigned:
                tag = assigned.group(1)
            elif local:
                tag = local.group(1)
            elif vec and vec.group(1) in vectors:
                tag = vec.group(1)
            else:
                tag = None
                for j in range(i, -1, -1):
                    m = FUNCTION_START.match(lines[j])
                    if m:
                        tag = m.group(1)
                        break
                tag = tag or "?"
            starts.append((f, i + 1, tag))
    return starts


def tag_matches(tag, tokens):
    short = tag.split("::")[-1]
    for t in tokens:
        t = re.sub(r"\(.*\)$", "", t.strip())
        if t == tag or t == short or t.endswith("::" + short) or t.endswith("->" + short) \
                or t.endswith("." + short):
            return True
    return False


def check_threads(arch):
    threads = section(arch, "Threads", "docs/architecture.md")
    rows = [r for r in table_rows(threads) if not re.match(r"^\|[\s|:-]+\|?$", r)]
    if not rows:
        problem("docs/architecture.md, \"Threads\": no table")
        return
    header = [c.strip().lower() for c in rows[0].strip("|").split("|")]
    col = next((k for k, c in enumerate(header) if c.startswith("started in")), None)
    if col is None:
        problem("docs/architecture.md, \"Threads\": the table has no column \"started in\"")
        return
    cells = []  # (file, tokens) per row
    for r in rows[1:]:
        parts = [c.strip() for c in r.strip().strip("|").split("|")]
        if col >= len(parts):
            problem(f"docs/architecture.md, \"Threads\": a row without a \"started in\" cell: {r}")
            continue
        toks = backticked(parts[col])
        paths = [t for t in toks if looks_like_path(t)]
        cells.append((paths[0] if paths else None, [t for t in toks if not looks_like_path(t)], r))
    starts = thread_starts()
    for f, line, tag in starts:
        if not any(p == f and tag_matches(tag, toks) for p, toks, _ in cells):
            problem(f"docs/architecture.md, \"Threads\": the thread started at {f}:{line} "
                    f"(tag `{tag}`) is not in the table (a row with `{f}` and `{tag}` "
                    f"in its \"started in\" cell)")
    for p, toks, r in cells:
        if p is None:
            continue  # a thread the code does not start (a process's main thread)
        if not any(f == p and tag_matches(tag, toks) for f, _, tag in starts):
            problem(f"docs/architecture.md, \"Threads\": a row names a start that is not "
                    f"in {p}: {r.strip()[:120]}")


# 3b. Lock levels: every mutex declared with KCACHE_LEVEL(n) is in the row of level n of
# the locks table, by its name or its class (`Class::name`, `Class`).
LEVELLED = re.compile(r"\bMutex\s+(\w+)\s+KCACHE_LEVEL\((\d)\)")
CLASS = re.compile(r"^\s*(?:class|struct)\s+(\w+)[^;]*$")


def levelled_mutexes():
    found = []  # (file, line, class or None, name, level)
    for f in product_files():
        if not f.endswith((".cpp", ".hpp", ".h")):
            continue
        lines = read(f).splitlines()
        for i, raw in enumerate(lines):
            m = LEVELLED.search(strip_comment(raw))
            if not m or raw.lstrip().startswith("#"):
                continue
            cls = None
            if raw.startswith((" ", "\t")):
                for j in range(i - 1, -1, -1):
                    c = CLASS.match(lines[j])
                    if c and len(lines[j]) - len(lines[j].lstrip()) < len(raw) - len(raw.lstrip()):
                        cls = c.group(1)
                        break
            found.append((f, i + 1, cls, m.group(1), m.group(2)))
    return found


def check_locks(arch):
    locks = section(arch, "Locks", "docs/architecture.md")
    rows = {}
    for r in table_rows(locks):
        cells = [c.strip() for c in r.strip().strip("|").split("|")]
        for level in re.findall(r"\d", cells[0]) if cells else []:
            rows.setdefault(level, []).extend(backticked(r))
    for f, line, cls, name, level in levelled_mutexes():
        toks = [t.strip() for t in rows.get(level, [])]
        ok = any(t == name or t.endswith("::" + name) and (cls is None or t.startswith(cls + "::"))
                 or (cls is not None and (t == cls or t.startswith(cls + "::") and t.endswith(name)))
                 for t in toks)
        if not ok:
            problem(f"docs/architecture.md, \"Locks\": the mutex {name} of level {level} "
                    f"({f}:{line}{', ' + cls if cls else ''}) is not in the row of level {level}")


# 4. Links and section references.
def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(rel):
    text = read(rel)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [re.sub(r"^#+\s*", "", h).strip() for h in re.findall(r"^#+ .*$", text, re.M)]


def moved_titles(arch):
    m = section(arch, "Moved", "docs/architecture.md")
    return re.findall(r'"([^"]+)"', m)


def check_links():
    md = ["README.md", "bench/README.md"] + ["docs/" + f for f in sorted(os.listdir(
        os.path.join(ROOT, "docs"))) if f.endswith(".md")]
    for doc in md:
        text = re.sub(r"^```.*?^```", "", read(doc), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not exists(rel):
                problem(f"{doc}: links to {target}, and {rel} does not exist")
            elif anchor and rel.endswith(".md") and anchor not in {slug(h) for h in headings(rel)}:
                problem(f"{doc}: links to {target}, and {rel} has no such section")


SECTION_REF = re.compile(r"\b(architecture|fsd|core|glossary)\.md[,:]?\s+\"([^\"]+)\"")


def check_section_refs(arch):
    moved = moved_titles(arch)
    titles = {}
    for name in ("architecture", "fsd", "core", "glossary"):
        rel = f"docs/{name}.md"
        titles[name] = headings(rel) if exists(rel) else []
    titles["architecture"] += moved
    scan = ["README.md"] + walk("docs") + walk("bench") + walk("scripts") + walk("tests")
    for folder in PRODUCT:
        scan += walk(folder)
    for rel in scan:
        if rel == "tests/docs/check_architecture_map.py":
            continue  # this file's own examples
        if not rel.endswith((".md", ".cpp", ".hpp", ".h", ".c", ".py", ".sh", ".txt")):
            continue
        try:
            text = read(rel)
        except UnicodeDecodeError:
            continue
        # a reference may be wrapped over a comment's lines
        flat = re.sub(r"\s*\n\s*(?://+|#+|\*)?\s*", " ", text)
        for name, title in SECTION_REF.findall(flat):
            title = title.strip().rstrip(".,")
            if not any(h.lower().startswith(title.lower()) for h in titles[name]):
                problem(f"{rel}: refers to {name}.md, \"{title}\", which has no such section")


def main():
    for doc in MAP_DOCS:
        if not exists(doc):
            problem(f"{doc} is missing")
    if problems:
        print("\n".join(problems))
        return 1
    arch = read("docs/architecture.md")
    for doc in MAP_DOCS:
        check_paths(doc)
    check_layout(arch)
    check_threads(arch)
    check_locks(arch)
    check_links()
    check_section_refs(arch)
    if problems:
        print(f"{len(problems)} problem(s) with the docs' map of the code:")
        print("\n".join(problems))
        return 1
    print(f"docs map: {len(product_files())} product files in the layout table, "
          f"{len(thread_starts())} thread starts in the threads table, "
          f"{len(levelled_mutexes())} levelled mutexes in the locks table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
