"""The pieces every command shares: the parser class, --set/--config, --device, JSON output, texts from stdin,
dataset paths, the slow-bf16 note, and the training context of a train command (one process, or a rank of a
torchrun launch)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit.config.sources import RECIPES
from attnkit.errors import InputError

if TYPE_CHECKING:
    from attnkit.cli.progress import TrainingProgress
    from attnkit.training.task import TrainContext


RESUME_HELP = (
    "continue the run in --out from its last saved state: a killed run, or a finished one given a larger budget "
    "(--epochs, --max-steps, --set max_minutes=M; the learning-rate schedule is planned again over it); a run killed "
    "before it saved anything starts"
)
OUT_HELP = "run directory to write; locked while a training writes it, so that a second one fails at once"


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="auto (the default: CUDA when torch sees a GPU, then MPS, else the CPU), cpu, cuda, cuda:N or mps",
    )


def device_of(args: argparse.Namespace):  # -> torch.device (torch is imported only when a command runs)
    """The device --device names, checked: one this machine lacks is an error line saying so."""
    from attnkit.devices import resolve_device

    return resolve_device(args.device)


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",  # --set a=1 --set b=2 sets both (a second --set used to replace the first)
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. --set d_model=64 n_heads=2 dropout=0.2 (may be given more than once)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a recipe: a YAML file of config keys, or the name of one of attnkit's (configs/*.yaml: "
        f"{', '.join(sorted(recipe.stem for recipe in RECIPES.glob('*.yaml')))}); --set overrides its keys",
    )


def config_overrides(args: argparse.Namespace, task: str) -> dict[str, object]:
    """The settings of ``task`` a command was given: the --config file's keys, then --set on top (a key in both
    takes the --set value). The train commands' own flags (--epochs, --max-steps, ...) are applied after these."""
    from attnkit.config import load_config_file, parse_overrides

    merged: dict[str, object] = load_config_file(args.config, task) if getattr(args, "config", None) else {}
    merged.update(parse_overrides(args.overrides))
    return merged


def apply_flags(args: argparse.Namespace, overrides: dict[str, object], keys: tuple[str, ...]) -> None:
    """The train command's own flags (``--epochs``, ``--max-steps``, ``--seed``, ...) among ``keys`` into
    ``overrides``, over --config and --set. ``--epochs`` and ``--max-steps`` are both upper bounds, as the config keys
    are: given together, the run ends at whichever comes first."""
    for key in keys:
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)


def check_prepared(train: object, overrides: dict, train_cfg) -> None:
    """A ``tokenizer`` given (``overrides``: --config, --set) with a prepared corpus (``train``, when it is one) must
    be the kind of the tokenizer the corpus brings: another kind was silently ignored, and the run's config.json
    recorded it as if it had been used. (``vocab_size`` is the tokenizer's upper bound, and the run records the size
    it reached, as a run trained from text does.) The text run's settings pass, so the same command trains from text
    or from the corpus."""
    from attnkit.data.prepared import PreparedCorpus

    if not isinstance(train, PreparedCorpus):
        return
    kind = train.meta["tokenizer"]["kind"]
    if "tokenizer" in overrides and train_cfg.tokenizer != kind:
        raise InputError(
            f"{train.directory}: the corpus was prepared with a {kind} tokenizer, not tokenizer={train_cfg.tokenizer} "
            "(prepare it again, or drop the key)"
        )


def check_training_extras(train_cfg) -> None:
    """What a training config needs installed, checked before anything is read or written (the metrics log found out
    only after the run directory held its config, tokenizer and labels)."""
    if not train_cfg.tensorboard:
        return
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401 - what the metrics log will import
    except ImportError:
        raise InputError("config key tensorboard=true needs the tensorboard package: pip install tensorboard") from None


def add_budget_args(p: argparse.ArgumentParser) -> None:
    """--max-steps and --epochs of a train command: its budget (``--resume`` may grow it); the first one reached ends
    the run."""
    p.add_argument("--max-steps", type=int, help="optimizer steps, at most (default 0: no limit, --epochs decides)")
    p.add_argument("--epochs", type=int, help="passes over the data, at most (default: the task's); the first ends it")


