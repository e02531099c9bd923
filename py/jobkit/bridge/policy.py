"""The bridge's policy: configs/bridge_policy.yaml (+ a site-local file) read into entries, and one decision
per command line: a Plan of argv lists to run, or Refused naming the rule and what to ask the person for.

The decision is made on the parsed command (shellwords), never on its text: every stage's program must be an
entry, every option and subcommand must be one its entry allows, every path argument must resolve (symlinks
followed) under the repository or the workspace, and the checks written in code (own-job, node-resume, ssh)
see the exact argv that would run. Nothing the policy does not understand gets through: an unknown option is
refused even when it would have been harmless.
"""

from __future__ import annotations

import glob as globmod
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobkit.bridge.shellwords import Pipeline, Refused, Stage, Word, parse, quote
from jobkit.core.nodelist import expand_nodelist
from jobkit.core.paths import CONFIGS_DIR

POLICY_FILE = CONFIGS_DIR / "bridge_policy.yaml"
LOCAL_POLICY_FILE = CONFIGS_DIR / "bridge_policy.local.yaml"
LOCAL_SETTING = "BRIDGE_POLICY_FILE"
KINDS = ("flag", "int", "text", "path")
POSITIONALS = ("none", "text", "path", "pattern+path")
CHECKS = ("own-job", "node-resume", "ssh")
ENTRY_KEYS = {"why", "exec", "enabled", "args", "options", "numeric_option", "positional", "max_positional",
              "subcommands", "check", "remote", "local", "paths"}  # fmt: skip
ASK_PERSON = "ask the person to run it on the host, or to add it to configs/bridge_policy.local.yaml"


class PolicyError(Exception):
    """A policy file that cannot be used: the message names the file, the entry and the fix."""


@dataclass
class Entry:
    name: str
    why: str = ""
    exec: str = ""
    enabled: bool = True
    any_args: bool = False
    options: dict[str, str] = field(default_factory=dict)
    numeric_option: bool = False
    positional: str = "none"
    max_positional: int | None = None
    subcommands: dict[str, Entry] = field(default_factory=dict)
    check: str = ""
    remote: bool = False
    local: bool = True
    check_paths: bool = True


@dataclass
class Policy:
    programs: dict[str, Entry]
    limits: dict[str, int]
    pass_env: list[str]
    deny_paths: list[str]
    ssh_nodes: list[str]
    files: list[str]


DEFAULT_LIMITS = {"command_chars": 4096, "request_bytes": 16384, "output_bytes": 1 << 20,
                  "timeout_max_s": 86400, "keep_results_hours": 24}  # fmt: skip


def _entry(where: str, name: str, raw) -> Entry:
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: entry {name!r} is not a mapping; give it why:/args: or options:")
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        raise PolicyError(f"{where}: entry {name!r}: unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
    options = raw.get("options") or {}
    for opt, kind in options.items():
        if not str(opt).startswith("-") or kind not in KINDS:
            raise PolicyError(f"{where}: {name} option {opt!r}: {kind!r} is not one of {KINDS}")
    positional = raw.get("positional", "none")
    if positional not in POSITIONALS:
        raise PolicyError(f"{where}: {name}: positional {positional!r} is not one of {POSITIONALS}")
    check = raw.get("check", "")
    if check and check not in CHECKS:
        raise PolicyError(f"{where}: {name}: check {check!r} is not one of {CHECKS}")
    args = raw.get("args")
    if args not in (None, "any"):
        raise PolicyError(f"{where}: {name}: args {args!r}: only `any` (or leave it out and list options:)")
    subs = raw.get("subcommands") or {}
    return Entry(
        name=name, why=str(raw.get("why", "")), exec=str(raw.get("exec", "")), enabled=bool(raw.get("enabled", True)),
        any_args=args == "any", options={str(k): v for k, v in options.items()},
        numeric_option=bool(raw.get("numeric_option")), positional=positional,
        max_positional=raw.get("max_positional"), check=check, remote=bool(raw.get("remote")),
        local=bool(raw.get("local", True)), check_paths=raw.get("paths", "checked") != "unchecked",
        subcommands={str(k): _entry(where, f"{name} {k}", v) for k, v in subs.items()},
    )  # fmt: skip


def _read(path: Path) -> dict:
    import yaml  # deferred: only the server reads the policy

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read it ({exc.strerror}); restore it or unset {LOCAL_SETTING}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the file") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: not a mapping of limits:/programs:; fix the file")
    return data


