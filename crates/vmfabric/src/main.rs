//! `vmfabric`: the command line of the fabric — run jobs, clean stale regions, show configuration, benchmark.
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod bench;
mod dvm_cli;
mod info;
mod migrate_bench;
mod mtx_bench;
mod mtx_cli;
mod rma_bench;
mod overcommit;
mod selftest;
mod selftest_rma;
mod sweep;
mod vnic_cli;
mod wakeup_bench;
mod vm_cli;

#[derive(Parser)]
#[command(
    name = "vmfabric",
    version,
    about = "Message-passing fabric for virtual worker nodes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start N ranks of PROGRAM on this host with a PMI-1 bootstrap channel.
    Run {
        /// Number of ranks.
        #[arg(short = 'n', long = "np", default_value_t = 1)]
        np: usize,
        /// Prefix every output line with "[rank] ".
        #[arg(long)]
        tag_output: bool,
        /// Directory for the shared regions (default: $VMF_REGION_DIR or /dev/shm).
        #[arg(long)]
        region_dir: Option<PathBuf>,
        /// Print setup decisions (job id, regions, channels).
        #[arg(short, long)]
        verbose: bool,
        /// Print nothing of our own unless the job fails (no job-id line), as mpiexec does; for test
        /// harnesses that compare a program's whole output.
        #[arg(short, long, conflicts_with = "verbose")]
        quiet: bool,
        /// How waiting ranks use the CPU (sets VMF_WAIT for every rank).
        #[arg(long, value_parser = ["spin", "yield", "block", "adaptive"])]
        wait: Option<String>,
        /// CPU binding (sets VMF_BIND): auto pins a host's ranks in blocks when they outnumber its CPUs;
        /// core always pins (one CPU each while there are enough); none leaves placement to the kernel.
        /// Default: VMF_BIND if set, else auto.
        #[arg(long, value_parser = ["auto", "core", "none"])]
        bind: Option<String>,
        /// Place ranks on this many emulated hosts (network namespaces joined by a bridge; needs root). Hosts
        /// beyond the ranks start empty (destinations for `vmfabric migrate`).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=250))]
        hosts: Option<u16>,
        /// Placement on hosts: round robin (rr) or consecutive blocks (block).
        #[arg(long, value_parser = ["rr", "block"], default_value = "rr")]
        map: String,
        /// Universe size the ranks are told (MPI_UNIVERSE_SIZE: how many processes MPI_Comm_spawn may
        /// usefully add); at least -n. Default: $VMF_UNIVERSE_SIZE, else not set (as under Hydra).
        #[arg(long)]
        universe_size: Option<usize>,
        /// Program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Remove shared regions left behind by dead jobs.
    Clean {
        /// Directory to clean (default: $VMF_REGION_DIR or /dev/shm).
        #[arg(long)]
        region_dir: Option<PathBuf>,
    },
    /// List the running jobs (id, launcher, ranks, hosts, placement).
    Jobs {
        /// Registry directory (default: $VMF_REGION_DIR or /dev/shm).
        #[arg(long)]
        region_dir: Option<PathBuf>,
    },
    /// Move a running rank to another emulated host, live.
    Migrate {
        /// Job id (printed by `vmfabric run`, listed by `vmfabric jobs`).
        #[arg(long)]
        job: String,
        /// Rank to move.
        #[arg(long)]
        rank: usize,
        /// Destination host index.
        #[arg(long = "to-host")]
        to_host: usize,
    },
    /// Show transports, the region directory, region memory and every tunable.
    Info {
        /// Report region memory for this many co-resident ranks (default: 2, 4, 8, 16).
        #[arg(long)]
        ranks: Option<usize>,
        /// Print only the directory holding libmpich.so.12 (for LD_LIBRARY_PATH).
        #[arg(long)]
        libdir: bool,
        /// Print only the directory holding mpi.h and vmfabric/mtx.h (for -I).
        #[arg(long, conflicts_with = "libdir")]
        incdir: bool,
        /// Measure how large messages move fastest between co-resident ranks on this host (eager limit,
        /// pipeline chunk, pipelined or single copy per size), print the curves and cache the choice
        /// (VMF_CALIBRATION) for every later job.
        #[arg(long, conflicts_with_all = ["libdir", "incdir"])]
        calibrate: bool,
    },
    /// Benchmarks (run inside a job: `vmfabric run -n 2 vmfabric bench latency`).
    Bench(bench::BenchArgs),
    /// Minitransaction stores that outlive processes (`vmfabric mtx create PATH --nodes N --bytes B`).
    Mtx(mtx_cli::MtxArgs),
    /// The distributed virtual machine: run DASS applications (`vmfabric dvm run APPDIR`).
    Dvm(dvm_cli::DvmArgs),
    /// The virtual NIC over emulated message-passing hardware (`vmfabric vnic up --nodes N`).
    Vnic(vnic_cli::VnicArgs),
    /// Run an MPI benchmark over the vnic for every combination of a sweep file's parameters (and over a
    /// veth bridge as the baseline); CSV and plots at the end; resumes after an interruption.
    Sweep(sweep::SweepArgs),
    /// Jobs across real QEMU guests sharing an ivshmem region (`vmfabric vm run --vms 2 -n 2 PROG`).
    Vm(vm_cli::VmArgs),
    /// Rank programs for the integration tests.
    #[command(hide = true)]
    Selftest(selftest::SelftestArgs),
}

