"""A translator run directory as a deployable CTranslate2 model directory: ``export_ct2``, ``attnkit export ct2``.

The export is the conversion (``attnkit_to_ct2``) saved with what attnkit adds: ``TOKENIZER``, the run's tokenizer,
and ``META``, the source run and the conventions ``CT2Translator`` reads back (token ids, the length policy with
``MAX_EXTRA``, the tokenizer's fingerprint).
"""

from __future__ import annotations

from pathlib import Path

from attnkit import __version__
from attnkit.atomic import atomic_directory, atomic_write_json
from attnkit.errors import InputError
from attnkit.interop.ct2.convert import QUANTIZATIONS, attnkit_to_ct2, import_ctranslate2, tokenizer_tokens

META = "attnkit_ct2.json"  # what attnkit adds to a CTranslate2 model directory (source run, token conventions)
TOKENIZER = "tokenizer.json"
# What an export's folder holds: CTranslate2's converter writes the first three (one vocabulary: the shared BPE)
EXPORT_FILES = {"model.bin", "config.json", "shared_vocabulary.json", TOKENIZER, META}
MAX_EXTRA = 50  # §6.1: maximum output length = input length + 50


def export_ct2(run_dir: str | Path, out_dir: str | Path, *, quantization: str | None = None) -> Path:
    """Write the translator run at ``run_dir`` as a CTranslate2 model directory at ``out_dir``.

    The directory holds CTranslate2's files (``model.bin``, ``config.json``, ``shared_vocabulary.json``), attnkit's
    ``tokenizer.json`` and ``attnkit_ct2.json`` (the source run, the quantization, the token-id conventions, the
    length policy and the tokenizer's fingerprint). It is built under a temporary name beside ``out_dir`` and
    renamed into place, so it appears complete or not at all; an earlier export at ``out_dir`` is replaced.

    Args:
        quantization: weight type to store, one of ``QUANTIZATIONS`` (None keeps float32).
    Raises:
        InputError: CTranslate2 is missing, the quantization is unknown, the run is not a readable translator or
            has a structure CTranslate2 cannot express, or ``out_dir`` is something other than an earlier export.
    """
    from attnkit import runs
    from attnkit.tasks.translate import TranslatorRun

    import_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InputError(f"quantization {quantization!r}; expected one of {', '.join(QUANTIZATIONS)}")
    run = TranslatorRun(run_dir)  # checks the files against the manifest and that the run is a translator
    tokenizer = run.tokenizer
    tokens = tokenizer_tokens(tokenizer)
    if len(tokens) != run.model_cfg.vocab_size:
        raise InputError(f"{run.run_dir}: the tokenizer has {len(tokens)} tokens, the model {run.model_cfg.vocab_size}")
    if tokenizer.bos_id is None or tokenizer.eos_id is None:
        raise InputError(f"{run.run_dir}: the tokenizer has no BOS or EOS token, which a translator needs")
    meta = {
        "format": "attnkit-ct2/1",
        "attnkit_version": __version__,
        "source_run": str(run.run_dir.resolve()),
        "source_manifest_sha256": runs.sha256_file(run.run_dir / runs.MANIFEST),
        "quantization": quantization or "float32",
        "tokenizer": tokenizer.meta(),  # kind, special-token roles, fingerprint (checked when the export is loaded)
        "tokens": {
            "vocabulary": "the tokenizer's token of each id, in id order (shared by source and target)",
            # set on the tokenizer of tokenizer.json to read "<pad>" in a text as text, as attnkit does (the
            # `tokenizers` library does not save this setting)
            "encode_special_tokens": tokenizer.lossless,
            "vocab_size": len(tokens),
            "pad_id": tokenizer.pad_id,
            "unk_id": tokenizer.unk_id,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "decoder_start_token": tokens[tokenizer.bos_id],
            "add_source_eos": True,  # pass a source's tokens without its EOS; CTranslate2 appends it
        },
        "decoding": {"max_len": run.model_cfg.max_len, "max_len_policy": run.max_len_policy, "max_extra": MAX_EXTRA},
    }

    out_dir = Path(out_dir)
    _check_out(out_dir)
    with atomic_directory(out_dir) as work:
        try:
            attnkit_to_ct2(
                run.model,
                work,
                tokens=tokens,
                bos=tokens[tokenizer.bos_id],
                eos=tokens[tokenizer.eos_id],
                unk=tokens[tokenizer.unk_id],
                add_source_eos=True,
                quantization=quantization,
            )
        except ValueError as err:
            raise InputError(f"{run.run_dir}: cannot be expressed as a CTranslate2 Transformer ({err})") from None
        tokenizer.save(work / TOKENIZER)
        # the weights' sha256, checked when attnkit loads the export (a run's files are checked against its manifest)
        meta["sha256"] = {name: runs.sha256_file(work / name) for name in ("model.bin", "config.json")}
        atomic_write_json(work / META, meta)
    return out_dir


def _check_out(out_dir: Path) -> None:
    """Refuse to replace anything but an empty directory or an earlier export (never a run or unrelated files): an
    earlier export's folder holding files of the user's (a README, a .git) is refused too, as the replacement would
    delete them."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not (out_dir / META).is_file():
        raise InputError(f"{out_dir}: exists and is not an attnkit CTranslate2 export; choose a new --out")
    others = sorted(path.name for path in out_dir.iterdir() if path.name not in EXPORT_FILES)
    if others:
        raise InputError(
            f"{out_dir}: holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}, which an export does not "
            "write; an export replaces only an earlier export's folder (choose a new --out)"
        )