def load(path: Path | None = None, local: Path | None | bool = True) -> Policy:
    """The policy (PATH, default configs/bridge_policy.yaml) with the site-local file merged (LOCAL: True: the
    one BRIDGE_POLICY_FILE names, else configs/bridge_policy.local.yaml when present; None/False: none)."""
    path = Path(path or POLICY_FILE)
    data = _read(path)
    programs = {str(k): _entry(str(path), str(k), v) for k, v in (data.get("programs") or {}).items()}
    policy = Policy(programs, {**DEFAULT_LIMITS, **(data.get("limits") or {})}, list(data.get("pass_env") or []),
                    list(data.get("deny_paths") or []), list(data.get("ssh_nodes") or []), [str(path)])  # fmt: skip
    if local is True:
        given = os.environ.get(LOCAL_SETTING)
        if given and not Path(given).is_file():
            raise PolicyError(f"{LOCAL_SETTING}={given}: no such file; point it at a policy file or unset it")
        local = Path(given) if given else (LOCAL_POLICY_FILE if LOCAL_POLICY_FILE.is_file() else None)
    if local:
        _merge(policy, Path(local), _read(Path(local)))
    for key, value in policy.limits.items():
        if key not in DEFAULT_LIMITS or not isinstance(value, int) or value <= 0:
            raise PolicyError(f"{policy.files[-1]}: limits.{key}={value!r}: give one of {sorted(DEFAULT_LIMITS)}, > 0")
    return policy


def _merge(policy: Policy, path: Path, data: dict) -> None:
    where = str(path)
    for name in data.get("remove") or []:
        if policy.programs.pop(str(name), None) is None:
            raise PolicyError(f"{where}: remove: {name!r} is not in the policy; check the name")
    for name, raw in (data.get("programs") or {}).items():
        name = str(name)
        if isinstance(raw, dict) and set(raw) == {"enabled"} and name in policy.programs:
            policy.programs[name].enabled = bool(raw["enabled"])
        elif isinstance(raw, dict) and set(raw) == {"subcommands"} and name in policy.programs:
            for sub, subraw in raw["subcommands"].items():  # e.g. scontrol: {subcommands: {update: {enabled: true}}}
                have = policy.programs[name].subcommands.get(str(sub))
                if have is not None and isinstance(subraw, dict) and set(subraw) == {"enabled"}:
                    have.enabled = bool(subraw["enabled"])
                else:
                    policy.programs[name].subcommands[str(sub)] = _entry(where, f"{name} {sub}", subraw)
        else:
            policy.programs[name] = _entry(where, name, raw)
    policy.limits.update(data.get("limits") or {})
    if "pass_env" in data:
        policy.pass_env = [str(v) for v in data["pass_env"] or []]
    if "deny_paths" in data:
        policy.deny_paths = list(data["deny_paths"] or [])
    policy.ssh_nodes += [str(n) for n in data.get("ssh_nodes") or []]
    policy.files.append(where)


# ---------------------------------------------------------------------------------------------------------
# Deciding


@dataclass
class Step:
    """One program of a pipeline, ready to run: its argv (argv[0] absolute) and where its streams go."""

    argv: list[str]
    stdin: str | None = None  # a file (checked) for `< file`
    stdout_null: bool = False
    stderr: str = "pipe"  # pipe | null | stdout
    repo_program: bool = False


@dataclass
class Plan:
    pipelines: list[tuple[str, list[Step]]]  # (separator before it, its steps)


@dataclass
class Context:
    """What a decision needs besides the policy: where things are and what the cluster is."""

    repo: Path
    workspace: Path
    cwd: Path  # already checked to be under a root
    nodes: Callable[[], set[str]] = set  # this cluster's node names (sinfo), asked only when needed
    which: Callable[[str], str | None] = shutil.which
    translate: Callable[[str], str] = str  # the container's view of a path -> the host's

    def roots(self) -> list[Path]:
        return [self.repo.resolve(), self.workspace.resolve()]


