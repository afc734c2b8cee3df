#!/usr/bin/env python3
"""Generate vmfabric's Fortran binding (libmpichfort.so.12) and mpif.h from the C header mpi/include/mpi.h.

Run by mpi/fortran/build.sh at every install, so bindings follow the C library: every function declared in
mpi.h whose arguments have a known Fortran mapping gets a binding, with no list to maintain.

    python3 mpi/fortran/gen.py --header mpi/include/mpi.h --out DIR

writes
    DIR/fbind.c     the bindings: for each MPI_X, `mpi_x_` (calls MPI_X) and `pmpi_x_` (calls PMPI_X), plus the
                    aliases MPI_X upper case, mpi_x, mpi_x__ (and the same for PMPI), as in MPICH's library
    DIR/mpif.h      the Fortran header (fixed/free-form compatible), values from mpi.h with MPICH's Fortran
                    adjustments (MPI_MAX_*_STRING lengths minus one, Fortran attribute keyvals = C keyval + 1)
    DIR/bindings.txt   one line per C function: `bound NAME` or `skipped NAME: reason`

Argument mapping (the MPICH ABI, gfortran conventions): every Fortran argument is passed by reference;
handles and INTEGER are MPI_Fint (= int = the C handle, so no conversion); INTEGER(KIND=MPI_ADDRESS_KIND /
MPI_OFFSET_KIND / MPI_COUNT_KIND) are 8 bytes; LOGICAL is 0/1 like C; status arrays have the C MPI_Status
layout (MPI_STATUS_SIZE = 5); CHARACTER arguments get a hidden size_t length appended after ierror.
The sentinels MPI_BOTTOM, MPI_IN_PLACE, MPI_STATUS(ES)_IGNORE, MPI_ERRCODES_IGNORE, MPI_UNWEIGHTED,
MPI_WEIGHTS_EMPTY are variables in MPICH's common blocks (/MPIPRIV1/, /MPIPRIV2/, /MPIFCMB5/, /MPIFCMB9/); the
library defines the same blocks and maps their addresses to the C sentinels. Indices returned by
Waitany/Testany/Waitsome/Testsome are made 1-based. Predefined Fortran attribute keyvals are translated.
"""
import argparse
import os
import re
import sys

HANDLES = {"MPI_Comm", "MPI_Datatype", "MPI_Group", "MPI_Op", "MPI_Info", "MPI_Errhandler", "MPI_Request",
           "MPI_Message", "MPI_Win", "MPI_Session", "MPIX_Grequest_class"}
WIDE = {"MPI_Aint", "MPI_Count", "MPI_Offset"}
# Callback types whose C call convention (all arguments by pointer) is what a Fortran procedure expects.
FNPTR_OK = {"MPI_User_function", "MPI_User_function_c", "MPI_Comm_errhandler_function", "MPI_Win_errhandler_function",
            "MPI_Session_errhandler_function", "MPI_Handler_function", "MPI_Comm_errhandler_fn",
            "MPI_File_errhandler_function", "MPI_File_errhandler_fn",
            "MPI_Win_errhandler_fn", "MPI_Session_errhandler_fn"}
# Written by hand below (emitted only when the C function exists).
SPECIAL = {"MPI_Init", "MPI_Init_thread", "MPI_Buffer_detach", "MPI_Pcontrol", "MPI_Comm_get_attr",
           "MPI_Comm_set_attr", "MPI_Attr_get", "MPI_Attr_put", "MPI_Type_get_attr", "MPI_Type_set_attr",
           "MPI_Win_get_attr", "MPI_Win_set_attr", "MPI_Info_create_env",
           "MPI_Comm_create_keyval", "MPI_Type_create_keyval", "MPI_Win_create_keyval", "MPI_Keyval_create",
           "MPI_Grequest_start", "MPI_Info_get_string", "MPI_Comm_spawn", "MPI_Comm_spawn_multiple",
           "MPI_Register_datarep"}
# Deprecated MPI-1 functions whose Fortran form has INTEGER where C has MPI_Aint: not bound (removed in MPI-3).
SKIP_NAMES = {"MPI_Type_hvector": "Fortran INTEGER stride vs C MPI_Aint (removed in MPI-3)",
              "MPI_Type_hindexed": "Fortran INTEGER displacements vs C MPI_Aint (removed in MPI-3)",
              "MPI_Type_struct": "Fortran INTEGER displacements vs C MPI_Aint (removed in MPI-3)",
              "MPI_Type_extent": "Fortran INTEGER extent vs C MPI_Aint (removed in MPI-3)",
              "MPI_Type_lb": "Fortran INTEGER vs C MPI_Aint (removed in MPI-3)",
              "MPI_Type_ub": "Fortran INTEGER vs C MPI_Aint (removed in MPI-3)"}
# Post-processing after the C call (1-based indices in Fortran).
POST = {
    "MPI_Waitany": "if (*indx >= 0) (*indx)++;",
    "MPI_Testany": "if (*indx >= 0) (*indx)++;",
    "MPI_Waitsome": "if ((vmf_rc == MPI_SUCCESS || vmf_rc == MPI_ERR_IN_STATUS) && *outcount != MPI_UNDEFINED)"
                    " for (int vmf_i = 0; vmf_i < *outcount; vmf_i++) array_of_indices[vmf_i]++;",
    "MPI_Testsome": "if ((vmf_rc == MPI_SUCCESS || vmf_rc == MPI_ERR_IN_STATUS) && *outcount != MPI_UNDEFINED)"
                    " for (int vmf_i = 0; vmf_i < *outcount; vmf_i++) array_of_indices[vmf_i]++;",
}

PROTO_RE = re.compile(r"^\s*(int|double|MPI_Aint)\s+(MPI_\w+|MPIX_\w+)\s*\(([^;{)]*)\)[^;{]*;", re.M | re.S)
PARAM_RE = re.compile(r"^(const\s+)?(\w+)\s*(\**)\s*(\w+)?\s*((?:\[\w*\])*)$")


class Skip(Exception):
    pass


def parse_params(s):
    s = " ".join(s.split())
    if s in ("", "void"):
        return []
    out = []
    for p in s.split(","):
        p = p.strip()
        if p == "...":
            raise Skip("varargs")
        m = PARAM_RE.match(p)
        if not m or not m.group(4):
            raise Skip(f"cannot parse parameter '{p}'")
        const, base, stars, name, dims = m.groups()
        depth = len(stars) + dims.count("[")
        out.append(dict(const=bool(const), base=base, depth=depth, name=name, ctype=p))
    return out


def fname(cname):
    return cname.lower()


def shim_names(cname, large):
    """C function names of the mpif.h-convention shims of cname: exported mpi_x_/pmpi_x_, or, for a
    large-count C function (which mpif.h does not bind; only mpi_f08's _large procedures use them), static."""
    lname = fname(cname)
    if large:
        return f"vmf_l_{lname}_", f"vmf_l_p{lname}_"
    return f"{lname}_", f"p{lname}_"


