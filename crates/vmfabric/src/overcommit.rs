//! `vmfabric bench overcommit`: communication patterns that suffer when waiting ranks burn the CPU that
//! the ranks they wait for need (the seed's NPB IS/LU observations on overcommitted hosts).
//!
//! - `ring`: an 8-byte token goes around all ranks `rounds` times;
//! - `alltoall`: `rounds` rounds of all-to-all exchanges of a small (64 B) and a medium (8 KiB) message per
//!   pair, with a fixed amount of computation between rounds (the shape of NPB IS).
//!
//! Wall time is measured by rank 0 between barriers; CPU time is the sum over all ranks of user+system
//! time spent in the measured section.
use clap::{Args, ValueEnum};
use std::time::Instant;
use vmf_core::{Error, Fabric, SendMode, Source, TagSel};

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum, Debug)]
pub enum Pattern {
    /// Token ring.
    Ring,
    /// Rounds of all-to-all with computation between them.
    Alltoall,
}

#[derive(Args)]
pub struct OvercommitArgs {
    /// Communication pattern.
    #[arg(long, value_enum, default_value = "alltoall")]
    pattern: Pattern,
    /// Laps of the ring, or rounds of all-to-all.
    #[arg(long)]
    rounds: Option<usize>,
    /// Units of computation between all-to-all rounds (each about a microsecond).
    #[arg(long, default_value_t = 50)]
    compute: u64,
    /// Run a CPU-burning process on the host during the measurement (the seed's noise VM).
    #[arg(long)]
    noise: bool,
    /// Run a second job of the same shape (same ranks, pattern and compute) beside the measured one for
    /// the whole measurement: `vmfabric` (this benchmark under `vmfabric run`) or `mpich` (its MPI twin
    /// bench/c/mpi_overcommit.c built with mpicc.mpich, under mpiexec.mpich; the binary is
    /// $VMF_BENCH_MPICH_OVERCOMMIT, default bench/build/mpi_overcommit.mpich as `make bench` builds it).
    #[arg(long, value_enum)]
    neighbours: Option<Neighbours>,
}

/// The job that runs beside the measured one.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum, Debug)]
pub enum Neighbours {
    /// Another vmfabric job.
    Vmfabric,
    /// An MPICH job.
    Mpich,
}

/// Start the neighbour job: the same pattern for far more rounds than the measurement needs (it is
/// stopped when the measurement ends).
fn start_neighbour(k: Neighbours, a: &OvercommitArgs, n: usize) -> std::io::Result<std::process::Child> {
    let pat = match a.pattern {
        Pattern::Ring => "ring",
        Pattern::Alltoall => "alltoall",
    };
    let rounds = (a.rounds.unwrap_or(10000) * 1000).to_string();
    let compute = a.compute.to_string();
    let mut c = match k {
        Neighbours::Vmfabric => {
            let exe = std::env::current_exe()?;
            let mut c = std::process::Command::new(&exe);
            c.args(["run", "--quiet", "-n", &n.to_string()])
                .arg(&exe)
                .args(["bench", "overcommit", "--pattern", pat, "--rounds", &rounds, "--compute", &compute]);
            c
        }
        Neighbours::Mpich => {
            let prog = std::env::var("VMF_BENCH_MPICH_OVERCOMMIT")
                .unwrap_or_else(|_| "bench/build/mpi_overcommit.mpich".into());
            if !std::path::Path::new(&prog).exists() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{prog} does not exist (make bench builds it; or set VMF_BENCH_MPICH_OVERCOMMIT)"),
                ));
            }
            let mut c = std::process::Command::new("mpiexec.mpich");
            c.args(["-n", &n.to_string(), &prog, "--pattern", pat, "--rounds", &rounds, "--compute", &compute]);
            // Its own library, not ours.
            c.env_remove("LD_LIBRARY_PATH");
            c
        }
    };
    // Not part of this job: no inherited PMI or fabric settings.
    for (k, _) in std::env::vars() {
        if k.starts_with("PMI_") || k.starts_with("VMF_") || k.starts_with("MPI_LOCAL") {
            c.env_remove(k);
        }
    }
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
}

/// About a microsecond of arithmetic that the optimiser cannot remove.
fn compute(units: u64) -> u64 {
    let mut x = 0x9E3779B97F4A7C15u64;
    for _ in 0..units * 750 {
        x = std::hint::black_box(x)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
    std::hint::black_box(x)
}

pub fn run(a: OvercommitArgs, json: Option<std::path::PathBuf>) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric bench overcommit: {e}");
            return 1;
        }
    };
    if f.size() < 2 {
        eprintln!("vmfabric bench overcommit: needs at least 2 ranks (vmfabric run -n K ...)");
        return 2;
    }
    let mut noise = None;
    if a.noise && f.rank() == 0 {
        match std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
        {
            Ok(c) => noise = Some(c),
            Err(e) => eprintln!("vmfabric bench overcommit: cannot start the noise process: {e}"),
        }
    }
    let mut neighbour = None;
    if let (Some(k), 0) = (a.neighbours, f.rank()) {
        match start_neighbour(k, &a, f.size()) {
            Ok(c) => neighbour = Some(c),
            Err(e) => {
                eprintln!("vmfabric bench overcommit: cannot start the {k:?} neighbour job: {e}");
                f.abort(1, "no neighbour job");
            }
        }
        // Let it start up before the measurement begins.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let r = measure(&f, &a, json.as_deref());
    if let Some(mut c) = noise {
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Some(mut c) = neighbour {
        // SAFETY: signalling our own child (both launchers stop their job on SIGTERM).
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
    }
    match r {
        Ok(()) => match f.finalize() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("vmfabric bench overcommit: {e}");
                1
            }
        },
        Err(e) => {
            eprintln!("vmfabric bench overcommit: rank {}: {e}", f.rank());
            f.abort(1, "benchmark failed")
        }
    }
}

