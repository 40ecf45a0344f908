"""Run directories (layer 3): the files a training run writes, the manifest that checks them, the format version,
atomic writing of JSON and weights, the metrics log, and ``load_run``, which loads any run for inference.

``files`` holds the file names and the reading and writing, ``metrics`` the metrics log, ``load`` the dispatch on
the task. Everything is importable from ``attnkit.runs``.
"""

from attnkit.atomic import atomic_write_bytes, atomic_write_json
from attnkit.runs.files import (
    CHECKPOINTS,
    CONFIG,
    FORMAT,
    FORMAT_BEFORE_VERSIONING,
    LABELS,
    MANIFEST,
    METRICS,
    READABLE_FORMATS,
    TOKENIZER,
    WEIGHTS,
    check_format,
    check_run_dir,
    check_state_dict,
    checkpoint_paths,
    config_header,
    load_weights,
    prepare_run_dir,
    read_json,
    read_labels,
    remove_temporary_files,
    save_weights,
    sha256_file,
    state_dict_for_saving,
    write_manifest,
)
from attnkit.runs.load import TASKS, LoadedRun, load_run
from attnkit.runs.metrics import MetricsLog, read_metrics

__all__ = [
    "CHECKPOINTS",
    "CONFIG",
    "FORMAT",
    "FORMAT_BEFORE_VERSIONING",
    "LABELS",
    "MANIFEST",
    "METRICS",
    "READABLE_FORMATS",
    "TASKS",
    "TOKENIZER",
    "WEIGHTS",
    "LoadedRun",
    "MetricsLog",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_format",
    "check_run_dir",
    "checkpoint_paths",
    "check_state_dict",
    "config_header",
    "load_run",
    "load_weights",
    "prepare_run_dir",
    "read_json",
    "read_labels",
    "read_metrics",
    "remove_temporary_files",
    "save_weights",
    "sha256_file",
    "state_dict_for_saving",
    "write_manifest",
]