def binding(cname, ret, params, pmpi_exists, large=False):
    """Returns C source defining mpi_x_ and pmpi_x_ (and aliases) for one function, or raises Skip.
    With large, cname is a large-count function (MPI_X_c) and the shims are static, without aliases."""
    if cname in SKIP_NAMES:
        raise Skip(SKIP_NAMES[cname])
    if cname == cname.upper() or re.search(r"_(fn|FN)$", cname):
        raise Skip("predefined callback, not a Fortran binding")
    if large != bool(re.search(r"_c$", cname)) or re.search(r"_(c2f|f2c|f082c|c2f08|f2f08|f082f|x_c)$", cname) \
            or cname.startswith("MPI_T_"):
        raise Skip("C-only (large-count, handle conversion or tool interface)")
    fargs, cargs, pre, post, lens = [], [], [], [], []
    for p in params:
        b, d, n = p["base"], p["depth"], p["name"]
        if b in ("MPI_Fint", "MPI_F08_status") or b.startswith("MPI_T_"):
            raise Skip(f"argument type {b}")
        if b == "MPI_File" and d == 0:
            fargs.append(f"MPI_Fint *{n}")
            cargs.append(f"MPI_File_f2c(*{n})")
            continue
        if b == "MPI_File" and d == 1:
            # A file handle is an integer in Fortran and a pointer in C.
            fargs.append(f"MPI_Fint *{n}")
            pre.append(f"MPI_File {n}_c = MPI_File_f2c(*{n});")
            cargs.append(f"&{n}_c")
            post.append(f"*{n} = MPI_File_c2f({n}_c);")
            continue
        if b == "void" and d == 1:
            fargs.append(f"void *{n}")
            cargs.append(f"vmf_buf({n})")
        elif b == "void":
            raise Skip(f"argument {p['ctype']}")
        elif (b == "int" or b in HANDLES) and d == 0:
            fargs.append(f"MPI_Fint *{n}")
            cargs.append(f"*{n}")
        elif (b == "int" or b in HANDLES) and d >= 1:
            fargs.append(f"MPI_Fint *{n}")
            if "weights" in n:
                cargs.append(f"(void *)vmf_weights({n})")
            elif "errcodes" in n:
                cargs.append(f"(void *)vmf_errcodes({n})")
            else:
                cargs.append(f"(void *){n}")
        elif b in WIDE and d == 0:
            fargs.append(f"{b} *{n}")
            cargs.append(f"*{n}")
        elif b in WIDE:
            fargs.append(f"{b} *{n}")
            cargs.append(f"(void *){n}")
        elif b == "MPI_Status" and d == 1:
            fargs.append(f"MPI_Fint *{n}")
            if "[" in p["ctype"] or "statuses" in n:
                cargs.append(f"vmf_statuses({n})")
            else:
                cargs.append(f"vmf_status({n})")
        elif b == "char" and d == 1:
            fargs.append(f"char *{n}")
            lens.append(f"size_t {n}_len")
            if p["const"]:
                trim = "1" if cname.startswith("MPI_Info_") else "0"
                pre.append(f"char *{n}_c = vmf_str_in({n}, {n}_len, {trim});")
                cargs.append(f"{n}_c")
                post.append(f"free({n}_c);")
            else:
                pre.append(f"char *{n}_c = vmf_str_out_alloc({n}_len);")
                cargs.append(f"{n}_c")
                post.append(f"vmf_str_out_copy({n}, {n}_len, {n}_c, vmf_rc);")
        elif b in FNPTR_OK and d == 1:
            fargs.append(f"{b} *{n}")
            cargs.append(n)
        else:
            raise Skip(f"argument {p['ctype']}")
    if cname in POST:
        post.insert(0, POST[cname])
    lname = fname(cname)
    out = []
    for (prefix, target), f in zip((("", cname), ("p", "P" + cname if pmpi_exists else cname)),
                                   shim_names(cname, large)):
        call = f"{target}({', '.join(cargs)})"
        storage = "static __attribute__((unused)) " if large else ""
        if ret == "int":
            sig = ", ".join(fargs + ["MPI_Fint *ierr"] + lens)
            # IERROR is OPTIONAL in mpi_f08, whose procedures without choice buffers are these shims.
            body = "    MPI_Fint vmf_e;\n    if (!ierr) ierr = &vmf_e;\n"
            body += "".join(f"    {x}\n" for x in pre)
            body += f"    int vmf_rc = {call};\n"
            body += "".join(f"    {x}\n" for x in post)
            body += "    *ierr = vmf_rc;\n"
            out.append(f"{storage}void {f}({sig})\n{{\n{body}}}\n")
        else:
            if pre or post:
                raise Skip("function with string arguments")
            sig = ", ".join(fargs + lens) or "void"
            out.append(f"{storage}{ret} {f}({sig})\n{{\n    return {call};\n}}\n")
        if not large:
            out.append(aliases(prefix + lname))
    return "".join(out)


def special_source(name, P, fn, lead=1, p=""):
    """The hand-written shim `name` of SPECIAL_SRC, calling {P}MPI_..., defined as function fn (spawn's only:
    the others are named by the {p} prefix); lead: whether spawn arguments lose leading blanks."""
    # IERROR is OPTIONAL in mpi_f08 (these shims serve it too): an absent one is NULL.
    body = re.sub(r"\)\s*\{\{", ")\n{{ MPI_Fint vmf_e; if (!ierr) ierr = &vmf_e;", SPECIAL_SRC[name], count=1)
    return body.format(p=p, P=P, fn=fn, lead=lead)


def aliases(lname):
    """MPICH exports each binding as NAME (upper), name, name_, name__; gfortran calls name_."""
    s = ""
    for a in (lname.upper(), lname, lname + "__"):
        s += f"#undef {a}\nextern __typeof({lname}_) {a} __attribute__((alias(\"{lname}_\")));\n"
    return s + "\n"


