"""`make bench`: what memsweep costs, measured side by side in one run; appended to benchmarks/RESULTS.md.

1. Framework overhead: the same default training through `python train.py`, a hand-written loop
   (plain_loop.py) and stock Trainer (plain_trainer.py), fp32 and bf16, per step and start-up; and what
   memsweep adds to a step, counted in one run (own_cost.py).
2. Sweep efficiency: a 6-job `-m` sweep in one process against the same 6 jobs as separate processes.
3. Hardware efficiency: training FLOP/s against a matmul timed in the same process (hw_efficiency.py).
4. `python train.py --help` and `--cfg job` response times.

Method of each section: docs/guide/benchmarks.md.
"""
import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "src"))  # this checkout's memsweep, whatever the venv has installed
ARMS = ("memsweep", "plain_loop", "plain_trainer")
SWEEP_GRID = ("precision=fp32,bf16", "optim=adamw,adafactor,sgd")
TARGETS = {"plain_loop": 1.03, "plain_trainer": 1.01, "sweep": 0.8, "cli_s": 3.0}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=25, help="optimizer steps per overhead run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm per dtype (alternating order)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--sweep-steps", type=int, default=10, help="optimizer steps of each sweep job")
    p.add_argument("--sweep-repeats", type=int, default=1)
    p.add_argument("--hw-steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads in every arm; 0 = torch's default")
    p.add_argument("--sections", default="overhead,account,sweep,hw,cli")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"))
    p.add_argument("--work", default=None, help="scratch dir (default: a new temp dir)")
    p.add_argument("--dry-results", action="store_true", help="print the section instead of appending it")
    return p.parse_args()


def env() -> dict[str, str]:
    e = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_SILENT="true",
             HF_HUB_DISABLE_TELEMETRY="1")
    e.setdefault("WANDB_MODE", "offline")
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(HERE)]
                                      + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    return e


def run(cmd: list[str], log: Path, cwd: Path = ROOT) -> float:
    """Run to completion, output to `log`; returns wall seconds. Raises with the log's tail on failure."""
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=cwd, env=env(), stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}; log {log}:\n{tail}")
    return wall


def export_data(work: Path) -> tuple[Path, str, dict]:
    """The default job's train subset as JSONL (text, label), the model folder, and the default config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from memsweep.config.schema import register_configs
    from memsweep.run import data, model

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config"))
    train, _, names = data.load_frames(cfg.data, cfg.seed)
    path = work / "train.jsonl"
    rows = train.assign(label=[names.index(x) for x in train["label"]])[["text", "label"]]
    rows.to_json(path, orient="records", lines=True, force_ascii=False)
    defaults = {"batch_size": cfg.batch_size, "max_seq_len": cfg.max_seq_len, "seed": cfg.seed, "lr": cfg.lr,
                "train_examples": len(train)}
    return path, model.embedded_minilm_path(), defaults


def memsweep_arm(dtype: str, args, out: Path) -> dict:
    cmd = [PY, "train.py", f"precision={dtype}", f"max_steps={args.steps}", "dataloader.group_by_length=false",
           f"hydra.run.dir={out}"] + ([f"threads={args.threads}"] if args.threads else [])
    run(cmd, out.with_suffix(".log"))
    res = json.loads((out / "results.json").read_text())
    if res["status"] != "ok":
        raise RuntimeError(f"memsweep run {out} ended {res['status']}: {res['reason']}")
    t = res["time"]
    return {"arm": "memsweep", "dtype": dtype, "step_s_median": t["step_s_median"], "steps_timed": t["steps_timed"],
            "startup_s": t["startup_s"], "optimizer_steps": t["optimizer_steps"],
            "train_tokens_seen": res["data"]["train_tokens_seen"]}


def plain_arm(arm: str, dtype: str, args, data_csv: Path, model_dir: str, out: Path) -> dict:
    cmd = [PY, str(HERE / f"{arm}.py"), "--data", str(data_csv), "--model", model_dir, "--dtype", dtype,
           "--steps", str(args.steps), "--warmup", "2", "--threads", str(args.threads), "--out", str(out)]
    run(cmd, out.with_suffix(".log"))
    return json.loads(out.read_text())


def overhead(args, work: Path, data_csv: Path, model_dir: str) -> list[dict]:
    runs = []
    for r in range(args.repeats):
        for dtype in args.dtypes.split(","):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                out = work / f"overhead_{dtype}_{arm}_{r}"
                print(f"[bench] overhead {dtype} {arm} run {r + 1}/{args.repeats}", flush=True)
                rec = memsweep_arm(dtype, args, out) if arm == "memsweep" else \
                    plain_arm(arm, dtype, args, data_csv, model_dir, out.with_suffix(".json"))
                rec["repeat"] = r
                runs.append(rec)
                print(f"[bench]   step {rec['step_s_median']:.4f} s, start-up {rec['startup_s']:.1f} s", flush=True)
    return runs


def account(args, work: Path) -> list[dict]:
    """own_cost.py per dtype: memsweep's own code and the W&B writer, counted inside the default job."""
    out = []
    for dtype in args.dtypes.split(","):
        print(f"[bench] what memsweep adds to a step ({dtype}): cProfile of its own code, W&B writer CPU", flush=True)
        path = work / f"own_cost_{dtype}.json"
        run([PY, str(HERE / "own_cost.py"), "--steps", str(args.steps), "--threads", str(args.threads),
             "--override", f"precision={dtype}", "--out", str(path)], work / f"own_cost_{dtype}.log")
        out.append({"dtype": dtype, **json.loads(path.read_text())})
    return out


