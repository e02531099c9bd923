"""A command line as the bridge understands it: words, pipes, `&&` / `||` / `;` and a few redirections.

The grammar is a small, strict subset of POSIX sh. Quoting follows shlex's posix rules (single quotes keep
everything, double quotes keep everything but `\\"` and `\\\\`, a backslash outside quotes keeps the next
character), but unlike `shlex.split` the tokenizer also records what a shell would have *done* with each
character, because that is what a policy must know: an unquoted `*` is a glob, a `$` anywhere but inside
single quotes is an expansion, a `(` is a subshell. Anything with a meaning the bridge does not carry out
itself is refused here with the name of the rule, never passed on, so no shell ever sees the text:

  expansion    $VAR, ${...}, $(...), $'...', `...` (in or out of double quotes)
  subshell     ( ... ), <( ... ), >( ... )
  brace        {a,b} brace expansion, { ...; } groups
  heredoc      << and <<<
  background   a lone &, and |&
  redirect     any redirection but `< file`, `> /dev/null`, `2> /dev/null`, `2>&1`
  control-char newline, carriage return, NUL and other control characters
  comment      an unquoted # at the start of a word
  tilde        an unquoted ~ at the start of a word
  syntax       an unclosed quote, a trailing backslash, an empty command between operators, `!`
"""

from __future__ import annotations

from dataclasses import dataclass, field


class Refused(Exception):
    """A command the bridge will not run: RULE names the policy rule, the message says what and why."""

    def __init__(self, rule: str, message: str, ask: str = ""):
        super().__init__(message)
        self.rule = rule
        self.ask = ask


@dataclass(frozen=True)
class Word:
    text: str
    glob: bool = False  # holds an unquoted * ? or [ (a shell would have expanded it)


@dataclass
class Redirect:
    fd: int  # 0 stdin, 1 stdout, 2 stderr
    op: str  # "<", ">", ">>", ">&"
    target: str


@dataclass
class Stage:
    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)


@dataclass
class Pipeline:
    stages: list[Stage]
    sep: str = ""  # how it joins the pipeline before it: "", ";", "&&" or "||"


def _refuse(rule: str, message: str) -> Refused:
    return Refused(rule, message, "write the command without it; the bridge runs programs itself, with no shell")


def tokenize(line: str) -> list[Word | str]:
    """LINE as words and operator strings ("|", "&&", "||", ";", and redirections "N<", "N>", "N>>", "N>&")."""
    out: list[Word | str] = []
    buf: list[str] = []
    in_word = glob = False
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal in_word, glob
        if in_word:
            out.append(Word("".join(buf), glob))
        buf.clear()
        in_word = glob = False

    for at, c in enumerate(line):  # anywhere, quoted or not: one line of printable text
        if (ord(c) < 32 and c != "\t") or c == "\x7f":
            raise _refuse("control-char", f"control character {c!r} at offset {at} (one command line, no newlines)")
    while i < n:
        c = line[i]
        if c in " \t":
            end_word()
        elif c in "'\"":
            i = _quoted(line, i, buf)
            in_word = True
        elif c == "\\":
            if i + 1 >= n:
                raise _refuse("syntax", "trailing backslash")
            buf.append(line[i + 1])
            in_word, i = True, i + 1
        elif c in FORBIDDEN or (c in "#~!" and not in_word):
            raise _forbidden(c, i)
        elif c in "|&;":
            end_word()
            i = _operator(line, i, out)
        elif c in "<>":
            fd = None
            if in_word and buf and "".join(buf).isdigit() and not glob and line[i - 1].isdigit():
                fd = int("".join(buf))
                buf.clear()
                in_word = False
            end_word()
            i = _redirect(line, i, fd, out)
        else:
            if c in "*?[":
                glob = True
            buf.append(c)
            in_word = True
        i += 1
    end_word()
    return out


FORBIDDEN = "$`(){}"


def _forbidden(c: str, i: int) -> Refused:
    """The refusal for a character with a shell meaning the bridge does not carry out."""
    why = {
        "$": ("expansion", "the bridge expands no variables or commands"),
        "`": ("expansion", "the bridge expands no variables or commands"),
        "(": ("subshell", "no subshells or process substitution"),
        ")": ("subshell", "no subshells or process substitution"),
        "{": ("brace", "no brace expansion or command groups (quote it if literal)"),
        "}": ("brace", "no brace expansion or command groups (quote it if literal)"),
        "#": ("comment", "it starts a shell comment (quote it if literal)"),
        "~": ("tilde", "no home-directory expansion; give the path"),
        "!": ("syntax", "no pipeline negation or history (quote it if literal)"),
    }[c]
    return _refuse(why[0], f"{c!r} at offset {i}: {why[1]}")


