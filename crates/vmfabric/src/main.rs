//! `vmfabric`: the command line of the fabric — run jobs, clean stale regions, show configuration, benchmark.
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod bench;
mod info;
mod overcommit;
mod selftest;

#[derive(Parser)]
#[command(name = "vmfabric", version, about = "Message-passing fabric for virtual worker nodes")]
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
        /// How waiting ranks use the CPU (sets VMF_WAIT for every rank).
        #[arg(long, value_parser = ["spin", "yield", "block", "adaptive"])]
        wait: Option<String>,
        /// Pin ranks to cores (rank r on the r-th allowed CPU, round robin) or not.
        #[arg(long, value_parser = ["none", "core"], default_value = "none")]
        bind: String,
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
    /// Show transports, the region directory, region memory and every tunable.
    Info {
        /// Report region memory for this many co-resident ranks (default: 2, 4, 8, 16).
        #[arg(long)]
        ranks: Option<usize>,
        /// Print only the directory holding libmpich.so.12 (for LD_LIBRARY_PATH).
        #[arg(long)]
        libdir: bool,
    },
    /// Benchmarks (run inside a job: `vmfabric run -n 2 vmfabric bench latency`).
    Bench(bench::BenchArgs),
    /// Rank programs for the integration tests.
    #[command(hide = true)]
    Selftest(selftest::SelftestArgs),
}

fn default_region_dir(given: Option<PathBuf>) -> PathBuf {
    given
        .or_else(|| std::env::var_os("VMF_REGION_DIR").filter(|v| !v.is_empty()).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Run { np, tag_output, region_dir, verbose, wait, bind, command } => {
            let mut extra_env = Vec::new();
            if verbose {
                extra_env.push(("VMF_VERBOSE".into(), "1".into()));
            }
            if let Some(w) = wait {
                extra_env.push(("VMF_WAIT".into(), w));
            }
            let opts = vmf_launch::RunOptions {
                np,
                program: command[0].clone(),
                args: command[1..].to_vec(),
                tag_output,
                region_dir: default_region_dir(region_dir),
                verbose,
                extra_env,
                bind_cores: bind == "core",
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
            println!("{} stale region(s) removed from {}", removed.len(), dir.display());
            0
        }
        Cmd::Info { ranks, libdir } => {
            if libdir {
                println!("{}", vmf_launch::mpi_libdir().display());
                0
            } else {
                info::run(ranks)
            }
        }
        Cmd::Bench(a) => bench::run(a),
        Cmd::Selftest(a) => selftest::run(a),
    };
    std::process::exit(code);
}