SPECIAL_SRC = {
    "MPI_Init": """
void {p}mpi_init_(MPI_Fint *ierr) {{ *ierr = {P}MPI_Init(NULL, NULL); }}
""",
    "MPI_Init_thread": """
void {p}mpi_init_thread_(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr)
{{ *ierr = {P}MPI_Init_thread(NULL, NULL, *required, provided); }}
""",
    "MPI_Buffer_detach": """
void {p}mpi_buffer_detach_(void *buffer_addr, MPI_Fint *size, MPI_Fint *ierr)
{{ void *b = NULL; (void)buffer_addr; *ierr = {P}MPI_Buffer_detach(&b, size); }}
""",
    "MPI_Pcontrol": """
void {p}mpi_pcontrol_(MPI_Fint *level, MPI_Fint *ierr) {{ *ierr = {P}MPI_Pcontrol(*level); }}
""",
    # Fortran's BUFLEN is the value's length without a terminator (C's counts it), and VALUE receives at most
    # BUFLEN characters, blank-padded; with BUFLEN 0 or FLAG false, VALUE is left alone.
    "MPI_Info_get_string": """
void {p}mpi_info_get_string_(MPI_Fint *info, char *key, MPI_Fint *buflen, char *value, MPI_Fint *flag,
                            MPI_Fint *ierr, size_t key_len, size_t value_len)
{{
    char *key_c = vmf_str_in(key, key_len, 1);
    int n = 0, f = 0;
    if (!key_c) {{ *ierr = MPI_ERR_NO_MEM; return; }}
    *ierr = {P}MPI_Info_get_string(*info, key_c, &n, NULL, &f);
    if (*ierr == MPI_SUCCESS && f && *buflen > 0 && n > 0) {{
        char *v = malloc((size_t)n);
        int m = n;
        if (!v) *ierr = MPI_ERR_NO_MEM;
        else *ierr = {P}MPI_Info_get_string(*info, key_c, &m, v, &f);
        if (*ierr == MPI_SUCCESS) {{
            size_t c = strlen(v);
            if (c > (size_t)*buflen) c = (size_t)*buflen;
            if (c > value_len) c = value_len;
            memcpy(value, v, c);
            memset(value + c, ' ', value_len - c);
        }}
        free(v);
    }}
    if (*ierr == MPI_SUCCESS) {{
        *flag = f;
        if (f) *buflen = n > 0 ? n - 1 : 0;
    }}
    free(key_c);
}}
""",
    # COMMAND and ARGV are CHARACTER*(*); ARGV ends with a blank entry, MPI_ARGV_NULL is /MPIPRIVC/'s.
    "MPI_Comm_spawn": """
void {fn}(char *command, char *argv, MPI_Fint *maxprocs, MPI_Fint *info, MPI_Fint *root,
                       MPI_Fint *comm, MPI_Fint *intercomm, MPI_Fint *errcodes, MPI_Fint *ierr,
                       size_t command_len, size_t argv_len)
{{
    char *cmd = vmf_str_in(command, command_len, 1);
    int bad = 0;
    char **av = vmf_argv_in(argv, 1, argv_len, 0, {lead}, &bad);
    if (!cmd || bad) {{ *ierr = MPI_ERR_NO_MEM; free(cmd); vmf_argv_free(av); return; }}
    *ierr = {P}MPI_Comm_spawn(cmd, av, *maxprocs, *info, *root, *comm, intercomm, vmf_errcodes(errcodes));
    free(cmd);
    vmf_argv_free(av);
}}
""",
    # ARRAY_OF_COMMANDS(COUNT) and ARRAY_OF_ARGV(COUNT, *) (column-major: argument j of command i at
    # i + j * COUNT), each command's arguments ending with a blank entry; MPI_ARGVS_NULL is /MPIPRIVC/'s.
    "MPI_Comm_spawn_multiple": """
void {fn}(MPI_Fint *count, char *commands, char *argvs, MPI_Fint *maxprocs,
                                MPI_Fint *infos, MPI_Fint *root, MPI_Fint *comm, MPI_Fint *intercomm,
                                MPI_Fint *errcodes, MPI_Fint *ierr, size_t commands_len, size_t argvs_len)
{{
    int n = *count > 0 ? *count : 0, bad = 0;
    char **cmds = calloc((size_t)n + 1, sizeof *cmds);
    int none = argvs == &mpiprivc_[0] || argvs == MPI_F_ARGVS_NULL ||
               VMF_F08_IS(argvs, __mpi_f08_link_constants_MOD_mpi_argvs_null);
    char ***avs = none ? NULL : calloc((size_t)n + 1, sizeof *avs);
    if (!cmds || (!none && !avs)) bad = 1;
    for (int i = 0; !bad && i < n; i++) {{
        cmds[i] = vmf_str_in(commands + (size_t)i * commands_len, commands_len, 1);
        if (!cmds[i]) bad = 1;
        if (avs) avs[i] = vmf_argv_in(argvs + (size_t)i * argvs_len, (size_t)n, argvs_len, 1, {lead}, &bad);
    }}
    if (bad) *ierr = MPI_ERR_NO_MEM;
    else *ierr = {P}MPI_Comm_spawn_multiple(*count, cmds, avs, maxprocs, infos, *root, *comm, intercomm,
                                            vmf_errcodes(errcodes));
    for (int i = 0; cmds && i < n; i++) {{ free(cmds[i]); if (avs) vmf_argv_free(avs[i]); }}
    free(cmds);
    free(avs);
}}
""",
    "MPI_Info_create_env": """
void {p}mpi_info_create_env_(MPI_Fint *info, MPI_Fint *ierr) {{ *ierr = {P}MPI_Info_create_env(0, NULL, info); }}
""",
    # Keyvals with Fortran callbacks: the C library calls a trampoline (C convention, values by value) with a
    # heap record as extra_state; the trampoline calls the Fortran procedure (by reference, with ierror).
    "MPI_Comm_create_keyval": """
void {p}mpi_comm_create_keyval_(vmf_f_copy_fn *copy, vmf_f_delete_fn *del, MPI_Fint *keyval, MPI_Aint *extra,
                               MPI_Fint *ierr)
{{
    struct vmf_kv *k = vmf_kv_new(copy, del, *extra, 0);
    *ierr = {P}MPI_Comm_create_keyval(vmf_kv_copy, vmf_kv_delete, keyval, k);
}}
""",
    "MPI_Type_create_keyval": """
void {p}mpi_type_create_keyval_(vmf_f_copy_fn *copy, vmf_f_delete_fn *del, MPI_Fint *keyval, MPI_Aint *extra,
                               MPI_Fint *ierr)
{{
    struct vmf_kv *k = vmf_kv_new(copy, del, *extra, 0);
    *ierr = {P}MPI_Type_create_keyval(vmf_kv_copy, vmf_kv_delete, keyval, k);
}}
""",
    "MPI_Win_create_keyval": """
void {p}mpi_win_create_keyval_(vmf_f_copy_fn *copy, vmf_f_delete_fn *del, MPI_Fint *keyval, MPI_Aint *extra,
                              MPI_Fint *ierr)
{{
    struct vmf_kv *k = vmf_kv_new(copy, del, *extra, 0);
    *ierr = {P}MPI_Win_create_keyval(vmf_kv_copy, vmf_kv_delete, keyval, k);
}}
""",
    "MPI_Keyval_create": """
void {p}mpi_keyval_create_(vmf_f_copy_fn *copy, vmf_f_delete_fn *del, MPI_Fint *keyval, MPI_Fint *extra,
                          MPI_Fint *ierr)
{{
    struct vmf_kv *k = vmf_kv_new(copy, del, *extra, 1);
    *ierr = {P}MPI_Keyval_create(vmf_kv_copy, vmf_kv_delete, keyval, k);
}}
""",
    # Generalized requests: the C library calls trampolines with a heap record as extra_state; they call the
    # Fortran procedures with a reference to the program's EXTRA_STATE variable (as MPICH does, so a callback
    # that updates it updates the program's variable). The free trampoline releases the record.
    "MPI_Grequest_start": """
void {p}mpi_grequest_start_(vmf_f_greq_query *query, vmf_f_greq_free *freef, vmf_f_greq_cancel *cancel,
                           MPI_Aint *extra, MPI_Fint *request, MPI_Fint *ierr)
{{
    struct vmf_greq *g = malloc(sizeof *g);
    if (!g) {{ *ierr = MPI_ERR_NO_MEM; return; }}
    g->query = query; g->freef = freef; g->cancel = cancel; g->extra = extra;
    *ierr = {P}MPI_Grequest_start(vmf_greq_query, vmf_greq_free, vmf_greq_cancel, g, request);
    if (*ierr != MPI_SUCCESS) free(g);
}}
""",
    # Data representations with Fortran conversion callbacks: the C library calls trampolines with a heap
    # record as extra_state; they call the Fortran procedures (every argument by reference, EXTRA_STATE an
    # INTEGER(KIND=MPI_ADDRESS_KIND) in the record). MPI_CONVERSION_FN_NULL from Fortran means none (NULL).
    "MPI_Register_datarep": """
void {p}mpi_register_datarep_(char *datarep, vmf_f_conv_fn *rd, vmf_f_conv_fn *wr, vmf_f_extent_fn *ext,
                             MPI_Aint *extra, MPI_Fint *ierr, size_t datarep_len)
{{
    char *name = vmf_str_in(datarep, datarep_len, 1);
    struct vmf_drep *d = malloc(sizeof *d);
    if (!name || !d) {{ free(name); free(d); *ierr = MPI_ERR_NO_MEM; return; }}
    d->rd = rd; d->wr = wr; d->ext = ext; d->extra = *extra;
    *ierr = {P}MPI_Register_datarep(name, vmf_conv_null(rd) ? NULL : vmf_drep_read,
                                    vmf_conv_null(wr) ? NULL : vmf_drep_write, vmf_drep_extent, d);
    free(name);
    if (*ierr != MPI_SUCCESS) free(d);
}}
""",
    # Attributes: Fortran values are INTEGER(KIND=MPI_ADDRESS_KIND) stored as the C attribute pointer value;
    # predefined keyvals (Fortran value = C value + 1) point to the value in C and are dereferenced here.
    "MPI_Comm_get_attr": """
void {p}mpi_comm_get_attr_(MPI_Fint *comm, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *flag, MPI_Fint *ierr)
{{
    void *v = NULL; int f = 0, k = *keyval, pre = vmf_comm_keyval_predef(k);
    *ierr = {P}MPI_Comm_get_attr(*comm, pre ? k - 1 : k, &v, &f);
    if (*ierr == MPI_SUCCESS && f) *val = pre ? (MPI_Aint)*(int *)v : vmf_cell_value(v);
    *flag = f;
}}
""",
    "MPI_Attr_get": """
void {p}mpi_attr_get_(MPI_Fint *comm, MPI_Fint *keyval, MPI_Fint *val, MPI_Fint *flag, MPI_Fint *ierr)
{{
    void *v = NULL; int f = 0, k = *keyval, pre = vmf_comm_keyval_predef(k);
    *ierr = {P}MPI_Attr_get(*comm, pre ? k - 1 : k, &v, &f);
    if (*ierr == MPI_SUCCESS && f) *val = pre ? *(int *)v : (MPI_Fint)vmf_cell_value(v);
    *flag = f;
}}
""",
    "MPI_Comm_set_attr": """
void {p}mpi_comm_set_attr_(MPI_Fint *comm, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *ierr)
{{
    MPI_Aint *cell = vmf_cell_new(*val);
    if (!cell) {{ *ierr = MPI_ERR_NO_MEM; return; }}
    *ierr = {P}MPI_Comm_set_attr(*comm, *keyval, cell);
    if (*ierr != MPI_SUCCESS) vmf_cell_free(cell);
}}
""",
    "MPI_Attr_put": """
void {p}mpi_attr_put_(MPI_Fint *comm, MPI_Fint *keyval, MPI_Fint *val, MPI_Fint *ierr)
{{ *ierr = {P}MPI_Attr_put(*comm, *keyval, (void *)(MPI_Aint)*val); }}
""",
    "MPI_Type_get_attr": """
void {p}mpi_type_get_attr_(MPI_Fint *type, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *flag, MPI_Fint *ierr)
{{
    void *v = NULL; int f = 0;
    *ierr = {P}MPI_Type_get_attr(*type, *keyval, &v, &f);
    if (*ierr == MPI_SUCCESS && f) *val = vmf_cell_value(v);
    *flag = f;
}}
""",
    "MPI_Type_set_attr": """
void {p}mpi_type_set_attr_(MPI_Fint *type, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *ierr)
{{
    MPI_Aint *cell = vmf_cell_new(*val);
    if (!cell) {{ *ierr = MPI_ERR_NO_MEM; return; }}
    *ierr = {P}MPI_Type_set_attr(*type, *keyval, cell);
    if (*ierr != MPI_SUCCESS) vmf_cell_free(cell);
}}
""",
    "MPI_Win_get_attr": """
void {p}mpi_win_get_attr_(MPI_Fint *win, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *flag, MPI_Fint *ierr)
{{
    void *v = NULL; int f = 0, k = *keyval, pre = vmf_win_keyval_predef(k);
    *ierr = {P}MPI_Win_get_attr(*win, pre ? k - 1 : k, &v, &f);
    if (*ierr == MPI_SUCCESS && f) {{
        if (!pre) *val = vmf_cell_value(v);
        else if (k - 1 == MPI_WIN_BASE) *val = (MPI_Aint)v;
        else if (k - 1 == MPI_WIN_SIZE) *val = *(MPI_Aint *)v;
        else *val = *(int *)v;
    }}
    *flag = f;
}}
""",
    "MPI_Win_set_attr": """
void {p}mpi_win_set_attr_(MPI_Fint *win, MPI_Fint *keyval, MPI_Aint *val, MPI_Fint *ierr)
{{
    MPI_Aint *cell = vmf_cell_new(*val);
    if (!cell) {{ *ierr = MPI_ERR_NO_MEM; return; }}
    *ierr = {P}MPI_Win_set_attr(*win, *keyval, cell);
    if (*ierr != MPI_SUCCESS) vmf_cell_free(cell);
}}
""",
}

