"""A job's command line read as torchrun reads it: clusterrun's options before SCRIPT, the script's after.

``clusterrun up [OPTIONS] [INVENTORY] SCRIPT [ARGS]...``: everything after SCRIPT goes to the script exactly
as typed (``--timeout 30``, ``-q``, ``-m foo`` and ``~/data`` included), so a script option that happens to
share a name with one of clusterrun's is never taken. A ``--`` right after SCRIPT is dropped (it used to be the
way to pass such options); one anywhere else in the script's arguments is passed on.

Without INVENTORY and without --ips/--hostfile/--slurm, a first positional that names a script (``train.py``, or
a module after ``-m``) is SCRIPT, and the job runs on this machine, as with torchrun and paddle.distributed.launch
(``clusterrun up --devices=0,1 train.py --lr=0.01``).

Before SCRIPT, the spellings users bring from torchrun, fleetrun and DeepSpeed are understood
(``--nproc_per_node 2``, ``--nproc-per-node gpu``, ``--devices 0,1``, ``--num_gpus 4``), the ones clusterrun
derives (``--nnodes``, ``--node_rank``, ``--master_addr``, rendezvous flags) are refused with the reason, other
launchers' flags get clusterrun's equivalent (the table in :mod:`clusterrun.cli.foreign_flags`), and any other
unknown option is an error that suggests the nearest one, instead of being taken for SCRIPT.
"""

from __future__ import annotations

import difflib

import click

from clusterrun.cli.foreign_flags import ALIASES, DERIVED, SINGLE_DASH, explain

# torchrun's values for "one process per GPU": clusterrun's default already.
AUTO_NPROC = ("gpu", "auto")
#: ctx.meta key: True when the command line names no nodes and SCRIPT comes first (a run on this machine).
LOCAL_KEY = "clusterrun.this_machine"
_INVENTORY_SUFFIXES = (".yaml", ".yml", ".json")


def names_script(token: str, module: bool) -> bool:
    """Whether ``token``, the first positional argument of a command line that names no nodes (no
    --ips/--hostfile/--slurm), is SCRIPT rather than INVENTORY: a file name ending in ``.py``, or, after ``-m``, a
    module name (no existing file, no inventory suffix). SCRIPT first means: run on this machine, as torchrun
    and paddle.distributed.launch do."""
    import os

    if token.endswith(".py"):
        return True
    return module and not token.lower().endswith(_INVENTORY_SUFFIXES) and not os.path.isfile(token)


def _options(command: click.Command) -> dict[str, bool]:
    """Every option string of ``command`` -> whether it takes a value."""
    table: dict[str, bool] = {"-h": False, "--help": False}
    for param in command.params:
        if isinstance(param, click.Option):
            takes = not (param.is_flag or param.count)
            for name in [*param.opts, *param.secondary_opts]:
                table[name] = takes and name not in param.secondary_opts
    return table


def _usage(text: str) -> Exception:
    from clusterrun.errors import UsageError

    return UsageError(text)


