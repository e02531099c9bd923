"""The agent playbooks (skills/**/*.md, AGENTS.md) and the docs (README.md, docs/*.md) only use commands
and flags that exist.

Agents copy the fenced shell blocks of a skill and run them, and people copy those of the docs, so a renamed
flag or a driver that was never written turns into a failed job or a confused agent on a real cluster. This
file reads every ```bash /
```sh / ```shell block, splits it into simple commands the way a shell would (line continuations, pipes,
`&&`, `||`, `;`, `$(...)`, comments, `FOO=1 cmd` assignments, `for ...; do ...; done`), and checks the
commands that are ours against their real `--help`:

1. Which commands are ours: `jobkit` (also `.venv/bin/jobkit`, `py/bin/jobkit`) and any command written as
   a relative path into the repo (`./submit.sh`, `./run_local.sh`, `utils/<x>.sh`, `bench/<x>.sh`,
   `tests/run.sh`). Everything else (squeue, scancel, grep, curl, `.venv/bin/python`, ...) is left alone,
   except a repo-root script written without its `./` (`submit.sh tiny`): it is not on PATH, so it fails.
2. `jobkit`: the words after it must walk down the click groups (`jobkit sweep batch`); a word that is no
   subcommand of a group fails. Every option (`--foo`, `--foo=v`, `-w`) before a ` -- ` must be listed in
   the Options section of `jobkit <path> --help`.
3. A repo script must exist and be executable; every option before ` -- ` must appear somewhere in its
   `--help` output. If its Usage lines name subcommands (`prometheus.sh view`, `local_cluster.sh up`), the
   first word that is not an option must be one of them.
4. `submit.sh` passes sbatch options through: before ` -- `, an option counts if submit.sh's help names it
   or it is in SBATCH_OPTIONS below (options sbatch documents, the ones a skill may reasonably use).
5. After ` -- ` come MaxText `key=value` / `_env_KEY=VALUE` words: not checked.

Placeholders in angle brackets (`<model>`, `<jobid>`) stand for one word; optional-syntax brackets
(`[--serial]`) are stripped. An option value that itself starts with a dash must be attached with `=`
(`--sbatch-arg=--time=30:00`), or it is read as an option. Each distinct `--help` runs once.
Besides: every skill has front matter with `name` (= its directory) and a `description`, every skill
uses at least one project command, skills/README.md links every skill, and relative links resolve (in the
docs too; `mkdocs build --strict`, in tests/py/test_docs.py, also checks the docs' anchors).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SKILLS = REPO / "skills"
AGENTS = REPO / "AGENTS.md"
README = REPO / "README.md"
DOCS = REPO / "docs"
SHELL_LANGS = {"bash", "sh", "shell"}

# sbatch options a skill may hand to submit.sh before ` -- ` (all documented by sbatch(1)); not the ones
# submit.sh sets itself and refuses (-J, --output, --error, --chdir, --export).
SBATCH_OPTIONS = {
    "-N", "--nodes", "-w", "--nodelist", "-x", "--exclude", "-p", "--partition", "-t", "--time",
    "--reservation", "-A", "--account", "-q", "--qos", "-d", "--dependency",
    "--exclusive", "--mem", "--gres", "--gpus-per-node",
}  # fmt: skip
JOBKIT_NAMES = {"jobkit", ".venv/bin/jobkit", "py/bin/jobkit"}
# Words in front of a command that leave the command itself in place.
PREFIX_WORDS = {"sudo", "env", "time", "nohup", "exec", "command", "!", "{", "(", "then", "do", "else", "if", "while",
                "until", "elif"}  # fmt: skip
SKIP_SEGMENT = {"for", "case", "done", "fi", "esac", "}", ")", "function"}
# <model>, <jobid>, <sweep id>, <data range end, e.g. 18:00:28>: one word each (not a redirection).
PLACEHOLDER = re.compile(r"<[A-Za-z_][^<>\n'\"|;&]*>")


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    where: str  # file:line where the command starts


# --- 1. blocks and commands -----------------------------------------------------------------------------


def shell_blocks(text: str, name: str) -> list[tuple[str, str]]:
    """(where, body) of every fenced block whose language is bash/sh/shell."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", lines[i])
        if not fence:
            i += 1
            continue
        marker, lang, start = fence.group(1), fence.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i])
            i += 1
        i += 1
        if lang in SHELL_LANGS:
            blocks.append((f"{name}:{start + 1}", "\n".join(body)))
    return blocks


