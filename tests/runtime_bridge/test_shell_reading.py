"""Which shell commands Pi and Codex run under ``ask`` without a person being asked.

One reading serves both: Pi's bash tool calls (``pi.describe``) and Codex's command approval
requests (``codex.describe_command``, the script inside ``/bin/bash -lc '…'``). A command runs
unasked only when it is plainly read-only programs on literal words; every hostile spelling
below is asked, and the everyday reads stay quiet.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from runtime_bridge import approvals
from runtime_bridge.approvals import ApprovalRequest
from runtime_bridge.providers import codex, pi
from runtime_bridge.shell_reading import literal_commands, reads_only, script_of

# Each once let a command run unasked that writes, deletes or runs something.
BYPASSES = [
    # An unquoted here-document before a quoted one: its body's substitution runs.
    "cat <<A <<'B'\n$(id > f)\nA\nx\nB",
    # ``@P`` expands a value as a prompt, running the substitutions inside it.
    "echo ${BASH_COMMAND@P}",
    "echo '$(touch f)'; echo ${_@P}",
    # Not a descriptor: stdout and stderr into a file named ``2file``.
    "echo hi >&2file",
    # Globs meeting planted files named ``-delete`` and ``--pre=sh``.
    "find . [-]d*",
    "rg x *",
]

HOSTILE = [
    # Command substitution, every spelling.
    "echo $(id > f)",
    "echo `id > f`",
    'echo "$(id > f)"',
    'echo "`id > f`"',
    "echo a$(id)b",
    "cat $(ls)",
    'ls "$(rm x)"/y',
    "echo $(( $(id > f) ))",
    # ANSI-C and locale quoting, arithmetic.
    "find . $'-delete'",
    "echo $'\\x2ddelete'",
    "echo $'\\'; rm -rf x; echo \\''",
    'echo $"x"',
    "echo $((1+1))",
    "echo $[1+1]",
    # Parameter expansion.
    "echo ${x@P}",
    "echo $HOME",
    "echo ${HOME}",
    'echo "$x"',
    "echo ${x:-$(id)}",
    'grep "x\\$y" f',
    # Redirections that write, or open something other than /dev/null.
    "echo x > f",
    "echo x >> f",
    "echo x >| f",
    "echo x &> f",
    "echo x &>> f",
    "echo x 2> f",
    "echo x 1>&2file",
    "echo x >& f",
    "echo x >&-",
    "echo x >&3",
    "cat <> f",
    "cat < f",
    "echo x > /dev/tcp/example.com/80",
    "echo x > /dev/null2",
    "echo x > /dev/null/../../tmp/f",
    "ls {fd}>/dev/null",
    "echo 'a' > f",
    "echo x > /dev/null; rm x",
    # Process substitution.
    "cat <(id > f)",
    "diff <(ls) >(tee f)",
    "cat >(tee f)",
    # Here-documents and here-strings.
    "cat <<EOF\n$(id > f)\nEOF",
    "cat <<'EOF'\nx\nEOF",
    "cat <<< hi",
    "cat <<< $(id)",
    "amux memory upsert a.md <<EOF\n$(id > f)\nEOF",
    "amux memory upsert a.md <<A <<'B'\n$(id > f)\nA\nx\nB",
    "amux memory upsert a.md <<\\EOF\nx\nEOF",
    "amux memory upsert a.md <<'EOF'\nx\nEOF \nrm -rf x\nEOF",
    "amux memory upsert a.md <<'EOF'\nx\nEOF\nrm -rf x",
    "amux memory upsert a.md <<'EOF' && id > f\nx\nEOF",
    "amux memory upsert a.md <<-'EOF'\n\tx\n\tEOF\nrm x",
    "amux memory upsert a.md <<'EOF'\nx",
    "cat <<'EOF'\nx\nEOF\nrm -rf x\nEOF",
    "ls <<'EOF'\nx\nEOF",
    "amux memory show a <<'A'; amux memory show b <<'B'\nx\nA\ny\nB",
    # Globs, braces and tildes in each position.
    "cat *.md",
    "cat ?.md",
    "cat [ab].md",
    "l? -la",
    "/bin/l[s]",
    "find . -name x *",
    "find . -{delete,}",
    "ls {a,b}",
    "ls a{1..3}",
    "ls ~",
    "ls ~/x",
    "cat ~root/.profile",
    "ls x=~/y",
    "ls !(x)",
    # Programs that run others, or are not plain programs.
    "eval ls",
    "exec ls",
    "command ls",
    "builtin echo x",
    "env ls",
    "xargs ls",
    "ls | xargs rm",
    "time ls",
    "nohup ls",
    "source x",
    ". x",
    "sudo ls",
    "bash -c ls",
    "sh -c 'rm x'",
    "coproc ls",
    "/bin/ls",
    "./ls",
    "printf x | sh",
    # Assignments.
    "FOO=x ls",
    "PATH=. ls",
    "export X=1",
    "X=1",
    "local x",
    "declare -x X=1",
    # find, rg, sed and file options that write or run.
    "find . -exec rm {} ;",
    "find . -name x -exec rm {} \\;",
    "find . -name x -exec rm {} ;",
    "find . -execdir id ;",
    "find . -ok id ;",
    "find . -delete",
    "find . -fprint out.txt",
    "find . -fls out.txt",
    "find . '-delete'",
    'find . "-delete"',
    "find . -del''ete",
    'find . -de"le"te',
    "find . -del\\ete",
    "rg --pre sh x",
    "rg --pre=sh x",
    "rg --pre-glob '*' --pre sh x",
    "rg -z x",
    "rg -iz x",
    "rg --search-zip x",
    "rg --hostname-bin=sh x",
    "sed -i s/a/b/ f",
    "sed -n 1p -i f",
    "sed e f",
    "sed -n '1e id' f",
    "sed -n 'w out' f",
    "sed s/a/b/w out f",
    "sed -n '1,2p;w x' f",
    "file -C -m magic",
    "file -bC -m magic",
    "file --compile -m magic",
    # git reads a repository's config, which can name programs it runs.
    "git status",
    "git log --oneline -5",
    "git diff HEAD~1",
    "git -c core.fsmonitor=./x status",
    "git show HEAD",
    "git diff --output=patch.txt",
    "git commit -m x",
    # Aliases.
    "alias ls='rm -rf x'; ls",
    "alias ls=rm",
    # Line continuations.
    "find . -del\\\nete",
    "ls \\\n-la",
    "ls; \\\nrm x",
    # More than one command, one of them not reading.
    "ls\nrm x",
    "ls\n\nid > f",
    "ls\r\nrm x",
    "ls; rm -rf build",
    "ls && rm -rf x",
    "ls || rm -rf x",
    "echo 'a'; rm x",
    'echo "a";rm x',
    "echo 'a'\"b\";id>f",
    "cd /tmp && rm x",
    "cat a | tee b",
    # Backgrounds, groups, subshells, functions, control flow, negation, comments.
    "ls &",
    "ls & rm x",
    "ls |& cat",
    "(ls)",
    "{ ls; }",
    "f() { ls; }; f",
    "! ls",
    "if true; then ls; fi",
    "for x in a; do ls; done",
    "while false; do ls; done",
    "case x in x) ls;; esac",
    "[[ -f x ]]",
    "[ -f x ]",
    "ls # $(id)",
    # Unicode lookalikes and hidden characters.
    "ls\uff1brm x",
    "\uff4c\uff53",
    "ls\u00a0-la",
    "ls\u200b;rm x",
    "ls\u2028rm x",
    "echo x \uff1e f",
    "ls\x00; rm x",
    "ls\x1b[2J",
    # Broken or empty.
    "",
    "   ",
    "ls &&",
    "ls |",
    'echo "unclosed',
    "echo 'unclosed",
    # Other programs.
    "rm -rf x",
    "touch x",
    "cp a b",
    "python3 -c 'print(1)'",
    "amux agent run hello",
    "amuxx memory search x",
    "ls >/dev/null -la",
]

BENIGN = [
    "ls",
    "ls -la",
    "ls;",
    "cat README.md",
    "cat 说明.md",
    "grep -rn foo src",
    "grep -rn 'foo(bar)' .",
    'grep "a\\.b" f',
    "grep -c x a.txt 2>&1 | tail -1",
    "grep -rn TODO . | head -20",
    "find . -name x.py",
    "find . -name '*.py'",
    'find . -type f -name "*.md"',
    "rg foo",
    "rg -n TODO src",
    "rg --files 2>/dev/null | tail -5",
    "sed -n 1,20p f",
    "sed -n 10p a.py",
    "cat a | head -5",
    "head -n 5 f",
    "tail -20 f",
    "ls 2>/dev/null",
    "ls >/dev/null 2>&1",
    "ls &>/dev/null",
    "ls -la src && cat README.md | wc -l",
    "pwd; echo hello",
    "ls\ncat README.md",
    "stat a.txt && file a.txt",
    "cd src && ls -la | grep py",
    "which python3",
    "echo 'a; rm -rf x' \"b > c\"",
    "amux memory search x",
    "amux memory show MEMORY.md",
    "cat notes.md | amux memory upsert topics/notes.md --expected-revision absent",
    "printf '%s' '# Build' | amux memory upsert topics/build.md --expected-revision absent",
    "printf '%s' '# Build\nrun make; rm > x' | amux memory upsert t.md",
    "amux memory upsert topics/a.md --expected-revision absent <<'EOF'\n# A; rm -rf x > y\nEOF",
    'amux memory upsert a.md <<"EOF"\n$(not run) `nor this`\nEOF',
    "amux memory upsert a.md <<-'EOF'\n\tx\n\tEOF\nls",
]


def asked_by_pi(command: str) -> bool:
    request = pi.describe("bash", {"command": command})
    if request is not None:
        # The person sees the command exactly as it would run.
        assert request == ApprovalRequest("bash", approvals.COMMAND, command)
    return request is not None


def asked_by_codex(command: str) -> bool:
    reported = shlex.join(["/bin/bash", "-lc", command])
    request = codex.describe_command({"command": reported, "cwd": "/w"})
    return request is not None


@pytest.mark.parametrize("command", BYPASSES + HOSTILE)
def test_every_hostile_command_is_asked_by_pi_and_codex(command: str) -> None:
    assert asked_by_pi(command)
    assert asked_by_codex(command)


@pytest.mark.parametrize("command", BENIGN)
def test_everyday_reads_run_unasked_under_pi_and_codex(command: str) -> None:
    assert not asked_by_pi(command)
    assert not asked_by_codex(command)


@pytest.mark.parametrize(
    ("reported", "script"),
    [
        ("/bin/bash -lc 'rg x *'", "rg x *"),
        ("bash -c ls", "ls"),
        ("/bin/sh -c 'cat a'", "cat a"),
        # Another shell's script is not bash's: the whole line is judged, and asked.
        ("/bin/zsh -lc ls", "/bin/zsh -lc ls"),
        ("/bin/bash -lc ls extra", "/bin/bash -lc ls extra"),
        ("ls -la", "ls -la"),
    ],
)
def test_codexs_shell_wrapper_is_unwrapped_only_for_bash_like_shells(
    reported: str, script: str
) -> None:
    assert script_of(reported) == script


def test_a_command_codex_reports_unwrapped_or_unquotable_is_judged_or_asked() -> None:
    assert script_of("/bin/bash -lc 'unclosed") is None
    assert codex.read_only_command("/bin/bash -lc 'unclosed") is False
    assert codex.read_only_command("/bin/zsh -lc ls") is False
    assert codex.read_only_command("/bin/bash -lc ''") is False
    assert codex.read_only_command("touch x") is False
    assert codex.read_only_command("ls -la") is True


def test_a_script_too_long_or_too_deep_to_read_at_a_glance_is_asked() -> None:
    assert reads_only("ls " + "a " * 5_000)
    assert not reads_only("ls " + "a " * 20_000)
    assert reads_only(" && ".join(["ls"] * 50))
    assert not reads_only(" && ".join(["ls"] * 3_000))


# What bash itself makes of what the reading accepts: stub programs on PATH record the words
# (and the standard input) they were run with, in a directory of planted files that any glob,
# tilde or variable would bring into those words.
STUBS = ("cat", "ls", "grep", "find", "rg", "head", "wc", "sed", "amux")
STUB = """#!/bin/sh
printf '%s\\0' "${0##*/}" "$@" > "$STUB_LOG/$$.argv"
if [ "${0##*/}" = amux ]; then /bin/cat > "$STUB_LOG/$$.stdin"; fi
"""
PLANTED = ("-delete", "--pre=sh", "a.md", "{b,c}")
# Mostly word characters, and every character a shell could read as more than itself.
ALPHABET = "abcxyz-_./,:=+%@0123456789é说" + "*?[]{}~$`\\!#()<>|&;'\" \t\n^"

words = st.one_of(
    st.text("abcxyz-_./,:=+%@0123456789é说", min_size=1, max_size=8),
    st.text(ALPHABET, min_size=1, max_size=8),
    st.text(ALPHABET.replace("'", ""), max_size=6).map(lambda text: f"'{text}'"),
    st.text(ALPHABET, max_size=6).map(lambda text: f'"{text}"'),
)
simple_commands = st.tuples(
    st.sampled_from(STUBS[:-1]),
    st.lists(words, max_size=4),
    st.sampled_from(["", " 2>/dev/null", " >/dev/null", " 2>&1", " &>/dev/null", " >&2"]),
).map(lambda parts: " ".join([parts[0], *parts[1]]) + parts[2])
scripts = st.lists(simple_commands, min_size=1, max_size=3).flatmap(
    lambda commands: st.lists(
        st.sampled_from([" ; ", " && ", " | ", "\n", ";"]),
        min_size=len(commands) - 1,
        max_size=len(commands) - 1,
    ).map(lambda joiners: "".join(c + j for c, j in zip(commands, [*joiners, ""], strict=True)))
)
bodies = st.lists(
    st.text(ALPHABET.replace("\n", ""), max_size=12).filter(lambda line: line.strip() != "EOF"),
    max_size=3,
)
heredocs = st.tuples(
    st.sampled_from(["'EOF'", '"EOF"', "EOF", "\\EOF", "E'O'F"]),
    st.sampled_from(["<<", "<<-"]),
    bodies,
    st.sampled_from(["", "\nls"]),
).map(
    lambda p: (
        (f"amux memory upsert x.md {p[1]}{p[0]}\n" + "".join(b + "\n" for b in p[2])) + "EOF" + p[3]
    )
)


@pytest.fixture(scope="module")
def stub_shell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stub-shell")
    (root / "bin").mkdir()
    for name in STUBS:
        stub = root / "bin" / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    return root


def run_in_bash(root: Path, script: str) -> tuple[list[list[str]], list[str], list[str]]:
    """The words of each stub bash ran, the standard input ``amux`` read, and the files left."""
    work = Path(tempfile.mkdtemp(dir=root))
    log = Path(tempfile.mkdtemp(dir=root))
    for name in PLANTED:
        (work / name).write_text("")
    env = {"PATH": str(root / "bin"), "HOME": "/home-of-nobody", "STUB_LOG": str(log)}
    subprocess.run(["/bin/bash", "-c", script], cwd=work, env=env, timeout=20, check=False)
    ran = [p.read_bytes().split(b"\0")[:-1] for p in sorted(log.glob("*.argv"))]
    fed = [p.read_text() for p in sorted(log.glob("*.stdin"))]
    return sorted([w.decode() for w in argv] for argv in ran), fed, sorted(os.listdir(work))


def comparable(script: str) -> list[list[str]] | None:
    """The reading's words of ``script``, if it accepts it and each of its programs records its
    words (a line break inside a generated word may start another program)."""
    commands = literal_commands(script)
    compared = commands is not None and all(argv[0] in STUBS for argv in commands)
    event("compared with bash" if compared else "not compared")
    return commands if compared else None


@pytest.mark.e2e
@settings(max_examples=150, deadline=None)
@given(script=scripts)
def test_what_the_reading_accepts_is_what_bash_runs(stub_shell: Path, script: str) -> None:
    commands = comparable(script)
    if commands is None:
        return
    ran, _, left = run_in_bash(stub_shell, script)
    assert ran == sorted(commands)
    assert left == sorted(PLANTED)


@pytest.mark.e2e
@settings(max_examples=40, deadline=None)
@given(script=heredocs)
def test_a_here_document_the_reading_accepts_reaches_amux_as_written(
    stub_shell: Path, script: str
) -> None:
    commands = comparable(script)
    if commands is None:
        return
    ran, fed, left = run_in_bash(stub_shell, script)
    assert ran == sorted(commands)
    head, _, rest = script.partition("\n")
    body = rest.rsplit("EOF", 1)[0]
    if "<<-" in head:
        body = "".join(line.lstrip("\t") + "\n" for line in body.splitlines())
    assert fed == [body]
    assert left == sorted(PLANTED)
