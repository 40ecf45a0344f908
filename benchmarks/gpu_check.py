"""The GPU check: everything about attnkit that needs a CUDA GPU, in one command, in under 10 minutes.

    python3 benchmarks/gpu_check.py OUT [--data DIR] [--parts tests train decode bible] [--bible-minutes 2]

Runs, each in a process of its own with a time cap, from the repository's root (``src/`` on the path: nothing is
installed; the machine needs torch, transformers, pytest and attnkit's own dependencies, which a stock PyTorch image
with ``transformers`` has):

    tests   the CUDA tests (tests/test_cuda.py, tests/bench/test_bench_gpu.py): training in fp32, bf16, fp16 on the
            GPU, CPU/GPU agreement, bit-exact resume, a step under torch.cuda.set_sync_debug_mode("error"), the
            compiled step against the eager one, every bench suite on the GPU                         (~3 min)
    train   ``attnkit bench train --device cuda``: attnkit, torch.nn and Hugging Face Marian, float32, TF32 and
            bfloat16, fixed shapes and token-budget batches                                           (~3 min)
    decode  ``attnkit bench decode --device cuda``                                                     (~1.5 min)
    bible   the README's Bible En-De recipe on the GPU (``--device cuda --set precision=bf16``), stopped after
            ``--bible-minutes`` of training (the 4,700 steps should take at most 3), then BLEU on John with beam 4
                                                                                                      (~2.5 min)

and writes to OUT (at most 8 files, what a lent machine returns): ``summary.txt`` (the table printed last),
``check.log`` (every part's output), ``tests.txt``, ``bench_train.json``, ``bench_decode.json``,
``bible_metrics.jsonl``, ``bible_eval.json``, ``gpu.txt`` (nvidia-smi and torch's view of the device).

The Bible data: the recipe's three split files, found under DIR/bible/en-de/ (``--data DIR``, a folder shaped like
attnkit's cache; default ``$ATTNKIT_CACHE`` or ``~/.cache/attnkit``). A machine without network cannot fetch them:
fetch them elsewhere (``attnkit data fetch bible --pair en-de``, 8 MB) and bring the folder along (docs/gpu.md);
without them the part is skipped with a note. ``--device cpu`` runs every part at its smallest on a CPU, to check
the script itself (tests/bench/test_benchmark_scripts.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("tests", "train", "decode", "bible")
CAPS_S = {"tests": 200, "train": 200, "decode": 100}  # each part's time cap; bible: its training cap + 60 s
RECIPE = (  # the README's Bible En-De recipe
    "--preset small --max-steps 4700 --set schedule=linear lr=1e-3 warmup_steps=300 checkpoint_every=250"
).split()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="folder for the figures and logs (created)")
    ap.add_argument("--data", type=Path, help="a folder holding bible/en-de/{train,valid,test}.tsv (attnkit's cache)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--bible-minutes", type=float, default=2.0, help="training time cap of the Bible recipe")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu: every part at its smallest")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    smoke = a.device == "cpu"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env["PYTHONUNBUFFERED"] = "1"
    log = open(a.out / "check.log", "w", encoding="utf-8")
    rows: list[str] = []

    def run(part: str, command: list[str], cap_s: float, stdout_to: Path | None = None) -> tuple[int, float]:
        """``command`` in a process of its own, its output appended to check.log (stdout to ``stdout_to``)."""
        log.write(f"\n=== {part}: {' '.join(command)}\n")
        log.flush()
        started = time.perf_counter()
        sink = open(stdout_to, "w", encoding="utf-8") if stdout_to else log
        try:
            code = subprocess.run(command, cwd=REPO, env=env, timeout=cap_s, stdout=sink, stderr=log).returncode
        except subprocess.TimeoutExpired:
            log.write(f"=== {part}: stopped at its cap of {cap_s:.0f} s\n")
            code = 124
        finally:
            if sink is not log:
                sink.close()
        log.flush()
        return code, time.perf_counter() - started

    python = sys.executable
    (a.out / "gpu.txt").write_text(_device_record(a.device), encoding="utf-8")
    if "tests" in a.parts:
        files = ["tests/test_cuda.py", "tests/bench/test_bench_gpu.py"]
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", *files]
        code, seconds = run("tests", command, CAPS_S["tests"], a.out / "tests.txt")
        last = (a.out / "tests.txt").read_text(encoding="utf-8").strip().splitlines()[-1:] or ["(no output)"]
        rows.append(f"tests     {'ok' if code == 0 else f'FAILED ({code})'}  {seconds:5.0f} s  {last[0]}")
    for suite in ("train", "decode"):
        if suite not in a.parts:
            continue
        out_json = a.out / f"bench_{suite}.json"
        command = [python, "-m", "attnkit", "bench", suite, "--device", a.device, "--json", str(out_json)]
        code, seconds = run(suite, command + (["--quick"] if smoke else []), CAPS_S[suite])
        rows.append(f"{suite:9s} {'ok' if code == 0 else f'FAILED ({code})'}  {seconds:5.0f} s")
        if code == 0 and suite == "train":
            rows += _train_table(json.loads(out_json.read_text(encoding="utf-8")))
    if "bible" in a.parts:
        rows += _bible(a, run, python, env, smoke)
    summary = "\n".join(rows) + "\n"
    (a.out / "summary.txt").write_text(summary, encoding="utf-8")
    log.close()
    print(summary, end="")
    return 0 if all(" FAILED" not in row for row in rows) else 1


def _bible(a: argparse.Namespace, run, python: str, env: dict[str, str], smoke: bool) -> list[str]:
    """The Bible recipe, capped in time, and its BLEU on John; rows for the summary."""
    cache = a.data or Path(os.environ.get("ATTNKIT_CACHE") or Path.home() / ".cache" / "attnkit")
    if not all((cache / "bible" / "en-de" / f"{split}.tsv").is_file() for split in ("train", "valid", "test")):
        return [
            f"bible     skipped: no {cache}/bible/en-de/{{train,valid,test}}.tsv (fetch them where there is a network:"
            " `attnkit data fetch bible --pair en-de`, and give their folder with --data; docs/gpu.md)"
        ]
    env["ATTNKIT_CACHE"] = str(cache.resolve())
    with tempfile.TemporaryDirectory() as work:
        run_dir = Path(work) / "bible-en-de"
        minutes = 0.05 if smoke else a.bible_minutes
        smallest = ["valid_bleu=false", "--max-steps", "2"] if smoke else []
        precision = "fp32" if smoke else "bf16"
        command = [
            python, "-m", "attnkit", "translate", "train", "--dataset", "bible", "--pair", "en-de", "--out",
            str(run_dir), "--quiet", "--device", a.device, *RECIPE, f"max_minutes={minutes}", f"precision={precision}",
            *smallest,
        ]  # fmt: skip
        code, seconds = run("bible", command, minutes * 60 + 120, Path(work) / "train.json")
        metrics = run_dir / "metrics.jsonl"
        if code != 0 or not metrics.is_file():
            return [f"bible     FAILED ({code}) after {seconds:.0f} s: see check.log"]
        (a.out / "bible_metrics.jsonl").write_bytes(metrics.read_bytes())
        trained = json.loads((Path(work) / "train.json").read_text(encoding="utf-8"))  # translate train's summary
        evaluate = [python, "-m", "attnkit", "translate", "eval", "--model", str(run_dir), "--dataset", "bible"]
        evaluate += ["--pair", "en-de", "--split", "test", "--beam", "1" if smoke else "4", "--device", a.device]
        eval_code, eval_seconds = run("bible eval", evaluate, 60 if smoke else 120, a.out / "bible_eval.json")
        scores = json.loads((a.out / "bible_eval.json").read_text(encoding="utf-8")) if eval_code == 0 else {}
    steps, trained_s = trained["steps"], trained["seconds"]
    rate = steps / max(trained_s, 1e-9)
    rows = [
        f"bible     {steps} steps in {trained_s:.0f} s of training ({seconds:.0f} s with the tokenizer and setup): "
        f"{rate:.1f} steps/s, 4,700 steps in ~{4700 / max(rate, 1e-9) / 60:.1f} min (goal: at most 3)"
    ]
    if eval_code != 0:
        return [*rows, f"bible     eval FAILED ({eval_code}): see check.log"]
    return [
        *rows,
        f"bible     John, beam {1 if smoke else 4}: BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} "
        f"({eval_seconds:.0f} s; the CPU run of the whole recipe: 22.6, the goal within 1.0 of it)",
    ]


def _train_table(document: dict) -> list[str]:
    """attnkit against Hugging Face Marian per row of the train suite: ms a step, the speed-up, attnkit's MFU."""
    results = document["results"]
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in results:
        if r["impl"] in ("attnkit", "transformers", "torch.nn"):
            key = (r["config"], r["seq_len"], r["dtype"], r.get("variant") or "fixed")
            by_key.setdefault(key, {})[r["impl"]] = r
    lines = ["          config len dtype     variant       attnkit ms  Marian ms  Marian/attnkit  attnkit MFU"]
    for (config, length, dtype, variant), impls in by_key.items():
        ours, marian = impls.get("attnkit"), impls.get("transformers")
        if ours is None:
            continue
        theirs = f"{marian['ms']:9.1f}  {marian['ms'] / ours['ms']:13.2f}x" if marian else f"{'-':>9s}  {'-':>14s}"
        mfu = f"{ours['mfu']:.1%}" if ours.get("mfu") is not None else "-"
        lines.append(
            f"          {config:6s} {length:3d} {dtype:9s} {variant:12s} {ours['ms']:10.1f}  {theirs}  {mfu:>11s}"
        )
    return lines


def _device_record(device: str) -> str:
    """nvidia-smi's view and torch's of the device the check runs on."""
    lines = []
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        lines.append(smi.stdout)
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append(f"nvidia-smi: {e}")
    import torch

    lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    if device != "cpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"{props.name}: compute {props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
