#!/usr/bin/env python3
"""scan_commands.py: the commands the project's shell scripts run, each
checked against the Debian packages a fresh machine has once the project's
own files installed what they install.

A fresh machine is a minbase Debian (every package of priority "required",
every Essential one) with make, gcc, libc6-dev, git and ca-certificates added
(README's promise); `make test` then installs the Makefile's lists. A command
that resolves here to a file of any other package (a tool installed by hand
once, as bc was) works on a developer's machine and fails on the next one:
this scan names it, the script and the line.

Usage: scan_commands.py PACKAGES... -- SCRIPTS...
  PACKAGES: what the project installs (the Makefile's lists: make deps-list)
Prints one line per command outside them and exits 1; exits 0 when none.

How a command is found: each line of a script is cut at the shell's command
separators (; & | && || ( ) { } $( ` and the keywords that start a command);
the first word of each piece, past variable assignments and the wrappers that
run their arguments (timeout, env, check, ...), is a command when it names an
executable on the system PATH and is neither a shell builtin nor a function
the scripts define. A heuristic, not a shell parser: it reads what the
scripts write plainly (a command in a variable is not seen), which is how
the scripts here call the system's tools.
"""
import os
import re
import subprocess
import sys

# The fresh machine's own additions to a minbase Debian (README).
BASE_ADDED = ["make", "gcc", "libc6-dev", "git", "ca-certificates"]
# Commands called only behind a `command -v` guard that skips without them:
# optional by design, each with where it is guarded.
OPTIONAL = {
    "lintian": "test_deb.sh: a lint pass when present",
    "nvidia-smi": "tests/gpu/run.sh: only on a GPU machine",
    "compute-sanitizer": "tests/gpu/run.sh: only on a GPU machine",
}
# Wrappers whose arguments are a command: how many words (after options)
# precede it. check NAME CMD...; timeout [opts] N CMD...; env [VAR=x] CMD.
WRAPPERS = {"timeout": 1, "env": 0, "check": 1, "bg": 0, "exec": 0, "nice": 0,
            "setpriv": 0, "nsenter": 0, "sudo": 0, "time": 0, "xargs": 0,
            "command": 0, "stdbuf": 0, "ionice": 0, "unshare": 0}
# Where a command is looked up: the system's directories (a fresh machine's
# PATH less /usr/local); DP_SCAN_PATH replaces it (the test's own tools).
SYSTEM_PATH = os.environ.get("DP_SCAN_PATH", "/usr/sbin:/usr/bin:/sbin:/bin").split(":")
KEYWORDS_BEFORE_COMMAND = {"then", "do", "else", "elif", "if", "while", "until", "!", "time"}


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def installed_packages():
    """name -> (depends fields, essential, priority) of every installed package."""
    out = run("dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Priority}\t${Provides}\t"
              "${Depends}, ${Pre-Depends}\n")
    pkgs, provides = {}, {}
    for line in out.splitlines():
        name, ess, prio, prov, deps = (line.split("\t") + [""] * 5)[:5]
        pkgs[name] = (deps, ess == "yes", prio)
        for p in prov.split(","):
            p = p.strip().split(" ")[0]
            if p:
                provides.setdefault(p, set()).add(name)
    return pkgs, provides


def closure(roots, pkgs, provides):
    """Every installed package the roots depend on (Depends, Pre-Depends),
    every installed alternative of an "a | b" counted."""
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop().split(":")[0]
        for name in [p] + sorted(provides.get(p, ())):
            if name in seen or name not in pkgs:
                continue
            seen.add(name)
            for dep in re.split(r"[,|]", pkgs[name][0]):
                dep = dep.strip().split(" ")[0]
                if dep:
                    todo.append(dep)
    return seen


def file_owners():
    """path -> package, from dpkg's file lists (one read, not a dpkg -S a command)."""
    owners = {}
    info = "/var/lib/dpkg/info"
    for name in os.listdir(info):
        if name.endswith(".list"):
            pkg = name[:-5].split(":")[0]
            with open(os.path.join(info, name), errors="replace") as f:
                for line in f:
                    owners.setdefault(line.rstrip("\n"), pkg)
    return owners


def owner(path, owners):
    """The package that installed PATH (its link's target and /usr-merged twin tried too)."""
    cands = [path, os.path.realpath(path)]
    for c in list(cands):
        for a, b in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
            if c.startswith(a):
                cands.append(b + c[len(a):])
            elif c.startswith(b):
                cands.append(a + c[len(b):])
    for c in cands:
        if c in owners:
            return owners[c]
    return None


