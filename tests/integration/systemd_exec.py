#!/usr/bin/env python3
"""systemd_exec.py: start a unit's ExecStart as systemd would, without systemd.

  systemd_exec.py UNIT INSTANCE --state DIR --logs DIR --etc DIR --creds DIR [--show KEY]

Reads UNIT (a template such as downpour-ps@.service) and its drop-ins
(UNIT.d/*.conf beside it, in name order) for the instance INSTANCE and
applies systemd's rules for what its [Service] uses:
  - line continuations (a trailing backslash) and comments (# ;);
  - specifiers %i / %I (the instance), %S and %L (the roots of
    StateDirectory= and LogsDirectory=: --state, --logs), %d (the
    credentials directory: --creds), %%; any other specifier is an error,
    so a unit that starts using one fails here;
  - LoadCredential=ID:PATH: PATH copied to --creds/ID, mode 0400;
  - Environment= (quoted assignments), then each EnvironmentFile= in order
    ("-" before the path: optional), later ones overriding earlier ones;
    paths under /etc (there, in LoadCredential= and in the command's
    arguments) are read under --etc;
  - ExecStart= split into words (quotes honoured), then "${VAR}" anywhere in
    a word replaced by the value as one argument, and "$VAR" as a word of its
    own replaced by the value split at blanks (zero or more arguments);
  - StateDirectory= and LogsDirectory= made under their roots.
Then prints the command line (one line, each argument in brackets) and
execs it with that environment. --show KEY prints the [Service] KEY's value
(after specifiers) instead, e.g. SuccessExitStatus.
"""
import glob
import os
import re
import shlex
import shutil
import sys


def read_unit(path, sections=None):
    """{section: [(key, value)]}, continuations joined; adds to sections."""
    sections, cur, buf = sections if sections is not None else {}, None, ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and line.lstrip().startswith(("#", ";")):
                continue
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            line, buf = (buf + line).strip(), ""
            if not line:
                continue
            if line.startswith("[") and line.endswith("]"):
                cur = sections.setdefault(line[1:-1], [])
                continue
            key, sep, value = line.partition("=")
            if not sep or cur is None:
                sys.exit(f"systemd_exec: {path}: not a Key=Value line: {line}")
            cur.append((key.strip(), value.strip()))
    return sections


def specifiers(s, spec):
    def one(m):
        c = m.group(1)
        if c not in spec:
            sys.exit(f"systemd_exec: specifier %{c} is not supported here")
        return spec[c]
    return re.sub(r"%(.)", one, s)


def read_env_file(path, env):
    """systemd's EnvironmentFile= syntax: KEY=VALUE lines, # ; comments,
    optional quotes around the value."""
    with open(path) as f:
        text = f.read().replace("\\\n", "")
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            sys.exit(f"systemd_exec: {path}:{n}: not KEY=VALUE: {line}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value


def expand_word(word, env):
    m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if m:
        return env.get(m.group(1), "").split()
    if re.search(r"\$(?!\{)", word):
        sys.exit(f"systemd_exec: unbraced $ inside the word {word!r}: systemd does not expand it")
    return [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word)]


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    unit, instance = argv[1], argv[2]
    opts = dict(zip(argv[3::2], argv[4::2]))
    spec = {"i": instance, "I": instance, "S": opts["--state"], "L": opts["--logs"],
            "d": opts["--creds"], "%": "%"}
    sections = read_unit(unit)
    for conf in sorted(glob.glob(unit + ".d/*.conf")):
        read_unit(conf, sections)
    service = sections.get("Service", [])
    if "--show" in opts:
        print(" ".join(specifiers(v, spec) for k, v in service if k == opts["--show"]))
        return 0
    env, files, exec_start = {}, [], None
    for key, value in service:
        value = specifiers(value, spec)
        if key == "Environment":
            for a in shlex.split(value):
                k, _, v = a.partition("=")
                env[k] = v
        elif key == "EnvironmentFile":
            files.append(value)
        elif key == "ExecStart":
            exec_start = value
        elif key == "LoadCredential":
            cid, _, path = value.partition(":")
            if path.startswith("/etc/"):
                path = os.path.join(opts["--etc"], path[len("/etc/"):])
            os.makedirs(opts["--creds"], exist_ok=True)
            dst = os.path.join(opts["--creds"], cid)
            if os.path.exists(dst):
                os.chmod(dst, 0o600)
            shutil.copyfile(path, dst)  # a missing one: systemd would not start the unit
            os.chmod(dst, 0o400)
        elif key in ("StateDirectory", "LogsDirectory"):
            root = opts["--state"] if key == "StateDirectory" else opts["--logs"]
            for d in value.split():
                os.makedirs(os.path.join(root, d), exist_ok=True)
    for path in files:
        optional = path.startswith("-")
        path = path.lstrip("-")
        if path.startswith("/etc/"):
            path = os.path.join(opts["--etc"], path[len("/etc/"):])
        if os.path.exists(path):
            read_env_file(path, env)
        elif not optional:
            sys.exit(f"systemd_exec: EnvironmentFile {path} is missing (systemd would not start the unit)")
    if not exec_start:
        sys.exit(f"systemd_exec: {unit}: no ExecStart=")
    words = shlex.split(exec_start)
    argv_out = [w2 for w in words for w2 in expand_word(w, env)]
    argv_out = [os.path.join(opts["--etc"], a[len("/etc/"):]) if a.startswith("/etc/") else a
                for a in argv_out]
    argv_out[0] = argv_out[0].lstrip("-@+!:")
    print("systemd_exec: " + " ".join(f"[{a}]" for a in argv_out), flush=True)
    os.execve(argv_out[0], argv_out, {**{"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **env})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
