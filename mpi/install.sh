#!/usr/bin/env bash
# mpi/install.sh -- install vmfabric's MPI library and tools next to the vmfabric binary.
#
# After `cargo build --release` (which builds target/release/libvmf_mpi.so, soname libmpich.so.12):
#   target/release/lib/libmpich.so.12        the library (a copy)
#   target/release/lib/libmpi.so.12          -> libmpich.so.12
#   target/release/lib/libmpich.so, libmpi.so -> libmpich.so.12   (for -lmpich / -lmpi at link time)
#   target/release/lib/libvmfabric.so -> libmpich.so.12  (-lvmfabric: the vmf_* functions of vmfabric/mtx.h)
#   target/release/include/mpi.h             our header
#   target/release/include/vmfabric/mtx.h    minitransactions and barriers (vmfabric's extension)
#   target/release/mpicc, mpiexec, mpirun    wrappers
# Usage: mpi/install.sh [RELEASE_DIR]   (default: <repo>/target/release). Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rel="${1:-$root/target/release}"
so="$rel/libvmf_mpi.so"
if [ ! -f "$so" ]; then
    echo "mpi/install.sh: $so not found; run 'cargo build --release -p vmf-mpi' first" >&2
    exit 1
fi
mkdir -p "$rel/lib" "$rel/include"
# Copy to a temporary name and rename, so running programs keep their mapping of the old file.
cp -f "$so" "$rel/lib/.libmpich.so.12.tmp"
mv -f "$rel/lib/.libmpich.so.12.tmp" "$rel/lib/libmpich.so.12"
for l in libmpi.so.12 libmpich.so libmpi.so libvmfabric.so; do
    ln -sfn libmpich.so.12 "$rel/lib/$l"
done
cp -f "$root/mpi/include/mpi.h" "$rel/include/mpi.h"
mkdir -p "$rel/include/vmfabric"
cp -f "$root/mpi/include/vmfabric/mtx.h" "$rel/include/vmfabric/mtx.h"
cp -f "$root/mpi/bin/mpicc" "$rel/mpicc"
cp -f "$root/mpi/bin/mpiexec" "$rel/mpiexec"
ln -sfn mpiexec "$rel/mpirun"
chmod +x "$rel/mpicc" "$rel/mpiexec"
bash "$root/mpi/fortran/build.sh" "$rel"   # Fortran: lib/libmpichfort.so.12, include/mpif.h + mpi.mod, mpif90, mpifort
