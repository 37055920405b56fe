"""Doctor's terminal output: a check x node table, the problems with their hints (each told once, with the
nodes or pairs it was found on), recommended settings."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from clusterrun.doctor.model import Verdict, worst
from clusterrun.doctor.report import Report

_MARK = {Verdict.passed: ("ok", "green"), Verdict.warned: ("WARN", "yellow"), Verdict.failed: ("FAIL", "bold red"),
         Verdict.skipped: ("-", "dim")}
MAX_NODE_COLUMNS = 8


def _cell(verdicts: list[Verdict]) -> Text:
    if not verdicts:
        return Text("")
    word, style = _MARK[worst(verdicts)]
    return Text(word, style=style)


def console_for(out: TextIO) -> Console:
    return Console(file=out, width=None if out.isatty() else 120, highlight=False, soft_wrap=False)


def print_report(report: Report, out: TextIO, *, verbose: bool = False) -> None:
    console = console_for(out)
    matrix = len(report.nodes) <= MAX_NODE_COLUMNS
    table = Table(title=f"clusterrun doctor: {len(report.nodes)} node(s)", title_justify="left", show_lines=False)
    table.add_column("check")
    if matrix:
        for name in report.nodes:
            table.add_column(name, justify="center")
        table.add_column("all", justify="center")
    else:
        table.add_column("verdict", justify="center")
        table.add_column("nodes (pass/warn/fail)")
    for check in report.checks:
        found = report.of(check.name)
        if matrix:
            cells = [_cell([f.verdict for f in found if f.node == n]) for n in report.nodes]
            table.add_row(check.name, *cells, _cell([f.verdict for f in found if f.node is None]))
        else:
            per = {n: worst([f.verdict for f in found if f.node == n]) for n in report.nodes
                   if any(f.node == n for f in found)}
            counts = "/".join(str(sum(v is k for v in per.values()))
                              for k in (Verdict.passed, Verdict.warned, Verdict.failed))
            table.add_row(check.name, _cell([f.verdict for f in found]), counts if per else "")
    console.print(table)
    problems = report.problems()
    if problems:
        console.print()
        folded = sum(len(p.findings) for p in problems) - len(problems)
        console.print(Text.assemble(("Problems", "bold"), (
            f" (each told once for the nodes or pairs it was found on{'' if verbose else '; --verbose lists each'})"
            if folded else "", "dim")))
        for p in problems:  # failures first: the finding that matters is never below a screen of warnings
            word, style = _MARK[p.verdict]
            console.print(Text.assemble((f"{word:>4} ", style), (f"{p.check}: ", "bold"), p.summary))
            if verbose and p.folded:
                for f in p.findings:
                    console.print(Text(f"         {f.summary}"))
            if p.hint:
                console.print(Text(f"       -> {p.hint}", style="dim" if p.verdict is Verdict.warned else ""))
    if verbose:
        console.print()
        console.print("[bold]All findings[/bold]")
        for f in report.findings:
            word, style = _MARK[f.verdict]
            console.print(Text.assemble((f"{word:>4} ", style), (f"{f.check}: ", "bold"), f.summary))
    skipped = [f for f in report.findings if f.verdict is Verdict.skipped and f.node is None]
    if skipped and not verbose:
        console.print()
        for f in skipped:
            console.print(Text(f"skip {f.check}: {f.summary}", style="dim"))
    if report.recommended:
        console.print()
        console.print("[bold]Recommended settings[/bold] (inventory snippet)")
        console.print(Text(report.recommended.rstrip()))
    counts = report.counts()
    word, style = _MARK[report.verdict]
    console.print()
    console.print(Text.assemble(
        ("doctor: ", "bold"), (f"{word} ", style),
        f"{counts['pass']} passed, {counts['warn']} warned, {counts['fail']} failed, {counts['skip']} skipped "
        f"in {report.duration:.1f}s; report in {report.directory}/"))
