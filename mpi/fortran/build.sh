#!/usr/bin/env bash
# mpi/fortran/build.sh -- build and install vmfabric's Fortran MPI binding next to the C library.
#
# Called by mpi/install.sh (after it installed lib/libmpich.so.12 and include/mpi.h). Generates the bindings
# from mpi/include/mpi.h with gen.py, so every C function the library declares gets its Fortran binding
# (rerun after the C side grows), and installs into RELEASE_DIR (default <repo>/target/release):
#   lib/libmpichfort.so.12        the binding (thin C shims over the C API; NEEDED libmpich.so.12, RUNPATH $ORIGIN)
#   lib/libmpichfort.so, lib/libmpifort.so(.12)  -> libmpichfort.so.12
#   include/mpif.h                Fortran header (fixed and free form)
#   include/mpi.mod, mpi_sizeofs.mod   the `mpi` module (only when gfortran is installed)
#   include/mpi_f08.mod, pmpi_f08.mod, mpi_f08_*.mod   the `mpi_f08` module (idem; without gfortran the
#                                 library has no mpi_f08 procedures)
#   mpif90, mpifort               wrappers
# Needs python3 and cc; gfortran for mpi.mod and mpi_f08. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
rel="${1:-$root/target/release}"
if [ ! -f "$rel/lib/libmpich.so.12" ]; then
    echo "mpi/fortran/build.sh: $rel/lib/libmpich.so.12 not found; run mpi/install.sh" >&2
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "mpi/fortran/build.sh: python3 not found; Fortran binding not built (apt-get install python3)" >&2
    exit 0
fi
out="$rel/fortran-build"
mkdir -p "$out" "$rel/lib" "$rel/include"
fc="${MPIF90_FC:-gfortran}"
f08=""
command -v "$fc" >/dev/null 2>&1 && f08="--f08"
# Regenerate; recompile only when the generated sources (or the C library's header) changed: the mpi_f08
# part takes ~15 s to compile.
stamp="$out/.inputs"
python3 "$here/gen.py" --header "$root/mpi/include/mpi.h" --out "$out" $f08
sum="$(cat "$out/fbind.c" "$out/mpi_f08.f90" "$out/f08_wrappers.f90" 2>/dev/null | cksum) $f08"
if [ -f "$out/libmpichfort.so.12" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    :
elif [ -n "$f08" ]; then
    # mpi_f08: the modules (types, constants, callbacks, interfaces) and the choice-buffer wrappers are
    # Fortran; the C shims read their CFI descriptors through gfortran's ISO_Fortran_binding.h.
    (cd "$out" && "$fc" -c -fPIC -O1 -J"$out" mpi_f08.f90 -o mpi_f08.o &&
        "$fc" -c -fPIC -O1 f08_wrappers.f90 -o f08_wrappers.o)
    ${CC:-cc} -O2 -g -fPIC -c -Wall -Wno-unused-parameter -DVMF_F08 -I"$root/mpi/include" \
        -I"$("$fc" -print-file-name=include)" "$out/fbind.c" -o "$out/fbind.o"
    "$fc" -shared "$out/fbind.o" "$out/mpi_f08.o" "$out/f08_wrappers.o" -o "$out/libmpichfort.so.12" \
        -Wl,-soname,libmpichfort.so.12 -Wl,-rpath,'$ORIGIN' -L"$rel/lib" -lmpich 2> >(grep -v "alignment .* of symbol" >&2)
    echo "$sum" >"$stamp"
else
    echo "mpi/fortran/build.sh: $fc not found; the mpi_f08 module and its bindings are not built" >&2
    ${CC:-cc} -O2 -g -fPIC -shared -Wall -Wno-unused-parameter -I"$root/mpi/include" "$out/fbind.c" \
        -o "$out/libmpichfort.so.12" -Wl,-soname,libmpichfort.so.12 -Wl,-rpath,'$ORIGIN' -L"$rel/lib" -lmpich
    echo "$sum" >"$stamp"
fi
# Functions declared in mpi.h but missing from the library would fail only when called: say so now.
nm -D --defined-only "$rel/lib/libmpich.so.12" | awk '{print $3}' | sort -u >"$out/c-exports.txt"
missing="$(nm -D --undefined-only "$out/libmpichfort.so.12" | awk '{print $2}' | grep -E '^P?MPIX?_' | sort -u |
    comm -23 - "$out/c-exports.txt" | tr "\n" " " || true)"
[ -z "$missing" ] || echo "mpi/fortran/build.sh: warning: not in libmpich.so.12: $missing" >&2
# Copy and rename, so running programs keep their mapping of the old file.
cp -f "$out/libmpichfort.so.12" "$rel/lib/.libmpichfort.so.12.tmp"
mv -f "$rel/lib/.libmpichfort.so.12.tmp" "$rel/lib/libmpichfort.so.12"
for l in libmpichfort.so libmpifort.so.12 libmpifort.so; do
    ln -sfn libmpichfort.so.12 "$rel/lib/$l"
done
cp -f "$out/mpif.h" "$rel/include/mpif.h"
if [ -n "$f08" ]; then
    (cd "$out" && "$fc" -c -I"$rel/include" -J"$out" "$here/mpi.f90" -o "$out/mpi_mod.o")
    cp -f "$out/mpi.mod" "$out/mpi_sizeofs.mod" "$rel/include/"
    for m in mpi_f08 pmpi_f08 mpi_f08_types mpi_f08_compile_constants mpi_f08_link_constants mpi_f08_callbacks; do
        cp -f "$out/$m.mod" "$rel/include/"
    done
else
    echo "mpi/fortran/build.sh: gfortran not found; include/mpi.mod not built (mpif.h and the library are)" >&2
fi
cp -f "$root/mpi/bin/mpif90" "$rel/mpif90"
cp -f "$root/mpi/bin/mpifort" "$rel/mpifort"
chmod +x "$rel/mpif90" "$rel/mpifort"
