"""``attnkit pretrain``: BERT's masked-LM corruption has its published statistics and never touches special tokens; an
encoder pretrained on a tiny predictable corpus learns it (loss falls, masked accuracy far above chance); the run is
the start of a classifier (the exact encoder tensors) and exports as a BERT folder that transformers reproduces; a
stopped and resumed run is bitwise the uninterrupted one; bad input is one error line and leaves nothing behind."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from attnkit import runs
from attnkit.cli import main
from attnkit.config import MaskedLMConfig, PretrainTrainConfig
from attnkit.data.batching import pad
from attnkit.tasks.pretrain import (
    MASK_TOKEN,
    batch_seed,
    choose_and_corrupt,
    load_pretrained_run,
    maskable_ids,
    pretrain_encoder,
)
from attnkit.training.events import Resumed, Step

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo "
    "sierra tango uniform victor whiskey xray yankee zulu"
).split()
SENTENCES = [[WORDS[(3 * i + 5 * j) % len(WORDS)] for j in range(6)] for i in range(6)]
MODEL: dict[str, Any] = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, vocab_size=480, max_len=32, dropout=0.0)
TRAIN: dict[str, Any] = dict(
    min_freq=1, batch_size=16, lr=1e-2, valid_fraction=0.1, epochs=10, checkpoint_every=5, seed=1
)


def corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` draws of six six-word sentences: a masked word is fixed by the other words of its sentence and its
    position, which the encoder must learn to read (its own position alone leaves several words possible)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(SENTENCES)) for _ in range(n)]


def pretrain(out: Path, texts: list[str], on_event=lambda event: None, resume: bool = False, **train):
    return pretrain_encoder(
        texts,
        model_cfg=MaskedLMConfig(**MODEL),
        train_cfg=PretrainTrainConfig(**{**TRAIN, **train}),
        out_dir=out,
        resume=resume,
        on_event=on_event,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain") / "run"
    torch.manual_seed(0)
    pretrain(out, corpus(400))
    return out


# ---------------------------------------------------------------------------------------------------------------
# The corruption of §3.1


def test_masking_has_berts_statistics_and_never_chooses_special_tokens():
    vocab, mask_id, pad_id, cls_id = 1000, 3, 0, 2
    maskable = torch.ones(vocab, dtype=torch.bool)
    maskable[:5] = False  # <pad> <unk> <cls> <mask> and one more special
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 120, (1000,), generator=gen)
    rows = [[cls_id, *torch.randint(5, vocab, (int(n),), generator=gen).tolist()] for n in lengths]
    ids = pad(rows, pad_id)  # (B, S), padded
    inputs, chosen = choose_and_corrupt(ids, maskable=maskable, mask_id=mask_id, mask_prob=0.15, generator=gen)

    assert not chosen[~maskable[ids]].any()  # padding and <cls> never chosen
    assert torch.equal(inputs[~chosen], ids[~chosen])  # nothing else changes
    per_text = chosen.sum(dim=1).float() / lengths.float()  # exactly round(15%) of each text (BERT's own code)
    assert (per_text - 0.15).abs().max() < 0.5 / 20 + 1e-6
    assert abs(chosen.sum().item() / lengths.sum().item() - 0.15) < 0.005
    was, now = ids[chosen], inputs[chosen]  # (N,)
    n = len(was)
    assert n > 9000  # the tolerances below are 5 standard deviations at this count
    masked = (now == mask_id).float().mean().item()
    unchanged = (now == was).float().mean().item()
    random_ = ((now != mask_id) & (now != was)).float().mean().item()
    assert abs(masked - 0.8) < 0.02 and abs(unchanged - 0.1) < 0.015 and abs(random_ - 0.1) < 0.015
    assert maskable[now[now != mask_id]].all()  # random replacements are ordinary tokens, never specials


def test_masks_depend_on_the_seed_alone():
    maskable = torch.ones(50, dtype=torch.bool)
    maskable[0] = False
    ids = torch.randint(1, 50, (8, 30))

    def draw(seed: int):
        gen = torch.Generator().manual_seed(seed)
        return choose_and_corrupt(ids, maskable=maskable, mask_id=0, mask_prob=0.15, generator=gen)

    torch.manual_seed(123)  # the global random state plays no part
    a = draw(batch_seed(1, 7, [3, 4, 5]))
    torch.manual_seed(456)
    b = draw(batch_seed(1, 7, [3, 4, 5]))
    c = draw(batch_seed(1, 8, [3, 4, 5]))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_a_text_of_one_token_still_gets_a_target_and_an_empty_one_none():
    maskable = torch.tensor([False, True, True, True])
    ids = torch.tensor([[1, 0, 0], [0, 0, 0]])  # one real token; none
    _, chosen = choose_and_corrupt(
        ids, maskable=maskable, mask_id=0, mask_prob=0.15, generator=torch.Generator().manual_seed(0)
    )
    assert chosen.tolist() == [[True, False, False], [False, False, False]]


# ---------------------------------------------------------------------------------------------------------------
# Learning


def test_pretraining_learns_the_corpus(run):
    rows = [json.loads(line) for line in (run / runs.METRICS).read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "valid_loss" in r]
    assert len(evals) == 10 and {"valid_accuracy", "valid_perplexity"} <= set(evals[0])
    first = sum(r["loss"] for r in steps[:3]) / 3
    assert evals[-1]["valid_loss"] < 0.3 * first
    assert evals[-1]["valid_loss"] < evals[0]["valid_loss"]
    chance = 1 / len(WORDS)  # a masked position holds one of the 26 words
    assert evals[-1]["valid_accuracy"] > 0.8 > 8 * chance
    assert abs(evals[-1]["valid_perplexity"] - 2.718281828 ** evals[-1]["valid_loss"]) < 1e-3


def test_the_run_records_its_tokenizer_with_cls_and_mask(run):
    pretrained = load_pretrained_run(run)
    tokenizer = pretrained.tokenizer
    assert tokenizer.encode("alpha bravo")[0] == tokenizer.cls_id  # first-token pooling has its <cls>
    mask_id = tokenizer.backend.token_to_id(MASK_TOKEN)
    assert mask_id == tokenizer.vocab_size - 1
    assert not maskable_ids(tokenizer)[[tokenizer.pad_id, tokenizer.cls_id, tokenizer.unk_id, mask_id]].any()
    assert runs.read_json(run / runs.CONFIG)["task"] == "pretrain"


# ---------------------------------------------------------------------------------------------------------------
# Fine-tuning from the run, and exporting it


def test_classify_init_from_the_run_starts_from_its_encoder(run, tmp_path, monkeypatch, capsys):
    """The model the classifier's loop receives holds the pretraining run's encoder tensors, exactly."""
    import attnkit.tasks.classify.train as classify_train

    encoder = {
        k: v for k, v in runs.load_run(run, task="pretrain").model.state_dict().items() if not k.startswith("head.")
    }
    handed: dict[str, torch.Tensor] = {}
    real_fit = classify_train.fit

    def recording_fit(model, *args, **kwargs):
        handed.update({k: v.clone() for k, v in model.state_dict().items()})
        return real_fit(model, *args, **kwargs)

    monkeypatch.setattr(classify_train, "fit", recording_fit)
    data = tmp_path / "train.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{t.split()[0][0] < 'h'}\n" for t in corpus(40, seed=3)))
    out = tmp_path / "cls"
    code = main(["classify", "train", "--train", str(data), "--init-from", str(run), "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert set(encoder) == {k for k in handed if not k.startswith("head.")}
    for name, tensor in encoder.items():
        assert torch.equal(handed[name], tensor), name
    config = runs.read_json(out / runs.CONFIG)
    assert config["init_from"] == str(run) and config["model"]["positional"] == "learned"
    assert config["tokenizer"]["fingerprint"] == runs.read_json(run / runs.CONFIG)["tokenizer"]["fingerprint"]


def test_embed_reads_the_runs_encoder(run):
    from attnkit.interop.bert import embed
    from attnkit.tasks.embed import sentence_embeddings

    texts = corpus(5, seed=4)
    pretrained = load_pretrained_run(run)
    tokenizer = pretrained.tokenizer
    encoder = runs.load_run(run, task="pretrain").model  # the masked LM itself, in eval mode
    with torch.no_grad():
        hidden, mask = encoder.encode(pad(tokenizer.encode_batch(texts), tokenizer.pad_id))  # (B, S, D)
    vectors = embed(run, texts)  # (N, D)
    torch.testing.assert_close(vectors, sentence_embeddings(pretrained.model, pretrained.tokenizer, texts))
    real = mask[:, 0, 0, :, None].float()  # (B, S, 1): the masked mean over real tokens, by hand
    torch.testing.assert_close(vectors, (hidden * real).sum(1) / real.sum(1), atol=1e-5, rtol=1e-5)


def test_export_hf_matches_transformers(run, tmp_path, capsys):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    assert main(["export", "hf", "--model", str(run), "--out", str(tmp_path / "bert")]) == 0, capsys.readouterr().err
    loaded = runs.load_run(run, task="pretrain")
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = pad(tokenizer.encode_batch(corpus(6, seed=9) + ["alpha"]), tokenizer.pad_id)  # (B, S) with padding
    real = ids != tokenizer.pad_id  # (B, S)
    with torch.no_grad():
        ours = model(ids, real)  # (N, V)
        hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "bert").eval()
        theirs = hf(input_ids=ids, attention_mask=real.long()).logits[real]  # (N, V)
        hidden, _ = model.encode(ids)  # (B, S, D)
        encoder = transformers.BertModel.from_pretrained(tmp_path / "bert", add_pooling_layer=False).eval()
        reference = encoder(input_ids=ids, attention_mask=real.long()).last_hidden_state  # (B, S, D)
    assert (ours - theirs).abs().max().item() < 1e-4
    assert (hidden[real] - reference[real]).abs().max().item() < 1e-5
    assert torch.equal(hf.cls.predictions.decoder.weight, hf.bert.embeddings.word_embeddings.weight)
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    assert json.loads((tmp_path / "bert" / "tokenizer_config.json").read_text())["mask_token"] == MASK_TOKEN


def test_an_exported_bpe_tokenizer_reads_a_special_tokens_spelling_as_text_as_attnkit_does(tmp_path, capsys):
    """attnkit's BPE reads "<mask>" typed in a text as text; the exported folder's tokenizer read it as the mask id
    (embeddings 0.03 apart), as the `tokenizers` library does not save that setting: tokenizer_config.json says
    ``split_special_tokens``, which transformers applies."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    pretrain(tmp_path / "run", corpus(40), tokenizer="bpe", epochs=1)
    assert main(["export", "hf", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "bert")]) == 0, (
        capsys.readouterr().err
    )
    ours = runs.load_run(tmp_path / "run", task="pretrain").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "bert")
    text = f"alpha {MASK_TOKEN} bravo <pad> <cls>"
    assert theirs(text)["input_ids"] == ours.encode(text)
    assert ours.backend.token_to_id(MASK_TOKEN) not in ours.encode(text)  # five characters of text, not the mask


