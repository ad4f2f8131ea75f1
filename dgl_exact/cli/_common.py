"""What every ``dgl-exact`` command shares: the one-line user error and the checks of outputs, sizes and
datasets made before any work starts."""
from __future__ import annotations

import os

import click

from ..errors import UserError, did_you_mean

__all__ = ["UserError", "check_dataset", "check_outputs", "int_choice", "parse_size"]

# The names the options offer, known here without importing torch (dgl_exact.training.config and .models, which
# define them, import it), so that ``dgl-exact --help`` and ``dgl-exact <cmd> --help`` stay fast;
# tests/cli/test_dialect.py checks them against those modules.
MODELS = ("gcn", "sage", "gat", "gcn2")
PYG_MODELS = ("pyg-gcn", "pyg-sage", "pyg-gat", "pyg-gcn2", "pyg-gatv2")  # dgl_exact.training.workloads.PYG_MODELS
# train's --model: MODELS, and the networks built of PyG's layers alone (--framework pyg; dgl_exact.training.config)
TRAIN_MODELS = MODELS + ("gatv2",)
SAMPLERS = ("full", "saint", "cluster", "neighbor")
SAINT_MODES = ("node", "edge", "walk")
MAX_COUNT = 2**31 - 1  # sizes and counts (int32), as dgl_exact.training.config.MAX_COUNT
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
DEFAULT_MODEL = "gcn"    # every command's default model: `train`'s (TrainConfig.model)
DEFAULT_DEVICE = "auto"  # every command's default device: `train`'s (TrainConfig.device)
DATA_ROOT_SHOWN = "data (or $DGL_EXACT_DATA)"  # --data-root's default, as --help shows it
# every command shows its options' defaults in --help; -h is --help
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True}


