"""The one training loop on a toy task small enough to check exactly: accumulation, resume, budgets, patience and
best-checkpoint selection, keep-last-K, the non-finite guard, and the schedule the budgets size."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from attnkit.config import (
    ClassifierTrainConfig,
    TranslatorTrainConfig,
    train_config_class,
)
from attnkit.errors import InputError, NonFiniteError
from attnkit.training.events import Checkpointed, Evaluated, Planned, Resumed, Skipped, Step, Stopped, Warned
from attnkit.training.loop import fit
from attnkit.training.schedules import plan
from attnkit.training.task import Batch, BatchLoss

N_EXAMPLES = 24


class ToyTask:
    """24 points in R^4, labelled by the sign of their sum; batches cut from a seeded permutation."""

    metric = "accuracy"
    higher_is_better = True
    unit = "sentences"
    stats: tuple[str, ...] = ("accuracy",)
    d_model = 16
    fingerprint = "toy"

    def __init__(self, batch_sizes=(4,), mean=False, scripted=None, nan_at_call=None):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N_EXAMPLES, 4, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.batch_sizes, self.mean = batch_sizes, mean
        self.scripted = list(scripted) if scripted is not None else None  # evaluation results, in order
        self.nan_at_call, self.calls = nan_at_call, 0
        self.snapshots: list[dict[str, torch.Tensor]] = []  # the weights at each evaluation

    def epoch_batches(self, generator):
        order = (
            torch.randperm(N_EXAMPLES, generator=generator).tolist()
            if generator is not None
            else list(range(N_EXAMPLES))
        )
        batches, start, i = [], 0, 0
        while start < N_EXAMPLES:
            size = self.batch_sizes[i % len(self.batch_sizes)]
            batches.append(order[start : start + size])
            start, i = start + size, i + 1
        return batches

    def collate(self, indices):
        return Batch((self.x[indices], self.y[indices]), len(indices))

    def loss(self, model, batch):
        x, y = batch.tensors
        logits = model(x)
        value = F.cross_entropy(logits, y, reduction="mean" if self.mean else "sum")
        if torch.is_grad_enabled():  # not the guard's replay
            self.calls += 1
            if self.calls == self.nan_at_call:
                value = value * float("nan")
        return BatchLoss(value, mean=self.mean, sums={"accuracy": float((logits.argmax(-1) == y).sum())})

    def evaluate(self, model, device):
        self.snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        if self.scripted is not None:
            return self.scripted.pop(0)
        logits = model(self.x)
        return {
            "loss": F.cross_entropy(logits, self.y).item(),
            "accuracy": (logits.argmax(-1) == self.y).float().mean().item(),
        }


def toy_model(dropout=0.1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 2))


def config(**kwargs) -> ClassifierTrainConfig:
    return ClassifierTrainConfig(**{"patience": 0, "epochs": 3, "checkpoint_every": 4, "lr": 0.05, **kwargs})


def train(tmp: Path, task: ToyTask, cfg, events=None, model=None, resume=False, optimizer="adamw"):
    model = model or toy_model()
    opt = (
        torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        if optimizer == "adamw"
        else torch.optim.SGD(model.parameters(), lr=cfg.lr)
    )
    tmp.mkdir(exist_ok=True)
    on_event = events.append if events is not None else lambda e: None
    result = fit(model, opt, task, cfg, tmp, resume=resume, on_event=on_event)
    return model, result


# ---------------------------------------------------------------------------------------------------------------
# Accumulation


@pytest.mark.parametrize("mean", [False, True])
def test_two_accumulated_batches_give_the_gradient_of_one_batch_of_both(tmp_path, mean):
    """Batches of 3 and 5 accumulated into one step == one batch of 8: the loss is normalised by the step's 8
    units (fairseq), not by each batch's own (which would weight the 3 more than the 5)."""
    cfg = config(schedule="constant", lr=1.0, clip_norm=0.0, max_steps=1, weight_decay=0.0)
    grads = []
    for sizes, accum in (((3, 5), 2), ((8,), 1)):
        model = toy_model(dropout=0.0)
        before = [p.detach().clone() for p in model.parameters()]
        model, result = train(
            tmp_path / f"a{accum}",
            ToyTask(sizes, mean=mean),
            dataclasses.replace(cfg, accum_steps=accum),
            model=model,
            optimizer="sgd",
        )
        assert result.steps == 1
        grads.append([(b - p.detach()) for b, p in zip(before, model.parameters())])  # SGD, lr 1: the gradient
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert max(g.abs().max() for g in grads[0]) > 1e-3  # a gradient, not zeros


