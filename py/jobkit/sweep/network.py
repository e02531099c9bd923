"""`jobkit sweep network MODEL -w NODES`: find the node or link that slows multi-node jobs, by bisection.

A 1-node job never crosses the network, so the node sweep cannot see a bad NIC, cable or switch port;
only jobs that span nodes can. The search:
  1. One job on all nodes. Within --tolerance % of the expected TGS/device (or faster): healthy, done.
     A smaller group is held to the best group of its own size when that did better (Search.reference).
  2. Otherwise split the group in halves and run both (together on Slurm; they share no node).
       one half bad     -> the problem is inside it: bisect that half
       both halves good -> the problem is on links between them: mixed groups (a part of each half)
       both halves bad  -> several problems, or something they share (a switch): report, stop
     A single node has no links to test, so a half of one node is never run.
  3. At a pair, name the suspect. The node sweep's 1-node TGS (--from-sweep) tells a slow node from a
     network problem, when the node's own shortfall accounts for the pair's; otherwise a job pairing
     each of the two with a node known to be fine tells which one's network it is, or that only their
     mutual link is bad.
A group is known healthy, without a job, when a healthy group that was run contains it (its links were
all exercised). Failed and hung jobs count as bad: a broken link shows as collective errors or hangs as
often as it shows as slowness. An out-of-memory or configuration failure is no network symptom: the
search stops and says so.

Point keys are "all" and "g:<nodes in -w order>", so a resumed sweep replays the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from jobkit.core import clitypes
from jobkit.core.errors import JobkitError
from jobkit.sweep import common, nodes, state
from jobkit.sweep.engine import CONFIG, Engine
from jobkit.sweep.jobs import Outcome, Point

HEALTHY, DEGRADED, FAILED, INCONCLUSIVE = "healthy", "DEGRADED", "FAILED", "inconclusive"


# --- expected TGS ---
@dataclass(frozen=True)
class Expectation:
    tgs: float
    source: str  # one line for the report: where the number came from
    node_words: dict[str, tuple[float | None, str]] = field(default_factory=dict)  # node sweep: node -> (%, word)
    node_sweep: str = ""


def expectation(model: str, baseline: float | None, from_sweep: str | None) -> Expectation:
    """The expected TGS/device: --baseline, else the upper median of a finished node sweep of MODEL."""
    if baseline is None and not from_sweep:
        raise state.SweepError(
            "no expected TGS: give --baseline TGS (a healthy run's TGS/device) "
            "or --from-sweep ID (a finished `jobkit sweep nodes` of this model)"
        )
    if not from_sweep:
        return Expectation(baseline, "--baseline")
    sweep = state.open_sweep(from_sweep)
    plan = sweep.plan()
    if plan.get("driver") != "nodes":
        raise state.SweepError(
            f"sweep {from_sweep} is a `{plan.get('driver')}` sweep; --from-sweep takes a `jobkit sweep nodes` sweep"
        )
    if plan.get("state") != state.FINISHED:
        raise state.SweepError(
            f"node sweep {from_sweep} is {plan.get('state')}, not finished; "
            f"finish it with `jobkit sweep resume {from_sweep}` or give --baseline"
        )
    theirs = str(plan.get("params", {}).get("model", ""))
    try:
        theirs = common.resolve_model(theirs)
    except state.SweepError:
        pass  # a config renamed since: compare the names as typed
    if theirs != model:
        raise state.SweepError(
            f"node sweep {from_sweep} ran {theirs}, not {model}; TGS of different models do not compare "
            f"(run `jobkit sweep nodes {model}` first, or give --baseline)"
        )
    done = sweep.done()
    passing = [o.tgs for o in done.values() if o.passed and o.tgs is not None]
    ref = nodes.reference(passing)
    if ref is None:
        raise state.SweepError(f"node sweep {from_sweep} has no passing node to take a TGS from; give --baseline")
    words = {node: nodes.health(outcome, ref) for node, outcome in done.items()}
    if baseline is not None:
        return Expectation(baseline, "--baseline", words, from_sweep)
    source = f"upper median of the {len(passing)} passing node(s) of node sweep {from_sweep}"
    return Expectation(ref, source, words, from_sweep)


# --- what was run ---
@dataclass
class Tested:
    role: str
    group: tuple[str, ...]
    outcome: Outcome
    delta: float | None
    word: str

    @property
    def bad(self) -> bool:
        return self.word in (DEGRADED, FAILED)


@dataclass
class Finding:
    kind: str  # healthy | node | link | pair | several | scale | inconclusive
    text: str
    exclude: tuple[str, ...] = ()


def judge(outcome: Outcome, expected: float, tolerance: float) -> tuple[float | None, str]:
    """(percent vs expected, word): a job's TGS within TOLERANCE % below EXPECTED (or above) is healthy."""
    if outcome.passed and outcome.tgs is not None:
        delta = (outcome.tgs - expected) / expected * 100
        return delta, HEALTHY if delta >= -tolerance else DEGRADED
    if outcome.passed or outcome.is_oom or outcome.reason in CONFIG:
        return None, INCONCLUSIVE  # no TGS, or a failure that says nothing about the network
    return None, FAILED


