#!/bin/sh
# mpiexec for MPICH's runtests (scripts/mpich-testsuite.sh): the job runs under `vmfabric run --quiet`,
# with a time limit so a hang fails one program, not the run: VMF_TEST_TIMEOUT seconds (default 180,
# runtests' own default: threads/pt2pt/multisend4 at 5 ranks, 25 threads spinning in thread barriers on
# 2 cores, takes 44 s under MPICH and 45-60 s here, and passed 120 s once when the machine was busy),
# or the program's own timeLimit from its testlist (runtests passes it as MPIEXEC_TIMEOUT), at most 600.
# init/timeout, which spins for 5 minutes to check that mpiexec stops it, asks for 10 s.
here="$(cd "$(dirname "$0")/.." && pwd)"
limit="${VMF_TEST_TIMEOUT:-180}"
if [ -n "${MPIEXEC_TIMEOUT:-}" ] && [ "$MPIEXEC_TIMEOUT" -ne 180 ] 2>/dev/null; then
  limit=$MPIEXEC_TIMEOUT
  [ "$limit" -gt 600 ] && limit=600
fi
# VMF_RUN_FLAGS: extra `vmfabric run` flags, e.g. "--hosts 2" to run the suite across emulated hosts.
# shellcheck disable=SC2086
exec timeout -k 5 "$limit" "$here/target/release/vmfabric" run --quiet ${VMF_RUN_FLAGS:-} "$@"