def test_a_partial_group_at_the_end_of_an_epoch_is_a_smaller_step(tmp_path):
    # 24 examples in batches of 5: 5 batches a epoch; accumulating 2: steps of 2, 2 and 1 batches.
    events: list = []
    _, result = train(tmp_path, ToyTask((5,)), config(accum_steps=2, epochs=2), events)
    steps = [e for e in events if isinstance(e, Step)]
    assert result.steps == 6
    assert [e.size for e in steps[:3]] == [10, 10, 4]


# ---------------------------------------------------------------------------------------------------------------
# Resume


def run_files(run: Path) -> dict[str, bytes]:
    files = {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    files.pop("manifest.json")  # records the attnkit version and hashes of the files compared here
    return files


@pytest.mark.parametrize("draw", range(4))
def test_run_stopped_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path, draw):
    cfg = config(epochs=3, checkpoint_every=4, keep_last=2)  # 6 steps an epoch, 18 in all
    train(tmp_path / "alone", ToyTask(), cfg)
    stop_at = random.Random(draw).randint(1, 17)  # 1: before the first save, so the resume starts from scratch
    print(f"stopping at step {stop_at}")

    def stop(event):
        if isinstance(event, Step) and event.step == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "stopped", ToyTask(), cfg, events=type("L", (list,), {"append": lambda self, e: stop(e)})())
    events: list = []
    _, result = train(tmp_path / "stopped", ToyTask(), cfg, events, resume=True)
    assert result.steps == 18
    resumed = [e for e in events if isinstance(e, Resumed)]
    saved = [s for s in range(1, stop_at) if s % 4 == 0 or s % 6 == 0]  # checkpoint_every 4, evaluations at epoch ends
    assert [e.step for e in resumed] == saved[-1:]
    assert run_files(tmp_path / "alone") == run_files(tmp_path / "stopped")


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
    cfg = config(epochs=2)
    train(tmp_path, ToyTask(), cfg)
    before = run_files(tmp_path)
    events: list = []
    _, result = train(tmp_path, ToyTask(), cfg, events, resume=True)
    assert not [e for e in events if isinstance(e, Step)]
    assert result.steps == 12 and result.stopped_by == "epochs"
    assert run_files(tmp_path) == before


def test_resume_on_other_data_is_refused(tmp_path):
    cfg = config(epochs=1)
    train(tmp_path, ToyTask(), cfg)
    other = ToyTask()
    other.fingerprint = "other"
    with pytest.raises(InputError, match="training data differs"):
        train(tmp_path, other, cfg, resume=True)


# ---------------------------------------------------------------------------------------------------------------
# Budgets


@pytest.mark.parametrize(
    ("budget", "steps", "why"),
    [
        ({"max_steps": 5}, 5, "max_steps"),
        ({"epochs": 2}, 12, "epochs"),
        ({"epochs": 2, "max_steps": 50}, 12, "epochs"),
        ({"max_minutes": 1e-9}, 1, "max_minutes"),
    ],
)
def test_budgets_stop_the_run(tmp_path, budget, steps, why):
    events: list = []
    _, result = train(tmp_path, ToyTask(), config(**budget), events)
    assert (result.steps, result.stopped_by) == (steps, why)
    assert [e for e in events if isinstance(e, Step)][-1].step == steps
    # Every stop ends with an evaluation and a saved state at the last step.
    assert [e for e in events if isinstance(e, Evaluated)][-1].step == steps
    assert (tmp_path / "train_state.safetensors").is_file() and (tmp_path / "manifest.json").is_file()
    # A stop before the plan's end is said once; the budgets the plan was sized by are not news.
    said = [e.message for e in events if isinstance(e, Stopped)]
    assert said == (["stopped at step 1: max_minutes=1e-09 spent"] if why == "max_minutes" else [])


