"""A BERT folder's tokenizer (``tokenizer.json``, or a WordPiece ``vocab.txt``) as an attnkit ``Tokenizer``."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from attnkit import runs
from attnkit.errors import InputError
from attnkit.tokenization.tokenizer import SpecialTokens, Tokenizer


def _special_token_names(folder: Path) -> dict[str, str]:
    """Which strings are [PAD], [UNK], [CLS], [SEP]: special_tokens_map.json / tokenizer_config.json, else BERT's."""
    names = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]"}
    for filename in ("tokenizer_config.json", "special_tokens_map.json"):  # the second wins, as in transformers
        path = folder / filename
        if path.is_file():
            raw = runs.read_json(path)
            for role in names:
                value = raw.get(f"{role}_token")
                value = value.get("content") if isinstance(value, dict) else value
                if isinstance(value, str):
                    names[role] = value
    return names


def wordpiece_from_vocab(
    vocab_path: Path,
    *,
    lowercase: bool,
    names: dict[str, str],
    strip_accents: bool | None = None,
    chinese_chars: bool = True,
) -> Backend:
    """BERT's tokenizer rebuilt from ``vocab.txt`` (one token per line, id = line number) with the `tokenizers`
    components of its BertWordPieceTokenizer: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] $A [SEP]."""
    lines = vocab_path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        vocab.setdefault(token.rstrip("\r"), i)
    for role in ("unk", "cls", "sep"):
        if names[role] not in vocab:
            raise InputError(f"{vocab_path}: no {names[role]} token")
    backend = Backend(models.WordPiece(vocab, unk_token=names["unk"], max_input_chars_per_word=100))
    specials = (names["pad"], names["unk"], names["cls"], names["sep"], "[MASK]")
    backend.add_special_tokens([t for t in specials if t in vocab])
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = names["cls"], names["sep"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def load_bert_tokenizer(folder: str | Path) -> Tokenizer:
    """The folder's tokenizer (``tokenizer.json``, else ``vocab.txt``), roles [PAD] / [UNK] / [CLS] (none where the
    vocabulary has no such token), no BOS / EOS."""
    folder = Path(folder)
    names = _special_token_names(folder)
    if (folder / "tokenizer.json").is_file():
        try:
            backend = Backend.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # the Rust side raises plain Exceptions on malformed files
            raise InputError(f"{folder / 'tokenizer.json'}: not a valid tokenizer file ({err})") from None
    elif (folder / "vocab.txt").is_file():
        settings = (
            runs.read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        )
        backend = wordpiece_from_vocab(
            folder / "vocab.txt",
            lowercase=settings.get("do_lower_case", True),
            names=names,
            strip_accents=settings.get("strip_accents"),
            chinese_chars=settings.get("tokenize_chinese_chars", True),
        )
    else:
        raise InputError(f"{folder}: no tokenizer.json or vocab.txt")
    # attnkit pads and truncates itself (``data.batching``); a fixed padding saved in the file would add pad tokens.
    backend.no_padding()
    backend.no_truncation()
    # No [CLS] in the vocabulary: a folder exported from a tokenizer that prepends none (attnkit's word and BPE kinds).
    cls = names["cls"] if backend.token_to_id(names["cls"]) is not None else None
    try:
        roles = SpecialTokens(pad=names["pad"], unk=names["unk"], cls=cls, bos=None, eos=None)
        return Tokenizer(backend, "wordpiece", roles)
    except InputError as err:
        raise InputError(f"{folder}: {err}") from None