def compact(group: tuple[str, ...]) -> str:
    """node1,node2,node3,node7 -> node[1-3,7]; plain commas when no two nodes are consecutive."""
    split = []
    for name in group:
        stem = name.rstrip("0123456789")
        split.append((stem, name[len(stem) :]))
    if len({stem for stem, _ in split}) != 1 or not all(digits for _, digits in split):
        return ",".join(group)
    runs: list[list[str]] = []
    for _, digits in split:
        if runs and int(digits) == int(runs[-1][-1]) + 1 and len(digits) == len(runs[-1][-1]):
            runs[-1].append(digits)
        else:
            runs.append([digits])
    if all(len(r) == 1 for r in runs):
        return ",".join(group)
    parts = [r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    return f"{split[0][0]}[{','.join(parts)}]"


def halves(group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    middle = len(group) // 2
    return group[:middle], group[middle:]


class Search:
    """The bisection over one engine; `tested` keeps every group in the order it ran (the table's rows)."""

    def __init__(
        self,
        engine: Engine,
        model: str,
        all_nodes: tuple[str, ...],
        args: tuple[str, ...],
        expect: Expectation,
        tolerance: float,
    ):
        self.engine = engine
        self.model = model
        self.all_nodes = all_nodes
        self.args = args
        self.expect = expect
        self.tolerance = tolerance
        self.tested: list[Tested] = []
        self._by_key: dict[str, Tested] = {}
        self._roles: dict[str, int] = {}

    # --- running groups ---
    def key(self, group: tuple[str, ...]) -> str:
        return "all" if group == self.all_nodes else "g:" + ",".join(group)

    def ordered(self, nodes_: set[str] | tuple[str, ...]) -> tuple[str, ...]:
        """Nodes in -w order (keys and nodelists never depend on how a group was put together)."""
        return tuple(n for n in self.all_nodes if n in set(nodes_))

    def known_healthy(self, group: tuple[str, ...]) -> bool:
        """No links to test (one node), or inside a group that ran healthy."""
        return len(group) < 2 or any(t.word == HEALTHY and set(group) <= set(t.group) for t in self.tested)

    def run(self, role: str, groups: list[tuple[str, ...]]) -> list[Tested | None]:
        """Run GROUPS (disjoint) together; None for a group known healthy without a job."""
        todo: list[Point] = []
        for group in groups:
            key = self.key(group)
            if key in self._by_key or self.known_healthy(group):
                continue
            self._roles[role] = self._roles.get(role, 0) + 1
            label = role if role == "all" else f"{role}-{self._roles[role]}"
            todo.append(Point(key, self.model, len(group), group, self.args, label=label))
        ran = list(zip(todo, self.engine.run(todo), strict=True))
        for point, outcome in ran:
            tested = Tested(point.label, point.nodes, outcome, None, "")
            self.tested.append(tested)
            self._by_key[point.key] = tested
        for point, outcome in ran:  # judged once the whole round is in: its groups are each other's peers
            tested = self._by_key[point.key]
            tested.delta, tested.word = judge(outcome, self.reference(len(point.nodes)), self.tolerance)
        return [self._by_key.get(self.key(g)) for g in groups]

    def reference(self, size: int) -> float:
        """The TGS/device a healthy group of SIZE nodes makes: the expected TGS, or the best group of that
        size run so far when it is higher. Per-device TGS is flat across sizes on dedicated nodes, but rises
        as groups shrink where nodes share CPUs or a fabric, so a small group is held to its peers."""
        peers = [t.outcome.tgs for t in self.tested if len(t.group) == size and t.outcome.passed and t.outcome.tgs]
        return max([self.expect.tgs, *peers])

    def one(self, role: str, group: tuple[str, ...]) -> Tested | None:
        return self.run(role, [group])[0]

    # --- the search ---
    def search(self) -> Finding:
        first = self.one("all", self.all_nodes)
        assert first is not None
        if first.word == HEALTHY:
            return Finding("healthy", f"all {len(self.all_nodes)} nodes together are healthy: no network problem found")
        if first.word == INCONCLUSIVE:
            return self.inconclusive(first)
        return self.bisect(self.all_nodes)

    def bisect(self, group: tuple[str, ...]) -> Finding:
        """GROUP ran bad; find the problem inside it."""
        if len(group) == 2:
            return self.pair(group)
        a, b = halves(group)
        ta, tb = self.run("half", [a, b])
        for t in (ta, tb):
            if t is not None and t.word == INCONCLUSIVE:
                return self.inconclusive(t)
        bad = [t for t in (ta, tb) if t is not None and t.bad]
        if len(bad) == 2:
            return self.several(bad)
        if len(bad) == 1:
            return self.bisect(bad[0].group)
        return self.cross(a, b)

    def cross(self, a: tuple[str, ...], b: tuple[str, ...]) -> Finding:
        """A and B are each healthy, together bad: the problem is on a link between them.
        Mixed groups take a half of each side; those that share no node run together."""
        if len(a) == 1 and len(b) == 1:
            return self.pair(self.ordered((*a, *b)))
        sides_a = halves(a) if len(a) > 1 else (a, a)
        sides_b = halves(b) if len(b) > 1 else (b, b)
        combos: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        for x, y in (
            (sides_a[0], sides_b[0]),
            (sides_a[1], sides_b[1]),
            (sides_a[0], sides_b[1]),
            (sides_a[1], sides_b[0]),
        ):
            if (x, y) not in combos:
                combos.append((x, y))
        while combos:
            # 1. a round: the next mixed groups that share no node
            round_, used = [], set()
            for x, y in list(combos):
                if used.isdisjoint(x + y):
                    round_.append((x, y))
                    used.update(x + y)
                    combos.remove((x, y))
            results = self.run("mixed", [self.ordered((*x, *y)) for x, y in round_])
            # 2. judge it
            for t in results:
                if t is not None and t.word == INCONCLUSIVE:
                    return self.inconclusive(t)
            bad = [(xy, t) for xy, t in zip(round_, results, strict=True) if t is not None and t.bad]
            if len(bad) > 1:
                return self.several([t for _, t in bad])
            if bad:
                (x, y), _ = bad[0]
                return self.cross(x, y)
        # A node shared by every mixed group (one side is a single node) and all of them bad is caught
        # above on the first one; here every link between the sides was fine in smaller groups.
        whole = self.ordered((*a, *b))
        return Finding(
            "scale",
            f"{compact(whole)} is slow together, but every smaller group across it is fine: the problem shows "
            "only at this scale (a shared switch or uplink, congestion); take it to the infrastructure team",
        )

    def pair(self, pair: tuple[str, ...]) -> Finding:
        """PAIR ran bad. Say which node, or that it is their link, as far as the evidence goes."""
        x, y = pair
        words = self.expect.node_words
        # 1. the node sweep: a node slow on its own explains the pair only as far as its own shortfall goes
        #    (8 % slow alone does not make a pair 60 % slow; that is the network too)
        ran = self._by_key.get(self.key(pair))
        slow_alone = [n for n in pair if self._explains(words.get(n, (None, "")), ran)]
        if len(slow_alone) == 2:
            return Finding(
                "node",
                f"{x} and {y}: both are slow on their own too (node sweep {self.expect.node_sweep}), "
                "so the nodes themselves, not the network, are the problem",
                pair,
            )
        if len(slow_alone) == 1:
            node = slow_alone[0]
            delta, word = words[node]
            how = f"{word.lower()}, {common.fmt_pct(delta, True)}" if delta is not None else word.lower()
            return Finding(
                "node",
                f"{node}: it is slow on its own too (node sweep {self.expect.node_sweep}: {how}), "
                "so the node itself, not the network, is the problem",
                (node,),
            )
        # 2. each of the two with a partner known to be fine (a different partner each, so both run at once)
        partners = [n for n in self.all_nodes if n not in pair and self._network_ok(n)]
        if partners:
            px = partners[0]
            py = partners[1] if len(partners) > 1 else partners[0]
            gx, gy = self.ordered((x, px)), self.ordered((y, py))
            tx, ty = self.run("check", [gx, gy]) if px != py else (self.one("check", gx), self.one("check", gy))
            for t in (tx, ty):
                if t is not None and t.word == INCONCLUSIVE:
                    return self.inconclusive(t)
            x_bad, y_bad = (tx is not None and tx.bad), (ty is not None and ty.bad)
            if x_bad and not y_bad:
                return self._node_network(x, y, px)
            if y_bad and not x_bad:
                return self._node_network(y, x, py)
            if not x_bad and not y_bad:
                return Finding(
                    "link",
                    f"the link between {x} and {y}: each is fine with other nodes "
                    f"({'+'.join(gx)}, {'+'.join(gy)}), the two together are not; "
                    "check the cables and switch ports on that path",
                    (y,),
                )
            return self.several([t for t in (tx, ty) if t is not None])
        both_fine = all(words.get(n, (None, ""))[1] in ("healthy", "marginal") for n in pair)
        why = f" (both are healthy alone in node sweep {self.expect.node_sweep})" if both_fine and words else ""
        return Finding(
            "pair",
            f"{x} or {y} (or the link between them){why}; no third node known to be fine was left to tell "
            "them apart: rerun on more nodes, or leave both out",
            pair,
        )

    def _explains(self, alone: tuple[float | None, str], pair: Tested | None) -> bool:
        """Does a node's own node-sweep result (ALONE: percent, word) account for how PAIR ran?"""
        delta, word = alone
        if word == "UNHEALTHY":
            return True  # it fails on its own
        if word != "DEGRADED" or delta is None or pair is None or pair.delta is None:
            return False
        return pair.delta >= delta - self.tolerance

    def _network_ok(self, node: str) -> bool:
        return any(t.word == HEALTHY and len(t.group) > 1 and node in t.group for t in self.tested)

    def _node_network(self, node: str, other: str, partner: str) -> Finding:
        return Finding(
            "node",
            f"{node}'s network (or its link to {other}): {node} is slow with {partner} too, "
            f"while {other} is fine with other nodes; check {node}'s NIC, cable and switch port",
            (node,),
        )

    def several(self, bad: list[Tested]) -> Finding:
        groups = " and ".join(compact(t.group) for t in bad)
        return Finding(
            "several",
            f"{groups} are each slow on their own: several problems, or infrastructure they share (a switch, "
            "a fabric manager); report to the infrastructure team",
        )

    def inconclusive(self, t: Tested) -> Finding:
        why = common.fmt_status(t.outcome) if not t.outcome.passed else "passed without a steady TGS"
        return Finding(
            "inconclusive",
            f"the job on {compact(t.group)} (job {t.outcome.job_id or '—'}) {why}: not a network symptom, so the "
            f"search stopped; fix that first (a model that fits on 2 nodes, enough --steps for a TGS)",
        )


def recommended(search: Search, finding: Finding) -> str:
    exclude = set(finding.exclude) | set(search.engine.excluded)
    if finding.kind in ("several", "scale", "inconclusive"):
        healthy = [t.group for t in search.tested if t.word == HEALTHY and not exclude & set(t.group)]
        best = max(healthy, key=len, default=())
        return f"{','.join(best)} (the largest group that ran healthy)" if best else "none proven healthy"
    kept = ",".join(n for n in search.all_nodes if n not in exclude) or "none"
    if finding.kind == "link":
        return f"{kept} (leaves out one end of the link, {finding.exclude[0]}; the other end would do as well)"
    return kept


def report(search: Search, finding: Finding) -> str:
    expect = search.expect
    rows = []
    for t in search.tested:
        status = t.word if t.outcome.passed else f"{t.word}: {common.fmt_status(t.outcome)}"
        rows.append(
            [
                t.role,
                compact(t.group),
                t.outcome.job_id or "—",
                common.fmt_tgs(t.outcome.tgs),
                common.fmt_pct(t.delta, True),
                status,
            ]
        )
    lines = [
        f"## Network sweep: {search.model}, {len(search.all_nodes)} nodes ({compact(search.all_nodes)})\n",
        common.table(["Group", "Nodes", "Job", "TGS/device", "vs. expected", "Status"], rows),
        f"Expected: {common.fmt_tgs(expect.tgs)} TGS/device ({expect.source}); "
        f"degraded = more than {search.tolerance:g} % below (a smaller group: below the best group of its size, "
        "when that is higher).",
        f"Conclusion: {finding.text}.",
        f"Recommended nodelist: {recommended(search, finding)}",
    ]
    if search.engine.excluded:
        lines.append(f"Excluded by the engine (errors blamed on them): {','.join(search.engine.excluded)}")
    return "\n".join(lines) + "\n"


@common.driver_command("network")
@click.argument("model")
@click.option("-w", "--nodelist", "nodelist", help="Nodes to test together, e.g. 'node[1-8]' (required).")
@click.option(
    "--baseline",
    type=clitypes.Positive("TGS per device", max=1e9),
    help="Expected TGS/device (a healthy run of MODEL).",
)
@click.option("--from-sweep", "from_sweep", help="A finished `jobkit sweep nodes` of MODEL: its median is expected.")
@click.option(
    "--tolerance",
    type=clitypes.Percent(),
    default=5.0,
    show_default=True,
    help="Percent below expected that still counts as healthy.",
)
@common.steps_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(model, nodelist, baseline, from_sweep, tolerance, steps, extra, **params):
    """All NODES in one job of MODEL; if slower than expected, bisect to the node or link to blame.

    The expected TGS/device is --baseline, else the median of a node sweep (--from-sweep ID), whose
    per-node results also tell a slow node from a bad link. EXTRA (after --) are MaxText key=value and
    _env_KEY=VALUE settings for every job.
    """
    try:
        if params.get("local"):
            raise state.SweepError("a network sweep runs multi-node jobs on Slurm; --local cannot (drop it)")
        model = common.resolve_model(model)
        all_nodes = common.parse_nodes(nodelist)
        if len(all_nodes) < 2:
            raise state.SweepError(
                f"-w {nodelist!r} is one node; a network sweep needs at least 2 (e.g. -w 'node[1-4]')"
            )
        expect = expectation(model, baseline, from_sweep)
    except state.SweepError as exc:
        raise JobkitError("sweep", str(exc)) from None
    args = common.with_steps(tuple(extra), steps)

    def body(engine: Engine) -> str:
        search = Search(engine, model, all_nodes, args, expect, tolerance)
        return report(search, search.search())

    common.execute("network", model, body)