def test_the_schedule_plans_on_the_smaller_budget(tmp_path):
    events: list = []
    train(tmp_path, ToyTask(), config(epochs=2, max_steps=50), events)
    (planned,) = [e for e in events if isinstance(e, Planned)]
    assert (planned.total_steps, planned.steps_per_epoch, planned.warmup) == (12, 6, 1)


def test_evaluation_every_n_steps(tmp_path):
    events: list = []
    train(tmp_path, ToyTask(), config(epochs=2, eval_every=5), events)
    assert [e.step for e in events if isinstance(e, Evaluated)] == [5, 10, 12]


# ---------------------------------------------------------------------------------------------------------------
# Model selection


def scripted(*pairs):
    return [{"accuracy": acc, "loss": loss} for acc, loss in pairs]


def test_patience_counts_evaluations_without_improvement_and_ties_go_to_the_lower_loss(tmp_path):
    # Evaluation 3 ties 2 on accuracy with a lower loss: it is the best. 4 ties with a higher loss, 5 is worse:
    # two evaluations without improvement, patience 2 stops the run there.
    task = ToyTask(scripted=scripted((0.5, 1.0), (0.7, 0.9), (0.7, 0.8), (0.7, 0.85), (0.6, 0.7), (0.9, 0.1)))
    events: list = []
    _, result = train(tmp_path, task, config(epochs=10, patience=2), events)
    evals = [e for e in events if isinstance(e, Evaluated)]
    assert [e.best for e in evals] == [True, True, True, False, False]
    assert (result.stopped_by, result.steps, result.best_step, result.best_epoch) == ("patience", 30, 18, 3)
    assert result.best == {"accuracy": 0.7, "loss": 0.8}
    (stopped,) = [e for e in events if isinstance(e, Stopped)]
    assert stopped.message == (
        "stopped early at step 30: valid accuracy has not improved in 2 evaluations (patience=2); "
        "the model is step 18's weights (epoch 3)"
    )
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in task.snapshots[2].items())  # the weights of evaluation 3
    assert not all(torch.equal(saved[k], v) for k, v in task.snapshots[4].items())


def test_loss_as_the_metric_lower_is_better(tmp_path):
    task = ToyTask(scripted=scripted((0.5, 1.0), (0.9, 1.2), (0.4, 0.6)))
    task.metric, task.higher_is_better = "loss", False
    _, result = train(tmp_path, task, config(epochs=3))
    assert result.best_step == 18 and result.best["loss"] == 0.6


def test_without_validation_the_last_weights_are_the_model(tmp_path):
    class NoValidation(ToyTask):
        def evaluate(self, model, device):
            return None

    model, result = train(tmp_path, NoValidation(), config(epochs=2))
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert result.best == {} and result.stopped_by == "epochs"
    assert (result.best_step, result.best_epoch) == (12, 2)  # the weights kept are the last step's


def test_keep_last_k_step_checkpoints(tmp_path):
    events: list = []
    model, _ = train(tmp_path, ToyTask(), config(keep_last=2, checkpoint_every=2, max_steps=7), events)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_6.safetensors", "step_7.safetensors"]
    assert [e.step for e in events if isinstance(e, Checkpointed)] == [2, 4, 6, 7]
    last = load_file(str(tmp_path / "checkpoints" / "step_7.safetensors"))
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())


