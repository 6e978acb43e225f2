"""A mutation score per package from a seeded sample, and the mutants of a change (Python 3.11+).

Run through hatch (``hatch run mutation:sample``, ``hatch run mutation:changed``), which stages
the five packages' ``src/netcl`` trees merged into ``.mutation/src`` first (hatch.toml); this
script then works in ``.mutation`` with mutmut 3's own machinery: mutmut generates every mutant
(its names: ``module.x_function__mutmut_N``, ``module.xǁClassǁmethod__mutmut_N``), this script
picks some, ``mutmut run NAME...`` runs only those (each against the tests that reach its
function), and the verdicts and diffs are read back from mutmut's files.

``sample``: every package module's mutants, a random sample per package drawn with a seed
(stratified: each module in proportion to its mutants, at least one each, at least ``--size``
per package), run, and a table per package (killed, survived, timed out, score with its 95%
Wilson interval) with each survivor's diff, added to benchmarks/results/mutation.md with the
date, commit, seed, wall and CPU time. Survivors judged by hand are listed in
benchmarks/tracking/mutation_equivalent.toml with the reason: equivalent ones leave the score,
those a test kills that mutmut did not run count as killed (see :class:`Equivalent`); a kind of
mutant that cannot change behaviour is judged by a rule there (see :func:`by_rule`).
``--budget MINUTES`` stops mutmut when spent (the rest count as not run); ``--report-only``
records the verdicts mutmut already has (run it with ``hatch run mutation:python
benchmarks/tracking/mutation.py sample --seed N --report-only``: the hatch script would stage
afresh and drop them).

``changed [BASE]``: the mutants of the functions and methods whose lines changed since BASE
(default: the merge base with main; uncommitted changes count), run, and their verdicts printed.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import random
import re
import resource
import signal
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / ".mutation"
RESULTS = ROOT / "benchmarks" / "results" / "mutation.md"
EQUIVALENT = Path(__file__).with_name("mutation_equivalent.toml")
MARKER = "<!-- mutation:sample adds each new sample below this line -->"
# mutmut's exit-code classes (mutmut.stats.status_by_exit_code) folded into the table's columns:
# a crash of the test process (segfault, or SIGKILL after the CPU limit) is a detection too, and
# so is pytest's "interrupted" status (a KeyboardInterrupt that escaped a test: the scheduler's
# and capture's interrupt tests raise one on purpose and must catch it; nobody presses Ctrl-C).
COLUMN = {
    "killed": "killed",
    "segfault": "killed",
    "check was interrupted by user": "killed",
    "timeout": "timeout",
    "not checked": "not run",
}


def package_of(mutant: str) -> str:
    """A mutant's package: ``netcl.core.x...`` -> core, ``netcl.runtime.cache.x...`` -> cache."""
    parts = mutant.split(".")
    return parts[1] if parts[1] == "core" else parts[2]


def module_of(mutant: str) -> str:
    """The dotted module of a mutant name (everything before its ``x_``/``xǁ`` function part)."""
    from mutmut.utils.format_utils import get_module_from_key

    return get_module_from_key(mutant.partition("__mutmut_")[0])


def generate() -> dict[str, int | None]:
    """Every mutant of every staged module with its verdict so far (None: not run), by mutmut.

    The same steps ``mutmut run`` starts with (copy, mutate changed files, keep verdicts of
    unchanged functions), without its test runs.
    """
    import mutmut.__main__ as mm
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.utils.file_utils import walk_mutatable_files

    os.makedirs("mutants", exist_ok=True)
    mm.copy_src_dir()
    mm.copy_also_copy_files()
    mm.create_mutants(2)
    verdicts: dict[str, int | None] = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        verdicts.update(data.exit_code_by_key)
    return verdicts


def draw(mutants: list[str], size: int, seed: int) -> dict[str, list[str]]:
    """A stratified sample per package: each module in proportion to its mutants (largest
    remainders), at least one mutant per module, at least ``size`` per package."""
    by_module: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name in sorted(mutants):
        by_module[package_of(name)][module_of(name)].append(name)
    rng = random.Random(seed)
    sample: dict[str, list[str]] = {}
    for package in sorted(by_module):
        modules = by_module[package]
        total = sum(len(names) for names in modules.values())
        shares = {m: len(names) * size / total for m, names in modules.items()}
        counts = {m: max(1, math.floor(share)) for m, share in shares.items()}
        by_remainder = sorted(shares, key=lambda m: shares[m] - math.floor(shares[m]), reverse=True)
        for module in by_remainder[: max(0, size - sum(counts.values()))]:
            counts[module] += 1
        sample[package] = [
            name
            for module in sorted(modules)
            for name in rng.sample(modules[module], min(counts[module], len(modules[module])))
        ]
    return sample


