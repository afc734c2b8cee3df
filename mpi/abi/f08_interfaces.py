#!/usr/bin/env python3
"""Compare the procedure interfaces of two builds of the mpi_f08 module (ours and MPICH's).

    python3 mpi/abi/f08_interfaces.py OUR_INCLUDE_DIR MPICH_MODULE_DIR

Reads mpi_f08.mod and pmpi_f08.mod of each (gfortran's gzip'd module format) and, for every specific
procedure MPICH's modules declare (mpi_send_f08ts, pmpir_comm_rank_f08 ...), compares what decides how a
call is compiled: the dummy arguments in order, each one's name (keyword calls), type and kind (handles by
their derived type's name), whether it is an array (explicit-shape and assumed-size are both passed as an
address, so they compare equal; assumed-rank and assumed-shape pass descriptors), and the OPTIONAL, VALUE
and ASYNCHRONOUS attributes (ours may declare more dummies ASYNCHRONOUS than MPICH's, not fewer). Prints each difference; exits 1 if there is one, or if a procedure of MPICH's is missing.
"""
import gzip
import os
import re
import sys

TOKEN = re.compile(r"\(|\)|'(?:[^']|'')*'|[^\s()']+")
IGNORED = set()


def parse(text):
    stack = [[]]
    for t in TOKEN.findall(text):
        if t == "(":
            stack.append([])
        elif t == ")":
            x = stack.pop()
            stack[-1].append(x)
        else:
            stack[-1].append(t)
    return stack[0]


def symbols(path):
    body = gzip.open(path, "rt").read().split("\n", 1)[1]
    table = max((x for x in parse(body) if isinstance(x, list)), key=len)
    out = {}
    for i in range(0, len(table) - 5, 6):
        sid, name, _module, _label, _ns, info = table[i:i + 6]
        out[int(sid)] = (name.strip("'"), info)
    return out


def describe(syms, sid):
    name, info = syms[sid]
    flags, typespec = info[0], info[2]
    typ, kind = typespec[0], typespec[1]
    if typ == "DERIVED":
        kind = syms[int(kind)][0].lower() if int(kind) in syms else kind
    elif typ in ("CHARACTER", "ASSUMED"):
        kind = ""
    shape = ""
    if "DIMENSION" in flags:
        spec = [y for y in info[6] if isinstance(y, str) and not y.isdigit()]
        shape = "[addr]" if spec and spec[0] in ("EXPLICIT", "ASSUMED_SIZE") else f"[{','.join(spec)}]"
    if "PROCEDURE" in flags:
        typ, kind = "PROCEDURE", ""
    attrs = "".join(f" {a}" for a in flags if a in ("OPTIONAL", "VALUE", "POINTER", "ALLOCATABLE", "ASYNCHRONOUS"))
    return f"{name}:{typ}{'(' + kind + ')' if kind else ''}{shape}{attrs}"


def procedures(path):
    syms = symbols(path)
    out = {}
    for sid, (name, info) in syms.items():
        flags = info[0]
        if "PROCEDURE" not in flags or "GENERIC" in flags or not re.match(r"^p?mpi", name):
            continue
        formal = [int(y) for y in info[5]] if isinstance(info[5], list) else []
        result = ""
        if "FUNCTION" in flags:
            result = f" -> {info[2][0]}({info[2][1]})"
        out[name] = "(" + ", ".join(describe(syms, a) for a in formal if a in syms) + ")" + result
    return out


def relaxed(ours, theirs):
    """Ours with ASYNCHRONOUS dropped from the dummies where MPICH's lacks it: declaring a buffer the library
    may still use after the call ASYNCHRONOUS is the safe side (MPICH's module leaves it off the buffers of
    MPI_Psend_init/MPI_Precv_init and the displacements of MPI_Neighbor_allgatherv_init, whose siblings
    have it); it does not change how a call is compiled, only what the compiler may move across it."""
    o, t = ours.split(", "), theirs.split(", ")
    if len(o) != len(t):
        return ours
    return ", ".join(a.replace(" ASYNCHRONOUS", "") if "ASYNCHRONOUS" not in b else a for a, b in zip(o, t))


def main():
    ours_dir, theirs_dir = sys.argv[1], sys.argv[2]
    bad = 0
    total = 0
    for mod in ("mpi_f08.mod", "pmpi_f08.mod"):
        ours = procedures(os.path.join(ours_dir, mod))
        theirs = procedures(os.path.join(theirs_dir, mod))
        for name in sorted(theirs):
            if name in IGNORED:
                continue
            total += 1
            if name not in ours:
                print(f"{mod}: {name} missing")
                bad += 1
            elif relaxed(ours[name], theirs[name]) != theirs[name]:
                print(f"{mod}: {name}\n  MPICH: {theirs[name]}\n  ours:  {ours[name]}")
                bad += 1
    print(f"{total} procedures compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