PROLOGUE = r"""/* fbind.c -- vmfabric's Fortran binding (libmpichfort.so.12). Generated by mpi/fortran/gen.py from mpi.h at
 * build time; do not edit. Calls the C library (libmpich.so.12) through its public API only. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "mpi.h"

/* The Fortran sentinels: MPICH's common blocks (same names, layouts and sizes as in mpif.h). A program's
 * own common block of the same name takes precedence (the executable defines it and this library's references
 * bind to it through the GOT), so the addresses compared below are the program's. */
struct vmf_mpipriv1 { MPI_Fint bottom, in_place, status_ignore[5]; };
struct vmf_mpipriv2 { MPI_Fint statuses_ignore[5], errcodes_ignore[1]; };
struct vmf_mpipriv1 mpipriv1_ __attribute__((aligned(32)));
struct vmf_mpipriv2 mpipriv2_ __attribute__((aligned(32)));
char mpiprivc_[2] __attribute__((aligned(32)));
MPI_Fint mpifcmb5_ __attribute__((aligned(16)));
MPI_Fint mpifcmb9_ __attribute__((aligned(16)));
/* MPICH's library also exports objects of these names for MPI_ARGV(S)_NULL and MPI_ERRCODES_IGNORE: a
 * program or tool passing them means those sentinels too. */
char MPI_F_ARGV_NULL[1], MPI_F_ARGVS_NULL[1];
MPI_Fint MPI_F_ERRCODES_IGNORE[1];

/* mpi_f08's sentinels (module mpi_f08_link_constants and mpi_f08_callbacks, linked into this library when
 * gfortran built them): the same shims serve both bindings. */
#ifdef VMF_F08
extern MPI_Fint MPIR_F08_MPI_STATUS_IGNORE_OBJ[5], MPIR_F08_MPI_STATUSES_IGNORE_OBJ[5];
extern char __mpi_f08_link_constants_MOD_mpi_argv_null[1], __mpi_f08_link_constants_MOD_mpi_argvs_null[1];
extern MPI_Fint __mpi_f08_link_constants_MOD_mpi_errcodes_ignore[1];
extern MPI_Fint __mpi_f08_link_constants_MOD_mpi_unweighted[1], __mpi_f08_link_constants_MOD_mpi_weights_empty[1];
extern void __mpi_f08_callbacks_MOD_mpi_conversion_fn_null(void);
#define VMF_F08_IS(p, sym) ((const void *)(p) == (const void *)(sym))
#else
#define VMF_F08_IS(p, sym) 0
#endif
static inline void *vmf_buf(void *p)
{
    if (p == (void *)&mpipriv1_.bottom) return MPI_BOTTOM;
    if (p == (void *)&mpipriv1_.in_place) return MPI_IN_PLACE;
    return p;
}
static inline MPI_Status *vmf_status(MPI_Fint *p)
{
    return p == mpipriv1_.status_ignore || VMF_F08_IS(p, MPIR_F08_MPI_STATUS_IGNORE_OBJ) ? MPI_STATUS_IGNORE
                                                                                     : (MPI_Status *)(void *)p;
}
static inline MPI_Status *vmf_statuses(MPI_Fint *p)
{
    return p == mpipriv2_.statuses_ignore || VMF_F08_IS(p, MPIR_F08_MPI_STATUSES_IGNORE_OBJ)
        ? MPI_STATUSES_IGNORE : (MPI_Status *)(void *)p;
}
static inline int *vmf_errcodes(MPI_Fint *p)
{
    return p == mpipriv2_.errcodes_ignore || p == MPI_F_ERRCODES_IGNORE ||
           VMF_F08_IS(p, __mpi_f08_link_constants_MOD_mpi_errcodes_ignore) ? MPI_ERRCODES_IGNORE : p;
}
static inline int *vmf_weights(MPI_Fint *p)
{
    if (p == &mpifcmb5_ || VMF_F08_IS(p, __mpi_f08_link_constants_MOD_mpi_unweighted)) return MPI_UNWEIGHTED;
    if (p == &mpifcmb9_ || VMF_F08_IS(p, __mpi_f08_link_constants_MOD_mpi_weights_empty)) return MPI_WEIGHTS_EMPTY;
    return p;
}
/* Input strings: Fortran blank-padded, no NUL. Trailing blanks are dropped (leading ones too for info keys). */
static char *vmf_str_in(const char *s, size_t len, int trim_leading)
{
    size_t b = 0, e = len;
    while (e > 0 && s[e - 1] == ' ') e--;
    if (trim_leading) while (b < e && s[b] == ' ') b++;
    char *c = malloc(e - b + 1);
    if (c) { memcpy(c, s + b, e - b); c[e - b] = 0; }
    return c;
}
/* A Fortran argument list for MPI_Comm_spawn: entries of `len` characters `stride` entries apart (trailing
 * blanks dropped, and with `lead` leading ones too: MPICH's mpif.h binding drops them, its mpi_f08 binding
 * keeps them), ended by a blank entry; MPI_ARGV_NULL (the second byte of /MPIPRIVC/) is NULL. Sets *bad when
 * out of memory. */
static char **vmf_argv_in(const char *a, size_t stride, size_t len, int multiple, int lead, int *bad)
{
    if (len == 0 || a == &mpiprivc_[1] || (multiple && a == &mpiprivc_[0]) || a == MPI_F_ARGV_NULL ||
        (multiple && a == MPI_F_ARGVS_NULL) ||
        VMF_F08_IS(a, __mpi_f08_link_constants_MOD_mpi_argv_null) ||
        (multiple && VMF_F08_IS(a, __mpi_f08_link_constants_MOD_mpi_argvs_null)))
        return NULL;
    size_t n = 0;
    for (;;) {
        const char *e = a + n * stride * len;
        size_t k = len;
        while (k > 0 && e[k - 1] == ' ') k--;
        if (k == 0) break;
        n++;
    }
    char **v = calloc(n + 1, sizeof *v);
    if (!v) { *bad = 1; return NULL; }
    for (size_t i = 0; i < n; i++)
        if (!(v[i] = vmf_str_in(a + i * stride * len, len, lead))) *bad = 1;
    return v;
}
static void vmf_argv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++) free(v[i]);
    free(v);
}
/* Output strings: the C function writes into a buffer of at least its MPI_MAX_* size (or the Fortran length
 * if larger); the result is copied and blank-padded, unless the C function did not write (e.g. Info_get with
 * flag false) or failed. */
#define VMF_STR_MIN 8192
static char *vmf_str_out_alloc(size_t len)
{
    char *c = malloc((len > VMF_STR_MIN ? len : VMF_STR_MIN) + 2);
    if (c) { c[0] = 1; c[1] = 0; }
    return c;
}
static void vmf_str_out_copy(char *f, size_t len, char *c, int rc)
{
    if (!c) return;
    if (rc == MPI_SUCCESS && !(c[0] == 1 && c[1] == 0)) {
        size_t n = strlen(c);
        if (n > len) n = len;
        memcpy(f, c, n);
        memset(f + n, ' ', len - n);
    }
    free(c);
}
/* Attribute values set from Fortran (MPI-2 style: INTEGER(KIND=MPI_ADDRESS_KIND)) live in cells, and C
 * is given the cell's address: as the standard says (and MPICH does), C's MPI_Comm_get_attr then returns a
 * pointer to the stored integer, while Fortran's returns the integer. The cells are registered, so a value
 * set from C (any pointer) is told apart and passed to Fortran as its address. Cells of keyvals created
 * from Fortran are freed when the attribute is deleted; those of C keyvals live as long as the process (their
 * C callbacks may have copied the pointer). */
static pthread_mutex_t vmf_cells_mu = PTHREAD_MUTEX_INITIALIZER;
static MPI_Aint **vmf_cells;
static size_t vmf_ncells, vmf_capcells;
static MPI_Aint *vmf_cell_new(MPI_Aint v)
{
    MPI_Aint *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = v;
    pthread_mutex_lock(&vmf_cells_mu);
    if (vmf_ncells == vmf_capcells) {
        size_t cap = vmf_capcells ? 2 * vmf_capcells : 64;
        MPI_Aint **n = realloc(vmf_cells, cap * sizeof *n);
        if (!n) { pthread_mutex_unlock(&vmf_cells_mu); free(c); return NULL; }
        vmf_cells = n;
        vmf_capcells = cap;
    }
    vmf_cells[vmf_ncells++] = c;
    pthread_mutex_unlock(&vmf_cells_mu);
    return c;
}
/* The integer a Fortran caller sees for attribute value p: the cell's content, or the pointer itself. */
static MPI_Aint vmf_cell_value(void *p)
{
    MPI_Aint v = (MPI_Aint)p;
    pthread_mutex_lock(&vmf_cells_mu);
    for (size_t i = vmf_ncells; i-- > 0;)
        if (vmf_cells[i] == p) { v = *vmf_cells[i]; break; }
    pthread_mutex_unlock(&vmf_cells_mu);
    return v;
}
static void vmf_cell_free(void *p)
{
    pthread_mutex_lock(&vmf_cells_mu);
    for (size_t i = vmf_ncells; i-- > 0;)
        if (vmf_cells[i] == p) {
            vmf_cells[i] = vmf_cells[--vmf_ncells];
            free(p);
            break;
        }
    pthread_mutex_unlock(&vmf_cells_mu);
}
/* Attribute keyvals created from Fortran. The Fortran callbacks take every argument by reference and
 * return ierror; MPI-2 style (Comm/Type/Win_create_keyval) values are INTEGER(KIND=MPI_ADDRESS_KIND), MPI-1
 * style (Keyval_create) values INTEGER. Attribute values live in C as the pointer value. */
typedef void (vmf_f_copy_fn)(MPI_Fint *, MPI_Fint *, void *, void *, void *, MPI_Fint *, MPI_Fint *);
typedef void (vmf_f_delete_fn)(MPI_Fint *, MPI_Fint *, void *, void *, MPI_Fint *);
struct vmf_kv { vmf_f_copy_fn *copy; vmf_f_delete_fn *del; MPI_Aint extra; MPI_Fint extra32; int f77; };
static __attribute__((unused)) struct vmf_kv *vmf_kv_new(vmf_f_copy_fn *c, vmf_f_delete_fn *d, MPI_Aint extra, int f77)
{
    struct vmf_kv *k = malloc(sizeof *k);
    if (k) { k->copy = c; k->del = d; k->extra = extra; k->extra32 = (MPI_Fint)extra; k->f77 = f77; }
    return k;
}
static __attribute__((unused)) int vmf_kv_copy(int old, int keyval, void *extra, void *in, void *out, int *flag)
{
    struct vmf_kv *k = extra;
    MPI_Fint h = old, kv = keyval, fl = 0, ierr = MPI_SUCCESS;
    if (k->f77) {
        MPI_Fint vin = (MPI_Fint)vmf_cell_value(in), vout = 0;
        k->copy(&h, &kv, &k->extra32, &vin, &vout, &fl, &ierr);
        if (fl) *(void **)out = (void *)(MPI_Aint)vout;
    } else {
        MPI_Aint vin = vmf_cell_value(in), vout = 0;
        k->copy(&h, &kv, &k->extra, &vin, &vout, &fl, &ierr);
        if (fl && ierr == MPI_SUCCESS) {
            MPI_Aint *cell = vmf_cell_new(vout);
            if (!cell) return MPI_ERR_NO_MEM;
            *(void **)out = cell;
        }
    }
    *flag = fl != 0;
    return ierr;
}
static __attribute__((unused)) int vmf_kv_delete(int h0, int keyval, void *val, void *extra)
{
    struct vmf_kv *k = extra;
    MPI_Fint h = h0, kv = keyval, ierr = MPI_SUCCESS;
    if (k->f77) {
        MPI_Fint v = (MPI_Fint)vmf_cell_value(val);
        k->del(&h, &kv, &v, &k->extra32, &ierr);
        if (ierr == MPI_SUCCESS) vmf_cell_free(val);
    } else {
        MPI_Aint v = vmf_cell_value(val);
        k->del(&h, &kv, &v, &k->extra, &ierr);
        if (ierr == MPI_SUCCESS) vmf_cell_free(val);
    }
    return ierr;
}
/* Every other spelling MPICH exports for a Fortran-only procedure defined as lower_: lower, lower__, the
 * upper case and the pmpi/PMPI forms (the upper-case names of the callbacks are also C macros of mpi.h,
 * #undef'd before use). */
#define VMF_SPELLINGS(lower, UPPER) \
    extern __typeof(lower##_) lower __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) lower##__ __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) p##lower __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) p##lower##_ __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) p##lower##__ __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) UPPER __attribute__((alias(#lower "_"))); \
    extern __typeof(lower##_) P##UPPER __attribute__((alias(#lower "_")));
/* The predefined Fortran callbacks (MPI_COMM_NULL_COPY_FN ... in mpif.h), MPI-2 (ADDRESS_KIND) and MPI-1
 * (INTEGER) forms. */
#undef MPI_COMM_NULL_COPY_FN
#undef MPI_TYPE_NULL_COPY_FN
#undef MPI_WIN_NULL_COPY_FN
#undef MPI_NULL_COPY_FN
#undef MPI_COMM_DUP_FN
#undef MPI_TYPE_DUP_FN
#undef MPI_WIN_DUP_FN
#undef MPI_DUP_FN
#undef MPI_COMM_NULL_DELETE_FN
#undef MPI_TYPE_NULL_DELETE_FN
#undef MPI_WIN_NULL_DELETE_FN
#undef MPI_NULL_DELETE_FN
#define VMF_F_CB(name, UPPER, body, ...) \
    void name##_(__VA_ARGS__) { body } \
    VMF_SPELLINGS(name, UPPER)
#define VMF_NULL_COPY(name, UPPER) VMF_F_CB(name, UPPER, *flag = 0; *ierr = MPI_SUCCESS; (void)h; (void)kv; (void)ex; (void)in; (void)out;, \
    MPI_Fint *h, MPI_Fint *kv, void *ex, void *in, void *out, MPI_Fint *flag, MPI_Fint *ierr)
#define VMF_DUP(name, UPPER, T) VMF_F_CB(name, UPPER, *(T *)out = *(T *)in; *flag = 1; *ierr = MPI_SUCCESS; (void)h; (void)kv; (void)ex;, \
    MPI_Fint *h, MPI_Fint *kv, void *ex, void *in, void *out, MPI_Fint *flag, MPI_Fint *ierr)
#define VMF_NULL_DELETE(name, UPPER) VMF_F_CB(name, UPPER, *ierr = MPI_SUCCESS; (void)h; (void)kv; (void)v; (void)ex;, \
    MPI_Fint *h, MPI_Fint *kv, void *v, void *ex, MPI_Fint *ierr)
VMF_NULL_COPY(mpi_comm_null_copy_fn, MPI_COMM_NULL_COPY_FN) VMF_NULL_COPY(mpi_type_null_copy_fn, MPI_TYPE_NULL_COPY_FN)
VMF_NULL_COPY(mpi_win_null_copy_fn, MPI_WIN_NULL_COPY_FN) VMF_NULL_COPY(mpi_null_copy_fn, MPI_NULL_COPY_FN)
VMF_DUP(mpi_comm_dup_fn, MPI_COMM_DUP_FN, MPI_Aint) VMF_DUP(mpi_type_dup_fn, MPI_TYPE_DUP_FN, MPI_Aint)
VMF_DUP(mpi_win_dup_fn, MPI_WIN_DUP_FN, MPI_Aint) VMF_DUP(mpi_dup_fn, MPI_DUP_FN, MPI_Fint)
VMF_NULL_DELETE(mpi_comm_null_delete_fn, MPI_COMM_NULL_DELETE_FN)
VMF_NULL_DELETE(mpi_type_null_delete_fn, MPI_TYPE_NULL_DELETE_FN)
VMF_NULL_DELETE(mpi_win_null_delete_fn, MPI_WIN_NULL_DELETE_FN) VMF_NULL_DELETE(mpi_null_delete_fn, MPI_NULL_DELETE_FN)

/* Data representations registered from Fortran (MPI_REGISTER_DATAREP): conversion callbacks take USERBUF,
 * DATATYPE, COUNT, FILEBUF, POSITION (INTEGER(KIND=MPI_OFFSET_KIND)), EXTRA_STATE (ADDRESS_KIND), IERROR;
 * the extent callback DATATYPE, EXTENT (ADDRESS_KIND), EXTRA_STATE, IERROR. All by reference. */
typedef void (vmf_f_conv_fn)(void *, MPI_Fint *, MPI_Fint *, void *, MPI_Offset *, MPI_Aint *, MPI_Fint *);
typedef void (vmf_f_extent_fn)(MPI_Fint *, MPI_Aint *, MPI_Aint *, MPI_Fint *);
struct vmf_drep { vmf_f_conv_fn *rd, *wr; vmf_f_extent_fn *ext; MPI_Aint extra; };
static int vmf_drep_conv(vmf_f_conv_fn *f, void *u, MPI_Datatype t, int count, void *fb, MPI_Offset pos, struct vmf_drep *d)
{
    MPI_Fint ft = (MPI_Fint)t, fc = count, ierr = MPI_SUCCESS;
    MPI_Offset p = pos;
    f(u, &ft, &fc, fb, &p, &d->extra, &ierr);
    return ierr;
}
static __attribute__((unused)) int vmf_drep_read(void *u, MPI_Datatype t, int count, void *fb, MPI_Offset pos, void *extra)
{
    struct vmf_drep *d = extra;
    return vmf_drep_conv(d->rd, u, t, count, fb, pos, d);
}
static __attribute__((unused)) int vmf_drep_write(void *u, MPI_Datatype t, int count, void *fb, MPI_Offset pos, void *extra)
{
    struct vmf_drep *d = extra;
    return vmf_drep_conv(d->wr, u, t, count, fb, pos, d);
}
static __attribute__((unused)) int vmf_drep_extent(MPI_Datatype t, MPI_Aint *ext, void *extra)
{
    struct vmf_drep *d = extra;
    MPI_Fint ft = (MPI_Fint)t, ierr = MPI_SUCCESS;
    d->ext(&ft, ext, &d->extra, &ierr);
    return ierr;
}
/* MPI_CONVERSION_FN_NULL (EXTERNAL in mpif.h): passed to MPI_REGISTER_DATAREP it means no conversion; called,
 * it does nothing. Every spelling (upper, lower, one or two underscores, PMPI) is this one procedure. */
void mpi_conversion_fn_null_(void *u, MPI_Fint *t, MPI_Fint *c, void *fb, MPI_Offset *p, MPI_Aint *ex, MPI_Fint *ierr)
{ (void)u; (void)t; (void)c; (void)fb; (void)p; (void)ex; *ierr = MPI_SUCCESS; }
#undef MPI_CONVERSION_FN_NULL
VMF_SPELLINGS(mpi_conversion_fn_null, MPI_CONVERSION_FN_NULL)
static __attribute__((unused)) int vmf_conv_null(vmf_f_conv_fn *f) {
    return f == NULL || f == mpi_conversion_fn_null_ ||
           VMF_F08_IS(f, __mpi_f08_callbacks_MOD_mpi_conversion_fn_null);
}

/* MPI_SIZEOF: the specific procedures of MPICH's module mpi_sizeofs (programs compiled against MPICH's mpi.mod
 * call these symbols; our mpi.mod declares the same module procedures, so its callers land here too). */
#define VMF_SIZEOF(sfx, n) \
    void __mpi_sizeofs_MOD_mpi_sizeof_##sfx(void *x, MPI_Fint *size, MPI_Fint *ierr) { (void)x; *size = n; *ierr = MPI_SUCCESS; }
VMF_SIZEOF(ch, 1) VMF_SIZEOF(chv, 1) VMF_SIZEOF(cx, 8) VMF_SIZEOF(cxv, 8) VMF_SIZEOF(d, 8) VMF_SIZEOF(dv, 8)
VMF_SIZEOF(i, 4) VMF_SIZEOF(iv, 4) VMF_SIZEOF(i1, 1) VMF_SIZEOF(i1v, 1) VMF_SIZEOF(i2, 2) VMF_SIZEOF(i2v, 2)
VMF_SIZEOF(i8, 8) VMF_SIZEOF(i8v, 8) VMF_SIZEOF(l, 4) VMF_SIZEOF(lv, 4) VMF_SIZEOF(r, 4) VMF_SIZEOF(rv, 4)

/* Fortran-only: MPI_F_SYNC_REG(buf) only has to make the compiler assume buf was used. */
void mpi_f_sync_reg_(void *buf) { __asm__ __volatile__("" : : "r"(buf) : "memory"); }
VMF_SPELLINGS(mpi_f_sync_reg, MPI_F_SYNC_REG)

static inline int vmf_comm_keyval_predef(int k)
{
    return (k & 0xffffff00) == 0x64400000 && (k & 1) == 0 && k > 0x64400000 && k <= 0x6440000e;
}
static inline int vmf_win_keyval_predef(int k)
{
    return (k & 0xffffff00) == 0x66000000 && (k & 1) == 0 && k > 0x66000000 && k <= 0x6600000a;
}

typedef void vmf_f_greq_query(MPI_Aint *extra, MPI_Fint *status, MPI_Fint *ierr);
typedef void vmf_f_greq_free(MPI_Aint *extra, MPI_Fint *ierr);
typedef void vmf_f_greq_cancel(MPI_Aint *extra, MPI_Fint *complete, MPI_Fint *ierr);
struct vmf_greq { vmf_f_greq_query *query; vmf_f_greq_free *freef; vmf_f_greq_cancel *cancel; MPI_Aint *extra; };
static int vmf_greq_query(void *p, MPI_Status *status)
{
    struct vmf_greq *g = p;
    MPI_Fint ierr = MPI_SUCCESS;
    g->query(g->extra, (MPI_Fint *)(void *)status, &ierr);
    return ierr;
}
static int vmf_greq_free(void *p)
{
    struct vmf_greq *g = p;
    MPI_Fint ierr = MPI_SUCCESS;
    g->freef(g->extra, &ierr);
    free(g);
    return ierr;
}
static int vmf_greq_cancel(void *p, int complete)
{
    struct vmf_greq *g = p;
    MPI_Fint ierr = MPI_SUCCESS, c = complete != 0;
    g->cancel(g->extra, &c, &ierr);
    return ierr;
}

/* MPI-1 functions removed in MPI-3 (the address ones take INTEGER where C takes MPI_Aint; MPI_ERRHANDLER_*
 * were renamed): MPICH's Fortran library still has them (old programs call them), so they are here, on their
 * MPI-2 replacements. */
/* INTEGER displacements widened to MPI_Aint (malloc'd; NULL when out of memory). */
static MPI_Aint *vmf_aints(const MPI_Fint *disps, MPI_Fint count)
{
    int n = count > 0 ? count : 0;
    MPI_Aint *d = malloc(sizeof(MPI_Aint) * (n ? n : 1));
    if (d)
        for (int i = 0; i < n; i++) d[i] = disps[i];
    return d;
}
#define VMF_REMOVED(P, p) \
void p##mpi_address_(void *location, MPI_Fint *address, MPI_Fint *ierr) \
{ MPI_Aint a = 0; *ierr = P##MPI_Get_address(vmf_buf(location), &a); *address = (MPI_Fint)a; } \
void p##mpi_type_extent_(MPI_Fint *type, MPI_Fint *extent, MPI_Fint *ierr) \
{ MPI_Aint lb = 0, ext = 0; *ierr = P##MPI_Type_get_extent(*type, &lb, &ext); *extent = (MPI_Fint)ext; } \
void p##mpi_type_lb_(MPI_Fint *type, MPI_Fint *lbout, MPI_Fint *ierr) \
{ MPI_Aint lb = 0, ext = 0; *ierr = P##MPI_Type_get_extent(*type, &lb, &ext); *lbout = (MPI_Fint)lb; } \
void p##mpi_type_ub_(MPI_Fint *type, MPI_Fint *ubout, MPI_Fint *ierr) \
{ MPI_Aint lb = 0, ext = 0; *ierr = P##MPI_Type_get_extent(*type, &lb, &ext); *ubout = (MPI_Fint)(lb + ext); } \
void p##mpi_type_hvector_(MPI_Fint *count, MPI_Fint *bl, MPI_Fint *stride, MPI_Fint *old, MPI_Fint *newt, \
                          MPI_Fint *ierr) \
{ *ierr = P##MPI_Type_create_hvector(*count, *bl, (MPI_Aint)*stride, *old, newt); } \
void p##mpi_errhandler_create_(MPI_Comm_errhandler_function *fn, MPI_Fint *errhandler, MPI_Fint *ierr) \
{ *ierr = P##MPI_Comm_create_errhandler(fn, errhandler); } \
void p##mpi_errhandler_get_(MPI_Fint *comm, MPI_Fint *errhandler, MPI_Fint *ierr) \
{ *ierr = P##MPI_Comm_get_errhandler(*comm, errhandler); } \
void p##mpi_errhandler_set_(MPI_Fint *comm, MPI_Fint *errhandler, MPI_Fint *ierr) \
{ *ierr = P##MPI_Comm_set_errhandler(*comm, *errhandler); } \
void p##mpi_type_hindexed_(MPI_Fint *count, MPI_Fint *bls, MPI_Fint *disps, MPI_Fint *old, MPI_Fint *newt, \
                           MPI_Fint *ierr) \
{ \
    MPI_Aint *d = vmf_aints(disps, *count); \
    *ierr = d ? P##MPI_Type_create_hindexed(*count, bls, d, *old, newt) : MPI_ERR_NO_MEM; \
    free(d); \
} \
void p##mpi_type_struct_(MPI_Fint *count, MPI_Fint *bls, MPI_Fint *disps, MPI_Fint *types, MPI_Fint *newt, \
                         MPI_Fint *ierr) \
{ \
    MPI_Aint *d = vmf_aints(disps, *count); \
    *ierr = d ? P##MPI_Type_create_struct(*count, bls, d, types, newt) : MPI_ERR_NO_MEM; \
    free(d); \
}
VMF_REMOVED(, )
VMF_REMOVED(P, p)
"""
REMOVED_NAMES = ["mpi_errhandler_create", "mpi_errhandler_get", "mpi_errhandler_set", "mpi_address", "mpi_type_extent", "mpi_type_lb", "mpi_type_ub", "mpi_type_hvector",
                 "mpi_type_hindexed", "mpi_type_struct"]