def sweep(args, work: Path) -> list[dict]:
    from itertools import product

    common = [f"max_steps={args.sweep_steps}"] + ([f"threads={args.threads}"] if args.threads else [])
    grid = [dict(kv) for kv in product(*[[(g.split("=")[0], v) for v in g.split("=")[1].split(",")]
                                         for g in SWEEP_GRID])]
    walls = []
    for r in range(args.sweep_repeats):
        for how in (("multirun", "separate") if r % 2 == 0 else ("separate", "multirun")):
            base = work / f"sweep_{how}_{r}"
            print(f"[bench] sweep: {len(grid)} jobs, {how}, run {r + 1}/{args.sweep_repeats}", flush=True)
            if how == "multirun":
                wall = run([PY, "train.py", "-m", *SWEEP_GRID, *common, f"hydra.sweep.dir={base}"],
                           work / f"sweep_{how}_{r}.log")
                dirs = sorted(p for p in base.iterdir() if (p / "results.json").exists())
            else:
                wall, dirs = 0.0, []
                for i, job in enumerate(grid):
                    d = base / str(i)
                    wall += run([PY, "train.py", *[f"{k}={v}" for k, v in job.items()], *common,
                                 f"hydra.run.dir={d}"], work / f"sweep_{how}_{r}_{i}.log")
                    dirs.append(d)
            results = [json.loads((d / "results.json").read_text()) for d in dirs]
            bad = [(str(d), x["status"]) for d, x in zip(dirs, results) if x["status"] != "ok"]
            if len(results) != len(grid) or bad:
                raise RuntimeError(f"sweep arm {how}: {len(results)} results, not ok: {bad}")
            walls.append({"how": how, "repeat": r, "wall_s": wall, "jobs": len(results),
                          "train_s_sum": sum(x["time"]["train_s"] for x in results)})
            print(f"[bench]   {wall:.1f} s wall", flush=True)
    return walls


def hardware(args, work: Path, model_dir: str) -> dict:
    print("[bench] hardware efficiency (FLOP count, matmul ceiling, profile if needed)", flush=True)
    out = work / "hw.json"
    run([PY, str(HERE / "hw_efficiency.py"), "--model", model_dir, "--dtypes", args.dtypes,
         "--steps", str(args.hw_steps), "--threads", str(args.threads), "--out", str(out)], work / "hw.log")
    return json.loads(out.read_text())


def cli_times(work: Path, repeats: int = 3) -> dict[str, float]:
    print("[bench] train.py --help / --cfg job", flush=True)
    return {flag: statistics.median(run([PY, "train.py", *flag.split()], work / "cli.log") for _ in range(repeats))
            for flag in ("--help", "--cfg job")}


def machine() -> dict:
    import torch

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}


def _med(runs, arm, dtype, key):
    values = [r[key] for r in runs if r["arm"] == arm and r["dtype"] == dtype and r[key] is not None]
    return statistics.median(values) if values else None


def _paired(runs, base, dtype) -> list[float]:
    """memsweep's step time over the baseline's, repeat by repeat."""
    step = {(r["arm"], r["repeat"]): r["step_s_median"] for r in runs if r["dtype"] == dtype}
    return [step["memsweep", k] / step[base, k] for a, k in step if a == "memsweep" and (base, k) in step]


def _verdict(ratio, target, below=True) -> str:
    ok = ratio <= target if below else ratio >= target
    return f"target <= {target}: {'met' if ok else 'NOT met'}"