def decide(policy: Policy, line: str, ctx: Context) -> Plan:
    """LINE as a Plan, or Refused (rule, message, ask)."""
    if len(line) > policy.limits["command_chars"]:
        raise Refused("request-size", f"the command is {len(line)} characters, over {policy.limits['command_chars']}",
                      "split it into shorter commands")  # fmt: skip
    plan = Plan([])
    for pipeline in parse(line):
        plan.pipelines.append((pipeline.sep, [_step(policy, stage, ctx, i, len(pipeline.stages))
                                              for i, stage in enumerate(pipeline.stages)]))  # fmt: skip
    return plan


ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _step(policy: Policy, stage: Stage, ctx: Context, index: int, count: int) -> Step:
    first = stage.words[0]
    if ASSIGNMENT.match(first.text):
        raise Refused("env-assign", f"{first.text}: no variables set for a command", "pass settings as arguments")
    entry, exe = _program(policy, first, ctx)
    if not entry.local:
        raise Refused("remote-only", f"{entry.name} runs only on a node: ssh <node> '{entry.name} ...'", ASK_PERSON)
    argv = [exe] + _args(policy, entry, stage.words[1:], ctx, remote=False)
    step = Step(argv, repo_program=entry.exec.startswith("{repo}"))
    for red in stage.redirects:
        if red.fd == 0:
            if index != 0:
                raise Refused("redirect", "< FILE only on the first command of a pipeline", "")
            step.stdin = _path(policy, red.target, ctx)
        elif red.fd == 1:
            step.stdout_null = True
        elif red.target == "/dev/null":
            step.stderr = "null"
        else:
            step.stderr = "stdout"
    return step


def _program(policy: Policy, word: Word, ctx: Context) -> tuple[Entry, str]:
    """The entry the program word names and the absolute path that will run."""
    name = word.text
    if word.glob:
        raise Refused("glob", f"program {name!r} is a pattern", "name the program")
    if "/" in name:  # by path: only this repository's own programs, named as their entry's exec
        real = os.path.realpath(ctx.translate(os.path.join(ctx.cwd, name)))
        for entry in policy.programs.values():
            if entry.exec and os.path.realpath(_exec_path(entry, ctx)) == real:
                return _enabled(entry), _exec_path(entry, ctx)
        raise Refused("program-path", f"{name}: a program given by path that the policy does not name",
                      f"use the bare name of an allowed program ({', '.join(sorted(policy.programs))}); {ASK_PERSON}")  # fmt: skip
    entry = policy.programs.get(name)
    if entry is None:
        raise Refused("program", f"{name!r} is not an allowed program",
                      f"allowed: {', '.join(sorted(policy.programs))}; {ASK_PERSON}")  # fmt: skip
    _enabled(entry)
    if entry.exec:
        return entry, _exec_path(entry, ctx)
    if not entry.local:
        return entry, name
    found = ctx.which(name)
    if not found:
        raise Refused("absent", f"{name} is not installed on this host (not on the server's PATH)", "")
    return entry, found


def _exec_path(entry: Entry, ctx: Context) -> str:
    path = entry.exec.replace("{repo}", str(ctx.repo))
    if entry.name == "jobkit" and not os.path.exists(path):  # no venv in the checkout: the jobkit on PATH
        return ctx.which("jobkit") or path
    return path


def _enabled(entry: Entry) -> Entry:
    if not entry.enabled:
        raise Refused("site-disabled", f"{entry.name} is off in this site's policy",
                      f"ask the person to enable `{entry.name}` in configs/bridge_policy.local.yaml, or to run it")  # fmt: skip
    return entry


