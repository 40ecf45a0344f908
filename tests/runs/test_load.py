"""load_run: one dispatch on the task, the run-directory format version, and the cleanup of interrupted writes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import torch

from attnkit import runs
from attnkit.config import ClassifierConfig, TrainConfig, TranslatorConfig
from attnkit.errors import InputError
from attnkit.model.build import build_classifier, build_translator
from attnkit.model.classifier import TransformerClassifier
from attnkit.model.transformer import Transformer
from attnkit.tasks.classify import ClassifierRun
from attnkit.tasks.translate import TranslatorRun
from attnkit.tokenization import train_tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"]
SHAPE: dict[str, Any] = {"d_model": 16, "n_heads": 2, "d_ff": 24, "n_layers": 1, "max_len": 24}


@pytest.fixture
def tiny_run(write_run):
    """``tiny_run(run_dir, task, edit=...)`` -> (run_dir, model): a tiny run directory of ``task`` as the training
    entries write one, with ``edit`` applied to its config."""

    def make(run_dir, task: str, *, edit=lambda config: None):
        if task == "classify":
            tokenizer = train_tokenizer(TEXTS, vocab_size=60, min_freq=1)
            classifier = ClassifierConfig(vocab_size=tokenizer.vocab_size, n_classes=2, **SHAPE)
            cfg: ClassifierConfig | TranslatorConfig = classifier
            model: torch.nn.Module = build_classifier(classifier, pad_id=tokenizer.pad_id)
        else:
            tokenizer = train_tokenizer(TEXTS, kind="bpe", vocab_size=300, min_freq=1)  # > 5 + 256 byte ids
            translator = TranslatorConfig(vocab_size=tokenizer.vocab_size, **SHAPE)
            cfg, model = translator, build_translator(translator, pad_id=tokenizer.pad_id)
        labels = ["neg", "pos"] if task == "classify" else None
        return write_run(run_dir, task, model, cfg, tokenizer, labels, edit), model

    return make


@pytest.mark.parametrize("task, model_type", [("classify", TransformerClassifier), ("translate", Transformer)])
def test_load_run_dispatches_on_the_task_and_loads_the_weights(tmp_path, task, model_type, tiny_run):
    run_dir, saved = tiny_run(tmp_path / "run", task)
    loaded = runs.load_run(run_dir)
    assert loaded.task == task and loaded.run_dir == run_dir
    assert isinstance(loaded.model, model_type) and not loaded.model.training
    assert loaded.labels == (["neg", "pos"] if task == "classify" else None)
    assert loaded.max_len_policy == TrainConfig().max_len_policy
    for name, tensor in saved.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


def test_new_runs_are_written_in_the_current_format(tmp_path, tiny_run):
    run_dir, _ = tiny_run(tmp_path / "run", "classify")
    assert json.loads((run_dir / runs.CONFIG).read_text())["format"] == "attnkit-run/1" == runs.FORMAT


def test_a_run_of_the_first_release_without_a_format_still_loads(tmp_path, tiny_run):
    run_dir, saved = tiny_run(tmp_path / "run", "classify", edit=lambda config: config.pop("format"))
    assert "format" not in json.loads((run_dir / runs.CONFIG).read_text())
    run = ClassifierRun(run_dir)
    assert torch.equal(run.model.head.weight, saved.head.weight)
    assert [p.label for p in run.predict(TEXTS)]  # it predicts


def test_an_unknown_format_is_refused_naming_the_file_and_the_format(tmp_path, tiny_run):
    run_dir, _ = tiny_run(tmp_path / "run", "translate", edit=lambda config: config.update(format="attnkit-run/9"))
    with pytest.raises(InputError, match="attnkit-run/9") as info:
        runs.load_run(run_dir)
    assert str(run_dir / runs.CONFIG) in str(info.value)
    with pytest.raises(InputError, match="attnkit-run/9"):
        TranslatorRun(run_dir)
    with pytest.raises(InputError, match="attnkit-run/9"):  # nor is it resumed
        runs.prepare_run_dir(run_dir, resume=True)


def test_an_unknown_task_is_refused_naming_it(tmp_path, tiny_run):
    run_dir, _ = tiny_run(tmp_path / "run", "classify", edit=lambda config: config.update(task="summarize"))
    with pytest.raises(InputError, match="unknown task 'summarize'"):
        runs.load_run(run_dir)


def test_a_run_of_the_other_task_is_refused_by_the_task_runs(tmp_path, tiny_run):
    classifier, _ = tiny_run(tmp_path / "classifier", "classify")
    translator, _ = tiny_run(tmp_path / "translator", "translate")
    with pytest.raises(InputError, match="is a 'translate' run, not a classifier"):
        ClassifierRun(translator)
    with pytest.raises(InputError, match="is a 'classify' run, not a translator"):
        TranslatorRun(classifier)


def test_remove_temporary_files_deletes_only_what_interrupted_writes_left(tmp_path, tiny_run):
    run_dir, _ = tiny_run(tmp_path / "run", "translate")
    (run_dir / runs.CHECKPOINTS).mkdir()
    runs.save_weights(
        run_dir / runs.CHECKPOINTS, build_translator(TranslatorConfig(vocab_size=60, **SHAPE)), "step_5.safetensors"
    )
    # What a kill inside atomic.open_atomic leaves: its temporary name, ".NAME.<uuid4 hex>.tmp", beside the target.
    leftovers = [
        run_dir / f".{runs.WEIGHTS}.{uuid.uuid4().hex}.tmp",
        run_dir / runs.CHECKPOINTS / f".step_10.safetensors.{uuid.uuid4().hex}.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"half")
    keep = [run_dir / ".hidden_note", run_dir / "notes.tmp"]  # not the atomic writer's pattern
    for path in keep:
        path.write_bytes(b"mine")
    before = {p for p in run_dir.rglob("*") if p.is_file()}

    assert sorted(runs.remove_temporary_files(run_dir)) == sorted(leftovers)
    assert {p for p in run_dir.rglob("*") if p.is_file()} == before - set(leftovers)
    assert runs.check_run_dir(run_dir) == run_dir  # the finished files are untouched
    assert runs.remove_temporary_files(run_dir) == []


def test_an_unknown_task_or_device_is_an_input_error_naming_it(tmp_path, tiny_run):
    """``load_run(task="classification")`` was a KeyError; ``device="gpu"`` a RuntimeError from torch's parser and
    ``device="cuda"`` on a machine without one an AssertionError from torch.cuda. The run classes say the same."""
    run_dir, _ = tiny_run(tmp_path / "run", "classify")
    with pytest.raises(InputError, match=r"task='classification'; expected one of classify, translate, pretrain"):
        runs.load_run(run_dir, task="classification")
    with pytest.raises(
        InputError, match=r"^device gpu: not a device torch knows; expected auto, cpu, cuda, cuda:N or mps$"
    ):
        runs.load_run(run_dir, device="gpu")
    with pytest.raises(InputError, match=r"^device gpu: not a device torch knows"):
        ClassifierRun(run_dir, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match=r"^device cuda: no CUDA device is visible to torch"):
            ClassifierRun(run_dir, device="cuda")
    translator_dir, _ = tiny_run(tmp_path / "translator", "translate")
    with pytest.raises(InputError, match=r"^device gpu: not a device torch knows"):
        TranslatorRun(translator_dir, device="gpu")
    assert ClassifierRun(run_dir, device=torch.device("cpu")).device == torch.device("cpu")


def test_the_run_classes_refuse_what_is_not_a_list_of_their_records(tmp_path, tiny_run):
    """``ClassifierRun.evaluate("test.tsv")`` and a list of tuples were AttributeErrors ('str' object has no
    attribute 'label'), ``TranslatorRun.evaluate([])`` an IndexError from sacrebleu and ``ClassifierRun.logits("a
    film")`` classified each character: each is an InputError naming the argument and the reader to use."""
    from attnkit.data.readers.labeled import Example
    from attnkit.data.readers.parallel import Pair

    run = ClassifierRun(tiny_run(tmp_path / "run", "classify")[0])
    with pytest.raises(InputError, match=r"^examples: expected a list of Examples, got one string \('test.tsv'\): "):
        run.evaluate("test.tsv")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^examples item #2 is of type tuple, not Example \(attnkit.read_labeled"):
        run.evaluate([Example("the cat", "neg", 1), ("a dog", "pos")])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"^examples: the list is empty"):
        run.evaluate([])
    assert run.evaluate([Example("the cat", "neg", 1)])["n"] == 1
    with pytest.raises(InputError, match=r"expected a list of texts, got one string \('a film'\)"):
        run.logits("a film")  # type: ignore[arg-type]
    assert run.logits(["a film", "the cat"]).shape == (2, 2)
    with pytest.raises(InputError, match=r"^expected a list of texts, got NoneType$"):
        run.predict(None)  # type: ignore[arg-type]

    translator = TranslatorRun(tiny_run(tmp_path / "translator", "translate")[0])
    with pytest.raises(InputError, match=r"^pairs: the list is empty; expected Pairs"):
        translator.evaluate([])
    with pytest.raises(InputError, match=r"^pairs item #1 is of type Example, not Pair"):
        translator.evaluate([Example("the cat", "neg", 1)])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"^expected a list of texts, got NoneType$"):
        translator.translate(None)  # type: ignore[arg-type]
    assert translator.evaluate([Pair("the cat", "the cat", 1)], beam=1)["n"] == 1
