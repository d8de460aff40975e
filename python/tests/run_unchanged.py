"""Runs a training script that knows nothing of cgx twice under torchrun, with
``--backend gloo`` and with ``--backend cgx``, and checks what a user of it would:

- the script imports neither cgx_torch nor torch_cgx (checked in its source): the `cgx`
  backend comes from torch's entry points, and TORCH_DEVICE_BACKEND_AUTOLOAD is left as
  the user has it;
- both runs succeed, and the cgx run really went through cgx: every rank's backend
  reports compressed calls (CGX_TORCH_REPORT);
- the last value the script prints for --metric (e.g. "val loss") is within --tol of
  gloo's.

    python run_unchanged.py --nproc 4 --metric "val loss" --tol 0.05 -- gpt_train.py --device=cpu --backend={backend}

``{backend}`` in the script's arguments is replaced by gloo and cgx. Prints
"run_unchanged: OK" or "run_unchanged: FAILED ...".
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def last_metric(out, metric):
    """The last number printed after `metric` (e.g. "val loss 2.41"), or None."""
    vals = re.findall(re.escape(metric) + r"[ :=]+(-?[0-9.]+(?:e-?[0-9]+)?)", out)
    return float(vals[-1]) if vals else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--metric", required=True)
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--expect", action="append", default=[], help="a line the cgx run must print (regex)")
    ap.add_argument("script", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.script[1:] if a.script and a.script[0] == "--" else a.script
    src = open(cmd[0]).read()
    if re.search(r"^\s*(import|from)\s+(cgx_torch|torch_cgx|cgx_utils)\b", src, re.M):
        print(f"run_unchanged: FAILED {cmd[0]} imports cgx itself")
        return 1
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("gloo", "cgx"):
            env = dict(os.environ)
            report = os.path.join(tmp, f"report-{backend}")
            env["CGX_TORCH_REPORT"] = report
            args = [x.replace("{backend}", backend) for x in cmd]
            run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(a.nproc)]
            for attempt in range(3 if backend == "gloo" else 1):
                p = subprocess.run(run + args, env=env, capture_output=True, text=True, timeout=900)
                out = p.stdout + p.stderr
                print(f"---- {backend}: exit {p.returncode}\n" + "\n".join(out.splitlines()[-25:]))
                # torch 2.15's gloo can abort a script at exit when DDP's reference cycles
                # outlive the interpreter (docs/pytorch.md, "Ending a torchrun script"): the
                # baseline is run again then; the cgx run gets one try (cgx_torch's exit
                # handler collects those cycles first).
                if p.returncode == 0 or "terminate called without an active exception" not in out:
                    break
                print(f"run_unchanged: the {backend} baseline aborted at exit (torch's gloo exit bug): again")
            if p.returncode != 0:
                print(f"run_unchanged: FAILED the {backend} run exited with {p.returncode}")
                return 1
            lines = [json.loads(x) for f in glob.glob(report + ".*") for x in open(f)]
            results[backend] = (last_metric(out, a.metric), lines, out)
    (g, g_lines, _), (c, c_lines, c_out) = results["gloo"], results["cgx"]
    print(f"run_unchanged: {a.metric}: gloo {g}, cgx {c}; cgx backend reports: {c_lines}")
    problems = []
    if g_lines:
        problems.append("the gloo run went through cgx")
    if len([x for x in c_lines if x["compressed_calls"] > 0]) < a.nproc:
        problems.append(f"not every rank of the cgx run made compressed calls ({c_lines})")
    if g is None or c is None:
        problems.append(f"no '{a.metric}' printed")
    elif abs(c - g) > a.tol:
        problems.append(f"{a.metric} {c} is {c - g:+.4f} from gloo's {g} (tolerance {a.tol})")
    for e in a.expect:
        if not re.search(e, c_out):
            problems.append(f"the cgx run did not print /{e}/")
    if problems:
        print("run_unchanged: FAILED " + "; ".join(problems))
        return 1
    print("run_unchanged: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