def _quoted(line: str, i: int, buf: list[str]) -> int:
    """Reads the quoted part starting at I into BUF; returns the index of its closing quote."""
    if line[i] == '"':
        return _double_quoted(line, i + 1, buf)
    close = line.find("'", i + 1)
    if close < 0:
        raise _refuse("syntax", "unclosed single quote")
    buf.append(line[i + 1 : close])
    return close


def _double_quoted(line: str, i: int, buf: list[str]) -> int:
    """Reads "..." from I (after the opening quote) into BUF; returns the index of the closing quote."""
    n = len(line)
    while i < n:
        c = line[i]
        if c == '"':
            return i
        if c in "$`":
            raise _refuse("expansion", f"{c!r} inside double quotes at offset {i}: the bridge expands nothing")
        if c == "\\" and i + 1 < n and line[i + 1] in '"\\':
            buf.append(line[i + 1])
            i += 2
            continue
        buf.append(c)
        i += 1
    raise _refuse("syntax", "unclosed double quote")


def _operator(line: str, i: int, out: list) -> int:
    two = line[i : i + 2]
    if two in ("&&", "||"):
        out.append(two)
        return i + 1
    if two in ("|&", ";;", ";&") or line[i : i + 3] == ";;&":
        raise _refuse("background" if two == "|&" else "syntax", f"{two!r} at offset {i} is not supported")
    if line[i] == "&":
        if line[i + 1 : i + 2] == ">":
            raise _refuse("redirect", f"'&>' at offset {i}: use 2>&1")
        raise _refuse("background", f"'&' at offset {i}: nothing runs in the background through the bridge")
    out.append(line[i])
    return i


def _redirect(line: str, i: int, fd: int | None, out: list) -> int:
    three, two = line[i : i + 3], line[i : i + 2]
    if two == "<<":
        raise _refuse("heredoc", f"{'<<<' if three == '<<<' else '<<'} at offset {i}: no here-documents")
    if two in ("<(", ">("):
        raise _refuse("subshell", f"{two!r} at offset {i}: no process substitution")
    if two in ("<>", ">|", "<&"):
        raise _refuse("redirect", f"{two!r} at offset {i} is not supported")
    if two in (">>", ">&"):
        out.append(f"{1 if fd is None else fd}{two}")
        return i + 1
    out.append(f"{(0 if line[i] == '<' else 1) if fd is None else fd}{line[i]}")
    return i


def parse(line: str) -> list[Pipeline]:
    """LINE as pipelines joined by ; && ||; Refused for anything outside the grammar."""
    pipelines: list[Pipeline] = []
    stages: list[Stage] = []
    stage = Stage()
    sep = ""
    tokens = tokenize(line)
    k = 0
    while k < len(tokens):
        tok = tokens[k]
        if isinstance(tok, Word):
            stage.words.append(tok)
        elif tok in ("|", "&&", "||", ";"):
            if not stage.words:
                raise _refuse("syntax", f"{tok!r} with no command before it")
            stages.append(stage)
            stage = Stage()
            if tok != "|":
                pipelines.append(Pipeline(stages, sep))
                stages, sep = [], tok
        else:  # a redirection: the next token is its target
            target = tokens[k + 1] if k + 1 < len(tokens) else None
            if not isinstance(target, Word):
                raise _refuse("syntax", f"redirection {tok!r} with no file after it")
            stage.redirects.append(_checked_redirect(tok, target))
            k += 1
        k += 1
    if not stage.words:
        if stages or pipelines or stage.redirects:
            raise _refuse("syntax", "the command line ends with an operator or a bare redirection")
        raise _refuse("syntax", "empty command")
    stages.append(stage)
    pipelines.append(Pipeline(stages, sep))
    return pipelines


def _checked_redirect(tok: str, target: Word) -> Redirect:
    """The redirections the bridge carries out: < file, >/dev/null, 2>/dev/null, 2>&1."""
    fd, op = int(tok.rstrip("<>&")), tok.lstrip("0123456789")
    if target.glob:
        raise _refuse("redirect", f"{tok}{target.text}: a redirection target must be a plain name")
    if op == "<" and fd == 0:
        return Redirect(0, "<", target.text)
    if op == ">&" and fd == 2 and target.text == "1":
        return Redirect(2, ">&", "1")
    if op in (">", ">>") and fd in (1, 2) and target.text == "/dev/null":
        return Redirect(fd, ">", "/dev/null")
    raise Refused(
        "redirect",
        f"{tok}{target.text}: the bridge writes no files; only < FILE, >/dev/null, 2>/dev/null and 2>&1",
        "read the output from the result instead; to keep it, ask the person to save it",
    )


def quote(word: str) -> str:
    """WORD as one shell word (for the remote command of ssh)."""
    import shlex

    return shlex.quote(word)
