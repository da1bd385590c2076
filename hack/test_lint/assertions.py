"""Fails when a test function of the e2e crate can pass without checking anything.

A test "checks" when its body asserts (`assert!`, `assert_eq!`, `assert_ne!`, `panic!`, `unreachable!`,
`.expect(`, `.unwrap_or_else(|` with a panic) or calls a function that does, directly or through other
functions: the helpers of `e2e/src` and the test files are scanned the same way, and a function counts
as asserting once any function it calls by name does. Names are matched as words followed by `(` or
`::<`, which over-approximates calls (a same-named function elsewhere counts) but never misses one, so
the check errs towards passing a test, never towards failing a sound one.

    python3 hack/test_lint/assertions.py [ROOT]      (ROOT: the e2e crate, default e2e/)

Exceptions are listed in EXCEPTIONS with the reason each test may hold no assertion.
"""

import os
import re
import sys

# test function name -> why it needs no assertion of its own.
EXCEPTIONS = {}

TEST_ATTR = re.compile(r"#\[(?:tokio::)?test\b[^\]]*\]")
FN_HEAD = re.compile(r"\b(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")
ASSERTS = re.compile(
    r"\b(?:assert|assert_eq|assert_ne|debug_assert|panic|unreachable|todo|unimplemented)!"
    r"|\.expect(?:_err)?\(|\.unwrap\(|\.unwrap_err\(|\bunwrap_or_else\(\s*\|[^|]*\|\s*panic!"
)
CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(|::<)")


def strip_comments_and_strings(src):
    """`src` with comments and the contents of string and char literals blanked, so a brace or a
    word inside them counts for nothing; lengths and line breaks are kept."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            hashes = re.match(r"r(#*)\"", src[i:]).group(1)
            end = src.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", src[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('"' + re.sub(r"[^\n]", " ", src[i + 1:j]) + '"')
            i = j + 1
        elif c == "'" and re.match(r"'(?:\\.|[^\\'])'", src[i:i + 4] + "  "):
            m = re.match(r"'(?:\\.[^']*|[^\\'])'", src[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(src):
    """Every `fn` in `src` (already stripped): (name, body, is_test), the body between its braces."""
    found = []
    for m in FN_HEAD.finditer(src):
        start = src.find("{", m.end())
        semi = src.find(";", m.end())
        if start < 0 or (0 <= semi < start):
            continue  # a declaration without a body (a trait's)
        depth, j = 0, start
        while j < len(src):
            if src[j] == "{":
                depth += 1
            elif src[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        head = src[max(0, m.start() - 200):m.start()]
        attrs = TEST_ATTR.findall(head)
        is_test = bool(attrs) and not re.search(r"\bfn\b|[;}]\s*$", head[head.rfind(attrs[-1]):])
        found.append((m.group(1), src[start:j + 1], is_test))
    return found


def unchecked_tests(sources):
    """Names of the test functions in `sources` (path -> text) that check nothing, with their path."""
    fns = []
    for path, text in sources.items():
        for name, body, is_test in functions(strip_comments_and_strings(text)):
            fns.append((path, name, body, is_test))
    asserting = {name for _, name, body, _ in fns if ASSERTS.search(body)}
    calls = {}
    for _, name, body, _ in fns:
        calls.setdefault(name, set()).update(CALL.findall(body))
    changed = True
    while changed:
        changed = False
        for name, called in calls.items():
            if name not in asserting and called & asserting:
                asserting.add(name)
                changed = True
    return sorted((path, name) for path, name, body, is_test in fns
                  if is_test and not ASSERTS.search(body) and not (set(CALL.findall(body)) & asserting)
                  and name not in EXCEPTIONS)


def read_sources(root):
    sources = {}
    for d, _, files in os.walk(root):
        if "target" in d.split(os.sep):
            continue
        for f in files:
            if f.endswith(".rs"):
                p = os.path.join(d, f)
                with open(p, encoding="utf-8") as fh:
                    sources[p] = fh.read()
    return sources


def main(argv):
    root = argv[0] if argv else "e2e"
    sources = read_sources(root)
    tests = sum(1 for t in sources.values() for _, _, is_test in functions(strip_comments_and_strings(t)) if is_test)
    bad = unchecked_tests(sources)
    for path, name in bad:
        print(f"{path}: test {name} asserts nothing and calls no function that asserts", file=sys.stderr)
    if tests == 0:
        print(f"no test functions found under {root}: the check itself is broken", file=sys.stderr)
        return 1
    print(f"{tests} test functions under {root}; {len(bad)} check nothing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