def _args(policy: Policy, entry: Entry, words: list[Word], ctx: Context, remote: bool) -> list[str]:
    """WORDS as checked arguments for ENTRY (its subcommand chosen and checked too)."""
    if entry.check == "ssh":
        return _ssh(policy, words, ctx)
    if entry.check == "own-job":
        return _own_job(words, ctx)
    if entry.any_args:
        return [_any_arg(policy, entry, w, ctx) for w in words]
    out, positionals, k, ended = [], [], 0, False
    while k < len(words):
        w = words[k]
        if w.text == "--" and not ended:
            ended = True
            out.append(w.text)
        elif w.text.startswith("-") and w.text != "-" and not ended:
            k = _option(policy, entry, words, k, ctx, out, remote)
        elif entry.subcommands and not positionals:
            sub = entry.subcommands.get(w.text)
            if sub is None or w.glob:
                raise Refused("subcommand", f"{entry.name} {w.text}: not an allowed subcommand",
                              f"allowed: {', '.join(f'{entry.name} {s}' for s in entry.subcommands)}; {ASK_PERSON}")  # fmt: skip
            _enabled(sub)
            if sub.check == "node-resume":
                return [*out, w.text, *_node_resume(words[k + 1 :], ctx)]
            return [*out, w.text, *_args(policy, sub, words[k + 1 :], ctx, remote)]
        else:
            positionals.append(w)
        k += 1
    return out + _positionals(policy, entry, positionals, ctx, remote, out)


def _any_arg(policy: Policy, entry: Entry, w: Word, ctx: Context) -> str:
    if w.glob:
        raise Refused("glob", f"{w.text!r}: an unquoted pattern in an argument of {entry.name}",
                      "quote it if it is meant literally; the bridge expands patterns only for file arguments")  # fmt: skip
    if entry.check_paths:  # a path-looking argument (or --opt=path), existing or not, must stay under the roots
        value = w.text.split("=", 1)[1] if w.text.startswith("-") and "=" in w.text else w.text
        if "/" in value or value in (".", ".."):
            _path(policy, value, ctx)
            return w.text[: len(w.text) - len(value)] + ctx.translate(value)
    return w.text


def _option(policy: Policy, entry: Entry, words: list[Word], k: int, ctx: Context, out: list, remote: bool) -> int:
    """Checks the option at WORDS[K] (and its value) into OUT; returns the index of the last word used."""
    w = words[k]
    text = w.text
    if w.glob:
        raise Refused("glob", f"{text!r}: an unquoted pattern", "quote it if it is meant literally")

    def value_of(opt: str, kind: str, attached: str | None) -> tuple[str, int]:
        if attached is None:
            if k + 1 >= len(words):
                raise Refused("args", f"{entry.name} {opt}: needs a value", "")
            return _value(policy, entry, opt, kind, words[k + 1], ctx, remote), k + 1
        return _value(policy, entry, opt, kind, Word(attached), ctx, remote), k

    if text.startswith("--"):
        opt, eq, attached = text.partition("=")
        kind = entry.options.get(opt)
        if kind is None:
            raise _bad_option(entry, opt)
        if kind == "flag":
            if eq:
                raise Refused("args", f"{entry.name} {opt} takes no value", "")
            out.append(opt)
            return k
        value, last = value_of(opt, kind, attached if eq else None)
        out.append(f"{opt}={value}" if eq else opt)
        if not eq:
            out.append(value)
        return last
    if entry.numeric_option and text[1:].isdigit():
        out.append(text)
        return k
    if text in entry.options and entry.options[text] != "flag":  # -opt value (rocm-smi's long single-dash kind)
        value, last = value_of(text, entry.options[text], None)
        out += [text, value]
        return last
    for j, ch in enumerate(text[1:], start=1):  # -abc, -n5, -A 3
        opt = f"-{ch}"
        kind = entry.options.get(opt)
        if kind is None:
            raise _bad_option(entry, text if len(text) == 2 else f"{opt} (in {text})")
        if kind != "flag":
            rest = text[j + 1 :]
            value, last = value_of(opt, kind, rest or None)
            out += [opt, value]
            return last
        out.append(opt)
    return k


def _bad_option(entry: Entry, opt: str) -> Refused:
    allowed = " ".join(entry.options) or "none"
    return Refused("option", f"{entry.name}: option {opt} is not allowed", f"allowed: {allowed}; {ASK_PERSON}")


