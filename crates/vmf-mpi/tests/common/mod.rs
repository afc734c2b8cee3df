//! Helpers shared by the MPI test drivers (C and Fortran).
use std::path::Path;
use std::process::{Command, Output};

/// Run `prog` with `n` ranks under `launcher` ("hydra": Debian's mpiexec.mpich; otherwise `vmfabric run`),
/// with our library directory first on LD_LIBRARY_PATH.
pub fn run_job(rel: &Path, libdir: &Path, launcher: &str, n: usize, prog: &Path) -> Output {
    run_job_env(rel, libdir, launcher, n, prog, &[])
}

/// [`run_job`] with extra environment variables.
#[allow(dead_code)]
pub fn run_job_env(
    rel: &Path,
    libdir: &Path,
    launcher: &str,
    n: usize,
    prog: &Path,
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("180");
    if launcher == "hydra" {
        cmd.arg("mpiexec.mpich");
    } else {
        cmd.arg(rel.join("vmfabric")).arg("run");
    }
    cmd.arg("-n").arg(n.to_string()).arg(prog);
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(v) if !v.is_empty() => format!("{}:{v}", libdir.display()),
        _ => libdir.display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", ld);
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

/// The builds to test: ours, and MPICH's when its wrappers are installed.
pub fn builds(mpich: bool) -> Vec<&'static str> {
    if mpich {
        vec!["ours", "mpich"]
    } else {
        vec!["ours"]
    }
}