def split(command: click.Command, args: list[str],
          sources: tuple[str, ...]) -> tuple[list[str], list[str], list[str], bool]:
    """``(clusterrun's option tokens, positionals up to SCRIPT, the script's arguments, whether a ``--`` marked
    them as the script's)`` of ``args``.

    ``sources``: the options that name the nodes (``--ips``...): with one of them, SCRIPT is the first
    positional; without, too when :func:`names_script` says the first positional is SCRIPT (this machine),
    otherwise SCRIPT is the second (after INVENTORY). Raises :class:`clusterrun.errors.UsageError` for an unknown or
    a derived option before SCRIPT.
    """
    table = _options(command)
    ours: list[str] = []
    positionals: list[str] = []
    seen_source = False

    def script_at() -> int:  # how many positionals up to and including SCRIPT
        first = positionals[0] if positionals else None
        return 1 if seen_source or (first is not None and names_script(first, "-m" in ours or "--module" in ours)) else 2

    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":  # the end of clusterrun's options: the rest are positionals, then the script's
            rest = args[i:]
            if not positionals and rest:
                positionals.append(rest.pop(0))
            need = script_at() - len(positionals)
            positionals += rest[:max(need, 0)]
            return ours, positionals, *_script_args(rest[max(need, 0):])
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            if len(positionals) == script_at():
                return ours, positionals, *_script_args(args[i:])
            continue
        if token in SINGLE_DASH:  # mpirun's -np and -npernode: whole words, not -n with a value
            raise _usage(explain(token, table) or f"no such option: {token}")
        if not token.startswith("--") and len(token) > 2 and not table.get(token[:2], True):
            # -qm: flags written together; a value-taking one ends the group (-qeKEY=V)
            args[i - 1:i] = [token[:2], "-" + token[2:]]
            i -= 1
            continue
        name, eq, value = token.partition("=") if token.startswith("--") else (token[:2], "", token[2:])
        if name in DERIVED:
            raise _usage(explain(name, table) or name)
        name = ALIASES.get(name, name)
        if name not in table:
            known = explain(name, table)
            if known:
                raise _usage(known)
            near = difflib.get_close_matches(name, [n for n in table if n.startswith("--")], n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise _usage(f"no such option: {token.split('=')[0]}{hint} (clusterrun's options go before SCRIPT; "
                         "everything after SCRIPT goes to the script)")
        if name in sources:
            seen_source = True
        if not table[name]:
            if eq or value:
                raise _usage(f"{name} takes no value")
            ours.append(name)
            continue
        if eq or value:
            got = value
        elif name == "--slurm":  # its value is optional: alone, the allocation's nodes
            if i < len(args) and not args[i].startswith("-") and not _looks_like_script(args[i]):
                got, i = args[i], i + 1
            else:
                got = ""
        elif name == "--wait-gpus":  # its value is optional: alone, no time limit
            got = "inf"
            if i < len(args) and args[i].replace(".", "", 1).isdigit():
                got, i = args[i], i + 1
        elif i < len(args):
            got, i = args[i], i + 1
        else:
            raise _usage(f"{name} needs a value")
        if name == "--nproc-per-node" and got.strip().lower() in AUTO_NPROC:
            continue  # one process per GPU (or one without GPUs) is what clusterrun does anyway
        ours += [name, got]
    return ours, positionals, [], False


def _script_args(rest: list[str]) -> tuple[list[str], bool]:
    return (rest[1:], True) if rest[:1] == ["--"] else (rest, False)


def _looks_like_script(token: str) -> bool:
    import os

    return token.endswith(".py") or os.path.isfile(token)


# Options of clusterrun that scripts often have too: after SCRIPT they are the script's, without a note.
COMMON = frozenset({"--timeout", "--json", "--grace", "--quiet", "--env", "--module", "--help", "--python",
                    "--nodes", "--gpus"})


def moved_options(command: click.Command, script_args: list[str]) -> list[str]:
    """clusterrun's own (distinctive) options found among the script's arguments: a hint that they were meant
    for clusterrun, which takes its options before SCRIPT only."""
    table = _options(command)
    found = []
    for token in script_args:
        name = token.split("=", 1)[0]
        if name.startswith("--") and name in table and name not in COMMON and name not in found:
            found.append(name)
    return found


class JobCommand(click.Command):
    """A click command whose arguments after SCRIPT belong to the script (see the module's text)."""

    source_flags: tuple[str, ...] = ("--ips", "--hostfile", "--slurm")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if any(a in ("-h", "--help") for a in self._before_script(args)):
            return super().parse_args(ctx, args)
        ours, positionals, script_args, explicit = split(self, list(args), self.source_flags)
        ctx.meta[LOCAL_KEY] = bool(positionals) and not any(flag in ours for flag in self.source_flags) and \
            names_script(positionals[0], "-m" in ours or "--module" in ours)
        moved = [] if explicit else moved_options(self, script_args)
        if moved:
            click.echo(f"clusterrun: note: {', '.join(moved)} after SCRIPT {'go' if len(moved) > 1 else 'goes'} to "
                       "the script, as with torchrun; clusterrun's own options go before SCRIPT", err=True)
        return super().parse_args(ctx, [*ours, "--", *positionals, *script_args])

    @staticmethod
    def _before_script(args: list[str]) -> list[str]:
        out = []
        for token in args:
            if not token.startswith("-"):
                break
            out.append(token)
        return out