# ---------------------------------------------------------------------------------------------------------------
# Resume, and bad input


@pytest.mark.parametrize("stop_at, saved_at", [(4, 3), (13, 12)])  # saves every 3 steps and at epoch ends (7, 14)
def test_stopped_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path, stop_at, saved_at, same_run):
    texts = corpus(120, seed=5)
    train: dict[str, Any] = dict(epochs=3, checkpoint_every=3)  # 7 steps an epoch
    torch.manual_seed(0)
    pretrain(tmp_path / "alone", texts, **train)

    def stop(event):
        if isinstance(event, Step) and event.step == stop_at:
            raise KeyboardInterrupt

    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        pretrain(tmp_path / "stopped", texts, on_event=stop, **train)
    torch.manual_seed(0)
    events: list = []
    pretrain(tmp_path / "stopped", texts, on_event=events.append, resume=True, **train)
    assert [e.step for e in events if isinstance(e, Resumed)] == [saved_at]  # continued, not started over
    same_run(tmp_path / "alone", tmp_path / "stopped")


@pytest.mark.parametrize(
    "problem, message",
    [
        ("missing", "no such file"),
        ("empty", "no text"),
        ("blank", "no text"),
        ("bad key", "config key 'pooling' does not apply to pretrain models (it is a classify key)"),
        ("bad value", "mask_prob=1.5"),
        # the user's own number, <mask> counted in it (it said vocab_size=261 ... use vocab_size > 261 of 262)
        (
            "small bpe",
            "config key vocab_size=262 leaves no room for bpe entries beyond the 5 special, 256 byte-fallback and 1 "
            "<mask> tokens; use vocab_size > 262",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys, problem, message):
    text = tmp_path / "text.txt"
    if problem != "missing":
        text.write_text({"empty": "", "blank": "\n  \n"}.get(problem, "alpha bravo\n"))
    extra = {
        "bad key": ["--set", "pooling=cls"],
        "bad value": ["--set", "mask_prob=1.5"],
        "small bpe": ["--set", "tokenizer=bpe", "vocab_size=262"],
    }.get(problem, [])
    out = tmp_path / "run"
    code = main(["pretrain", "--text", str(text), "--out", str(out), "--quiet", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not out.exists()