def gen_bindings(header_text):
    protos = PROTO_RE.findall(header_text)
    cfuncs = {}
    for ret, name, params in protos:
        cfuncs[name] = (ret, params)
    src = [PROLOGUE] + [aliases(p + n) for n in REMOVED_NAMES for p in ("", "p")]
    report = []
    nbound = 0
    old = {}
    for name in sorted(cfuncs):
        if name.startswith("PMPI"):
            continue
        ret, params = cfuncs[name]
        pmpi = ("P" + name) in cfuncs
        if name in SPECIAL:
            if name not in SPECIAL_SRC:
                report.append(f"skipped {name}: not bound")
                continue
            for p, P in (("", ""), ("p", "P" if pmpi else "")):
                src.append(special_source(name, P, f"{p}{fname(name)}_", p=p))
                src.append(aliases(p + fname(name)))
            report.append(f"bound {name} (special)")
            old[name] = shim_names(name, False)
            nbound += 1
            continue
        large = name.endswith("_c")
        try:
            s = binding(name, ret, parse_params(params), pmpi, large)
        except Skip as e:
            report.append(f"skipped {name}: {e}")
            continue
        src.append(s)
        old[name] = shim_names(name, large)
        if not large:
            report.append(f"bound {name}")
            nbound += 1
    return "".join(src), report, nbound, cfuncs, old


