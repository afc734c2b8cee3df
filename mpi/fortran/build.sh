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
#   mpif90, mpifort               wrappers
# Needs python3 and cc; gfortran only for mpi.mod. Idempotent.
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
python3 "$here/gen.py" --header "$root/mpi/include/mpi.h" --out "$out"
${CC:-cc} -O2 -g -fPIC -shared -Wall -Wno-unused-parameter -I"$root/mpi/include" "$out/fbind.c" \
    -o "$out/libmpichfort.so.12" -Wl,-soname,libmpichfort.so.12 -Wl,-rpath,'$ORIGIN' -L"$rel/lib" -lmpich
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
if command -v "${MPIF90_FC:-gfortran}" >/dev/null 2>&1; then
    (cd "$out" && "${MPIF90_FC:-gfortran}" -c -I"$rel/include" -J"$out" "$here/mpi.f90" -o "$out/mpi_mod.o")
    cp -f "$out/mpi.mod" "$out/mpi_sizeofs.mod" "$rel/include/"
else
    echo "mpi/fortran/build.sh: gfortran not found; include/mpi.mod not built (mpif.h and the library are)" >&2
fi
cp -f "$root/mpi/bin/mpif90" "$rel/mpif90"
cp -f "$root/mpi/bin/mpifort" "$rel/mpifort"
chmod +x "$rel/mpif90" "$rel/mpifort"