def test_no_step_checkpoints_without_keep_last(tmp_path):
    train(tmp_path, ToyTask(), config(epochs=1))
    assert not (tmp_path / "checkpoints").exists()


def test_a_new_run_over_an_old_one_starts_clean(tmp_path):
    train(tmp_path, ToyTask(), config(keep_last=5, checkpoint_every=1, max_steps=9))
    train(tmp_path, ToyTask(), config(keep_last=5, checkpoint_every=4, max_steps=4))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_4.safetensors"]


# ---------------------------------------------------------------------------------------------------------------
# The non-finite guard


def test_a_non_finite_step_stops_the_run_and_keeps_the_last_saved_weights(tmp_path):
    task = ToyTask(nan_at_call=3)
    with pytest.raises(NonFiniteError, match=r"^step 3: non-finite loss"):
        train(tmp_path, task, config(checkpoint_every=2))
    saved = load_file(str(tmp_path / "model.safetensors"))  # written with the state at step 2
    assert all(torch.isfinite(t).all() for t in saved.values())


def test_skip_nonfinite_skips_the_step_and_goes_on(tmp_path):
    events: list = []
    model, result = train(tmp_path, ToyTask(nan_at_call=3), config(skip_nonfinite=True, epochs=1), events)
    (skipped,) = [e for e in events if isinstance(e, Skipped)]
    assert skipped.step == 3 and "non-finite loss" in skipped.message
    assert result.skipped == 1 and result.steps == 6
    assert [e.step for e in events if isinstance(e, Step)] == [1, 2, 4, 5, 6]
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---------------------------------------------------------------------------------------------------------------
# The schedule a budget sizes, and per-task keys


def test_a_step_budget_sizes_the_translators_schedule():
    the_plan, warnings = plan(TranslatorTrainConfig(max_steps=1200), steps_per_epoch=40, d_model=256)
    assert (the_plan.schedule, the_plan.warmup, the_plan.total_steps, warnings) == ("linear", 120, 1200, [])
    assert the_plan.lr(120) == pytest.approx(1e-3) and the_plan.lr(1200) == 0.0


def test_without_a_step_budget_the_translator_keeps_the_papers_schedule():
    the_plan, warnings = plan(TranslatorTrainConfig(), steps_per_epoch=40, d_model=512)
    assert (the_plan.schedule, the_plan.warmup, warnings) == ("noam", 4000, [])


@pytest.mark.parametrize(
    "cfg",
    [
        TranslatorTrainConfig(max_steps=1200, schedule="noam"),
        TranslatorTrainConfig(max_steps=1000, warmup_steps=1500),
        TranslatorTrainConfig(epochs=10),
    ],
)  # 10 x 40 steps: 4,000 warmup steps do not fit
def test_a_warmup_that_cannot_finish_inside_the_budget_is_warned_about(cfg):
    _, warnings = plan(cfg, steps_per_epoch=40, d_model=256)
    (message,) = warnings
    assert "warmup" in message and "cannot finish" in message


def test_a_warmup_that_cannot_finish_inside_max_minutes_is_warned_about(tmp_path, monkeypatch):
    from attnkit.training import loop

    clock = iter(range(0, 10**6, 100))  # one step every 100 s: 180 s fit 1.8 steps, not the 10 of the warmup
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    events: list = []
    _, result = train(tmp_path, ToyTask(), config(epochs=3, max_minutes=3, warmup_steps=10), events)
    warnings = [e.message for e in events if isinstance(e, Warned)]
    assert len(warnings) == 1 and "max_minutes=3" in warnings[0]
    assert result.stopped_by == "max_minutes"


def test_the_classifiers_defaults_warn_about_nothing():
    _, warnings = plan(ClassifierTrainConfig(), steps_per_epoch=1, d_model=128)
    assert warnings == []