def _value(policy: Policy, entry: Entry, opt: str, kind: str, w: Word, ctx: Context, remote: bool) -> str:
    if kind == "int":
        if not re.fullmatch(r"[+-]?\d{1,12}", w.text):
            raise Refused("args", f"{entry.name} {opt} {w.text!r}: not a whole number", "")
        return w.text
    if w.glob:
        raise Refused("glob", f"{entry.name} {opt} {w.text!r}: an unquoted pattern", "quote it if literal")
    if kind == "path":
        if remote:
            raise Refused("path", f"{entry.name} {opt}: no file arguments on a node", "pipe the output instead")
        return _path(policy, w.text, ctx)
    return w.text


def _positionals(policy: Policy, entry: Entry, words: list[Word], ctx: Context, remote: bool, opts: list) -> list:
    kinds = entry.positional
    if kinds == "none" and words:
        raise Refused("args", f"{entry.name}: takes no arguments ({words[0].text!r} given)", ASK_PERSON)
    if entry.max_positional is not None and len(words) > entry.max_positional:
        raise Refused("args", f"{entry.name}: at most {entry.max_positional} arguments", "")
    out = []
    for i, w in enumerate(words):
        is_pattern = kinds == "pattern+path" and i == 0 and "-e" not in opts
        if kinds == "text" or is_pattern:
            if w.glob and not is_pattern:
                raise Refused("glob", f"{entry.name} {w.text!r}: an unquoted pattern", "quote it if literal")
            out.append(w.text)
        elif remote:
            raise Refused("path", f"{entry.name} {w.text}: no file arguments on a node", "pipe the output instead")
        elif w.glob:
            out += _expand(policy, w.text, ctx)
        else:
            out.append(_path(policy, w.text, ctx))
    return out


def _expand(policy: Policy, pattern: str, ctx: Context) -> list[str]:
    """A file pattern expanded here (as the shell would have), every match checked; no match: the pattern."""
    host = ctx.translate(pattern)
    matches = sorted(globmod.glob(host, root_dir=ctx.cwd))
    if matches:
        return [_path(policy, m, ctx) for m in matches]
    _path(policy, os.path.dirname(pattern) or ".", ctx)  # no match: the program says so, as after a shell
    return [os.path.join(ctx.cwd, host)]


def _path(policy: Policy, given: str, ctx: Context) -> str:
    """GIVEN (relative to the cwd, or absolute, in the container's view) as a host path under a root, with
    symlinks followed; refused otherwise. Returns the path to pass on (absolute, symlinks kept)."""
    if given == "-":
        return given
    host = os.path.join(ctx.cwd, ctx.translate(given))
    real = Path(os.path.realpath(host))
    if not any(real == root or root in real.parents for root in ctx.roots()):
        raise Refused("path", f"{given}: outside the repository and the workspace (it is {real})",
                      "read files under the repository or $JOB_WORKSPACE only; ask the person for anything else")  # fmt: skip
    for part in (Path(os.path.normpath(host)), real):
        text = "/" + "/".join(part.parts[1:]) + "/"
        for denied in policy.deny_paths:
            if f"/{denied.strip('/')}/" in text:
                raise Refused("path", f"{given}: under {denied}, which the bridge never reads", "ask the person")
    return os.path.normpath(host)


# ---------------------------------------------------------------------------------------------------------
# The checks written in code


JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")


def _own_job(words: list[Word], ctx: Context) -> list[str]:
    """scancel <id>: one job id, no options, and the job is this workspace's ($JOB_WORKSPACE/<id>-* exists)."""
    ask = "cancel one job of this workspace by its id (`scancel <id>`); for any other, ask the person"
    if len(words) != 1 or not JOB_ID.fullmatch(words[0].text):
        raise Refused(
            "own-job", f"scancel takes exactly one job id and no options (got {[w.text for w in words]})", ask
        )
    job = words[0].text.split("_")[0]
    if not globmod.glob(f"{globmod.escape(str(ctx.workspace))}/{job}-*"):
        raise Refused("own-job", f"job {job} is not in this workspace (no {ctx.workspace}/{job}-*)", ask)
    return [words[0].text]