# ---------------------------------------------------------------- mpif.h

FORTRAN_EXTRA = [  # (name, value) not in the C header, or Fortran-specific (values of MPICH 4.0's mpif.h)
    ("MPI_SOURCE", 3), ("MPI_TAG", 4), ("MPI_ERROR", 5), ("MPI_STATUS_SIZE", 5),
    ("MPI_ADDRESS_KIND", 8), ("MPI_OFFSET_KIND", 8), ("MPI_COUNT_KIND", 8), ("MPI_INTEGER_KIND", 4),
    ("MPI_MAX_DATAREP_STRING", 127),
    ("MPI_MODE_RDONLY", 2), ("MPI_MODE_RDWR", 8), ("MPI_MODE_WRONLY", 4), ("MPI_MODE_DELETE_ON_CLOSE", 16),
    ("MPI_MODE_UNIQUE_OPEN", 32), ("MPI_MODE_CREATE", 1), ("MPI_MODE_EXCL", 64), ("MPI_MODE_APPEND", 128),
    ("MPI_MODE_SEQUENTIAL", 256), ("MPI_SEEK_SET", 600), ("MPI_SEEK_CUR", 602), ("MPI_SEEK_END", 604),
]
MAX_STRINGS = {"MPI_MAX_ERROR_STRING", "MPI_MAX_PORT_NAME", "MPI_MAX_OBJECT_NAME", "MPI_MAX_INFO_KEY",
               "MPI_MAX_INFO_VAL", "MPI_MAX_PROCESSOR_NAME", "MPI_MAX_LIBRARY_VERSION_STRING",
               "MPI_MAX_DATAREP_STRING", "MPI_MAX_STRINGTAG_LEN", "MPI_MAX_PSET_NAME_LEN"}