def bundled_configs():
    """The bundled ``--conf`` names (``dgl_exact/configs/*.yaml``), as dgl_exact.training.config.bundled_configs."""
    if not os.path.isdir(CONFIG_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


class Choice(click.Choice):
    """A ``click.Choice`` whose refusal suggests the close names (``did you mean 'gcn'?``) instead of listing
    them all."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not one of the choices{did_you_mean(value, self.choices, 'choose from')}",
                      param, ctx)


def check_names(text: str, known, option: str) -> list:
    """The comma-separated names of ``text`` (an option such as ``--model gcn,sage``), each one of ``known``;
    one line suggesting the close names for any other."""
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    for name in names:
        if name not in known:
            raise UserError(f"{option}: unknown name {name!r}{did_you_mean(name, known, 'choose from')}")
    return names


def renamed(old: str, new: str, name=None, **option_kwargs):
    """Decorate a command whose option ``new`` (parameter ``name``, by default derived from ``new``) was spelled
    ``old`` before: ``old`` keeps working for one release (hidden from --help, its value goes to ``new``), with
    one line on stderr saying what to write instead; both at once is a one-line error. ``option_kwargs``:
    click.option's (``type``, ...)."""
    import functools

    old_name = "renamed_" + old.lstrip("-").replace("-", "_")
    new_name = name or new.lstrip("-").replace("-", "_")

    def decorate(f):
        @click.option(old, old_name, hidden=True, default=None, show_default=False, **option_kwargs)
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            value = kwargs.pop(old_name)
            if value is not None:
                ctx = click.get_current_context()
                if ctx.get_parameter_source(new_name) == click.core.ParameterSource.COMMANDLINE:
                    raise UserError(f"{old} is the old spelling of {new}: give {new} only")
                click.echo(f"warning: {old} is deprecated and goes in the next release; use {new}", err=True)
                kwargs[new_name] = value
            return f(*args, **kwargs)

        return wrapper

    return decorate


def int_choice(ctx, param, value):
    """A ``click.Choice`` of numbers as the int it names (None stays None)."""
    return None if value is None else int(value)


def check_outputs(files=None, folders=None) -> None:
    """Refuse, before any work is done, output paths that could not be written when the results are:
    ``files`` and ``folders`` map an option name to the path it was given (None: not given).

    A file path must not be a folder and a folder path not a file; the folders to be created must not
    pass through a file; the nearest existing folder must take a new file (tried: a temporary file is
    created there and removed; ``os.access`` says yes to root on a read-only mount); an existing file
    must be writable; and no two options may name the same file (compared as resolved real paths)."""
    import tempfile

    given = [(option, path, False) for option, path in (files or {}).items() if path is not None]
    given += [(option, path, True) for option, path in (folders or {}).items() if path is not None]
    seen = {}
    for option, path, is_folder in given:
        full = os.path.abspath(path)
        if not is_folder and os.path.isdir(full):
            raise UserError(f"{option} {path}: is a folder; give a file path")
        if is_folder and os.path.lexists(full) and not os.path.isdir(full):
            raise UserError(f"{option} {path}: is a file; give a folder")
        folder = full if is_folder else os.path.dirname(full)
        existing = folder
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise UserError(f"{option} {path}: cannot create the folder {folder}: {existing} is not a folder")
        try:
            fd, probe = tempfile.mkstemp(prefix=".dgl-exact-write-test-", dir=existing)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise UserError(f"{option} {path}: cannot write in {existing} ({e.strerror or e}); "
                            "give a path in a writable folder") from None
        if not is_folder and os.path.isfile(full) and not os.access(full, os.W_OK):
            raise UserError(f"{option} {path}: the file exists and is not writable")
        real = os.path.realpath(full)
        if not is_folder and real in seen:
            raise UserError(f"{seen[real]} and {option} name the same file ({path}): give two different paths")
        seen[real] = option


def hold_outputs(files) -> None:
    """Lock each output file ``files`` maps an option name to (None: not given) for the rest of the command
    (:class:`dgl_exact._files.OutputLock`, released when the command ends): a second run on the same file
    stops here, before any work, in one line naming the pid of the run that holds it."""
    _hold([(option, path) for option, path in files.items() if path is not None])


def hold_results(folder, *suites, option: str = "--out") -> None:
    """Lock, for the rest of the command, the results of each of ``suites`` in the benchmark folder ``folder``:
    the lock of ``<folder>/<suite>.jsonl`` (``.<suite>.jsonl.lock`` there), the file the suite's
    :class:`~dgl_exact.bench.results.ResultSink` writes; it stands for every file of that suite in the folder
    (its CSV, Markdown, per-row tables and figure). Two runs of one suite into one folder would rewrite each
    other's rows: the second stops before any work, in one line naming the holder's pid. Different suites
    write different files, so they may share a folder and run at the same time."""
    _hold([(option, os.path.join(folder, f"{suite}.jsonl")) for suite in suites])


def _hold(outputs) -> None:
    """Lock each ``(option, path)`` until the command ends. A lock file needs its folder: folders made for it
    are removed again when the command ends if they are still empty (a command refused after its lock, e.g. on
    an unknown dataset, leaves nothing behind)."""
    import contextlib

    import click

    from .._files import OutputLock

    ctx = click.get_current_context()
    for option, path in outputs:
        made, folder = [], os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(folder):
            made.append(folder)
            folder = os.path.dirname(folder)

        def remove_if_empty(made=made) -> None:  # runs after the lock is released: its callbacks unwind LIFO
            for folder in made:
                with contextlib.suppress(OSError):
                    os.rmdir(folder)

        ctx.call_on_close(remove_if_empty)
        ctx.with_resource(OutputLock(path, option))


def parse_size(text, option: str) -> int:
    """Bytes of a size given on the command line (``2GiB``, ``512MiB``, ``3e9``): one line naming ``option``
    for anything that is not a representable memory size. Every size option goes through here."""
    from ..units import parse_bytes

    try:
        return parse_bytes(text, option)
    except ValueError as e:
        raise UserError(str(e)) from None


def memory_budget_option(help: str):
    """The ``--memory-budget SIZE`` option `dgl-exact plan` and `train` share (none by default; a size such as
    2GiB, read with :func:`parse_size`, or 'device'); ``help``: what it bounds for the command."""
    return click.option("--memory-budget", default=None, metavar="SIZE", show_default="none", help=help)


def check_dataset(name, data_root) -> None:
    """A dataset name that cannot be loaded (unknown, files missing, bad ``synthetic:key=value``) is a
    one-line error before any work; nothing is loaded here."""
    from ..data import dataset_status
    from ..data.synthetic import check_fits, parse_synthetic_name

    try:
        if name.strip().lower().startswith("synthetic"):
            check_fits(parse_synthetic_name(name.strip().lower()), name.strip())
        present, message = dataset_status(name, data_root)
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    if not present:
        raise UserError(message)


def provenance_checked(f):
    """``--allow-dirty`` for a ``dgl-exact bench`` command: before it runs, the code measured is looked up
    (:mod:`dgl_exact.bench.provenance`) and a checkout with uncommitted changes to it is refused (one line)
    unless the flag is given; every output file then says "dirty tree"."""
    import functools

    import click

    @click.option("--allow-dirty", is_flag=True, envvar="DGL_EXACT_ALLOW_DIRTY",
                  help="Measure even with uncommitted changes to dgl_exact/, cuda/ or setup.* (every output file "
                       "then says \"dirty tree\"). Without a git checkout (an installed wheel) the version is "
                       "recorded instead of a commit.")
    @functools.wraps(f)
    def wrapper(*args, allow_dirty=False, **kwargs):
        from ..bench import provenance

        try:
            provenance.check(allow_dirty)  # with --allow-dirty, the tables printed and written say "dirty tree"
        except ValueError as e:
            raise UserError(str(e)) from None
        return f(*args, **kwargs)

    return wrapper


def command_line(ctx, prefix: str, skip=()) -> str:
    """The command as given: ``prefix`` and each option set on the command line (not its defaults), quoted for a
    shell, in the order the command declares them."""
    import shlex

    from click.core import ParameterSource

    words = [prefix]
    for param in ctx.command.params:
        if param.name in skip or ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        flag = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            words += [flag] if value else []
        else:
            words += [flag, shlex.quote(str(value))]
    return " ".join(words)


def record_results(results_path: str, device=None, **extra) -> None:
    """Record the run of the current ``dgl-exact bench`` command that wrote ``results_path`` (a result file) in
    its folder's manifest (``runs.json``: the command as given, the machine, the code measured), from which
    ``dgl-exact bench report`` generates the suite's README.md."""
    from ..bench.report import run_entry
    from ..bench.suites import record_run

    ctx = click.get_current_context()
    prefix = " ".join(["dgl-exact"] + ctx.command_path.split()[1:])
    entry = run_entry(os.path.basename(results_path), command_line(ctx, prefix, skip=("quiet",)), device, **extra)
    try:
        record_run(os.path.dirname(results_path) or ".", entry)
    except ValueError as e:
        raise UserError(str(e)) from None
