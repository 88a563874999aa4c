#!/usr/bin/env python3
"""The op table is one list: every entry that spmd/ops/ops.h declares in namespace op is in
all_ops() (beside the declarations) once and defined once, and every other OpDef object in spmd/ is one of
the entries below, which are made from a table entry or stand for what is not an op. With
EveryOpHasAConformanceRowAndAGradientCheck (conformance_test.cpp), which checks each entry of
all_ops() against the rows, no op goes without its rows."""
import pathlib
import re
import sys

# OpDef objects that are not entries of the table, and why.
NOT_IN_THE_TABLE = {
    "kUnaryDerivative": "an elementwise op's derivative, made from its functor (ops/pointwise.h)",
    "kBinaryDerivative": "an elementwise op's derivative, made from its functor (ops/pointwise.h)",
    "kDerivative": "a user op's derivative (ops/user_op.h)",
    "kExtremumWeights": "amax's and amin's backward weights (ops/reduction.cpp)",
    "kRedistributeOp": "what op observers see for DTensor::redistribute (dtensor/dtensor.cpp)",
    "kFromLocalOp": "what op observers see for DTensor::from_local (dtensor/dtensor.cpp)",
    "kToLocalGradOp": "what op observers see for to_local's gradient (dtensor/dtensor.cpp)",
    "kValueEventOp": "what op observers see for notify_value's events (dtensor/hooks.cpp)",
}


def strip_comments(text):
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


root = pathlib.Path(sys.argv[1])
ops_h = strip_comments((root / "spmd/ops/ops.h").read_text())
start = ops_h.index("namespace op {")
table = ops_h[start:ops_h.index("\n}", start)]
declared = re.findall(r"\b(?:extern const|inline constexpr) OpDef (\w+)", table)
inline = set(re.findall(r"\binline constexpr OpDef (\w+)", table))

body = ops_h[ops_h.index("all_ops() {"):]
listed = re.findall(r"&op::(\w+)", body[:body.index("};")])

defined = []
others = []
for path in sorted((root / "spmd").rglob("*")):
    if path.suffix not in (".h", ".cpp"):
        continue
    text = strip_comments(path.read_text())
    defined += re.findall(r"\bconst OpDef op::(\w+)\s*[{=]", text)
    if path.relative_to(root).as_posix() == "spmd/ops/ops.h":
        continue
    for name in re.findall(r"\bOpDef\s+(\w+)\s*[{=]", text):
        others.append((name, path.relative_to(root).as_posix()))

bad = []
for name in sorted(set(declared) - set(listed)):
    bad.append(f"op::{name} is declared in spmd/ops/ops.h but not listed in all_ops()")
for name in sorted(set(listed) - set(declared)):
    bad.append(f"all_ops() lists op::{name}, which spmd/ops/ops.h does not declare")
for name in sorted({n for n in listed if listed.count(n) > 1}):
    bad.append(f"all_ops() lists op::{name} more than once")
for name in sorted(set(declared) - inline - set(defined)):
    bad.append(f"op::{name} is declared but no spmd/ops/*.cpp defines it (const OpDef op::{name})")
for name in sorted({n for n in defined if defined.count(n) > 1}):
    bad.append(f"op::{name} is defined more than once")
for name, where in others:
    if name not in NOT_IN_THE_TABLE:
        bad.append(f"{where}: OpDef {name} is neither in the table (namespace op, all_ops()) nor "
                   "one of the entries this check knows to stand outside it")
print("\n".join(bad) if bad else f"all_ops() lists the {len(declared)} entries of the table")
sys.exit(1 if bad else 0)