FORTRAN_KEYVALS = {"MPI_TAG_UB", "MPI_HOST", "MPI_IO", "MPI_WTIME_IS_GLOBAL", "MPI_UNIVERSE_SIZE",
                   "MPI_LASTUSEDCODE", "MPI_APPNUM", "MPI_WIN_BASE", "MPI_WIN_SIZE", "MPI_WIN_DISP_UNIT",
                   "MPI_WIN_CREATE_FLAVOR", "MPI_WIN_MODEL"}
# Names defined in mpi.h that are not Fortran constants.
NOT_FORTRAN = re.compile(r"^(MPI_T_|MPIX_|MPI_F_|MPIR_|MPI_INCLUDED$|MPI_.*_FN$|MPI_CONVERSION_FN_NULL$|MPI_DISPLACEMENT_CURRENT$)")
# C-only integer types MPICH's mpif.h leaves out? (none: it defines the C datatypes too.)


def c_constants(header_text):
    """Integer constants of mpi.h: #defines (casts to handle types stripped) and enum members."""
    raw = {}
    for name, val in re.findall(r"^#define\s+(MPIX?_[A-Z0-9_]+)[ \t]+(.+?)\s*$", header_text, re.M):
        raw[name] = val
    for body in re.findall(r"enum\s*\{([^}]*)\}", header_text):
        for name, val in re.findall(r"(MPIX?_[A-Z0-9_]+)\s*=\s*([^,]+)", body):
            raw[name] = val.strip()
    vals = {}

    def ev(name, depth=0):
        if name in vals:
            return vals[name]
        v = raw[name]
        if re.search(r"\*\s*\)", v) or "NULL" in v and "_NULL" not in v:
            return None  # pointer constant
        v = re.sub(r"\(\s*MPIX?_[A-Za-z0-9_]*[a-z][A-Za-z0-9_]*\s*\)", "", v)  # (MPI_Datatype) casts
        if depth > 10:
            return None

        def sub(m):
            n = m.group(0)
            if n in raw:
                r = ev(n, depth + 1)
                if r is None:
                    raise ValueError
                return f"({r})"
            raise ValueError
        try:
            e = re.sub(r"\bMPIX?_[A-Za-z0-9_]+\b", sub, v)
            if not re.fullmatch(r"[0-9a-fA-FxX()+\-*/ <|&]+", e):
                return None
            r = eval(e, {}, {})
        except Exception:
            return None
        if not isinstance(r, int):
            return None
        if r >= 2**31:
            r -= 2**32
        vals[name] = r
        return r

    out = {}
    for name in raw:
        r = ev(name)
        if r is not None:
            out[name] = r
    return out


