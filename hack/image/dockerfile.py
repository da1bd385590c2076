"""The final stage of a Dockerfile, as hack/image.sh check compares it with the image it builds:
KEY<TAB>VALUE lines for ENTRYPOINT (the command as one line), USER, EXPOSE (one port a line, /tcp unless
a protocol is given), COPY (the destination), LABEL and ENV (one KEY=VALUE a line).

    dockerfile.py DOCKERFILE

Tests: python3 -m unittest discover -s hack/image
"""

import json
import shlex
import sys


def instructions(lines):
    """The instructions of a Dockerfile given as its lines (an open file will do), one string each:
    comment lines dropped (also inside a continued instruction, as Docker does), backslash continuations
    joined, blank lines skipped."""
    out, cur = [], ""
    for raw in lines:
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def final_stage(lines):
    """The (KEY, VALUE) pairs of the last stage (from its FROM on) of the Dockerfile of `lines`."""
    final = []
    for line in instructions(lines):
        if line.split()[0].upper() == "FROM":
            final = []
        final.append(line)
    out = []
    for line in final:
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "ENTRYPOINT":
            argv = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
            out.append(("ENTRYPOINT", " ".join(argv)))
        elif word == "USER":
            out.append(("USER", rest))
        elif word == "EXPOSE":
            out.extend(("EXPOSE", p if "/" in p else p + "/tcp") for p in rest.split())
        elif word == "COPY":
            out.append(("COPY", shlex.split(rest)[-1]))
        elif word in ("LABEL", "ENV"):
            out.extend((word, kv) for kv in shlex.split(rest))
    return out


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: dockerfile.py DOCKERFILE")
    with open(argv[0]) as f:
        for key, value in final_stage(f):
            print(key + "\t" + value)


if __name__ == "__main__":
    main(sys.argv[1:])
