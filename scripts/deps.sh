#!/usr/bin/env bash
# Installs what the build and tests need beyond the machine's toolchains. Idempotent: does nothing when
# everything is present.
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; else
    echo "deps: cargo not found; install Rust (rustup) first" >&2; exit 1; fi
fi
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v make >/dev/null 2>&1 || need+=(make)
# MPICH: the ABI reference the MPI library's tests compile against, and Hydra (mpiexec.mpich).
command -v mpicc.mpich >/dev/null 2>&1 || need+=(mpich libmpich-dev)
command -v objdump >/dev/null 2>&1 || need+=(binutils)
# Fortran bindings (libmpichfort.so.12) and their tests; python3 generates the bindings.
command -v gfortran >/dev/null 2>&1 || need+=(gfortran)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# NetPIPE as Debian builds it against MPICH: a standard benchmark binary the tests run unmodified.
command -v NPmpich2 >/dev/null 2>&1 || need+=(netpipe-mpich2)
# ScaLAPACK's test programs as Debian builds them against MPICH: run unmodified by the tests.
[ -x /usr/lib/x86_64-linux-gnu/scalapack/mpich-tests/xdlu ] || need+=(scalapack-mpi-test)
# A private single-node Slurm (munged, slurmctld, slurmd) for the srun --mpi=pmi2 test.
{ command -v slurmd >/dev/null 2>&1 && command -v slurmctld >/dev/null 2>&1 && command -v srun >/dev/null 2>&1; } ||
  need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
# Emulated hosts (vmfabric run --hosts) use ip(8).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The vnic (vmfabric vnic): its tests ping across the namespaces; its benchmark runs iperf3 against a veth pair.
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
# vmfabric sweep: plots (matplotlib for the system python3) and MTU-sized frames on its veth baseline (ethtool).
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || need+=(python3-matplotlib)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
# vmfabric vm (real QEMU guests): QEMU, Debian's guest kernel and a static busybox for the guests' initramfs.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1 || need+=(linux-image-amd64)
{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || need+=(busybox-static)
command -v modprobe >/dev/null 2>&1 || need+=(kmod)
if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