def gen_mpif(header_text):
    consts = c_constants(header_text)
    params = {}
    for name, v in consts.items():
        if NOT_FORTRAN.match(name) or len(name) > 31:
            continue
        if name in MAX_STRINGS:
            v -= 1
        if name in FORTRAN_KEYVALS:
            v += 1
        params[name] = v
    for name, v in FORTRAN_EXTRA:
        params.setdefault(name, v)
    lines = [
        "! mpif.h -- vmfabric's Fortran MPI header (MPICH 4.0 ABI:",
        "! libmpichfort.so.12, libmpich.so.12). Generated by",
        "! mpi/fortran/gen.py from mpi.h; do not edit.",
        "! Valid in fixed and free source form.",
    ]
    for name in sorted(params):
        lines.append(f"       INTEGER {name}")
        lines.append(f"       PARAMETER ({name}={params[name]})")
    lines += [
        "       INTEGER*8 MPI_DISPLACEMENT_CURRENT",
        "       PARAMETER (MPI_DISPLACEMENT_CURRENT=-54278278)",
        "       LOGICAL MPI_SUBARRAYS_SUPPORTED",
        "       PARAMETER (MPI_SUBARRAYS_SUPPORTED=.FALSE.)",
        "       LOGICAL MPI_ASYNC_PROTECTS_NONBLOCKING",
        "       PARAMETER (MPI_ASYNC_PROTECTS_NONBLOCKING=.FALSE.)",
        "       INTEGER MPI_BOTTOM, MPI_IN_PLACE, MPI_UNWEIGHTED",
        "       INTEGER MPI_WEIGHTS_EMPTY",
        "       INTEGER MPI_STATUS_IGNORE(MPI_STATUS_SIZE)",
        "       INTEGER MPI_STATUSES_IGNORE(MPI_STATUS_SIZE,1)",
        "       INTEGER MPI_ERRCODES_IGNORE(1)",
        "       CHARACTER*1 MPI_ARGVS_NULL(1,1)",
        "       CHARACTER*1 MPI_ARGV_NULL(1)",
        "       EXTERNAL MPI_DUP_FN, MPI_NULL_DELETE_FN, MPI_NULL_COPY_FN",
        "       EXTERNAL MPI_COMM_DUP_FN, MPI_COMM_NULL_DELETE_FN",
        "       EXTERNAL MPI_COMM_NULL_COPY_FN",
        "       EXTERNAL MPI_WIN_DUP_FN, MPI_WIN_NULL_DELETE_FN",
        "       EXTERNAL MPI_WIN_NULL_COPY_FN",
        "       EXTERNAL MPI_TYPE_DUP_FN, MPI_TYPE_NULL_DELETE_FN",
        "       EXTERNAL MPI_TYPE_NULL_COPY_FN",
        "       EXTERNAL MPI_CONVERSION_FN_NULL",
        "       EXTERNAL MPI_WTIME, MPI_WTICK",
        "       EXTERNAL PMPI_WTIME, PMPI_WTICK",
        "       DOUBLE PRECISION MPI_WTIME, MPI_WTICK",
        "       DOUBLE PRECISION PMPI_WTIME, PMPI_WTICK",
        "       COMMON /MPIFCMB5/ MPI_UNWEIGHTED",
        "       COMMON /MPIFCMB9/ MPI_WEIGHTS_EMPTY",
        "       SAVE /MPIFCMB5/",
        "       SAVE /MPIFCMB9/",
        "       COMMON /MPIPRIV1/ MPI_BOTTOM, MPI_IN_PLACE, MPI_STATUS_IGNORE",
        "       COMMON /MPIPRIV2/ MPI_STATUSES_IGNORE, MPI_ERRCODES_IGNORE",
        "       SAVE /MPIPRIV1/,/MPIPRIV2/",
        "       COMMON /MPIPRIVC/ MPI_ARGVS_NULL, MPI_ARGV_NULL",
        "       SAVE /MPIPRIVC/",
    ]
    for l in lines:
        assert len(l) <= 72, l
    return "\n".join(lines) + "\n", params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--header", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--f08", action="store_true", help="also generate the mpi_f08 binding (needs gfortran)")
    a = ap.parse_args()
    text = open(a.header).read()
    os.makedirs(a.out, exist_ok=True)
    src, report, n, cfuncs, old = gen_bindings(text)
    mpif, params = gen_mpif(text)
    files = [("mpif.h", mpif)]
    if a.f08:
        import gen_f08  # imports this module's helpers
        c08, wrappers, specs, rep08 = gen_f08.generate(text, cfuncs, old)
        src = src + gen_f08.C_PROLOGUE + c08
        report += rep08
        files += [("f08_wrappers.f90", wrappers), ("mpi_f08.f90", gen_f08.gen_modules(text, specs, params))]
    files += [("fbind.c", src), ("bindings.txt", "\n".join(report) + "\n")]
    for fn, content in files:
        tmp = os.path.join(a.out, fn + ".tmp")
        with open(tmp, "w") as f:
            f.write(content)
        os.replace(tmp, os.path.join(a.out, fn))
    print(f"gen.py: {n} functions bound, {len(report) - n} skipped, {len(params)} mpif.h constants", file=sys.stderr)


if __name__ == "__main__":
    main()