def take_substitutions(line: str) -> tuple[str, list[str]]:
    """LINE with every $(...) replaced by one word, and the texts inside them (nested ones included)."""
    out, inner, i = [], [], 0
    while i < len(line):
        if line.startswith("$(", i) and not line.startswith("$((", i):
            depth, j, quote = 1, i + 2, None
            while j < len(line) and depth:
                ch = line[j]
                if quote:
                    quote = None if ch == quote else quote
                elif ch in "'\"" and line[j - 1] != "\\":
                    quote = ch
                elif line.startswith("$(", j):
                    depth, j = depth + 1, j + 1
                elif ch == ")":
                    depth -= 1
                j += 1
            body = line[i + 2 : j - 1]
            rest, nested = take_substitutions(body)
            inner += [rest, *nested]
            out.append("SUBST")
            i = j
        else:
            out.append(line[i])
            i += 1
    return "".join(out), inner


def logical_lines(body: str) -> list[tuple[int, str]]:
    """(0-based line, text) of BODY's lines, `\\` continuations and lines ending in |, &&, || joined."""
    lines, current, first = [], "", 0
    for number, raw in enumerate(body.splitlines()):
        if not current:
            first = number
        stripped = raw.rstrip()
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        if re.search(r"(\|\||&&|\|)\s*$", current) and not current.lstrip().startswith("#"):
            current += " "
            continue
        lines.append((first, current))
        current = ""
    if current.strip():
        lines.append((first, current))
    return lines


def split_commands(body: str, where: str = "?:0") -> list[Command]:
    """Simple commands of a shell snippet, in order; each a tuple of words (quotes removed).

    WHERE is `file:line` of the block's fence; each command's own line is counted from there.
    """
    commands = []
    name, fence_line = where.rsplit(":", 1)
    for offset, line in logical_lines(body):
        where = f"{name}:{int(fence_line) + 1 + offset}"
        line = PLACEHOLDER.sub("PLACEHOLDER", line)
        line, substituted = take_substitutions(line)
        for text in [line, *substituted]:
            lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError as exc:  # unbalanced quotes: report it as a command the test will flag
                commands.append(Command(("<unparsable>", f"{exc}: {text}"), where))
                continue
            segment: list[str] = []
            redirect_target = False
            for token in [*tokens, ";"]:
                if re.fullmatch(r"[();|&]+", token):  # |, ||, &&, ;, &, (, ): the command ends
                    if segment:
                        commands.append(Command(tuple(segment), where))
                    segment, redirect_target = [], False
                elif re.fullmatch(r"[<>&]+", token):  # >, >>, <, >&, &>: drop it, its target, its fd number
                    if segment and segment[-1].isdigit():
                        segment.pop()
                    redirect_target = True
                elif redirect_target:
                    redirect_target = False
                else:
                    segment.append(token)
    return [c for c in (strip_prefixes(c) for c in commands) if c]


