"""Which shell commands an Agent may run under ``ask`` without a person being asked.

A command runs unasked only when a real shell grammar (tree-sitter's bash) shows it is plain
read-only programs with literal arguments, and nothing else:

- simple commands joined by ``|``, ``&&``, ``||``, ``;`` or line breaks; no background ``&``,
  subshell, group, function, loop, assignment, alias or comment;
- each word literal after quote removal: no ``$`` of any kind (variables, ``$(…)``, ``$((…))``,
  ``$'…'``, ``${x@P}``), no backquote, glob (``* ? [``), brace, tilde or backslash; a shell
  expands those into words nobody wrote, such as a planted file named ``-delete``;
- redirections only into ``/dev/null`` or onto standard output or error (``2>&1``); no here-string,
  no process substitution; a here-document only as the input of ``amux memory``, with a quoted
  delimiter (a body the shell takes as plain text) found where bash would end it;
- the words then fit ``READ_PROGRAMS`` or a rule below (``find``, ``rg``, ``sed``, ``file``,
  ``amux memory``).

Whatever the grammar could not parse cleanly, or parsed into a node not listed here, is asked.
Nothing here touches a file or a process: it reads text.
"""

from __future__ import annotations

import os
import re
import shlex
import unicodedata

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

BASH = Language(tree_sitter_bash.language())