fn measure(f: &Fabric, a: &OvercommitArgs, json: Option<&std::path::Path>) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    let rounds = a.rounds.unwrap_or(match a.pattern {
        Pattern::Ring => 10000,
        Pattern::Alltoall => 2000,
    });
    let small = [1u8; 64];
    let medium = vec![2u8; 8192];
    let mut rs = vec![vec![0u8; 64]; n];
    let mut rm = vec![vec![0u8; 8192]; n];
    f.barrier()?;
    let cpu0 = vmf_pal::process::cpu_time_s();
    let t0 = Instant::now();
    match a.pattern {
        Pattern::Ring => {
            let mut tok = [0u8; 8];
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for lap in 0..rounds as u64 {
                if me == 0 {
                    f.send(&lap.to_le_bytes(), next, 1)?;
                    f.recv(&mut tok, Source::Rank(prev), TagSel::Tag(1))?;
                    if u64::from_le_bytes(tok) != lap {
                        return Err(Error::Setup {
                            rank: me,
                            op: vmf_core::Op::Recv,
                            why: "token corrupted".into(),
                        });
                    }
                } else {
                    f.recv(&mut tok, Source::Rank(prev), TagSel::Tag(1))?;
                    f.send(&tok, next, 1)?;
                }
            }
        }
        Pattern::Alltoall => {
            let mut ids = Vec::with_capacity(4 * n);
            for _ in 0..rounds {
                let mut e = f.engine();
                ids.clear();
                for p in (0..n).filter(|&p| p != me) {
                    // SAFETY: every buffer outlives the requests, completed before the next round.
                    unsafe {
                        ids.push(e.irecv(rs[p].as_mut_ptr(), 64, p as i64, 2, 0)?);
                        ids.push(e.irecv(rm[p].as_mut_ptr(), 8192, p as i64, 3, 0)?);
                    }
                }
                for k in 1..n {
                    let p = (me + k) % n;
                    // SAFETY: as above.
                    unsafe {
                        ids.push(e.isend(
                            small.as_ptr(),
                            64,
                            p as i64,
                            2,
                            0,
                            SendMode::Standard,
                        )?);
                        ids.push(e.isend(
                            medium.as_ptr(),
                            8192,
                            p as i64,
                            3,
                            0,
                            SendMode::Standard,
                        )?);
                    }
                }
                e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&id| e.is_done(id)))?;
                for &id in &ids {
                    e.take(id)?;
                }
                drop(e);
                compute(a.compute);
            }
            if rs.iter().enumerate().any(|(p, b)| p != me && b[0] != 1)
                || rm.iter().enumerate().any(|(p, b)| p != me && b[8191] != 2)
            {
                return Err(Error::Setup {
                    rank: me,
                    op: vmf_core::Op::Recv,
                    why: "payload mismatch".into(),
                });
            }
        }
    }
    f.barrier()?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = vmf_pal::process::cpu_time_s() - cpu0;
    // Sum CPU time on rank 0.
    let mut total = cpu;
    if me == 0 {
        let mut b = [0u8; 8];
        for p in 1..n {
            f.recv(&mut b, Source::Rank(p), TagSel::Tag(9))?;
            total += f64::from_le_bytes(b);
        }
    } else {
        f.send(&cpu.to_le_bytes(), 0, 9)?;
    }
    if me == 0 {
        let wait = std::env::var("VMF_WAIT").unwrap_or_else(|_| "adaptive".into());
        let pat = match a.pattern {
            Pattern::Ring => "ring",
            Pattern::Alltoall => "alltoall",
        };
        println!(
            "overcommit {pat}: {n} ranks on {} cpus, wait {wait}{}: wall {wall:.4} s, cpu {total:.4} s, {:.2} us/round ({rounds} rounds, {} sleeps on rank 0)",
            vmf_pal::available_cpus(),
            match (a.noise, a.neighbours) {
                (true, _) => ", with noise".to_string(),
                (false, Some(k)) => format!(", beside a {} job", format!("{k:?}").to_lowercase()),
                _ => String::new(),
            },
            wall * 1e6 / rounds as f64,
            f.engine().waiter().sleeps
        );
        if let Some(path) = json {
            let doc = serde_json::json!({"benchmark": "overcommit", "pattern": pat, "ranks": n, "wait": wait,
                "wall_s": wall, "cpu_s": total, "rounds": rounds, "us_per_round": wall * 1e6 / rounds as f64, "noise": a.noise, "neighbours": a.neighbours.map(|k| format!("{k:?}").to_lowercase()), "implementation": "vmfabric"});
            std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n").map_err(
                |e| Error::Setup {
                    rank: me,
                    op: vmf_core::Op::Finalize,
                    why: format!("cannot write {}: {e}", path.display()),
                },
            )?;
        }
    }
    Ok(())
}
