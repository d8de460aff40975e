#!/usr/bin/env python3
"""Checks the device code of cgx's hot CUDA kernels without a GPU (CTest: device_code).

hot_kernels.cu instantiates the compress and decode kernels of maxmin.cuh (every width
1..8; float, __half, __nv_bfloat16, double), device<none>'s add kernel, and small probe
kernels that each hold one function of wire_format.hpp's per-bucket arithmetic. For
every architecture and for default flags and --use_fast_math, this script

  1. compiles it to PTX with nvcc and checks what wire_format.hpp promises
     ("Exact arithmetic of the quantizer"): no approximate instruction, no product
     contracted into an fma, every product, quotient, sum and difference rounded on its
     own (.rn) and never flushed (.ftz); the exceptions, where neither a contraction
     nor a flush can change a result, are listed in check_ptx below (rule "ptx");
  2. runs ptxas -v on that PTX and checks every kernel for spills and stack frames
     ("spill") and its registers against REGISTER_CAPS ("registers");
  3. with cuobjdump (scripts/sass-tools fetches it), reads the SASS of the cubin ptxas
     wrote: rules "ffma", "ftz", "mufu-rcp", "mufu", "local" (check_sass_function).
     Without cuobjdump this part is skipped and says so, or fails with --require-sass.

--mutant-build and --mutant-check RULE show that each rule can fail: the mutant is
hot_kernels.cu -DCGX_DC_MUTANT (a few hot kernels and a kernel with a local array)
compiled for one architecture with --use_fast_math against a copy of the headers whose
rn() lost its exact device branch (MUTATION); --mutant-check RULE succeeds only when RULE
reports it ("registers" with every cap lowered to MUTANT_REGISTER_CAP).

Exit status 0: every check passed; 1: a check failed (each failure is printed, with its
rule in brackets).
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


# ---- SASS (cuobjdump -sass of the cubin ptxas wrote) -----------------------------------

# Register ceilings, {family: cap}, checked against ptxas -v's count (the cubin's) for every
# architecture and both flag sets. Measured with CUDA 13.0's ptxas when they were set
# (highest kernel of the family, sm_80 / sm_90): compress 79 / 78 (maxmin<8, 16384,
# stochastic> float); decode 40 / 42 (double: bits 4 / bits 5); add 14 / 14; probes 30 / 30
# (bucket_params<4, double>). A cap is the highest count plus about 10% (2 for add): a
# change that makes a hot kernel hungrier (fewer resident warps) fails here and must raise
# the cap on purpose. __launch_bounds__ also bounds each kernel (65536 / its threads).
REGISTER_CAPS = {"compress": 88, "decode": 48, "add": 16, "probe": 36}


def register_family(name):
    for fam, pat in (("compress", "maxmin_compress_kernel"), ("decode", "maxmin_decode_kernel"),
                     ("add", "add_kernel"), ("probe", "probe_")):
        if pat in name:
            return fam
    return None


def sass_functions(text):
    """{function: [(address, instruction without predicate)]} of cuobjdump -sass."""
    funcs = {}
    cur = None
    for line in text.split("\n"):
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if cur and m:
            ins = re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())
            funcs[cur].append((int(m.group(1), 16), re.sub(r"\.reuse", "", ins)))
    return funcs


def sass_operands(ins):
    parts = ins.split(None, 1)
    return parts[0], [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []


def hot_function(name):
    return "maxmin_" in name or "probe_" in name or "add_kernel" in name


def check_sass_function(name, ins, fast_math, known_spill=False):
    """Violations [(rule, text)] of one function's SASS.

    The code after the first CALL target is the slow path of the IEEE divisions (ptxas's
    The slow paths of the IEEE divisions (ptxas's subroutines, called after the division's
    FCHK (fp32) or MUFU.RCP64H and DFMA refinement (fp64), correctly rounded by
    construction, with .FTZ and FFMA of their own) are exempt; every other instruction,
    other subroutines included (sm_80's divergent-shuffle helpers), is checked:
      ffma      an FFMA/HFMA2 (or a DFMA outside decode_value_wide<double>) that fuses a
                product with an addition, outside the refinement of an IEEE division (the
                instructions from its MUFU.RCP to its branch); a*b+0, 0*k+c and a*1+c are
                single roundings, not contractions, and pass;
      ftz       with default flags: any .FTZ. With --use_fast_math: a .FTZ other than the
                harmless ones the PTX check admits (x - x and sums of such, tests of them
                and of |x| against +INF, the clamp FMNMX, the truncating F2I, the offset's
                product by 2^-16 and its widening);
      mufu-rcp  a MUFU.RCP with no FCHK of the same divisor (an approximate fp32 reciprocal
                or division), a MUFU.RCP64H with no DFMA refinement after it;
      mufu      any other MUFU (EX2, LG2, RSQ, SQRT, SIN, COS, TANH: approximations);
      local     LDL/STL (local memory: spills or a stack array), anywhere in the function.
    """
    bad = []
    # Subroutines (CALL targets; sm_80's predicated call of the kernel's own EXIT is none):
    # the slow path of an IEEE division, called after its FCHK (fp32) or MUFU.RCP64H and
    # DFMA refinement (fp64), is exempt; any other (sm_80's divergent-shuffle helpers) is
    # checked as the kernel's own code.
    at = {a: i for a, i in ins}
    order = [a for a, _ in ins]
    exempt = set()
    for k, (a, i) in enumerate(ins):
        m = re.match(r"CALL\.REL(?:\.NOINC)?\s+(0x[0-9a-f]+)", i)
        if not m or at.get(int(m.group(1), 16), "").startswith("EXIT"):
            continue
        if any(j.startswith(("FCHK", "MUFU.RCP64H", "DFMA")) for _, j in ins[max(0, k - 24):k]):
            t = order.index(int(m.group(1), 16)) if int(m.group(1), 16) in at else len(ins)
            while t < len(ins) and not ins[t][1].startswith("RET"):
                exempt.add(ins[t][0])
                t += 1
    main = [(a, i) for a, i in ins if a not in exempt]
    for a, i in ins:
        if re.match(r"(LDL|STL)\b", i) and not known_spill:
            bad.append(("local", f"local memory at {a:#x}: {i}"))
    # Division windows: from each MUFU.RCP/RCP64H to the next branch or call (<= 24 instructions).
    in_div = [False] * len(main)
    for k, (a, i) in enumerate(main):
        op, ops = sass_operands(i)
        if op == "MUFU.RCP":
            div = ops[1] if len(ops) > 1 else None
            near = main[max(0, k - 4):k + 8]
            if not any(sass_operands(j)[0] == "FCHK" and len(sass_operands(j)[1]) > 2 and sass_operands(j)[1][2] == div
                       for _, j in near):
                bad.append(("mufu-rcp", f"approximate reciprocal (no FCHK of {div}: not an IEEE division) at {a:#x}: {i}"))
                continue
        elif op == "MUFU.RCP64H":
            if sum(1 for _, j in main[k + 1:k + 16] if j.startswith("DFMA")) < 3:
                bad.append(("mufu-rcp", f"approximate fp64 reciprocal (no DFMA refinement) at {a:#x}: {i}"))
                continue
        elif op.startswith("MUFU"):
            bad.append(("mufu", f"approximate function at {a:#x}: {i}"))
            continue
        else:
            continue
        for j in range(max(0, k - 4), min(len(main), k + 24)):
            if j > k and re.match(r"(BRA|CALL|EXIT|RET)\b", main[j][1]):
                break
            in_div[j] = True
    fin = set()  # registers whose latest definition is x - x, or a sum of such (0 or NaN)
    for k, (a, i) in enumerate(main):
        op, ops = sass_operands(i)
        base = op.split(".")[0]
        if base in ("FFMA", "HFMA2", "DFMA") and len(ops) >= 4 and not in_div[k]:
            src = [o.lstrip("-|").rstrip("|") for o in ops[1:4]]
            trivial = (src[2] == "RZ" or "RZ" in src[:2] or any(s in ("1", "-1", "1.0") for s in src[:2])
                       or (base == "HFMA2" and src[0] == "RZ" and src[1] == "RZ"))
            explicit = base == "DFMA" and allows_fma(name)
            if not trivial and not explicit:
                bad.append(("ffma", f"contracted product (fused multiply-add) at {a:#x}: {i}"))
        if ".FTZ" in op:
            ok = False
            if fast_math:
                regs = [o.lstrip("-|").rstrip("|") for o in ops[1:]]
                if base == "FADD" and len(ops) == 3:
                    ok = (regs[0] == regs[1] and ops[2].startswith("-") != ops[1].startswith("-")) or \
                         all(r in fin or r == "RZ" for r in regs)
                elif base == "FMUL":
                    ok = len(ops) == 3 and ops[2] == "1.52587890625e-05"  # the offset h * 2^-16
                elif base == "FSETP":
                    ok = any(r in fin for r in regs) or "+INF" in ops
                elif base in ("FMNMX", "F2I"):
                    ok = True  # the clamp to the top code; the truncation to the code
                elif base == "F2F":
                    ok = ".F64.F32" in op  # the offset widened for encode_value_wide
            if not ok:
                bad.append(("ftz", f"flushed to zero ({'--use_fast_math' if fast_math else 'default flags'}) at {a:#x}: {i}"))
        if op == "CS2R" and len(ops) == 2 and ops[1] == "SRZ":  # a register pair set to 0
            fin.update({ops[0], f"R{int(ops[0][1:]) + 1}"})
        elif base == "SHFL" and len(ops) >= 3:  # SHFL.BFLY PT, Rd, Rsrc, ...: a lane's copy
            (fin.add if ops[2] in fin else fin.discard)(ops[1])
        elif ops and re.fullmatch(r"R\d+", ops[0]):
            d = ops[0]
            is_fin = (op in ("IMAD.MOV.U32", "MOV") and all(o in ("RZ", "0x0") for o in ops[1:])) or \
                     (op == "IMAD.MOV.U32" and len(ops) == 4 and ops[1] == "RZ" and ops[2] == "RZ" and ops[3] in fin) or \
                     (op == "MOV" and len(ops) == 2 and ops[1] in fin)
            if op.startswith("FADD") and len(ops) == 3:
                r1, r2 = ops[1].lstrip("-"), ops[2].lstrip("-")
                is_fin = (r1 == r2 and ops[1].startswith("-") != ops[2].startswith("-")) or \
                         all(r in fin or r == "RZ" for r in (r1, r2))
            if is_fin:
                fin.add(d)
            else:
                fin.discard(d)
    return bad


def check_sass(funcs, fast_math, arch):
    """[(function, rule, text)] for every hot function of one cubin."""
    out = []
    for name, ins in funcs.items():
        if hot_function(name):
            known = any(sm == arch and frag in name for sm, frag in KNOWN_SPILLS)
            out += [(name, rule, text) for rule, text in check_sass_function(name, ins, fast_math, known)]
    return out


# The mutation of the mutant build: wire_format.hpp's rn(), the one door of the exact
# arithmetic, loses its device branch (inline PTX add.rn/sub.rn/mul.rn/div.rn without .ftz)
# and falls back to the plain operators, which nvcc's flags may contract, flush and
# approximate.
MUTATION = ("#if defined(__CUDA_ARCH__)\n  if constexpr (Op == rn_op::add) return ptx_add(a, b);",
            "#if 0  // device_code mutant: the exact device arithmetic removed\n"
            "  if constexpr (Op == rn_op::add) return ptx_add(a, b);")
# What each mutant test expects (--mutant-check RULE) and the register cap it lowers to.
MUTANT_RULES = ("ptx", "ffma", "ftz", "mufu-rcp", "local", "registers")
MUTANT_REGISTER_CAP = 16


def compile_one(a, arch, fm, tag, include, extra=()):
    """nvcc -ptx, then ptxas -v to a cubin, then (with cuobjdump) its SASS."""
    ptx = os.path.join(a.work, tag + ".ptx")
    t0 = time.time()
    run([a.nvcc, "-std=c++20", "-I", include, "-ptx", f"-arch=compute_{arch}"] + (["--use_fast_math"] if fm else [])
        + list(extra) + [a.source, "-o", ptx], os.path.join(a.work, tag + ".nvcc.log"))
    t1 = time.time()
    cubin = os.path.join(a.work, tag + ".cubin")
    run([a.ptxas, f"-arch=sm_{arch}", "-v", ptx, "-o", cubin], os.path.join(a.work, tag + ".ptxas.log"))
    t2 = time.time()
    if a.cuobjdump:
        run([a.cuobjdump, "-sass", cubin], os.path.join(a.work, tag + ".sass"))
    return tag, t1 - t0, t2 - t1


def analyse(a, tag, arch, fm, caps, expect_kernels):
    """[(rule, message)] of one build whose files are in the work folder."""
    failures = []
    with open(os.path.join(a.work, tag + ".ptx")) as f:
        entries = parse_entries(f.read())
    with open(os.path.join(a.work, tag + ".ptxas.log")) as f:
        stats = ptxas_report(f.read())
    ours = {e: b for e, b in entries.items() if hot_function(e)}
    print(f"== {tag}: {len(entries)} entries, {len(ours)} checked")
    if len(ours) < expect_kernels:
        failures.append(("count", f"{tag}: {len(ours)} kernels in the PTX, expected at least {expect_kernels}"))
    for e, body in sorted(ours.items()):
        if len(body) > MAX_INSTRUCTIONS:
            failures.append(("size", f"{tag}: {e}: {len(body)} PTX instructions, more than {MAX_INSTRUCTIONS} "
                             "(a loop unrolled without bound? CGX_UNROLL in config.hpp)"))
        if not any(fp_type(op) for op, _, _ in body) and "add_kernel" not in e:
            failures.append(("ptx", f"{tag}: {e}: no floating-point instruction found (parse error?)"))
        for v in check_ptx(e, body, fm):
            failures.append(("ptx", f"{tag}: {e}: {v}"))
    regs = {}
    for e in sorted(ours):
        s = stats.get(e)
        if s is None:
            failures.append(("spill", f"{tag}: {e}: no ptxas -v report"))
            continue
        r, stack, st, ld = s
        regs[e] = r
        fam = register_family(e)
        print(f"   {r:3d} registers (cap {caps.get(fam, '-')}), {stack} B stack, {st}/{ld} B spill stores/loads  {e}")
        if fam and r is not None and r > caps[fam]:
            failures.append(("registers", f"{tag}: {e}: {r} registers, more than the cap of {caps[fam]} for {fam} kernels"))
        known = next((v for (sm, frag), v in KNOWN_SPILLS.items() if sm == arch and frag in e), None)
        if known:
            if stack > known[0] or st > known[1] or ld > known[2]:
                failures.append(("spill", f"{tag}: {e}: spills grew: {stack} B stack, {st}/{ld} B stores/loads, "
                                 f"known {known[0]} B stack, {known[1]}/{known[2]} B"))
            elif not (stack or st or ld):
                print(f"   note: {e} no longer spills on sm_{arch}: remove it from KNOWN_SPILLS")
            else:
                print(f"   known spill (KNOWN_SPILLS), within its ceiling: {e}")
            continue
        if st or ld:
            failures.append(("spill", f"{tag}: {e}: spills ({st} bytes stores, {ld} bytes loads)"))
        if stack:
            failures.append(("spill", f"{tag}: {e}: {stack} bytes stack frame (local memory)"))
    sass_path = os.path.join(a.work, tag + ".sass")
    if a.cuobjdump:
        with open(sass_path) as f:
            funcs = sass_functions(f.read())
        hot = [n for n in funcs if hot_function(n)]
        if len(hot) < len(ours):
            failures.append(("count", f"{tag}: {len(hot)} hot kernels in the SASS, {len(ours)} in the PTX"))
        for name, rule, text in check_sass(funcs, fm, arch):
            failures.append((rule, f"{tag}: SASS: {name}: {text}"))
        n_ins = sum(len(funcs[n]) for n in hot)
        print(f"   SASS: {len(hot)} kernels, {n_ins} instructions checked (ffma, ftz, mufu-rcp, mufu, local)")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvcc")
    ap.add_argument("--ptxas")
    ap.add_argument("--cuobjdump", default="")
    ap.add_argument("--require-sass", action="store_true",
                    help="fail when cuobjdump is missing instead of skipping the SASS rules (CI)")
    ap.add_argument("--include")
    ap.add_argument("--source")
    ap.add_argument("--work", required=True)
    ap.add_argument("--arch", nargs="+", default=["80", "90"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--expect-kernels", type=int, default=1, help="entries hot_kernels.cu instantiates")
    ap.add_argument("--mutant-build", action="store_true",
                    help="compile the mutant (-DCGX_DC_MUTANT, mutated headers, --use_fast_math) for the first --arch")
    ap.add_argument("--mutant-check", choices=MUTANT_RULES,
                    help="check the mutant's files; succeed only when this rule reports it")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()
    a.cuobjdump = a.cuobjdump if a.cuobjdump and shutil.which(a.cuobjdump) else shutil.which("cuobjdump")
    if not a.cuobjdump and (a.require_sass or (a.mutant_check and a.mutant_check != "ptx")):
        print("device_code: FAIL: no cuobjdump (--cuobjdump or PATH), and the SASS rules are required "
              "(scripts/sass-tools fetches it; CMake: -DCGX_CUOBJDUMP=PATH)")
        return 1
    arch = a.arch[0]
    mtag = f"mutant_sm{arch}"

    if a.mutant_check:
        caps = {k: MUTANT_REGISTER_CAP for k in REGISTER_CAPS} if a.mutant_check == "registers" else REGISTER_CAPS
        found = [(r, m) for r, m in analyse(a, mtag, arch, True, caps, 1) if r == a.mutant_check]
        kinds = {}
        for _, m in found:
            k = re.search(r"(?:at 0x[0-9a-f]+: |: )([A-Za-z0-9_.]+)[^:]*$", m)
            kinds.setdefault(k.group(1) if k and a.mutant_check != "registers" else "-", m)
        for m in list(kinds.values())[:6]:
            print("caught:", m)
        if not found:
            print(f"device_code: FAIL: rule {a.mutant_check} reports nothing on the mutant (a rule that cannot fail)")
            return 1
        print(f"device_code: rule {a.mutant_check} caught the mutant ({len(found)} reports"
              f"{f', register cap lowered to {MUTANT_REGISTER_CAP}' if a.mutant_check == 'registers' else ''})")
        return 0

    if a.mutant_build:
        inc = os.path.join(a.work, "mutant-include")
        shutil.rmtree(inc, ignore_errors=True)
        shutil.copytree(a.include, inc)
        wf = os.path.join(inc, "cgx", "quant", "wire_format.hpp")
        with open(wf) as f:
            text = f.read()
        if MUTATION[0] not in text:
            print("device_code: FAIL: the mutation no longer applies to wire_format.hpp's rn(): update MUTATION")
            return 1
        with open(wf, "w") as f:
            f.write(text.replace(MUTATION[0], MUTATION[1], 1))
        _, tn, tp = compile_one(a, arch, True, mtag, inc, ["-DCGX_DC_MUTANT"])
        print(f"device_code: mutant built for sm_{arch} (--use_fast_math, exact arithmetic removed): "
              f"nvcc -ptx {tn:.1f} s, ptxas {tp:.1f} s")
        return 0

    builds = [(arch, fm) for fm in (False, True) for arch in a.arch]
    tags = [f"sm{arch}{'_fastmath' if fm else ''}" for arch, fm in builds]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = list(pool.map(lambda bt: compile_one(a, bt[0][0], bt[0][1], bt[1], a.include), zip(builds, tags)))
    failures = []
    for (arch, fm), (tag, tn, tp) in zip(builds, results):
        print(f"== {tag}: nvcc -ptx {tn:.1f} s, ptxas {tp:.1f} s")
        failures += analyse(a, tag, arch, fm, REGISTER_CAPS, a.expect_kernels)
    if not a.cuobjdump:
        print("device_code: SASS part SKIPPED: no cuobjdump on this machine (scripts/sass-tools fetches it; "
              "-DCGX_CUOBJDUMP=PATH -DCGX_REQUIRE_SASS=ON makes it required); the PTX rules, ptxas's spill, "
              "stack and register counts above were checked.")
    print(f"device_code: {time.time() - t_start:.1f} s")
    for rule, m in failures:
        print(f"FAIL [{rule}]:", m)
    if failures:
        print(f"device_code: {len(failures)} failures")
        return 1
    print("device_code: all checks passed" + (f" (SASS with {a.cuobjdump})" if a.cuobjdump else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