def strip_prefixes(command: Command) -> Command | None:
    """COMMAND without leading assignments and keywords; None when nothing runs."""
    words = list(command.words)
    while words and (words[0] in PREFIX_WORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
        words.pop(0)
    if not words or words[0] in SKIP_SEGMENT:
        return None
    return Command(tuple(words), command.where)


def playbooks() -> list[Path]:
    """What agents copy commands from: skills/**/*.md and AGENTS.md."""
    return sorted(SKILLS.rglob("*.md")) + ([AGENTS] if AGENTS.exists() else [])


def documents() -> list[Path]:
    """Every page whose shell blocks someone copies: the playbooks, README.md and each docs/*.md page."""
    return playbooks() + [p for p in [README, *sorted(DOCS.glob("*.md"))] if p.exists()]


def repo_root_scripts() -> set[str]:
    """The executables at the repo root (submit.sh, run_local.sh, ...): run as ./<name>, never found on PATH."""
    return {p.name for p in REPO.iterdir() if p.is_file() and p.suffix == ".sh" and os.access(p, os.X_OK)}


def commands_of(path: Path) -> list[Command]:
    name = str(path.relative_to(REPO))
    return [c for where, body in shell_blocks(path.read_text(), name) for c in split_commands(body, where)]


# --- 2. help texts --------------------------------------------------------------------------------------


def jobkit_exe() -> str:
    beside = Path(sys.executable).parent / "jobkit"
    return str(beside if beside.exists() else REPO / ".venv" / "bin" / "jobkit")


@functools.cache
def run_help(argv: tuple[str, ...]) -> tuple[int, str]:
    env = dict(os.environ, JOB_WORKSPACE=os.environ.get("JOB_WORKSPACE", str(REPO / "outputs")))
    try:
        result = subprocess.run(
            [*argv, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        return 127, str(exc)
    return result.returncode, result.stdout + result.stderr


def click_sections(text: str) -> tuple[set[str], set[str]]:
    """(options, subcommands) from a click help page."""
    options, commands, section = set(), set(), None
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1].strip()
            continue
        if section == "Options" and re.match(r"^\s{2}-", line):
            names = re.split(r"\s{2,}", line.strip())[0]
            options.update(re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", names))
        elif section == "Commands" and re.match(r"^\s{2}\S", line):
            commands.add(line.split()[0])
    return options, commands


def script_subcommands(text: str, script: str) -> set[str]:
    """Subcommand words named by the Usage lines of a script's help (`x.sh up [-N n] | down`)."""
    base = re.escape(Path(script).name)
    words = set()
    in_usage = False
    for line in text.splitlines():  # the Usage: line and the lines right below it that start with the script
        usage = re.sub(r"^\s*Usage:\s*", "", line)
        in_usage = usage != line or (in_usage and re.match(rf"^\s+(\S*/)?{base}\b", line) is not None)
        if not in_usage:
            continue
        depth, alt, alternatives = 0, "", []
        for ch in usage:
            depth += ch in "[<(" and 1 or (ch in "]>)" and -1) or 0
            if ch == "|" and depth == 0:
                alternatives.append(alt)
                alt = ""
            else:
                alt += ch
        alternatives.append(alt)
        for alternative in alternatives:
            parts = alternative.split()
            if parts and re.fullmatch(rf"(\S*/)?{base}", parts[0]):
                parts = parts[1:]
            if parts and re.fullmatch(r"[a-z][a-z-]*", parts[0]):
                words.add(parts[0])
    return words


def option_name(word: str) -> str | None:
    """The option a word uses (`--port=9` -> --port, `-N2` -> -N), None for a plain word or a negative number."""
    if word.startswith("[") and len(word) > 1:
        word = word.lstrip("[")
    word = word.rstrip("]")
    if word in ("-", "--") or not word.startswith("-") or re.fullmatch(r"-[\d.]+", word):
        return None
    return word.split("=", 1)[0] if word.startswith("--") else word[:2]


# --- 3. the checks --------------------------------------------------------------------------------------


def problems_of(command: Command) -> list[str]:
    """What is wrong with COMMAND (empty when it is fine or not ours)."""
    first, rest = command.words[0], list(command.words[1:])
    at = f"{command.where}: `{' '.join(command.words)}`"
    if first == "<unparsable>":
        return [f"{command.where}: cannot parse shell line ({rest[0]})"]
    if first in JOBKIT_NAMES:
        return check_jobkit(rest, at)
    if first in repo_root_scripts():
        return [f"{at}: write ./{first}: the repo's scripts are not on PATH"]
    if "/" in first and not first.startswith(("/", "~", "$", ".venv/")):
        return check_script(first, rest, at)
    return []


def before_separator(words: list[str]) -> list[str]:
    return words[: words.index("--")] if "--" in words else words


def check_jobkit(words: list[str], at: str) -> list[str]:
    path: list[str] = []
    words = before_separator(words)
    index = 0
    while True:
        rc, text = run_help((jobkit_exe(), *path))
        if rc != 0:
            return [f"{at}: `jobkit {' '.join(path)} --help` failed (exit {rc}): {text.strip()[-200:]}"]
        options, subcommands = click_sections(text)
        if not subcommands:
            break
        nxt = next((w for w in words[index:] if not w.startswith("-")), None)
        if nxt is None:
            break
        if nxt not in subcommands:
            if nxt in ("PLACEHOLDER", "SUBST", "..."):
                break
            return [
                f"{at}: `jobkit {' '.join(path)}` has no subcommand {nxt!r} (it has: {', '.join(sorted(subcommands))})"
            ]
        index = words.index(nxt, index) + 1
        path.append(nxt)
    bad = [opt for w in words[index:] if (opt := option_name(w)) and opt not in options]
    return [f"{at}: `jobkit {' '.join(path)}` has no option {opt}" for opt in bad]


def check_script(script: str, words: list[str], at: str) -> list[str]:
    target = REPO / script.removeprefix("./")
    if not target.is_file():
        return [f"{at}: {script} does not exist in the repo"]
    if not os.access(target, os.X_OK):
        return [f"{at}: {script} is not executable"]
    rc, text = run_help((str(target),))
    if rc != 0:
        return [f"{at}: `{script} --help` failed (exit {rc})"]
    known = set(re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", text))
    if target.name == "submit.sh":
        known |= SBATCH_OPTIONS
    checked = before_separator(words)
    problems = [f"{at}: {script} has no option {opt}" for w in checked if (opt := option_name(w)) and opt not in known]
    subcommands = script_subcommands(text, script)
    positional = next((w for w in checked if not w.startswith("-")), None)
    if subcommands and positional is not None and positional not in subcommands | {"PLACEHOLDER", "SUBST"}:
        problems.append(f"{at}: {script} has no subcommand {positional!r} (it has: {', '.join(sorted(subcommands))})")
    return problems


def problems_in(text: str, name: str = "snippet.md") -> list[str]:
    return [p for where, body in shell_blocks(text, name) for c in split_commands(body, where) for p in problems_of(c)]


# --- 4. tests -------------------------------------------------------------------------------------------


def skill_files() -> list[Path]:
    return sorted(SKILLS.glob("*/SKILL.md"))


def test_there_are_skills_and_an_agents_file():
    names = {p.parent.name for p in skill_files()}
    expected = {"batch-sweep", "xla-tuning", "node-health", "model-regression", "tsdb-diagnosis",
                "model-config-guide", "run-and-triage"}  # fmt: skip
    assert expected <= names, f"missing skills: {sorted(expected - names)}"
    assert AGENTS.is_file(), "AGENTS.md at the repo root is missing"
    assert "skills/" in AGENTS.read_text(), "AGENTS.md must point agents to skills/"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_project_command_and_flag_exists(doc):
    problems = [p for c in commands_of(doc) for p in problems_of(c)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("skill", skill_files(), ids=lambda p: p.parent.name)
def test_skill_front_matter_and_commands(skill):
    text = skill.read_text()
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, f"{skill}: no YAML front matter (--- name/description ---) at the top"
    meta = yaml.safe_load(match.group(1))
    assert isinstance(meta, dict), f"{skill}: front matter is not a mapping"
    assert meta.get("name") == skill.parent.name, f"{skill}: name {meta.get('name')!r} != directory name"
    description = meta.get("description")
    assert isinstance(description, str) and len(description) >= 60, f"{skill}: description says too little"
    assert "use" in description.lower(), f"{skill}: the description should say when to use the skill"
    ours = [c for c in commands_of(skill) if c.words[0] in JOBKIT_NAMES or "/" in c.words[0]]
    assert ours, f"{skill}: no project command in a ```bash block"


def test_index_lists_every_skill():
    index = (SKILLS / "README.md").read_text()
    linked = set(re.findall(r"\]\(\.?/?([\w-]+)/SKILL\.md\)", index))
    names = {p.parent.name for p in skill_files()}
    assert names <= linked, f"skills/README.md does not link {sorted(names - linked)}"
    assert linked <= names, f"skills/README.md links skills that do not exist: {sorted(linked - names)}"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc}: broken links {broken}"


# A word like node[1-2] outside quotes: the shell reads it as a glob (a file named node1 in the current
# directory turns `-w node[1-2]` into `-w node1`), so every hostlist an agent may copy is quoted.
UNQUOTED_HOSTLIST = re.compile(r"""(?:^|[\s=,])[A-Za-z][\w.-]*\[[0-9]""")


def bare_hostlist(line: str) -> bool:
    """LINE (one line of a shell block) has a hostlist outside quotes, before any comment."""
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", line)
    return bool(UNQUOTED_HOSTLIST.search(re.split(r"(?:^|\s)#", unquoted)[0]))


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_hostlists_in_shell_blocks_are_quoted(doc):
    bare = [
        f"{where}: {line.strip()}"
        for where, body in shell_blocks(doc.read_text(), str(doc.relative_to(REPO)))
        for line in body.splitlines()
        if bare_hostlist(line)
    ]
    assert not bare, f"quote these hostlists ('node[1-2]'): {bare}"


def test_the_hostlist_check_tells_quoted_from_bare():
    assert bare_hostlist("jobkit sweep nodes tiny -w node[1-4] --serial")
    assert bare_hostlist("srun -w=rack[1-2]-node1 x")
    assert not bare_hostlist("jobkit sweep nodes tiny -w 'node[1-4]' --serial  # not node[1-4]")
    assert not bare_hostlist('sinfo -n "node[1-4]"; [[ -n $x ]]; echo ${a[0]}')
    assert not bare_hostlist("q 'rate(tb_step_time_seconds[30m])' | top")


# --- 5. the checker itself ------------------------------------------------------------------------------

SELF_TEST = """
Some prose.

```bash
# a comment with jobkit sweep --not-checked
FOO=1 jobkit sweep nodes <model> -w node[1-4] --serial --no-such-flag -- steps=5 --maxtext-ok=1
jobkit sweep frobnicate tiny
jobkit sweep nodes <model> --id <sweep id> -w <two words> --bogus-after-placeholder
./submit.sh tiny -N 2 -w node1,node2 --bogus-sbatch -- --after-separator=1
utils/nope.sh --help
utils/prometheus.sh vieww <job>
jobkit tgs --json $(ls outputs/*.log | head -1) && jobkit why --no-why x.log | tail -1
```

```text
jobkit sweep batch --not-shell-so-unchecked
```
"""


SCHEDULER = {"squeue", "sacct", "sinfo", "srun", "sbatch", "scontrol", "scancel"}
POST_MORTEM_HEADING = "## 5. Post-mortem once the cluster is gone"


def _words(command: Command) -> tuple[str, ...]:
    stripped = strip_prefixes(command)
    return stripped.words if stripped else ()


def test_the_post_mortem_path_reads_the_job_files_not_the_scheduler():
    """issue 23: the skills had no path for a post-mortem once the cluster is gone (sacct, sinfo, srun fail).
    run-and-triage's section 5 is that path: it runs no scheduler command, and each tool it names is one whose
    flags the checker above verifies against its --help."""
    text = (SKILLS / "run-and-triage" / "SKILL.md").read_text()
    assert POST_MORTEM_HEADING in text
    section = text.split(POST_MORTEM_HEADING, 1)[1].split("\n## ", 1)[0]
    commands = [_words(c) for _, body in shell_blocks(section, "post-mortem") for c in split_commands(body)]
    assert not {w[0] for w in commands if w} & SCHEDULER, commands
    used = {" ".join(w[:2]) for w in commands if w}
    for tool in ("jobkit jobs", "jobkit tail", "jobkit why", "jobkit tgs", "jobkit analyze"):
        assert f".venv/bin/{tool}" in used, (tool, used)
    assert {"utils/prometheus.sh list", "utils/prometheus.sh view"} <= used, used
    assert problems_in(section) == []
    for skill in ("job-monitoring", "node-health", "tsdb-diagnosis"):  # each says where to go instead
        body = (SKILLS / skill / "SKILL.md").read_text()
        assert "cluster is gone" in body, skill


def test_a_job_id_given_to_tail_jobs_or_analyze_comes_with_its_workspace():
    """`jobkit tail 2` without JOB_WORKSPACE printed another job of outputs/ (issue 23): every skill example
    that names a job by id (not by a path) passes --workspace, and `jobkit jobs` does too. Only the playbooks:
    an agent may run in any directory, while the docs are read by people in the checkout, where the default
    workspace (outputs/) is the one their jobs went to."""
    missing = []
    for doc in playbooks():
        for command in commands_of(doc):
            words = _words(command)
            if len(words) < 2 or os.path.basename(words[0]) != "jobkit" or words[1] not in ("tail", "jobs", "analyze"):
                continue
            by_path = any("/" in w or w.startswith("$JOB_WORKSPACE") for w in words[2:3])
            if "--workspace" not in words and not by_path:
                missing.append(f"{command.where}: {' '.join(words)}")
    assert missing == []


def test_checker_reports_made_up_commands_and_flags():
    problems = "\n".join(problems_in(SELF_TEST))
    for expected in ("no option --no-such-flag", "no subcommand 'frobnicate'", "no option --bogus-sbatch",
                     "utils/nope.sh does not exist", "no subcommand 'vieww'", "no option --no-why",
                     "no option --bogus-after-placeholder"):  # fmt: skip
        assert expected in problems, f"expected {expected!r} in:\n{problems}"
    for not_expected in ("--maxtext-ok", "--after-separator", "--not-checked", "--not-shell", "--serial", "--json"):
        assert f"no option {not_expected}" not in problems, f"{not_expected!r} should not be flagged:\n{problems}"


# A docs page as the docs are written: who it is for, then a runnable example. Every line of the block but
# the first carries one mistake the checker must name, with the page and the line.
DOCS_SELF_TEST = """# Launching jobs

For engineers who start MaxText jobs.

```bash
./submit.sh 70b -N 8 -w 'node[1-8]' -- steps=100
./submit.sh 70b -N 8 --made-up-sbatch -- steps=100
RAY=1 ./run_local.sh tiny --made-up-local -- steps=5
jobkit why --made-up-why outputs/<job>.log
jobkit sweep batch tiny --local --made-up-sweep 3
MAX_RETRIES=2 submit.sh tiny -N 2
```
"""


def test_the_docs_are_checked_too():
    """README.md and every docs/*.md page are among the documents the command check reads."""
    checked = set(documents())
    pages = set(DOCS.glob("*.md"))
    assert len(pages) >= 10, "docs/ lost its pages?"
    assert pages <= checked and README in checked, sorted(map(str, pages | {README} - checked))


def test_checker_catches_a_made_up_flag_in_a_docs_page():
    problems = problems_in(DOCS_SELF_TEST, "docs/example.md")
    expected = {
        "docs/example.md:7": "./submit.sh has no option --made-up-sbatch",
        "docs/example.md:8": "./run_local.sh has no option --made-up-local",
        "docs/example.md:9": "`jobkit why` has no option --made-up-why",
        "docs/example.md:10": "`jobkit sweep batch` has no option --made-up-sweep",
        "docs/example.md:11": "write ./submit.sh",
    }
    for where, message in expected.items():
        assert any(p.startswith(f"{where}: ") and message in p for p in problems), (where, message, problems)
    assert not any(p.startswith("docs/example.md:6: ") for p in problems), problems
    assert len(problems) == len(expected), problems


def test_checker_accepts_real_commands():
    good = """```sh
jobkit sweep nodes tiny -w node[1-2] --serial --sbatch-arg=--time=30:00 -- _env_X=1
./submit.sh tiny:tag -N 2 --time=10:00 -w node[1-2] -p local -- steps=15
utils/prometheus.sh view <job> -p 9191
eval "$(utils/local_cluster.sh env)"
```"""
    assert problems_in(good) == []


def test_shell_splitting():
    body = """\
# comment line
A=1 B=2 jobkit tgs --json \\
    x.log | python3 -c 'import json' && echo "ok; not split" ; scancel <jobid>
for n in a b; do ./submit.sh tiny -w "$n" 2>&1 >/dev/null; done
eval "$(utils/local_cluster.sh env)"
sudo utils/local_cluster.sh up -N 2
"""
    words = [c.words for c in split_commands(body)]
    assert words == [
        ("jobkit", "tgs", "--json", "x.log"),
        ("python3", "-c", "import json"),
        ("echo", "ok; not split"),
        ("scancel", "PLACEHOLDER"),
        ("./submit.sh", "tiny", "-w", "$n"),
        ("eval", "SUBST"),
        ("utils/local_cluster.sh", "env"),
        ("utils/local_cluster.sh", "up", "-N", "2"),
    ], words