def run_mutants(names: list[str], max_children: int, budget_s: float | None = None) -> None:
    """``mutmut run`` on exactly these mutants (explicit names: it re-runs them even with a
    verdict from an earlier run). mutmut's own output goes to the terminal.

    Two retries: a test can fail once in mutmut's instrumented or unmutated pass (a timing test
    on a loaded machine), which then stops the run; a retry keeps the test-to-function map once
    it is collected (minutes).
    ``budget_s``: past it, mutmut is interrupted as by Ctrl-C (it keeps the verdicts it has;
    the rest count as not run).
    """
    command = ["mutmut", "run", "--max-children", str(max_children), *names]
    deadline = None if budget_s is None else time.monotonic() + budget_s
    for attempt in (1, 2, 3):
        with subprocess.Popen(command) as mutmut:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                code = mutmut.wait(timeout=left)
            except subprocess.TimeoutExpired:
                print(f"budget of {budget_s / 60:.0f} min spent: stopping mutmut", flush=True)
                mutmut.send_signal(signal.SIGINT)
                mutmut.wait()
                return
        if code == 0:
            return
        print(f"mutmut run failed (exit status {code}), attempt {attempt} of 3", flush=True)
    raise SystemExit(f"mutmut run failed three times (exit status {code})")


def verdicts() -> dict[str, str]:
    """Each mutant's status as mutmut names it (killed, survived, timeout, no tests, ...)."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    status: dict[str, str] = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        status.update({k: status_by_exit_code[v] for k, v in data.exit_code_by_key.items()})
    return status


def diff(name: str) -> str:
    """The mutant's changed lines, from the diff ``mutmut show`` prints (the results folder stays
    small: the mutant's name says the file and function); "" for a mutant that is gone."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    try:
        text = get_diff_for_mutant(name)
    except FileNotFoundError:  # its function was removed or has fewer mutants now
        return ""
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(("-", "+")) and not line.startswith(("--- ", "+++ "))
    )


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% for z = 1.96): right near 0% and 100%,
    where the normal approximation's interval would pass 100%."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


@dataclass
class Equivalent:
    """A surviving mutant judged by hand: ``change`` must occur in its diff (a guard against a
    name that now means another mutant, after its function changed), ``why`` says why. With
    ``killed_by`` (a test), it is not equivalent but caught by that test when applied by hand,
    a test mutmut did not run for it: mutmut links a function only to the tests that call it in
    their own process, which misses closures made at import and run later (the capture hooks)
    and code a test runs in a subprocess (checked mode's overruns, which may crash)."""

    change: str
    why: str
    killed_by: str = ""


@dataclass
class Rule:
    """A kind of mutant judged equivalent at once: its removed lines contain ``removed`` and are
    equal to its added lines once ``ignore`` (a pattern) is taken out of both."""

    removed: str
    ignore: str
    why: str


def equivalents() -> tuple[dict[str, Equivalent], dict[str, Rule]]:
    """The survivors judged by hand, and the rules (``[rules]``), from
    benchmarks/tracking/mutation_equivalent.toml."""
    table = tomllib.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    rules = {name: Rule(**entry) for name, entry in table.pop("rules", {}).items()}
    return {name: Equivalent(**entry) for name, entry in table.items()}, rules


def by_rule(change: str, rules: dict[str, Rule]) -> str | None:
    """The name of the rule a mutant's diff falls under, None if none."""
    old = [line[1:] for line in change.splitlines() if line.startswith("-")]
    new = [line[1:] for line in change.splitlines() if line.startswith("+")]
    for name, rule in rules.items():
        old_cut = [re.sub(rule.ignore, "", line) for line in old]
        new_cut = [re.sub(rule.ignore, "", line) for line in new]
        if old_cut == new_cut and old != new and any(rule.removed in x for x in old):
            return name
    return None