def check_resume(
    args: argparse.Namespace, settings: dict[str, object], model_cls: type, presets: dict, context: TrainContext
) -> bool:
    """A resumed run continues with the configuration it was started with. The same command with --resume appended
    is accepted: each setting (``--set``, --config and the flags, already merged into ``settings``; every model key
    of a --preset's shape) must equal the saved one, and a differing one is refused naming the key and both values.
    A larger budget (epochs, max_steps, max_minutes) is the exception: rank 0 writes it into the run, which goes on
    under it (its schedule planned again, ``training.loop`` says so). Called with the run's lock held.

    True when a saved run is resumed: the command then passes no configs to the task's train function, which takes
    the run's (the settings were checked here, key by key, where the library would compare whole configs)."""
    from attnkit import runs
    from attnkit.config import check_resume_settings, preset_shape, task_of
    from attnkit.training.run_setup import grow_budget
    from attnkit.training.state import STATE

    config = Path(args.out) / runs.CONFIG
    if not args.resume or not config.is_file() or not (Path(args.out) / STATE).is_file():  # nothing saved yet:
        return False  # the run starts from the beginning, under this command's settings
    saved = runs.read_json(config)
    task = task_of(model_cls)
    if saved.get("task") != task:
        raise InputError(
            f"{args.out}: --resume: it holds a {saved.get('task')!r} run, not a {task!r} one; resume it with its own "
            "command, or train into another --out"
        )
    chosen = getattr(args, "preset", None)  # pretrain has no presets
    requested = {**(preset_shape(model_cls, presets, chosen) if chosen else {}), **settings}
    grown = check_resume_settings(saved, requested, model_cls)
    init_from = getattr(args, "init_from", None)
    if init_from is not None and str(init_from) != saved.get("init_from"):
        raise InputError(
            f"--resume: --init-from {init_from} differs from the run's saved init_from="
            f"{saved.get('init_from')!r}; a resumed run continues with its saved configuration"
        )
    if grown and context.is_main:
        grow_budget(Path(args.out), grown)
    return True


def check_init_from(
    args: argparse.Namespace, overrides: dict, model_cls: type, settable: tuple[str, ...], source: str
) -> None:
    """Weights to start from (``--init-from``) fix the architecture and the tokenizer: of the model keys, only
    ``settable`` ones may be given, and no --preset. ``source`` says what gives the weights, for the error."""
    from dataclasses import fields

    if Path(args.init_from).resolve() == Path(args.out).resolve():  # it was accepted, and the run replaced its source
        raise InputError(f"--init-from {args.init_from}: is --out too; train into another directory")
    model_keys = {f.name for f in fields(model_cls)} - set(settable)
    fixed = sorted(k for k in overrides if k in model_keys or k in ("tokenizer", "min_freq", "pretokenize"))
    if args.preset or fixed:
        what = ", ".join((["--preset"] if args.preset else []) + [f"--set {k}" for k in fixed])
        raise InputError(f"--init-from {args.init_from}: {source} fixes the architecture and tokenizer; drop {what}")


def note_unfinished(run_dir: str | Path) -> None:
    """A note on stderr when the run to predict or evaluate with was stopped part-way (``state.unfinished``)."""
    from attnkit.training.state import unfinished

    if note := unfinished(run_dir):
        print(f"note: {note}", file=sys.stderr)


def print_json(obj: object) -> None:
    print(json.dumps(obj, ensure_ascii=False))


def texts_from(args_texts: list[str]) -> list[str]:
    """TEXT arguments, or one text per stdin line when there are none (blank lines skipped)."""
    if args_texts:
        return args_texts
    return [line for line in stdin_lines() if line.strip()]