@pytest.mark.parametrize(
    ("task", "key", "other"),
    [
        ("classify", "max_tokens", "translate"),
        ("classify", "valid_bleu", "translate"),
        ("translate", "batch_size", "classify"),
        ("translate", "layer_lr_decay", "classify"),
    ],
)
def test_a_key_of_another_task_is_refused_naming_the_key_and_the_task(task, key, other):
    with pytest.raises(InputError, match=f"'{key}' does not apply to {task} training .*{other}"):
        train_config_class(task, key)


@pytest.mark.parametrize("key", ["accum_steps", "max_minutes", "patience", "keep_last", "eval_every"])
def test_loop_keys_apply_to_both_tasks(key):
    for task in ("classify", "translate"):
        assert train_config_class(task, key)


def test_resume_settings_equal_to_the_saved_ones_pass_and_a_differing_one_is_named():
    from attnkit.config import ClassifierConfig, check_resume_settings

    saved = {"model": {"d_model": 16, "vocab_size": 40, "n_classes": 2}, "train": {"epochs": 2, "seed": 1, "lr": 0.001}}
    # vocab_size is an upper bound the tokenizer reached 40 of; n_classes=0 means one per label
    check_resume_settings(
        saved, {"epochs": 2, "d_model": "16", "lr": "1e-3", "vocab_size": "10000", "n_classes": "0"}, ClassifierConfig
    )
    with pytest.raises(InputError, match=r"seed=2 differs from the run's saved seed=1"):
        check_resume_settings(saved, {"seed": 2, "epochs": 2}, ClassifierConfig)
    with pytest.raises(InputError, match=r"d_model=32 differs from the run's saved d_model=16"):
        check_resume_settings(saved, {"d_model": "32"}, ClassifierConfig)


def test_a_resumed_run_may_be_given_a_larger_budget_never_a_smaller_one():
    from attnkit.config import ClassifierConfig, check_resume_settings

    saved = {"model": {}, "train": {"epochs": 2, "max_steps": 40, "max_minutes": 0.0, "seed": 1}}
    grown = check_resume_settings(saved, {"epochs": 3, "max_steps": "60", "seed": 1}, ClassifierConfig)
    assert grown == {"epochs": 3, "max_steps": 60}
    assert check_resume_settings(saved, {"max_steps": 0}, ClassifierConfig) == {"max_steps": 0}  # 0: no limit
    with pytest.raises(InputError, match=r"epochs=1 is a smaller budget than the run's saved epochs=2"):
        check_resume_settings(saved, {"epochs": 1}, ClassifierConfig)
    with pytest.raises(InputError, match=r"max_minutes=5.0 is a smaller budget than the run's saved max_minutes=0.0 "):
        check_resume_settings(saved, {"max_minutes": "5"}, ClassifierConfig)  # from no limit to one


def test_a_finished_run_resumed_with_a_larger_budget_continues_and_says_its_schedule_is_planned_again(tmp_path):
    cfg = config(epochs=50, max_steps=6, eval_every=2)
    assert train(tmp_path, ToyTask(), cfg)[1].steps == 6
    events: list = []
    train(tmp_path, ToyTask(), cfg, events, resume=True)
    (said,) = [e.message for e in events if isinstance(e, Warned)]
    assert said.startswith("the run had already used its budget (max_steps): nothing to train")
    assert not [e for e in events if isinstance(e, Step)]

    bigger = dataclasses.replace(cfg, max_steps=10)
    events = []
    _, result = train(tmp_path, ToyTask(), bigger, events, resume=True)
    steps = [e for e in events if isinstance(e, Step)]
    assert result.steps == 10 and [e.step for e in steps] == [7, 8, 9, 10]
    (said,) = [e.message for e in events if isinstance(e, Warned)]
    assert said.startswith("the budget changed from 6 to 10 steps: the learning-rate schedule (linear")
    expected, _ = plan(bigger, 6, ToyTask.d_model)  # 24 examples in batches of 4: 6 steps an epoch
    assert [e.lr for e in steps] == [expected.lr(s) for s in (7, 8, 9, 10)] and steps[0].lr > 0