def report(
    sample: dict[str, list[str]], totals: Counter[str], status: dict[str, str], heading: str
) -> str:
    """The Markdown section for one sample: the table, then survivors and equivalents."""
    judged, rules = equivalents()
    commit = git("rev-parse", "--short", "HEAD").strip()
    dirty = git("status", "--porcelain", "--untracked-files=no") and " (uncommitted changes)"
    lines = [
        heading,
        "",
        f"Commit {commit}{dirty}; {sum(map(len, sample.values()))} of {sum(totals.values())} "
        "mutants sampled.",
        "",
        "| package | mutants | sampled | killed | by hand | survived | timed out | equivalent "
        "| not run | score | 95% interval |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    survivors: list[tuple[str, str, str]] = []  # name, mutmut's status, diff
    equivalent_lines: list[str] = []
    by_hand_lines: list[str] = []
    for package, names in sample.items():
        counts: Counter[str] = Counter()
        for name in names:
            column = COLUMN.get(status[name], "survived")
            if column == "survived":  # judged by hand, by a rule, or left
                change = diff(name)
                entry = judged.get(name)
                if entry is not None and entry.change in change and entry.killed_by:
                    by_hand_lines.append(f"- `{name}`: `{entry.killed_by}`; {entry.why}")
                    column = "by hand"
                elif entry is not None and entry.change in change:
                    equivalent_lines.append(f"- `{name}`: {entry.why}")
                    column = "equivalent"
                elif rule := by_rule(change, rules):
                    equivalent_lines.append(f"- `{name}`: rule {rule!r}: {rules[rule].why}")
                    column = "equivalent"
                else:
                    survivors.append((name, status[name], change))
            counts[column] += 1
        detected = counts["killed"] + counts["by hand"] + counts["timeout"]
        judged_n = detected + counts["survived"]
        low, high = wilson(detected, judged_n)
        score = f"{100 * detected / judged_n:.1f}%" if judged_n else "-"
        lines.append(
            f"| {package} | {totals[package]} | {len(names)} | {counts['killed']} | "
            f"{counts['by hand']} | {counts['survived']} | {counts['timeout']} | "
            f"{counts['equivalent']} | "
            f"{counts['not run']} | {score} | {100 * low:.1f}-{100 * high:.1f}% |"
        )
    lines += [
        "",
        "Score: killed (by mutmut, or by hand where mutmut did not run the test that kills "
        "it) and timed out over the sampled mutants that are not equivalent and were run. "
        "Timed out counts as caught: the mutant made a test hang. No tests (mutmut found no "
        "test that calls the function in this process) counts as survived.",
        "",
        f"Survivors ({len(survivors)}):",
        "",
    ]
    for name, state, change in survivors:
        lines += [f"`{name}` ({state}):", "", "```diff", change, "```", ""]
    stale = [name for name, entry in judged.items() if entry.change not in diff(name)]
    if stale:  # the function was edited since: the mutant's number now means another change
        lines += [
            "Stale entries of `mutation_equivalent.toml` (their `change` is not in the "
            "mutant's diff: judge again or remove):",
            "",
            *(f"- `{n}`" for n in stale),
            "",
        ]
    if by_hand_lines:
        lines += ["Killed by hand (`mutation_equivalent.toml`):", "", *by_hand_lines, ""]
    if equivalent_lines:
        lines += ["Equivalent (`mutation_equivalent.toml`):", "", *equivalent_lines, ""]
    return "\n".join(lines) + "\n"


def record(section: str) -> None:
    """Add a sample's section to benchmarks/results/mutation.md, newest first, below the marker."""
    text = RESULTS.read_text() if RESULTS.exists() else f"# Mutation testing\n\n{MARKER}\n"
    if MARKER not in text:
        text += f"\n{MARKER}\n"
    RESULTS.write_text(text.replace(MARKER, f"{MARKER}\n\n{section}", 1))


def git(*args: str) -> str:
    """Output of a git command in the repository (not the staged copy)."""
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout


def changed_functions(base: str) -> set[str]:
    """The mutmut keys (``module.x_function``, ``module.xǁClassǁmethod``) of the top-level
    functions and methods of top-level classes that contain a line changed since ``base``: the
    units mutmut mutates (a nested function is part of the one around it)."""
    from mutmut.utils.format_utils import get_mutant_name, make_mutant_key

    touched: dict[str, set[int]] = defaultdict(set)
    current = ""
    for line in git("diff", "-U0", base, "--", "packages").splitlines():
        if line.startswith("+++ "):
            current = line[6:] if line.startswith("+++ b/") else ""  # b/: not a deleted file
        elif line.startswith("@@") and "/src/netcl/" in current and current.endswith(".py"):
            start, _, length = re.match(r"@@ -\S+ \+(\d+)(,\d+)?", line).group(1, 0, 2)  # type: ignore[union-attr]
            count = int(length[1:]) if length else 1
            touched[current].update(range(int(start), int(start) + max(count, 1)))
    keys: set[str] = set()
    for file, lines in touched.items():
        staged = Path("src") / file.split("/src/", 1)[1]  # packages/netcl-x/src/netcl/a.py
        tree = ast.parse((ROOT / file).read_text())
        units: list[tuple[ast.AST, str | None]] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                units += [(item, node.name) for item in node.body]
            else:
                units.append((node, None))
        for node, cls in units:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
                if lines.intersection(span):
                    keys.add(get_mutant_name(staged, make_mutant_key(node.name, cls)))
    return keys


def sample_command(
    seed: int, size: int, max_children: int, *, run: bool = True, budget_s: float | None = None
) -> None:
    """``mutation:sample``: generate, draw, run, and record the sample's table. ``run=False``
    (``--report-only``) records the verdicts mutmut already has for the sample (after a run was
    stopped: the mutants it did not reach count as not run)."""
    start = time.monotonic()
    all_mutants = generate()
    totals = Counter(package_of(name) for name in all_mutants)
    sample = draw(list(all_mutants), size, seed)
    drawn = ", ".join(f"{package} {len(names)}" for package, names in sample.items())
    print(f"{sum(totals.values())} mutants; seed {seed}; sampled {drawn}", flush=True)
    if run:
        run_mutants([name for names in sample.values() for name in names], max_children, budget_s)
    minutes = (time.monotonic() - start) / 60
    # CPU of every process mutmut ran (reaped: the fork server's children, then the server):
    # on a machine shared with other jobs, wall time says more about them than about the run
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (used.ru_utime + used.ru_stime) / 60
    took = (
        f"{minutes:.1f} min wall, {cpu:.1f} min CPU (generation and run, "
        f"`--max-children {max_children}`, load average {os.getloadavg()[1]:.1f} at the end)"
    )
    heading = (
        f"### Sample of {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, seed {seed}, "
        f"{took if run else 'verdicts of an earlier run'}"
    )
    section = report(sample, totals, verdicts(), heading)
    record(section)
    print(section)


def changed_command(base: str | None, max_children: int) -> None:
    """``mutation:changed``: the mutants of the functions changed since BASE, run."""
    base = base or git("merge-base", "HEAD", "main").strip()
    keys = changed_functions(base)
    names = sorted(n for n in generate() if n.partition("__mutmut_")[0] in keys)
    if not names:
        print(f"no mutants in the functions changed since {base}")
        return
    print(f"{len(names)} mutants in {len(keys)} functions changed since {base}")
    run_mutants(names, max_children)
    status = verdicts()
    for name in names:
        print(f"{status[name]:>10}  {name}")
    print(Counter(status[name] for name in names))


def main() -> None:
    """Parse the command line and run one command in the staged tree."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-children", type=int, default=2)
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser("sample", help="a seeded sample per package, into the results")
    sample.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    sample.add_argument("--size", type=int, default=150, help="mutants per package (at least)")
    sample.add_argument("--report-only", action="store_true", help="record verdicts, run none")
    sample.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MINUTES",
        help="stop mutmut after this long (the rest count as not run)",
    )
    changed = commands.add_parser("changed", help="the mutants of functions changed since BASE")
    changed.add_argument("base", nargs="?", help="a commit (default: the merge base with main)")
    args = parser.parse_args()
    os.chdir(STAGE)  # mutmut works in the staged tree: its config, src/ and mutants/ are there
    if args.command == "sample":
        seed = random.SystemRandom().randrange(1_000_000) if args.seed is None else args.seed
        budget = None if args.budget is None else 60 * args.budget
        sample_command(
            seed, args.size, args.max_children, run=not args.report_only, budget_s=budget
        )
    else:
        changed_command(args.base, args.max_children)


if __name__ == "__main__":
    main()
