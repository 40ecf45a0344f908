"""The one adapter between the server and attnkit's models: load a run directory (or a BERT folder) and run
already-encoded inputs through it, one class per kind of model the server serves.

Every call into the models and tasks of attnkit that the server makes is in this module (the tasks' inference in
``attnkit.tasks``, run directories through ``attnkit.runs``): a change of the tasks' inference API touches this file
alone.

The server tokenizes in the event loop (fast, and needed to count tokens for the batch budget and the limits) and
hands ids to the inference worker, whose ``execute.run_batch`` calls ``classify`` / ``embed`` / ``translate`` /
``attention`` below. A batch's outputs equal those of the same inputs alone: attnkit's padding masks and
per-sentence decoding limits make each output independent of the rest of its batch (the CLI-equality tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attnkit import runs
from attnkit.data.batching import pad
from attnkit.devices import model_device
from attnkit.errors import InputError
from attnkit.inference.programs import default_engine
from attnkit.tokenization import Tokenizer

TASKS = ("classifier", "translator", "embedder")


@dataclass(frozen=True)
class Candidate:
    """One n-best translation: raw summed log-probability and the length-penalised score it was ranked by."""

    translation: str
    score: float
    normalized_score: float
    eos: bool


class ServedModel:
    """What the server needs of a model. ``task`` says which endpoints apply."""

    task: str
    name: str
    tokenizer: Tokenizer
    model: Any  # a TransformerClassifier or a Transformer
    max_len: int  # the longest input, in tokens, that the model takes without truncation
    n_layers: int
    n_heads: int
    labels: list[str] | None = None
    keep_last: int = 0  # special tokens kept at the end when an input is truncated (EOS, [SEP])
    precision: str = "fp32"  # what inference runs in: fp32, bf16, fp16, int8 (an embedder always runs in fp32)

    def inference(self) -> dict:
        """Where and in what this copy of the model runs, as ``/info`` reports it."""
        return {"precision": self.precision, "device": str(model_device(self.model))}

    def token_ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def truncate(self, ids: list[int]) -> list[int]:
        """Cut ``ids`` to ``max_len`` as training did: keep the trailing specials."""
        if len(ids) <= self.max_len:
            return ids
        return (
            ids[: self.max_len - self.keep_last] + ids[len(ids) - self.keep_last :]
            if self.keep_last
            else ids[: self.max_len]
        )


class _EncoderModel(ServedModel):
    """A classifier run or a BERT encoder: encoder self-attention, pooled sentence vectors."""

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    @torch.inference_mode()
    def embed(self, seqs: list[list[int]], *, pool: str, normalize: bool) -> list[list[float]]:
        """Sentence vectors of encoded inputs, as ``attnkit embed`` computes them (one padded batch)."""
        ids = pad(seqs, self.tokenizer.pad_id).to(model_device(self.model))  # (B, S)
        hidden, mask, _ = self.model.encode(ids)  # (B, S, D)
        vectors = self.model.pool(hidden, mask, pool).float()  # (B, D)
        return (F.normalize(vectors, dim=-1) if normalize else vectors).tolist()

    @torch.inference_mode()
    def attention(self, ids: list[int]) -> dict:
        layers = tuple(range(self.n_layers))
        _, _, maps = self.model.encode(torch.tensor([ids], device=model_device(self.model)), layers)
        return {"encoder_self": [maps.encoder_self[i][0].tolist() for i in layers]}  # [layer][head][query][key]


class ClassifierModel(_EncoderModel):
    task = "classifier"

    def __init__(self, run_dir: str | Path, precision: str = "fp32", device: torch.device | str = "cpu"):
        from attnkit.tasks.classify import ClassifierRun

        self.run = ClassifierRun(run_dir, precision=precision, device=device)
        self.model, self.tokenizer, self.precision = self.run.model, self.run.tokenizer, precision
        cfg = self.run.model_cfg
        self.name, self.labels = Path(run_dir).name, list(self.run.labels)
        self.max_len, self.n_layers, self.n_heads = cfg.max_len, cfg.n_layers, cfg.n_heads
        self.keep_last = self.tokenizer.n_trailing_specials
        self._cfg = cfg

    def config(self) -> dict:
        return {"task": self.task, "labels": self.labels, **vars(self._cfg)}

    def classify(self, seqs: list[list[int]]) -> list[list[float]]:
        """Class probabilities (N, C) of encoded inputs, computed as ``classify predict`` does."""
        from attnkit.tasks.classify import predict_ids
        from attnkit.training.losses import class_probabilities
        from attnkit.training.precision import autocast

        with autocast(self.precision, self.run.device):
            logits = predict_ids(self.model, seqs, self.tokenizer.pad_id)  # (N, C)
        return class_probabilities(logits).tolist()


class EmbedderModel(_EncoderModel):
    """A pretrained BERT folder (or ``minilm``): embeddings and attention, no labels."""

    task = "embedder"

    def __init__(self, spec: str | Path, device: torch.device | str = "cpu"):
        from attnkit.interop.bert import load_bert_classifier, resolve_bert_folder

        folder = resolve_bert_folder(spec)
        from attnkit.inference import prepare_for_inference

        self.model, cfg, self.tokenizer = load_bert_classifier(folder, n_classes=1)
        self.model.to(device)
        prepare_for_inference(self.model)  # eval mode, W^Q W^K W^V fused once
        self.name = str(spec) if str(spec) == "minilm" else folder.name
        self.max_len, self.n_layers, self.n_heads = cfg.max_len, cfg.n_layers, cfg.n_heads
        self.keep_last = self.tokenizer.n_trailing_specials
        self._cfg = cfg

    def config(self) -> dict:
        return {"task": self.task, **{k: v for k, v in vars(self._cfg).items() if k != "n_classes"}}


class TranslatorModel(ServedModel):
    task = "translator"

    def __init__(self, run_dir: str | Path, precision: str = "fp32", device: torch.device | str = "cpu"):
        from attnkit.tasks.translate import TranslatorRun

        self.run = TranslatorRun(run_dir, precision=precision, device=device)
        self.model, self.tokenizer, self.precision = self.run.model, self.run.tokenizer, precision
        cfg = self.run.model_cfg
        self.name, self.max_len = Path(run_dir).name, cfg.max_len
        self.n_layers, self.n_heads, self.keep_last = cfg.n_layers, cfg.n_heads, 1  # the source's EOS
        if self.tokenizer.bos_id is None or self.tokenizer.eos_id is None:
            raise InputError(f"{run_dir}: the translator's tokenizer has no BOS or EOS token")
        self.bos_id: int = self.tokenizer.bos_id
        self.eos_id: int = self.tokenizer.eos_id
        self._cfg = cfg
        # The device's default (ATTNKIT_ENGINE); a compiled engine compiles a new bucket's programs in a thread of
        # its own while that bucket's requests decode eagerly: a request never waits for the compiler.
        self.engine = default_engine(model_device(self.model), background=True)

    def inference(self) -> dict:
        return {**super().inference(), "engine": self.engine.kind}

    def config(self) -> dict:
        return {"task": self.task, **vars(self._cfg)}

    def token_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) + [self.eos_id]  # as ``translate run`` encodes a source

    @torch.inference_mode()
    def translate(
        self, seqs: list[list[int]], *, beam: int, alpha: float, length_penalty: str, n_best: int
    ) -> list[list[Candidate]]:
        """The n best translations of each encoded source, best first. The best one is what ``translate run``
        prints: greedy search for beam 1 (its score summed during the search), otherwise beam search (§6.1)."""
        from attnkit.decoding import beam_search_nbest, greedy_decode_scored

        tok, max_positions = self.tokenizer, self.model.embeddings.position.max_len
        src = pad(seqs, tok.pad_id).to(model_device(self.model))  # (B, S)
        if beam == 1:
            found = greedy_decode_scored(
                self.model, src, bos_id=self.bos_id, eos_id=self.eos_id, max_positions=max_positions, engine=self.engine
            )
            nbest = [[h] for h in found]
        else:
            nbest = beam_search_nbest(
                self.model,
                src,
                bos_id=self.bos_id,
                eos_id=self.eos_id,
                max_positions=max_positions,
                n_best=n_best,
                beam_size=beam,
                alpha=alpha,
                length_penalty=length_penalty,
                engine=self.engine,
            )
        return [[Candidate(tok.decode(h.tokens), h.score, h.normalized, h.eos) for h in hyps] for hyps in nbest]

    @torch.inference_mode()
    def attention(self, ids: list[int]) -> dict:
        """Encoder self-, decoder self- and cross-attention for the greedy translation of one source."""
        from attnkit.decoding import greedy_decode
        from attnkit.decoding.limits import output_limits

        tok, model = self.tokenizer, self.model
        layers = tuple(range(self.n_layers))
        src = torch.tensor([ids], device=model_device(model))  # (1, S)
        max_positions = model.embeddings.position.max_len
        out = greedy_decode(
            model, src, bos_id=self.bos_id, eos_id=self.eos_id, max_positions=max_positions, engine=self.engine
        )[0]
        limit = int(output_limits(src, pad_id=tok.pad_id, max_extra=50, max_positions=max_positions, fixed_len=None)[0])
        # Decoder position t (BOS at 0) predicted output token t. When decoding stopped at EOS the rows are the
        # output tokens and EOS; when it ran to the length limit there was no EOS, and position len(out) (which may
        # be past max_len) predicted nothing: as in ``analysis.attention.translator_attention``. EOS is named as the
        # vocabulary names it, as in the source's ``tokens``.
        eos = [tok.backend.id_to_token(self.eos_id)] if len(out) < limit else []
        out_tokens = [tok.backend.id_to_token(i) for i in out] + eos
        fed = [self.bos_id] + out[: len(out_tokens) - 1]
        tgt_in = torch.tensor([fed], device=src.device)  # (1, T), T = len(out_tokens)
        memory, src_mask, enc_maps = model.encode(src, layers)  # (1, S, D)
        _, dec_maps, _ = model.decode(tgt_in, memory, src_mask, attn_layers=layers)
        return {
            "translation": tok.decode(out),
            "output_tokens": out_tokens,
            "input_tokens_decoder": [tok.backend.id_to_token(i) for i in fed],
            "encoder_self": [enc_maps.encoder_self[i][0].tolist() for i in layers],
            "decoder_self": [dec_maps.decoder_self[i][0].tolist() for i in layers],
            "cross": [dec_maps.cross[i][0].tolist() for i in layers],
        }


def load_model(spec: str | Path, precision: str = "fp32", device: torch.device | str = "cpu") -> ServedModel:
    """A run directory (classifier or translator), a BERT folder, or ``minilm``, on ``device``; ``InputError``
    otherwise."""
    if str(spec) == "minilm":
        return EmbedderModel(spec, device)
    path = Path(spec)
    if not path.is_dir():
        raise InputError(f"{path}: no such directory (expected a run directory, a BERT folder or 'minilm')")
    config_path = path / runs.CONFIG
    task = runs.read_json(config_path).get("task") if config_path.is_file() else None
    if task == "classify":
        return ClassifierModel(path, precision, device)
    if task == "translate":
        return TranslatorModel(path, precision, device)
    if (path / "config.json").is_file() and task is None:
        return EmbedderModel(path, device)
    raise InputError(f"{path}: not a classifier or translator run directory, nor a BERT folder")
