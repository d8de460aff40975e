#!/usr/bin/env python3
"""Checks the device code of cgx's hot CUDA kernels without a GPU (CTest: device_code).

hot_kernels.cu instantiates the compress and decode kernels of maxmin.cuh and small
probe kernels that each hold one function of wire_format.hpp's per-bucket arithmetic.
For every architecture and for default flags and --use_fast_math, this script

  1. compiles it to PTX with nvcc and checks what wire_format.hpp promises
     ("Exact arithmetic of the quantizer"): no approximate instruction, no product
     contracted into an fma, every product, quotient, sum and difference rounded on its
     own (.rn) and never flushed (.ftz); the exceptions, where neither a contraction
     nor a flush can change a result, are listed in check_ptx below;
  2. runs ptxas -v on that PTX and checks every kernel for spills and stack frames;
  3. where cuobjdump exists, reads the SASS of the cubin ptxas wrote and checks it for
     local memory (LDL/STL), .FTZ (default flags) and FFMA/DFMA/MUFU in the probes
     that have no division; without cuobjdump it says that this part was skipped.

Exit status 0: every check passed; 1: a check failed (each failure is printed).
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time

FLOAT_TYPES = (".f32", ".f64")
ZERO_IMMEDIATES = {"0f00000000", "0d0000000000000000"}
OFFSET_SCALE = "0f37800000"
# Spills measured when this check was written (CUDA 13.0's ptxas), kept as ceilings so
# that they cannot grow unseen: {(sm, mangled-name fragment): (stack, stores, loads)}.
# compress<2, 16384, stochastic, __half> spills on sm_90 only (70 registers on sm_80).
KNOWN_SPILLS = {
    ("90", "maxmin_compress_kernelILi2ELm16384ENS0_10stochasticE6__half"): (8, 8, 24),
}  # 2^-16: rounding_offsets<stochastic>::get, a 16-bit integer times it


# The largest kernel body allowed, in PTX instructions: the biggest hot kernel (bucket
# 16384, 8 positions per lane, fully unrolled on purpose) has about 8 k; a per-lane loop
# unrolled without bound for a bucket of 2^20 gives tens of thousands (issue 19 defect 5).
MAX_INSTRUCTIONS = 20000


def parse_entries(ptx):
    """{entry name: [(opcode, [operands], text)]} of every .entry of a PTX file."""
    entries = {}
    for m in re.finditer(r"^\.(?:visible |weak )?\.entry\s+(\S+?)\s*\(", ptx, re.M):
        start = ptx.index("{", m.end())
        end = ptx.find("\n}", start)
        body = []
        for line in ptx[start + 1:end].split("\n"):
            s = line.split("//")[0].strip()
            if not s or s.startswith((".", "$", "{", "}")) or s.endswith(":"):
                continue
            s = re.sub(r"^@!?%\w+\s+", "", s).rstrip(";").strip()
            parts = s.split(None, 1)
            ops = [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []
            body.append((parts[0], ops, s))
        entries[m.group(1)] = body
    return entries


def fp_type(opcode):
    for t in FLOAT_TYPES:
        if opcode.endswith(t):
            return t
    return None


def finiteness_registers(body):
    """Registers that only ever hold x - x or sums of such values (0 or NaN): the
    finiteness tests (is_finite, the load phase's NaN check). Flushing or contracting
    them cannot change what they say. Greatest fixpoint over every definition."""
    defs = {}
    for op, ops, _ in body:
        if ops and ops[0].startswith("%"):
            defs.setdefault(ops[0], []).append((op, ops))

    def shape_ok(op, ops, cand):
        base = op.split(".")[0]
        if not fp_type(op) or len(ops) < 2:
            return False
        if base == "sub" and len(ops) == 3:
            return ops[1] == ops[2] or all(o in cand or o in ZERO_IMMEDIATES for o in ops[1:])
        if base in ("add", "mov"):
            return all(o in cand or o in ZERO_IMMEDIATES for o in ops[1:])
        return False

    cand = {r for r, ds in defs.items() if all(shape_ok(op, ops, set(defs)) for op, ops in ds)}
    changed = True
    while changed:
        changed = False
        for r in list(cand):
            if not all(shape_ok(op, ops, cand) for op, ops in defs[r]):
                cand.discard(r)
                changed = True
    return cand, defs


def is_power_of_two_immediate(s):
    if re.fullmatch(r"0f[0-9A-Fa-f]{8}", s):
        bits = int(s[2:], 16)
        return bits & 0x7FFFFF == 0 and 0 < (bits >> 23) & 0xFF < 0xFF
    if re.fullmatch(r"0d[0-9A-Fa-f]{16}", s):
        bits = int(s[2:], 16)
        return bits & ((1 << 52) - 1) == 0 and 0 < (bits >> 52) & 0x7FF < 0x7FF
    return False


def allows_fma(entry):
    """decode_value_wide<double> is one explicit fma (wire_format.hpp): the double decode
    kernels and its probe."""
    return re.search(r"maxmin_decode_kernelI(?:L[^E]*E)+dE|probe_decode_wideIdE", entry) is not None


def check_ptx(entry, body, fast_math):
    """The rules of wire_format.hpp's "Exact arithmetic"; returns a list of violations."""
    bad = []
    fin, defs = finiteness_registers(body)

    def defined_by(reg, pred):
        return reg in defs and all(pred(op, ops) for op, ops in defs[reg])

    def is_offset(reg):  # h * 2^-16, h a 16-bit integer converted exactly
        return defined_by(reg, lambda op, ops: op.startswith("mul") and len(ops) == 3 and OFFSET_SCALE in ops[1:]
                          and all(o == OFFSET_SCALE or defined_by(o, lambda op2, _: op2.startswith("cvt.rn.f32.u"))
                                  for o in ops[1:]))

    for op, ops, text in body:
        parts = op.split(".")
        base = parts[0]
        t = fp_type(op)
        ftz = ".ftz" in op
        # Approximate instructions, anywhere: rcp/sqrt without .rn are .approx too.
        if ".approx" in op or ".full" in op or base in ("ex2", "lg2", "sin", "cos", "tanh", "rsqrt"):
            bad.append(f"approximate instruction: {text}")
            continue
        if not t:
            continue
        if ftz and not fast_math:
            bad.append(f"flushed to zero without -ftz=true: {text}")
            continue
        if base in ("fma", "mad"):
            if not (op == "fma.rn.f64" and allows_fma(entry)):
                bad.append(f"contracted product (only decode_value_wide<double> has an explicit fma): {text}")
            continue
        if base in ("mul", "div", "rcp", "sqrt"):
            rounded = "rn" in parts
            exact = base == "mul" and len(ops) == 3 and any(is_power_of_two_immediate(o) for o in ops[1:])
            if ftz and not (base == "mul" and is_offset(ops[0])):
                bad.append(f"flushed to zero: {text}")
            elif not rounded and not exact:
                bad.append(f"{base} without explicit rounding (contractible into an fma: use detail::mul_rn etc.): {text}")
            continue
        if base in ("add", "sub"):
            if ops and ops[0] in fin:
                continue  # a finiteness test: 0 or NaN whatever the flags
            if ftz:
                bad.append(f"flushed to zero: {text}")
            elif "rn" not in parts and not (base == "add" and len(ops) == 3 and ops[1] == ops[2]):
                bad.append(f"{base} without explicit rounding (contractible with a product: use detail::add_rn): {text}")
            continue
        if not ftz:
            continue
        if base == "setp" and len(ops) == 3 and ops[1] in fin and ops[2] in ZERO_IMMEDIATES:
            pass  # finiteness test against 0
        elif base == "min" and len(ops) == 3 and any(re.fullmatch(r"0f[0-9A-Fa-f]{8}", o)
                                                     and 0x3F800000 <= int(o[2:], 16) < 0x7F800000 for o in ops[1:]):
            pass  # encode_value's clamp to the top code L >= 1 (a finite positive immediate): v >= 0, a flushed v gives the same code
        elif base == "cvt" and re.match(r"cvt\.rzi\.ftz\.[su]32\.f32$", op):
            pass  # truncation to an integer code: a subnormal truncates to 0 flushed or not
        elif base == "cvt" and op == "cvt.ftz.f64.f32" and len(ops) == 2 and is_offset(ops[1]):
            pass  # the stochastic offset (0 or >= 2^-16) widened for encode_value_wide
        else:
            bad.append(f"flushed to zero: {text}")
    return bad


def run(cmd, log):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        raise SystemExit(f"device_code: command failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def ptxas_report(text):
    """{function: (registers, stack, spill stores, spill loads)} from ptxas -v."""
    out = {}
    cur = None
    for line in text.split("\n"):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            out[cur] = [None, int(m.group(1)), int(m.group(2)), int(m.group(3))]
            continue
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and cur in out:
            out[cur][0] = int(m.group(1))
    return out


def sass_functions(text):
    funcs = {}
    cur = None
    for line in text.split("\n"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            funcs[cur].append(line.strip())
    return funcs


def check_sass(funcs, fast_math, arch):
    bad = []
    for name, lines in funcs.items():
        hot = ("maxmin_" in name or "probe_" in name) and not any(
            sm == arch and frag in name for sm, frag in KNOWN_SPILLS)
        division_free = re.search(r"probe_(encode|decode)", name) is not None
        for l in lines:
            ins = re.sub(r"/\*[^*]*\*/", "", l).strip().rstrip(";")
            ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
            opc = ins.split()[0] if ins else ""
            if hot and re.match(r"(LDL|STL)\b", opc):
                bad.append(f"{name}: local memory: {ins}")
            if not fast_math and ".FTZ" in opc:
                bad.append(f"{name}: .FTZ with default flags: {ins}")
            if division_free and re.match(r"(FFMA|HFMA2|MUFU)\b", opc):
                bad.append(f"{name}: fused or approximate arithmetic: {ins}")
            if division_free and opc.startswith("DFMA") and not allows_fma(name):
                bad.append(f"{name}: fused arithmetic: {ins}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--ptxas", required=True)
    ap.add_argument("--cuobjdump", default="")
    ap.add_argument("--include", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--arch", nargs="+", default=["80", "90"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--expect-kernels", type=int, required=True, help="entries hot_kernels.cu instantiates")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    cuobjdump = a.cuobjdump if a.cuobjdump and shutil.which(a.cuobjdump) else shutil.which("cuobjdump")

    builds = [(arch, fm) for fm in (False, True) for arch in a.arch]

    def compile_one(b):
        arch, fm = b
        tag = f"sm{arch}{'_fastmath' if fm else ''}"
        ptx = os.path.join(a.work, tag + ".ptx")
        t0 = time.time()
        run([a.nvcc, "-std=c++20", "-I", a.include, "-ptx", f"-arch=compute_{arch}"] + (["--use_fast_math"] if fm else [])
            + [a.source, "-o", ptx], os.path.join(a.work, tag + ".nvcc.log"))
        t1 = time.time()
        cubin = os.path.join(a.work, tag + ".cubin")
        rep = run([a.ptxas, f"-arch=sm_{arch}", "-v", ptx, "-o", cubin], os.path.join(a.work, tag + ".ptxas.log"))
        return tag, ptx, cubin, rep, t1 - t0, time.time() - t1

    t_start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = list(pool.map(compile_one, builds))

    failures = []
    for (arch, fm), (tag, ptx, cubin, rep, t_nvcc, t_ptxas) in zip(builds, results):
        with open(ptx) as f:
            entries = parse_entries(f.read())
        print(f"== {tag}: nvcc -ptx {t_nvcc:.1f} s, ptxas {t_ptxas:.1f} s, {len(entries)} entries")
        ours = {e: b for e, b in entries.items() if "maxmin_" in e or "probe_" in e}
        if len(ours) < a.expect_kernels:
            failures.append(f"{tag}: {len(ours)} kernels in the PTX, expected at least {a.expect_kernels}")
        for e, body in sorted(ours.items()):
            if len(body) > MAX_INSTRUCTIONS:
                failures.append(f"{tag}: {e}: {len(body)} PTX instructions, more than {MAX_INSTRUCTIONS} "
                                "(a loop unrolled without bound? CGX_UNROLL in config.hpp)")
            n_fp = sum(1 for op, _, _ in body if fp_type(op))
            if n_fp == 0:
                failures.append(f"{tag}: {e}: no floating-point instruction found (parse error?)")
            for v in check_ptx(e, body, fm):
                failures.append(f"{tag}: {e}: {v}")
        stats = ptxas_report(rep)
        for e in sorted(ours):
            s = stats.get(e)
            if s is None:
                failures.append(f"{tag}: {e}: no ptxas -v report")
                continue
            regs, stack, st, ld = s
            print(f"   {regs:3d} registers, {stack} B stack, {st}/{ld} B spill stores/loads  {e}")
            known = next((v for (sm, frag), v in KNOWN_SPILLS.items() if sm == arch and frag in e), None)
            if known:
                if stack > known[0] or st > known[1] or ld > known[2]:
                    failures.append(f"{tag}: {e}: spills grew: {stack} B stack, {st}/{ld} B stores/loads, "
                                    f"known {known[0]} B stack, {known[1]}/{known[2]} B")
                elif not (stack or st or ld):
                    print(f"   note: {e} no longer spills on sm_{arch}: remove it from KNOWN_SPILLS")
                else:
                    print(f"   known spill (KNOWN_SPILLS), within its ceiling: {e}")
                continue
            if st or ld:
                failures.append(f"{tag}: {e}: spills ({st} bytes stores, {ld} bytes loads)")
            if stack:
                failures.append(f"{tag}: {e}: {stack} bytes stack frame (local memory)")
        if cuobjdump:
            sass = run([cuobjdump, "-sass", cubin], os.path.join(a.work, tag + ".sass"))
            funcs = sass_functions(sass)
            if not any("maxmin_" in f for f in funcs):
                failures.append(f"{tag}: no kernel found in the SASS of cuobjdump")
            for v in check_sass(funcs, fm, arch):
                failures.append(f"{tag}: SASS: {v}")
            print(f"   SASS ({cuobjdump}): {len(funcs)} functions checked")
    if not cuobjdump:
        print("device_code: SASS part SKIPPED: no cuobjdump on this machine (the toolkit here has only nvcc and "
              "ptxas); the PTX rules and ptxas's spill and stack counts above were checked.")
    print(f"device_code: {time.time() - t_start:.1f} s")
    for f in failures:
        print("FAIL:", f)
    if failures:
        print(f"device_code: {len(failures)} failures")
        return 1
    print("device_code: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