# Programs that only read or print, whatever their arguments.
READ_PROGRAMS = frozenset(
    {
        "basename", "cat", "cd", "cmp", "cut", "df", "diff", "dirname", "du", "echo", "egrep",
        "false", "fgrep", "grep", "head", "id", "ls", "nl", "printf", "pwd", "readlink",
        "realpath", "stat", "tail", "tr", "true", "uname", "wc", "which", "whoami",
    }
)  # fmt: skip
# find's actions that delete, write a file or start another program.
FIND_UNSAFE = frozenset(
    {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fls", "-fprint", "-fprint0", "-fprintf"}
)
# Shells whose ``-c`` script is judged as bash: tree-sitter's grammar is bash's.
SHELLS = frozenset({"bash", "sh", "dash"})
# Longer scripts are asked about: no reader vouches for what nobody can read at a glance.
MAX_CHARS = 20_000

# Characters a literal unquoted word may hold: anything else could be an operator, a quote or an
# expansion the grammar might read differently from bash.
_WORD = re.compile(r"[\w\-./,:=+%@]+")
_DIGITS = re.compile(r"-?[0-9]+")
_DELIMITER = re.compile(r"""(['"])(\w+)\1""")
# Between the parts of a command only blanks; between commands also line breaks. Anything else
# there (a backslash-newline, a comment) is text the grammar skipped.
_BLANKS = frozenset(" \t")
_BREAKS = frozenset(" \t\n")
_DEV_NULL = "/dev/null"


class _Doubt(Exception):
    """Raised inside the reading on anything it cannot vouch for."""


def _plain_text(script: str) -> bool:
    """No character a grammar could take differently from bash: controls other than tab and
    line feed (``\\r``, NUL), invisible formatting, and blanks other than the ASCII space."""
    for char in script:
        if char in "\t\n":
            continue
        category = unicodedata.category(char)
        if category[0] in "CZ" and char != " ":
            return False
    return True


def script_of(command: str) -> str | None:
    """The script of a command as Codex reports it (``/bin/bash -lc '<script>'``), the command
    itself when it is no shell's ``-c``, or None when its quoting does not split."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) == 3 and os.path.basename(words[0]) in SHELLS and words[1] in ("-c", "-lc"):
        return words[2]
    return command


def literal_commands(script: str) -> list[list[str]] | None:
    """The words of each simple command in ``script``, as bash would run them, when the script
    is only simple commands on literal words with harmless redirections; None otherwise."""
    if not script.strip() or len(script) > MAX_CHARS or not _plain_text(script):
        return None
    source = script.encode("utf-8")
    tree = Parser(BASH).parse(source)
    if tree.root_node.has_error:
        return None
    reading = _Reading(source)
    try:
        reading.program(tree.root_node)
    except (_Doubt, ValueError, RecursionError):
        # ValueError: a node without the children its type promises (or splitting a character);
        # RecursionError: commands nested deeper than a person would write them.
        return None
    return reading.commands


def reads_only(script: str) -> bool:
    """Whether bash running ``script`` would only run read-only programs on literal words."""
    commands = literal_commands(script)
    # A path names a program other than the one the allow-list means.
    return commands is not None and all(
        "/" not in argv[0] and argv_reads_only(argv) for argv in commands
    )


def argv_reads_only(argv: list[str]) -> bool:
    """Whether one program run with exactly these words only reads."""
    program, args = argv[0], argv[1:]
    if program == "amux":
        # Memory goes through the amux CLI to the Hub; its other commands are not memory.
        return args[:1] == ["memory"]
    if program in READ_PROGRAMS:
        return True
    if program == "find":
        return not FIND_UNSAFE.intersection(args)
    if program == "rg":
        # --pre runs a program per file, -z/--search-zip decompressors, --hostname-bin one more.
        return not any(
            a.startswith(("--pre", "--hostname-bin", "--search-zip"))
            or (a.startswith("-") and not a.startswith("--") and "z" in a)
            for a in args
        )
    if program == "sed":
        # Only printing lines: ``sed -n 10p`` or ``sed -n 1,20p``, then file names.
        return (
            len(args) >= 2
            and args[0] == "-n"
            and re.fullmatch(r"[0-9]+(,[0-9]+)?p", args[1]) is not None
            and not any(a.startswith("-") for a in args[2:])
        )
    if program == "file":
        # ``-C`` (also within ``-bC``) compiles a magic file, writing it.
        return not any(
            a == "--compile" or (a.startswith("-") and not a.startswith("--") and "C" in a)
            for a in args
        )
    return False


class _Reading:
    """A walk over one parse tree that accepts only node types it knows to be harmless."""

    def __init__(self, source: bytes) -> None:
        self._source = source
        # Bodies of two here-documents started on one line follow each other; one is enough.
        self._heredocs = 0
        self.commands: list[list[str]] = []

    def _text(self, node: Node) -> str:
        return self._source[node.start_byte : node.end_byte].decode("utf-8")

    def _children(self, node: Node, gaps: frozenset[str]) -> list[Node]:
        """``node``'s children, checking that what lies between them is only ``gaps``."""
        at = node.start_byte
        for child in [*node.children, None]:
            end = node.end_byte if child is None else child.start_byte
            if end < at or any(chr(b) not in gaps for b in self._source[at:end]):
                raise _Doubt
            if child is not None:
                if child.is_error or child.is_missing:
                    raise _Doubt
                at = child.end_byte
        return list(node.children)

    def program(self, node: Node) -> None:
        statements = 0
        for child in self._children(node, _BREAKS):
            if child.type != ";":
                self._statement(child)
                statements += 1
        if not statements:
            raise _Doubt

    def _statement(self, node: Node) -> None:
        if node.type in ("list", "pipeline"):
            joiners = ("&&", "||") if node.type == "list" else ("|",)
            children = self._children(node, _BREAKS)
            for index, child in enumerate(children):
                # Statements and joiners alternate; ``|&`` and anything else is doubted.
                if index % 2:
                    if child.type not in joiners:
                        raise _Doubt
                else:
                    self._statement(child)
            if len(children) % 2 == 0:
                raise _Doubt
        elif node.type == "redirected_statement":
            body, *redirects = self._children(node, _BLANKS)
            if body.type != "command" or not redirects:
                raise _Doubt
            heredoc = self._redirects(redirects)
            self._command(body, heredoc)
        elif node.type == "command":
            self._command(node, heredoc=False)
        else:
            raise _Doubt

    def _command(self, node: Node, heredoc: bool) -> None:
        name, *rest = self._children(node, _BLANKS)
        if name.type != "command_name":
            raise _Doubt
        (word,) = self._children(name, frozenset())
        argv = [self._literal(word)]
        redirects = [child for child in rest if child.type == "file_redirect"]
        self._redirects(redirects)
        argv += [self._literal(child) for child in rest if child.type != "file_redirect"]
        if heredoc and argv[:2] != ["amux", "memory"]:
            raise _Doubt
        self.commands.append(argv)

    def _redirects(self, nodes: list[Node]) -> bool:
        """Checks each redirection; whether one of them is a here-document."""
        heredoc = False
        for node in nodes:
            if node.type == "heredoc_redirect":
                self._heredoc(node)
                heredoc = True
            elif node.type == "file_redirect":
                self._file_redirect(node)
            else:
                raise _Doubt
        return heredoc

    def _file_redirect(self, node: Node) -> None:
        children = self._children(node, _BLANKS)
        if children and children[0].type == "file_descriptor":
            if not self._text(children[0]).isdigit():
                raise _Doubt
            children = children[1:]
        if len(children) != 2:
            raise _Doubt
        operator, target = children[0].type, self._literal(children[1])
        if target == _DEV_NULL and operator in (">", ">>", "&>", "&>>", ">&"):
            return
        if operator == ">&" and target in ("1", "2"):
            # Onto another descriptor: no file is named, none is written.
            return
        raise _Doubt

    def _heredoc(self, node: Node) -> None:
        """A here-document whose body bash takes as text: a quoted delimiter, nothing after it
        on its line, ended by the first line that is exactly the delimiter, as bash ends it."""
        self._heredocs += 1
        if len(node.children) != 4 or self._heredocs > 1:
            raise _Doubt
        operator, start, body, end = node.children
        if (
            operator.type not in ("<<", "<<-")
            or (start.type, body.type, end.type) != ("heredoc_start", "heredoc_body", "heredoc_end")
            or body.named_children
            or any(child.is_error or child.is_missing for child in node.children)
        ):
            raise _Doubt
        match = _DELIMITER.fullmatch(self._text(start))
        if match is None or self._text(end) != match[2]:
            raise _Doubt
        tag = match[2].encode()
        line_end = self._source.find(b"\n", start.end_byte)
        if line_end < 0 or self._source[start.end_byte : line_end].strip(b" \t"):
            raise _Doubt
        at = line_end + 1
        while True:
            stop = self._source.find(b"\n", at)
            stop = len(self._source) if stop < 0 else stop
            line = self._source[at:stop]
            indent = len(line) - len(line.lstrip(b"\t")) if operator.type == "<<-" else 0
            if line[indent:] == tag:
                if (end.start_byte, end.end_byte) != (at + indent, stop):
                    raise _Doubt
                return
            if stop >= len(self._source) or at >= end.end_byte:
                raise _Doubt
            at = stop + 1

    def _literal(self, node: Node) -> str:
        """The word a node becomes after quote removal, if it expands to exactly that."""
        text = self._text(node)
        if node.type in ("word", "number"):
            if node.children or not _WORD.fullmatch(text):
                raise _Doubt
            if node.type == "number" and not _DIGITS.fullmatch(text):
                raise _Doubt
            return text
        if node.type == "raw_string":
            if len(text) < 2 or text[0] != "'" or text[-1] != "'" or "'" in text[1:-1]:
                raise _Doubt
            return text[1:-1]
        if node.type == "string":
            return self._double_quoted(node, text)
        if node.type == "concatenation":
            parts = self._children(node, frozenset())
            if any(part.type == "concatenation" for part in parts):
                raise _Doubt
            return "".join(self._literal(part) for part in parts)
        raise _Doubt

    def _double_quoted(self, node: Node, text: str) -> str:
        if any(child.is_named and child.type != "string_content" for child in node.children):
            raise _Doubt
        if len(text) < 2 or text[0] != '"' or text[-1] != '"':
            raise _Doubt
        inner = text[1:-1]
        if any(char in inner for char in "$`") or "\\\n" in inner:
            raise _Doubt
        # Inside double quotes a backslash quotes only ``\`` and ``"`` here (``$``, backquote
        # and a line break were refused above); before anything else it stays.
        value: list[str] = []
        index = 0
        while index < len(inner):
            char = inner[index]
            following = inner[index + 1 : index + 2]
            if char == "\\" and following in ("\\", '"'):
                value.append(following)
                index += 2
                continue
            if char == '"':
                raise _Doubt
            value.append(char)
            index += 1
        return "".join(value)
