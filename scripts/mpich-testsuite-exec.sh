#!/bin/sh
# mpiexec for MPICH's runtests (scripts/mpich-testsuite.sh): the job runs under `vmfabric run --quiet`,
# with a time limit so a hang fails one program, not the run: VMF_TEST_TIMEOUT seconds (default 120),
# or the program's own timeLimit from its testlist (runtests passes it as MPIEXEC_TIMEOUT; its default,
# 180, is not taken as a request), at most 600. init/timeout, which spins for 5 minutes to check that
# mpiexec stops it, asks for 10 s.
here="$(cd "$(dirname "$0")/.." && pwd)"
limit="${VMF_TEST_TIMEOUT:-120}"
if [ -n "${MPIEXEC_TIMEOUT:-}" ] && [ "$MPIEXEC_TIMEOUT" -ne 180 ] 2>/dev/null; then
  limit=$MPIEXEC_TIMEOUT
  [ "$limit" -gt 600 ] && limit=600
fi
exec timeout -k 5 "$limit" "$here/target/release/vmfabric" run --quiet "$@"