def report(args, info, defaults, load_start, load_end, over, own, sweeps, hw, cli, started) -> str:
    cmd = "make bench" + (f" BENCH_ARGS=\"{' '.join(sys.argv[1:])}\"" if sys.argv[1:] else "")
    threads = args.threads or "torch default"
    lines = [f"## {started:%Y-%m-%d %H:%M} UTC: {info['cpu']}, {info['cores']} cores, torch {info['torch']}",
             "", f"- command: `{cmd}`",
             f"- load average (1 min) at start / end: {load_start:.2f} / {load_end:.2f} "
             "(another busy process on these 2 cores slows every arm several times: compare only quiet runs)",
             f"- threads: {threads}; python {info['python']}; total bench time "
             f"{(dt.datetime.now(dt.UTC) - started).total_seconds() / 60:.1f} min", ""]
    if over:
        lines += [f"### Framework overhead ({args.steps} optimizer steps per run, {args.repeats} runs per arm, "
                  "arms alternating)", "",
                  f"Every arm: embedded MiniLM, the default train subset ({defaults['train_examples']} tweets, "
                  f"exported once to JSONL for the baselines), batch {defaults['batch_size']}, max_seq_len "
                  f"{defaults['max_seq_len']}, seed {defaults['seed']}, fused AdamW lr {defaults['lr']}, linear decay, "
                  "clipping 1.0, batches in the same seeded random order padded to their longest sequence. memsweep "
                  "runs with `dataloader.group_by_length=false` (its default length buckets would give it "
                  "different, shorter batches) and otherwise its defaults (W&B offline, memory ledger on step 2, "
                  "tokens counted, eval after training). Step time = interval between consecutive optimizer-step "
                  "ends, median of steps 3..N (step 1 warm-up; step 2 is memsweep's ledger step, padded to "
                  "max_seq_len and traced, and is left out in every arm). Start-up = process start to the first "
                  "step. Values: median over runs of each run's median.", "",
                  "| dtype | arm | s/step | start-up s | runs | tokens trained (all runs) |",
                  "|---|---|---|---|---|---|"]
        dtypes = args.dtypes.split(",")
        for dtype in dtypes:
            for arm in ARMS:
                tokens = sorted({r["train_tokens_seen"] for r in over if r["arm"] == arm and r["dtype"] == dtype})
                lines.append(f"| {dtype} | {arm} | {_med(over, arm, dtype, 'step_s_median'):.4f} | "
                             f"{_med(over, arm, dtype, 'startup_s'):.1f} | "
                             f"{sum(1 for r in over if r['arm'] == arm and r['dtype'] == dtype)} | "
                             f"{', '.join(map(str, tokens))} |")
        same = len({r["train_tokens_seen"] for r in over}) == 1
        lines += ["", "Same examples in every arm (non-padding tokens trained are equal): "
                  + ("yes" if same else "NO: the arms did not train on the same batches"), ""]
        for dtype in dtypes:
            for base, label in (("plain_loop", "plain loop"), ("plain_trainer", "plain Trainer")):
                ratio = _med(over, "memsweep", dtype, "step_s_median") / _med(over, base, dtype, "step_s_median")
                lines.append(f"overhead vs {label} ({dtype}): {ratio:.2f}x  ({_verdict(ratio, TARGETS[base])})")
        lines += ["", "Paired by repeat (memsweep's run over the baseline's run of the same repeat, minutes apart, so "
                  "a slow spell of the machine hits both): median of the per-repeat ratios and their range. When "
                  "the range straddles the target, the run cannot tell the overhead from the machine's noise.", ""]
        for dtype in dtypes:
            for base, label in (("plain_loop", "plain loop"), ("plain_trainer", "plain Trainer")):
                paired = _paired(over, base, dtype)
                lines.append(f"paired overhead vs {label} ({dtype}): {statistics.median(paired):.3f}x, range "
                             f"{min(paired):.3f}-{max(paired):.3f} over {len(paired)} repeats")
        for dtype in dtypes:
            for base, label in (("plain_loop", "plain loop"), ("plain_trainer", "plain Trainer")):
                ratio = _med(over, "memsweep", dtype, "startup_s") / _med(over, base, dtype, "startup_s")
                lines.append(f"start-up vs {label} ({dtype}): {ratio:.2f}x")
        lines.append("")
    if own:
        lines += [f"### What memsweep adds to a step, counted in one run ({args.steps} optimizer steps, "
                  "default job)", "",
                  "The ratios above compare processes run minutes apart, and two identical runs on this machine "
                  "can differ by more than the targets. This counts what a memsweep step runs that a stock Trainer "
                  "step does not (benchmarks/own_cost.py), over the steps after the memory-ledger step: the self "
                  "time of every function in src/memsweep under cProfile (an upper bound: cProfile slows Python "
                  "calls), and the CPU time of the W&B writer process. Tracker calls: calls into torch's memory "
                  "and module trackers after the ledger step (hooks left installed would call them every step).",
                  "", "| dtype | s/step (profiled) | memsweep code ms/step | share of step | W&B writer CPU s | "
                  "share of the machine | tracker calls after the ledger step |", "|---|---|---|---|---|---|---|"]
        for r in own:
            lines.append(f"| {r['dtype']} | {r['step_s']:.4f} | {1e3 * r['own_s_per_step']:.3f} | "
                         f"{100 * r['own_share']:.3f} % | {r['wandb_cpu_s']:.2f} | "
                         f"{100 * r['wandb_cpu_share_of_machine']:.2f} % | {sum(r['tracker_calls'].values())} |")
        lines.append("")
        for r in own:
            added = r["own_share"] + r["wandb_cpu_share_of_machine"]
            lines.append(f"counted memsweep work per step ({r['dtype']}): {100 * added:.2f} % "
                         f"(own code {100 * r['own_share']:.3f} %, "
                         f"W&B writer {100 * r['wandb_cpu_share_of_machine']:.2f} %)")
        lines.append("")
    if sweeps:
        multi = statistics.median(w["wall_s"] for w in sweeps if w["how"] == "multirun")
        sep = statistics.median(w["wall_s"] for w in sweeps if w["how"] == "separate")
        train_m = statistics.median(w["train_s_sum"] for w in sweeps if w["how"] == "multirun")
        train_s = statistics.median(w["train_s_sum"] for w in sweeps if w["how"] == "separate")
        ratio = multi / sep
        lines += [f"### Sweep efficiency ({' '.join(SWEEP_GRID)}, max_steps={args.sweep_steps}, "
                  f"{args.sweep_repeats} run(s) each)", "",
                  f"One `python train.py -m` (Hydra basic launcher: imports, tokenised data and the model files "
                  f"shared in one process; sweep report at the end) took {multi:.1f} s; the same 6 jobs as "
                  f"separate `python train.py` processes took {sep:.1f} s. Training time inside the jobs: "
                  f"{train_m:.1f} s vs {train_s:.1f} s.", "",
                  f"sweep wall-clock vs 6 separate runs: {ratio:.2f}x  ({_verdict(ratio, TARGETS['sweep'])})", ""]
    if hw:
        lines += [f"### Hardware efficiency (fixed batch 32 x 64 tokens, {hw['threads']} threads)", "",
                  "Training FLOP/s = FLOPs of one step (FlopCounterMode; attention added analytically when the "
                  "fused CPU SDPA kernel hides it) / median step time of a hand-written step; ceiling = a "
                  "2048^3 `torch.mm` in the same dtype timed in the same process.", "",
                  "| dtype | GFLOP/step | s/step | training GFLOP/s | matmul ceiling GFLOP/s |",
                  "|---|---|---|---|---|"]
        for r in hw["results"]:
            lines.append(f"| {r['dtype']} | {r['flops_per_step'] / 1e9:.1f} | {r['step_s_median']:.3f} | "
                         f"{r['train_flops_per_s'] / 1e9:.1f} | {r['mm_ceiling_flops_per_s'] / 1e9:.0f} |")
        lines.append("")
        for r in hw["results"]:
            lines.append(f"training FLOP/s vs matmul ceiling ({r['dtype']}): {r['efficiency']:.2f}x")
        lines.append("")
        for r in hw["results"]:
            if r.get("analysis_md"):
                lines += ["#### Where fp32 time goes (torch.profiler)", "", r["analysis_md"], ""]
    if cli:
        lines += ["### Command-line response (median of 3)", ""]
        for flag, secs in cli.items():
            lines.append(f"`python train.py {flag}`: {secs:.2f} s  ({_verdict(secs, TARGETS['cli_s'])})")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    started = dt.datetime.now(dt.UTC)
    work = Path(args.work or tempfile.mkdtemp(prefix="memsweep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(","))
    load_start = os.getloadavg()[0]
    info = machine()
    print(f"[bench] {info}; scratch dir {work}", flush=True)
    data_csv, model_dir, defaults = export_data(work)
    over = overhead(args, work, data_csv, model_dir) if "overhead" in sections else []
    own = account(args, work) if "account" in sections else []
    sweeps = sweep(args, work) if "sweep" in sections else []
    hw = hardware(args, work, model_dir) if "hw" in sections else None
    cli = cli_times(work) if "cli" in sections else None
    (work / "raw.json").write_text(json.dumps({"overhead": over, "account": own, "sweep": sweeps, "hw": hw, "cli": cli},
                                              indent=2))
    text = report(args, info, defaults, load_start, os.getloadavg()[0], over, own, sweeps, hw, cli, started)
    print("\n" + text)
    if not args.dry_results:
        results = Path(args.results)
        if not results.exists():
            results.write_text("# Benchmark results\n\n"
                               "Appended by `make bench` (benchmarks/bench.py); newest last.\n\n")
        with open(results, "a") as f:
            f.write(text)
        print(f"[bench] appended to {results}; raw numbers in {work / 'raw.json'}")


if __name__ == "__main__":
    main()
