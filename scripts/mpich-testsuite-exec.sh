#!/bin/sh
# mpiexec for MPICH's runtests (scripts/mpich-testsuite.sh): the job runs under `vmfabric run --quiet`,
# with a time limit (VMF_TEST_TIMEOUT seconds, default 60) so a hang fails one program, not the run.
here="$(cd "$(dirname "$0")/.." && pwd)"
exec timeout -k 5 "${VMF_TEST_TIMEOUT:-60}" "$here/target/release/vmfabric" run --quiet "$@"