def which(word):
    for d in SYSTEM_PATH:
        p = os.path.join(d, word)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def without_heredocs(lines):
    """LINES with each here-document's body blanked (data, not commands)."""
    out, end = [], None
    for line in lines:
        if end is not None:
            out.append("")
            if line.strip() == end:
                end = None
            continue
        m = re.search(r"(?<!<)<<-?(?!<)\s*['\"]?([A-Za-z_]+)", line)
        if m:
            end = m.group(1)
        out.append(line)
    return out


def masked(text):
    """TEXT with what is never a command blanked: comments, single-quoted
    strings (an awk or python program) and the plain text of double-quoted
    ones; a $(...) keeps its commands wherever it stands. Newlines are kept,
    so line numbers hold."""
    out, stack, prev, i = [], [None], "\n", 0
    blank = lambda c: c if c == "\n" else " "
    while i < len(text):
        ch, top = text[i], stack[-1]
        if top == "'":
            out.append(blank(ch))
            if ch == "'":
                stack.pop()
        elif top == "#":
            out.append(blank(ch))
            if ch == "\n":
                stack.pop()
        elif ch == "\\":
            out.append(text[i:i + 2] if top != '"' else blank(text[i]) + blank(text[i + 1:i + 2]))
            i += 1
        elif top == '"':
            if ch == '"':
                stack.pop()
                out.append(ch)
            elif text.startswith("$(", i):
                stack.append("(")
                out.append("$(")
                i += 1
            else:
                out.append(blank(ch))
        elif ch in "'\"":
            stack.append(ch)
            out.append(" " if ch == "'" else ch)
        elif ch == "#" and prev in " \t\n;(":
            stack.append("#")
            out.append(" ")
        else:
            if ch == "(":
                stack.append("(")
            elif ch == ")" and top == "(":
                stack.pop()
            out.append(ch)
        prev = ch
        i += 1
    return "".join(out)


def command_words(line):
    """The first word of each command on LINE, wrappers looked through."""
    # An arithmetic $((...)) or a parameter ${...} is a word, not a command.
    line = re.sub(r"\$\(\([^()]*\)\)", " X ", line)
    line = re.sub(r"\$\{[^{}]*\}", "X", line)
    pieces = re.split(r"\$\(|`|&&|\|\||[;&|(){}]", line)
    for piece in pieces:
        words = piece.split()
        while words and (words[0] in KEYWORDS_BEFORE_COMMAND or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            words = words[1:]
        while words and words[0] in WRAPPERS:
            skip = WRAPPERS[words[0]]
            words = words[1:]
            while words and (words[0].startswith("-") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
                words = words[1:]
            if skip and words and words[0][:1] in ("'", '"'):  # check's quoted NAME
                q = words[0][0]
                while words and not (words[0].endswith(q) and len(words[0]) > 1):
                    words = words[1:]
                words, skip = words[1:], skip - 1
            words = words[max(skip, 0):]
        if words:
            yield words[0]


def main(argv):
    sep = argv.index("--")
    wanted, scripts = argv[:sep], argv[sep + 1:]
    pkgs, provides = installed_packages()
    base = [n for n, (_, ess, prio) in pkgs.items() if ess or prio == "required"]
    allowed = closure(base + BASE_ADDED + wanted, pkgs, provides)
    builtins = set(run("bash", "-c", "compgen -b; compgen -k").split())
    functions = set()
    texts = {}
    for s in scripts:
        with open(s, errors="replace") as f:
            texts[s] = masked("\n".join(without_heredocs(f.read().splitlines()))).splitlines()
        for line in texts[s]:
            m = re.match(r"^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)", line)
            if m:
                functions.add(m.group(1))
    owners = file_owners()
    bad, seen = [], {}
    for s, lines in texts.items():
        for n, line in enumerate(lines, 1):
            for word in command_words(line):
                if not re.match(r"^[A-Za-z0-9_.+-]+$", word) or word in builtins or word in functions:
                    continue
                path = which(word)
                if path is None:
                    continue
                if word not in seen:
                    seen[word] = owner(path, owners)
                pkg = seen[word]
                if word in OPTIONAL or (pkg and pkg in allowed):
                    continue
                bad.append(f"{s}:{n}: {word} ({path}, package {pkg or 'none'}) is not installed by the "
                           f"project's files: add its package to the Makefile's lists or stop using it")
    for b in bad:
        print(b)
    print(f"scanned {len(scripts)} scripts: {len(seen)} system commands, {len(bad)} outside "
          f"what the project installs ({len(allowed)} packages allowed)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