def stdin_lines() -> list[str]:
    """Standard input's lines without their line ends, as strict UTF-8: bytes that are not are an error line naming
    the line (``<stdin>:3: not valid UTF-8 (bytes e9)``), not a traceback."""
    from attnkit.data.readers.lines import stream_lines

    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream put in its place (a caller's io.StringIO): decoded already
        return [line.rstrip("\r\n") for line in sys.stdin]
    return list(stream_lines(raw))


def fetch_dataset(name: str, pair: str | None = None, *, task: str | None = None) -> Path:
    """The directory of dataset recipe ``name``, fetched if needed; with ``task``, a recipe of another kind (a
    classification set given to a translator, the MiniLM encoder given as data) is refused before anything is read."""
    from attnkit.data.recipes import RECIPES, fetch

    recipe = RECIPES.get(name.partition("/")[0])
    if task is not None and recipe is not None and recipe.task != task:
        raise InputError(
            f"dataset {name}: a {recipe.task} recipe, not {task} data; `attnkit data list` names each recipe's task"
        )
    return fetch(name, pair=pair)


def dataset_splits(name: str, task: str) -> tuple[Path, Path]:
    directory = fetch_dataset(name, task=task)
    return directory / "train.tsv", directory / "valid.tsv"


def add_precision_arg(p: argparse.ArgumentParser, help: str, *, int8: bool = False) -> None:
    """--precision fp32 | bf16 | fp16 (| int8 where a translator decodes) of an inference command; ``help`` says
    what each does there."""
    choices = ("fp32", "bf16", "fp16", "int8") if int8 else ("fp32", "bf16", "fp16")
    p.add_argument("--precision", choices=choices, default="fp32", help=f"{help} (default %(default)s)")


def check_precision(precision: str, device, *, what: str, note: bool = True) -> None:
    """fp16 off CUDA (and bf16 on a GPU without it) is an error line naming ``what``; bf16 on a CPU without AMX or
    AVX512-BF16 runs, much slower than fp32: say so, once (unless ``note`` is False)."""
    from attnkit.training import precision as precisions

    precisions.check_precision(precision, device, what=what, allowed=precisions.DECODING_PRECISIONS)
    if note and precisions.slow_bf16(precision, device):
        print(f"note: precision={precision}: {precisions.SLOW_BF16_NOTE}", file=sys.stderr)


def eval_file(args: argparse.Namespace, task: str) -> Path:
    """--data FILE, or --dataset NAME --split SPLIT (a dataset recipe of ``task``'s split, fetched if needed)."""
    if bool(args.data) == bool(args.dataset):
        raise InputError("give --data FILE or --dataset NAME [--split test] (one of them)")
    if args.data:
        check_no_split(args)
        return args.data
    return fetch_dataset(args.dataset, getattr(args, "pair", None), task=task) / f"{args.split or 'test'}.tsv"


def check_no_split(args: argparse.Namespace) -> None:
    """--split with files to evaluate (it picks a split of --dataset) is refused rather than ignored."""
    if args.split:
        raise InputError(f"--split {args.split} picks a split of --dataset; files given with --data are read whole")


@contextmanager
def training_context(args: argparse.Namespace) -> Iterator[TrainContext]:
    """Where a train command trains. Started by torchrun (``torchrun --nproc-per-node N -m attnkit ... train``),
    this process is one rank of a data-parallel run: it joins the process group here and leaves it at the end.

    The process that writes the run (rank 0) holds the lock of ``--out`` from here to the end, so that a second
    training into the same directory fails at once, naming this one; the other ranks write nothing and take none."""
    from attnkit.runs import run_lock
    from attnkit.training.distributed import context_from_environment, end_process_group

    def taken_over(holder) -> None:
        print(f"note: {args.out}: taking over the lock left by {holder}, which has ended", file=sys.stderr)

    context = context_from_environment(device_of(args))
    try:
        with run_lock(args.out, on_stale=taken_over) if context.is_main else nullcontext():
            yield context
    finally:
        end_process_group()


@contextmanager
def training_progress(args: argparse.Namespace, context: TrainContext, precision: str) -> Iterator[TrainingProgress]:
    """Around a train command's call into its task: the configured precision checked on this device (on every rank:
    a rank that skipped it waited for rank 0 in a collective and died in gloo's traceback when rank 0 refused; rank 0
    alone notes a slow bf16), and the progress display (rank 0 reports for all ranks), closed however training ends."""
    from attnkit.cli.progress import TrainingProgress

    check_precision(precision, context.device, what="config key precision", note=context.is_main)
    progress = TrainingProgress(quiet=args.quiet, muted=not context.is_main)
    try:
        yield progress
    finally:
        progress.close()


@contextmanager
def main_rank_first(context: TrainContext) -> Iterator[None]:
    """Rank 0 runs the block (a dataset fetch) before the other ranks, which then find its result in the cache."""
    from attnkit.training.distributed import main_done, wait_for_main

    wait_for_main(context)
    yield
    main_done(context)