fn default_region_dir(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| {
            std::env::var_os("VMF_REGION_DIR")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Run {
            np,
            tag_output,
            region_dir,
            verbose,
            quiet,
            wait,
            bind,
            hosts,
            map,
            universe_size,
            command,
        } => 'run: {
            let mut extra_env = Vec::new();
            if verbose {
                extra_env.push(("VMF_VERBOSE".into(), "1".into()));
            }
            if let Some(w) = wait {
                extra_env.push(("VMF_WAIT".into(), w));
            }
            let universe_size = match universe_size {
                Some(u) => Some(u),
                None => match std::env::var("VMF_UNIVERSE_SIZE") {
                    Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
                        Ok(u) => Some(u),
                        Err(_) => {
                            eprintln!(
                                "vmfabric: Unable to start the job since VMF_UNIVERSE_SIZE={v} is not a number"
                            );
                            break 'run 2;
                        }
                    },
                    _ => None,
                },
            };
            if np >= 2 {
                info::calibrate_on_first_use(verbose);
            }
            let opts = vmf_launch::RunOptions {
                np,
                program: command[0].clone(),
                args: command[1..].to_vec(),
                tag_output,
                region_dir: default_region_dir(region_dir),
                verbose,
                quiet,
                extra_env,
                bind_cores: bind
                    .clone()
                    .or_else(|| std::env::var("VMF_BIND").ok())
                    .is_some_and(|b| b == "core"),
                bind,
                hosts: hosts.map_or(0, usize::from),
                map_block: map == "block",
                placement: None,
                universe_size,
            };
            match vmf_launch::run(&opts) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("vmfabric: {e}");
                    2
                }
            }
        }
        Cmd::Clean { region_dir } => {
            let dir = default_region_dir(region_dir);
            let removed = vmf_launch::clean(&dir);
            for p in &removed {
                println!("removed {}", p.display());
            }
            println!(
                "{} stale region(s) removed from {}",
                removed.len(),
                dir.display()
            );
            0
        }
        Cmd::Jobs { region_dir } => {
            let dir = default_region_dir(region_dir);
            let jobs: Vec<_> = vmf_launch::control::list(&dir)
                .into_iter()
                .filter(|(_, alive)| *alive)
                .collect();
            if jobs.is_empty() {
                println!("no running jobs (registry {})", dir.display());
            }
            for (j, _) in jobs {
                let place = if j.hosts.is_empty() {
                    "one host".to_string()
                } else {
                    let p: Vec<String> = j
                        .placement
                        .iter()
                        .enumerate()
                        .map(|(r, h)| format!("{r}@{h}"))
                        .collect();
                    format!("{} hosts, ranks {}", j.hosts.len(), p.join(" "))
                };
                println!(
                    "{}  launcher pid {}  {} ranks  {place}",
                    j.job, j.launcher.pid, j.ranks
                );
            }
            0
        }
        Cmd::Migrate { job, rank, to_host } => {
            match vmf_launch::control::request_migration(&job, rank, to_host) {
                Ok(r) if r.starts_with("ok") => {
                    println!(
                        "rank {rank} of job {job} moved to host {to_host} ({})",
                        r.trim_start_matches("ok").trim()
                    );
                    0
                }
                Ok(r) => {
                    eprintln!(
                        "vmfabric migrate: {}",
                        r.trim_start_matches("error:")
                            .trim_start_matches("error")
                            .trim()
                    );
                    1
                }
                Err(e) => {
                    eprintln!("vmfabric migrate: {e}");
                    1
                }
            }
        }
        Cmd::Info {
            ranks,
            libdir,
            incdir,
            calibrate,
        } => {
            if calibrate {
                info::calibrate()
            } else if libdir {
                println!("{}", vmf_launch::mpi_libdir().display());
                0
            } else if incdir {
                println!("{}", vmf_launch::mpi_libdir().with_file_name("include").display());
                0
            } else {
                info::run(ranks)
            }
        }
        Cmd::Bench(a) => bench::run(a),
        Cmd::Mtx(a) => mtx_cli::run(a),
        Cmd::Dvm(a) => dvm_cli::run(a),
        Cmd::Vnic(a) => vnic_cli::run(a),
        Cmd::Sweep(a) => sweep::run(a),
        Cmd::Vm(a) => vm_cli::run(a),
        Cmd::Selftest(a) => selftest::run(a),
    };
    std::process::exit(code);
}