def _node_resume(words: list[Word], ctx: Context) -> list[str]:
    """scontrol update NodeName=<nodes of this cluster> State=RESUME, nothing else."""
    ask = "give exactly `scontrol update NodeName=<node> State=RESUME`; for anything else ask the person"
    pairs = dict(w.text.split("=", 1) for w in words if "=" in w.text and not w.glob)
    keys = {k.lower(): v for k, v in pairs.items()}
    if len(words) != 2 or len(keys) != 2 or set(keys) != {"nodename", "state"} or keys["state"].upper() != "RESUME":
        raise Refused(
            "node-resume", f"scontrol update {' '.join(w.text for w in words)}: not NodeName=... State=RESUME", ask
        )
    try:
        names = expand_nodelist(keys["nodename"])
    except ValueError:
        raise Refused("node-resume", f"NodeName={keys['nodename']}: not a node list", ask) from None
    unknown = sorted(set(names) - ctx.nodes())
    if unknown:
        raise Refused("node", f"{', '.join(unknown)}: not a node of this cluster (sinfo)", ask)
    return [w.text for w in words]


SSH_OPTIONS = ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]


def _ssh(policy: Policy, words: list[Word], ctx: Context) -> list[str]:
    """ssh <node> <command>: the node is this cluster's, the command is parsed and checked by the same policy
    (remote entries only, no file arguments) and sent as one string of quoted words."""
    ask = "use `ssh <node> '<dmesg|rocm-smi|nvidia-smi|ibstat ...> [| grep ...]'`; for anything else ask the person"
    if not words or words[0].text.startswith("-"):
        raise Refused("option", "ssh takes no options through the bridge (the server sets its own)", ask)
    node = words[0]
    if node.glob or node.text not in ctx.nodes() | set(policy.ssh_nodes):
        raise Refused("node", f"{node.text!r} is not a node of this cluster (sinfo)", ask)
    if len(words) < 2:
        raise Refused("args", "ssh without a command (no interactive logins)", ask)
    remote_line = " ".join(w.text for w in words[1:])
    parts = []
    for pipeline in parse(remote_line):
        parts.append((pipeline.sep, " | ".join(_remote_stage(policy, s, ctx) for s in pipeline.stages)))
    remote = " ".join(f"{sep} {text}" if sep else text for sep, text in parts)
    return [*SSH_OPTIONS, "--", node.text, remote]


def _remote_stage(policy: Policy, stage: Stage, ctx: Context) -> str:
    name = stage.words[0].text
    entry = policy.programs.get(name)
    if entry is None or not entry.remote or "/" in name:
        allowed = ", ".join(sorted(n for n, e in policy.programs.items() if e.remote))
        raise Refused("remote", f"{name!r} is not allowed on a node", f"allowed through ssh: {allowed}; {ASK_PERSON}")
    _enabled(entry)
    argv = [name] + _args(policy, entry, stage.words[1:], ctx, remote=True)
    redirects = []
    for red in stage.redirects:
        if red.fd == 0:
            raise Refused("path", "no < FILE on a node", "pipe the output instead")
        redirects.append("2>&1" if red.target == "1" else f"{red.fd}>/dev/null")
    return " ".join([*(quote(a) for a in argv), *redirects])


def describe(policy: Policy) -> str:
    """The policy in force, for `jobkit bridge policy`: one line per program (and subcommand)."""
    lines = [f"policy: {' + '.join(policy.files)}"]
    for name, e in sorted(policy.programs.items()):
        where = "node only" if not e.local else ("local+ssh" if e.remote else "local")
        state = "" if e.enabled else "  [off: site-disabled]"
        lines.append(f"  {name:<20} {where:<9} {e.why}{state}")
        for sub, s in e.subcommands.items():
            lines.append(f"  {'':<4}{name} {sub}{'  [off: site-disabled]' if not s.enabled else ''}  {s.why}".rstrip())
    lines.append(f"limits: {', '.join(f'{k}={v}' for k, v in policy.limits.items())}")
    lines.append(f"never read: {', '.join(policy.deny_paths)}; extra ssh nodes: {', '.join(policy.ssh_nodes) or '-'}")
    return "\n".join(lines)


__all__ = ["Context", "Entry", "Pipeline", "Plan", "Policy", "PolicyError", "Refused", "Step", "decide", "load"]
