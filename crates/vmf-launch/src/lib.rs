//! The vmfabric job launcher: what `vmfabric run` and `vmfabric clean` do.
//!
//! [`run`] starts `np` copies of a program on this host, serves them PMI-1 over an inherited socket
//! (`PMI_FD`, the way Hydra does), forwards their stdout/stderr line by line (optionally tagged `[rank] `),
//! watches them, stops the whole job within a second when one rank fails or aborts, and removes the job's
//! shared-memory region files however the job ends. [`clean`] removes region files left behind by dead jobs.
//!
//! Environment of every rank (besides the launcher's own environment, minus `PMI_PORT`/`PMI_ID`):
//!
//! | variable | value |
//! |---|---|
//! | `PMI_FD` | descriptor number of the rank's end of its PMI socket |
//! | `PMI_RANK`, `PMI_SIZE` | rank and number of ranks |
//! | `PMI_JOBID` | the key-value space name, `vmf-<jobid>` |
//! | `VMF_JOB_ID` | 12 random hex digits naming the job (its region is `vmf-<jobid>.shm`) |
//! | `VMF_LAUNCHER_PID`, `VMF_LAUNCHER_START` | pid and start time (clock ticks) of the launcher |
//! | `VMF_REGION_DIR` | the region directory |
//! | `VMF_LOCAL_SIZE`, `MPI_LOCALNRANKS` | ranks on this host (`np`) |
//! | `VMF_HOST_CPUS` | CPUs in the launcher's affinity mask (for the waiting policy) |
//! | `VMF_MACHINE_RANKS` | ranks this launch starts on this machine (for the waiting policy) |
//! | `MPI_LOCALRANKID` | the rank's index on this host (its rank) |
//! | `VMF_CTL_FD` | the rank's control socket (migration requests) |
//!
//! then [`RunOptions::extra_env`], which may override any of these. Every rank's stdin is `/dev/null`.
//! The PMI server answers `get_universe_size` with [`RunOptions::universe_size`] (-1, not known, when
//! none is given, as Hydra without `-usize`) and `get_appnum` with the rank's application number.
//!
//! # Spawned jobs (MPI_Comm_spawn)
//!
//! A rank's PMI-1 spawn request (`mcmd=spawn`, see [`vmf_pmi::SpawnCmd`]) starts a new job of
//! `sum(maxprocs)` processes on this machine, K-th of the run (K = 1, 2, ...; spawned processes may spawn
//! too). Its key-value space `vmf-<jobid>-sK` holds the request's preputs (MPICH's
//! `PARENT_ROOT_PORT_NAME`) before its processes start; the processes of command `i` have application
//! number `i`. They get the environment above with `PMI_RANK`/`PMI_SIZE`/`PMI_JOBID`/`VMF_LOCAL_SIZE`/
//! `MPI_LOCAL*` of the new job, `VMF_JOB_ID=<jobid>-sK` (their own region, `vmf-<jobid>-sK.shm`, removed
//! with the job's), `PMI_SPAWNED=1`, `VMF_MACHINE_RANKS` counting every process then running, and no
//! `VMF_CTL_FD` (only the first job's ranks migrate). Info keys: `wdir` (working directory), `path`
//! (`:`-separated directories searched for the program before `PATH`), `host`/`hosts` (comma-separated; with
//! `--hosts`: `hostK`, `K` or the host's address, round robin; without: this machine only); others are
//! ignored. By default they start on the spawning process's current host. With `--tag-output` their lines
//! are tagged `[sK.rank] `. A request that cannot be met (program not found or not executable, bad
//! `wdir`, unknown host, more than [`MAX_RANKS`] processes running) starts nothing and is answered with
//! `rc=-1` and why; the job goes on. Spawned processes are watched like the first job's ranks: the run
//! ends when every process has exited, a spawned process that fails or aborts stops everything (naming it
//! `spawned job K rank R (program, pid N)`), and Ctrl-C stops them all.
//!
//! Each rank starts a session of its own (`setsid`), as Hydra's ranks do: with the kernel's autogroup
//! scheduling (Debian's default) every session is one scheduling group, so a job whose ranks shared the
//! caller's session would get one share of a busy host's CPUs where an MPICH job gets one per rank (NPB EP
//! beside a CPU-bound job: 1.4-1.9x slower before). Not when the ranks outnumber the CPUs: then they share
//! the launcher's session, because a rank waiting for the rank that shares its CPU yields to it, and
//! `sched_yield` only passes the CPU within one scheduling group. A terminal's Ctrl-C reaches the launcher,
//! which stops the ranks (SIGTERM, then SIGKILL); ranks in the launcher's session get it directly too.
//! Ranks get `PR_SET_PDEATHSIG(SIGKILL)`, so they die if the launcher is killed with `kill -9`. Because the kernel
//! ties that signal to the *thread* that spawned them, call [`run`] from a thread that lives until it
//! returns (normally the main thread). A rank that initialised PMI must call `finalize` before exiting;
//! closing the PMI connection early while other ranks run stops the job, as Hydra does.
//!
//! # Examples
//! ```no_run
//! use vmf_launch::{run, RunOptions};
//! let opts = RunOptions::new(4, "./my_app", vec!["--size".into(), "1M".into()]);
//! let code = match run(&opts) {
//!     Ok(code) => code,
//!     Err(e) => {
//!         eprintln!("vmfabric: {e}");
//!         1
//!     }
//! };
//! std::process::exit(code);
//! ```
#![warn(missing_docs)]

pub mod control;
pub mod hosts;
mod output;
pub mod signals;
mod spawn;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thiserror::Error;
use vmf_pal::process::{set_parent_death_signal, ProcessId};
use vmf_pmi::{serve_connection, JobKvs, PmiEvent, SpawnCmd};
use vmf_transport::shm::region::{scan_regions, FILE_PREFIX};

/// Largest number of ranks [`run`] accepts, and of processes (ranks and spawned processes) running at once.
pub const MAX_RANKS: usize = 4096;
/// Region directory used when none is given: `/dev/shm`.
pub const DEFAULT_REGION_DIR: &str = "/dev/shm";
/// Region files younger than this are never removed by [`clean`] (their job may still be starting).
pub const CLEAN_GRACE: Duration = Duration::from_secs(2);

/// Grace between SIGTERM and SIGKILL when a rank failed or aborted.
const FAIL_GRACE: Duration = Duration::from_millis(500);
/// Grace between SIGTERM and SIGKILL when the launcher itself was signalled.
const SIGNAL_GRACE: Duration = Duration::from_secs(1);
/// How long a rank that dropped its PMI connection without finalize may take to show its exit status.
const DISCONNECT_GRACE: Duration = Duration::from_millis(300);
/// After a failure is seen, how long to wait for a more telling cause (an abort, a launcher signal).
const SETTLE: Duration = Duration::from_millis(50);
/// Polling period of the monitor loop.
const POLL: Duration = Duration::from_millis(10);

/// What [`run`] starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Number of ranks (1..=[`MAX_RANKS`]).
    pub np: usize,
    /// Program to run (a path, or a name looked up in `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Prefix every output line with `[rank] `.
    pub tag_output: bool,
    /// Directory of shared-memory region files (created with mode 0700 if missing).
    pub region_dir: PathBuf,
    /// Also print the region directory (and let ranks report their setup: VMF_VERBOSE).
    pub verbose: bool,
    /// No job-id line on stderr.
    pub quiet: bool,
    /// Extra environment variables for every rank (applied last, so they override the launcher's).
    pub extra_env: Vec<(String, String)>,
    /// Pin every rank to a CPU before it starts (`--bind core`).
    pub bind_cores: bool,
    /// `--bind` as given (auto, core or none), passed to the ranks as `VMF_BIND` (None: their
    /// environment decides).
    pub bind: Option<String>,
    /// Emulated hosts (network namespaces); 0: every rank on this host, no namespaces.
    pub hosts: usize,
    /// Placement on hosts: block (consecutive ranks together) instead of round robin.
    pub map_block: bool,
    /// The host of each rank, when the caller decides it (e.g. `vmfabric dvm run` from nodes.txt);
    /// overrides `map_block`. Every entry must be below `hosts`.
    pub placement: Option<Vec<usize>>,
    /// The universe size the ranks are told (`MPI_UNIVERSE_SIZE`, PMI `get_universe_size`); None: not
    /// known (answered as -1, as Hydra does without `-usize`). At least `np`, at most [`MAX_RANKS`].
    pub universe_size: Option<usize>,
}

/// The directory holding vmfabric's `libmpich.so.12`: `lib/` beside the running executable.
pub fn mpi_libdir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.join("lib")))
        .unwrap_or_else(|| PathBuf::from("lib"))
}

impl RunOptions {
    /// Options with defaults: no tagging, region directory [`DEFAULT_REGION_DIR`], not verbose, no extra
    /// environment.
    pub fn new(np: usize, program: impl Into<String>, args: Vec<String>) -> Self {
        RunOptions {
            np,
            program: program.into(),
            args,
            tag_output: false,
            region_dir: PathBuf::from(DEFAULT_REGION_DIR),
            verbose: false,
            quiet: false,
            extra_env: Vec::new(),
            bind_cores: false,
            bind: None,
            hosts: 0,
            map_block: false,
            placement: None,
            universe_size: None,
        }
    }
}

/// Why a job could not be run. The message is one line of the form "Unable to X since Y".
#[derive(Debug, Error)]
pub enum LaunchError {
    /// The options are invalid (np out of range, empty program).
    #[error("Unable to start the job since {0}")]
    InvalidOptions(String),
    /// The region directory is unusable.
    #[error("Unable to use the region directory {dir} since {why}")]
    RegionDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A rank could not be started (no such program, not executable, ...).
    #[error("Unable to start rank {rank} ({program}) since {why}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// What went wrong.
        why: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Another system resource (socket, thread, random numbers) was unavailable.
    #[error("Unable to {what} since {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Run the job described by `opts` and return the exit status the CLI must exit with: 0 when every rank
/// exits 0; the code of the first rank that fails (128 + signal number when it was killed by a signal); the
/// code passed to PMI abort; 128 + signal when the launcher itself gets SIGINT, SIGTERM or SIGHUP. On a
/// failure the remaining ranks get SIGTERM, then SIGKILL after 500 ms, and one line explaining why is
/// printed to stderr. Region files of the job are removed on every path; stale regions of dead jobs in
/// the region directory are removed before starting.
///
/// Errors (`Err`) are reserved for jobs that cannot start (invalid options, unusable region directory,
/// program not found); ranks already started are stopped first.
pub fn run(opts: &RunOptions) -> Result<i32, LaunchError> {
    if opts.np == 0 || opts.np > MAX_RANKS {
        return Err(LaunchError::InvalidOptions(format!(
            "the number of ranks {} is not within 1..={MAX_RANKS}",
            opts.np
        )));
    }
    if opts.program.is_empty() {
        return Err(LaunchError::InvalidOptions(
            "no program to run was given".into(),
        ));
    }
    let universe = match opts.universe_size {
        // Not known unless given (MPICH's Hydra without -usize): MPI_UNIVERSE_SIZE is then not set.
        None => 0,
        Some(u) if u < opts.np || u > MAX_RANKS => {
            return Err(LaunchError::InvalidOptions(format!(
                "the universe size {u} is not within {}..={MAX_RANKS} (at least the number of ranks)",
                opts.np
            )))
        }
        Some(u) => u,
    };
    check_ranks_per_host(opts)?;
    // Directories made for the job are removed when it ends (dropped last, after the teardown).
    let _made = prepare_region_dir(&opts.region_dir)?;
    let _ = clean(&opts.region_dir);
    let jobid = new_job_id()?;
    let topo = if opts.hosts > 0 {
        Some(hosts::Topology::create(
            &jobid,
            opts.hosts,
            &opts.region_dir,
        )?)
    } else {
        None
    };
    if let Some(p) = &opts.placement {
        if p.len() != opts.np || p.iter().any(|&h| h >= opts.hosts.max(1)) {
            return Err(LaunchError::InvalidOptions(format!(
                "the placement {p:?} does not give each of {} ranks one of {} hosts",
                opts.np,
                opts.hosts.max(1)
            )));
        }
    }
    let placement: Vec<usize> = (0..opts.np)
        .map(|r| match opts.hosts {
            _ if opts.placement.is_some() => opts.placement.as_ref().map_or(0, |p| p[r]),
            0 => 0,
            h if opts.map_block => r / opts.np.div_ceil(h),
            h => r % h,
        })
        .collect();
    let info = control::JobInfo {
        job: jobid.clone(),
        launcher: ProcessId::current(),
        ranks: opts.np,
        hosts: topo.as_ref().map_or(Vec::new(), |t| {
            t.hosts
                .iter()
                .map(|h| (h.netns.clone(), h.dir.display().to_string(), h.ip.clone()))
                .collect()
        }),
        placement: placement.clone(),
        path: control::registry_path(&opts.region_dir, &jobid),
    };
    let _ = info.save();
    let info = Arc::new(std::sync::Mutex::new(info));
    let kvs = JobKvs::new(&format!("vmf-{jobid}"), opts.np).with_universe_size(universe);
    let rank_ctl: control::RankCtl =
        Arc::new(std::sync::Mutex::new((0..opts.np).map(|_| None).collect()));
    if let Err(e) = control::serve(info.clone(), rank_ctl.clone()) {
        eprintln!(
            "vmfabric: warning: no control socket for job {jobid} ({e}); migrate will not reach it"
        );
    }
    // Announced once `vmfabric migrate` can reach the job.
    if !opts.quiet {
        eprintln!(
            "vmfabric: job {jobid}: {} ranks{}",
            opts.np,
            if opts.hosts > 0 {
                format!(" on {} emulated hosts", opts.hosts)
            } else {
                String::new()
            }
        );
    }
    if opts.verbose {
        eprintln!(
            "vmfabric: job {jobid}: region dir {}",
            opts.region_dir.display()
        );
    }
    let _signals = signals::Guard::install();
    let (tx, rx) = mpsc::channel();
    let mut job = Job {
        opts,
        jobs: vec![PmiJob {
            id: jobid.clone(),
            kvs: Arc::new(kvs),
        }],
        jobid,
        universe,
        procs: Vec::with_capacity(opts.np),
        pmi_socks: Vec::with_capacity(opts.np),
        pmi_threads: Vec::with_capacity(opts.np),
        fwd: output::Forwarders::new(),
        tx,
        rx,
        topo,
        placement,
        info,
        rank_ctl,
    };
    let res = job.start().map(|()| job.monitor());
    job.teardown();
    res
}

/// Remove the region files of dead jobs in `dir` (those [`scan_regions`] reports stale, older than
/// [`CLEAN_GRACE`]); returns the paths removed. A missing or unreadable directory removes nothing.
pub fn clean(dir: &Path) -> Vec<PathBuf> {
    let mut removed: Vec<PathBuf> = scan_regions(dir, CLEAN_GRACE)
        .into_iter()
        .filter(|f| f.stale)
        .filter_map(|f| std::fs::remove_file(&f.path).ok().map(|()| f.path))
        .collect();
    // Jobs whose launcher died: their namespaces, host directories and registry file.
    for (j, alive) in control::list(dir) {
        if !alive {
            hosts::remove_leftovers(&j.job, dir);
            for p in remove_job_files(dir, &j.job) {
                removed.push(p);
            }
        }
    }
    removed
}

/// Refuse, before anything starts, a job that puts more ranks on one host than its shared region has slots
/// (`VMF_SHM_MAX_LOCAL`, default 256, as the ranks will read it): otherwise every rank beyond would fail at
/// start-up with a PMI error of its own, burying the cause.
fn check_ranks_per_host(opts: &RunOptions) -> Result<(), LaunchError> {
    let var = "VMF_SHM_MAX_LOCAL";
    let given = opts
        .extra_env
        .iter()
        .rev()
        .find(|(k, _)| k == var)
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var(var).ok());
    // A value the ranks cannot parse is reported by the ranks, naming the variable.
    let Some(limit) = given.map_or(Some(256), |v| v.trim().parse::<usize>().ok()) else {
        return Ok(());
    };
    // Round robin and block placement both put at most ceil(np / hosts) ranks on a host.
    let most = opts.np.div_ceil(opts.hosts.max(1));
    if most > limit {
        let on = if opts.hosts > 0 {
            format!("on one of the {} emulated hosts", opts.hosts)
        } else {
            "on this host".to_string()
        };
        return Err(LaunchError::InvalidOptions(format!(
            "{most} ranks {on} exceed the {limit} ranks one shared region holds ({var}); raise {var} or spread the ranks over more hosts (--hosts)"
        )));
    }
    Ok(())
}

/// Directories the launcher made for a region directory that did not exist (innermost first); removed,
/// if empty, when dropped, so a mistyped `VMF_REGION_DIR` leaves nothing behind.
struct MadeDirs(Vec<PathBuf>);

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            if std::fs::remove_dir(d).is_err() {
                break; // not empty (something else put files there): keep it and its parents
            }
        }
    }
}

fn prepare_region_dir(dir: &Path) -> Result<MadeDirs, LaunchError> {
    let bad = |why: String| LaunchError::RegionDir {
        dir: dir.to_path_buf(),
        why,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(MadeDirs(Vec::new())),
        Ok(_) => Err(bad("it is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Note which of its ancestors are missing too, to remove exactly what is made here.
            let made: Vec<PathBuf> = dir
                .ancestors()
                .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
                .map(Path::to_path_buf)
                .collect();
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| bad(format!("it does not exist and cannot be created: {e}")))?;
            Ok(MadeDirs(made))
        }
        Err(e) => Err(bad(e.to_string())),
    }
}

fn new_job_id() -> Result<String, LaunchError> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).map_err(|e| LaunchError::Io {
        what: "create a job id".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Remove `<dir>/vmf-<jobid>*`; returns the paths removed.
fn remove_job_files(dir: &Path, jobid: &str) -> Vec<PathBuf> {
    let prefix = format!("{FILE_PREFIX}{jobid}");
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| std::fs::remove_file(e.path()).ok().map(|()| e.path()))
        .collect()
}

enum Msg {
    /// An event of the process with this index in `Job::procs`.
    Pmi(usize, PmiEvent),
    /// The PMI handler of the process with this index has ended.
    PmiDone(usize),
}

/// One PMI job of the run: the job `vmfabric run` started (index 0), or one started by a spawn request
/// (index K: `VMF_JOB_ID` `<jobid>-sK`, key-value space `vmf-<jobid>-sK`).
struct PmiJob {
    /// The `VMF_JOB_ID` of its processes.
    id: String,
    kvs: Arc<JobKvs>,
}

/// One process of the run (a rank of one of its PMI jobs).
struct RankProc {
    child: Child,
    pid: i32,
    status: Option<ExitStatus>,
    /// Index of its PMI job in `Job::jobs`.
    job: usize,
    /// Its rank in that job.
    rank: usize,
    /// The program as named (messages about spawned processes name it).
    program: String,
    /// The emulated host it started on (0 without hosts).
    host: usize,
    /// Its PMI handler has ended.
    pmi_done: bool,
    /// When it closed its PMI connection without finalize.
    disconnected: Option<Instant>,
    /// Stopped by the launcher because the spawn request that started it failed: not a job failure.
    discarded: bool,
}

/// A process to start.
struct ProcSpec<'s> {
    job: usize,
    rank: usize,
    size: usize,
    /// The program as named (argv[0]).
    program: &'s str,
    /// Its resolved path; None: `program` is looked up in `PATH` when it is executed.
    exe: Option<&'s Path>,
    args: &'s [String],
    host: usize,
    /// Position among its job's processes on its host, and their number (for `--bind core`).
    host_pos: (usize, usize),
    /// Working directory; None: the launcher's.
    wdir: Option<&'s Path>,
    /// Processes of this launch running on this machine once it runs (`VMF_MACHINE_RANKS`).
    machine_ranks: usize,
}

struct Job<'a> {
    topo: Option<hosts::Topology>,
    /// Hosts of the ranks of job 0 at start (the registry has where they are now).
    placement: Vec<usize>,
    info: Arc<std::sync::Mutex<control::JobInfo>>,
    rank_ctl: control::RankCtl,
    opts: &'a RunOptions,
    jobid: String,
    universe: usize,
    jobs: Vec<PmiJob>,
    procs: Vec<RankProc>,
    pmi_socks: Vec<UnixStream>,
    pmi_threads: Vec<JoinHandle<()>>,
    fwd: output::Forwarders,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
}

/// Exit code for a failed status: its code, or 128 + signal.
fn status_code(st: &ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signals::name(s)),
        _ => format!("ended with status {st}"),
    }
}

/// `LD_LIBRARY_PATH` for the processes: our library directory first, so programs built against MPICH find
/// our libmpich.so.12.
pub fn library_path() -> std::ffi::OsString {
    let libdir = mpi_libdir();
    match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut v = libdir.into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => libdir.into_os_string(),
    }
}

/// A process started by [`Job::spawn_proc`] whose threads are not running yet.
struct Started {
    idx: usize,
    label: String,
    job: usize,
    rank: usize,
    stdout: Option<std::process::ChildStdout>,
    stderr: Option<std::process::ChildStderr>,
    pmi: UnixStream,
}

impl Job<'_> {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }

    /// Start every rank: all processes first, then their PMI and output threads. A fork copies the
    /// launcher's page tables and mappings, and three threads per rank started before the next fork made
    /// every fork cost more (N forks × O(N) threads: 5% of a 512-rank start-up in copy_page_range alone).
    /// The ranks meanwhile wait on their PMI sockets, whose requests are served once the threads run.
    fn start(&mut self) -> Result<(), LaunchError> {
        let me = ProcessId::current();
        let o = self.opts;
        let mut started = Vec::with_capacity(o.np);
        let r = self.spawn_all(me, &mut started);
        for st in started {
            self.serve_proc(st)?;
        }
        r
    }

    fn spawn_all(&mut self, me: ProcessId, started: &mut Vec<Started>) -> Result<(), LaunchError> {
        let o = self.opts;
        for rank in 0..o.np {
            if signals::pending() != 0 {
                return Ok(()); // the monitor reports it
            }
            let host = self.placement[rank];
            let on_host: Vec<usize> = (0..o.np).filter(|&r| self.placement[r] == host).collect();
            let pos = on_host.iter().position(|&r| r == rank).unwrap_or(0);
            let spec = ProcSpec {
                job: 0,
                rank,
                size: o.np,
                program: &o.program,
                exe: None,
                args: &o.args,
                host,
                host_pos: (pos, on_host.len()),
                wdir: None,
                machine_ranks: o.np,
            };
            started.push(self.spawn_proc(&spec, me)?);
        }
        Ok(())
    }

    /// How messages name process `idx`: `rank R` in the job `vmfabric run` started, `spawned job K rank R
    /// (program)` in a spawned one.
    fn who(&self, idx: usize) -> String {
        let p = &self.procs[idx];
        if p.job == 0 {
            format!("rank {}", p.rank)
        } else {
            format!("spawned job {} rank {} ({})", p.job, p.rank, p.program)
        }
    }

    /// [`who`](Self::who) with the pid.
    fn who_pid(&self, idx: usize) -> String {
        let p = &self.procs[idx];
        if p.job == 0 {
            format!("rank {} (pid {})", p.rank, p.pid)
        } else {
            format!(
                "spawned job {} rank {} ({}, pid {})",
                p.job, p.rank, p.program, p.pid
            )
        }
    }

    fn start_proc(&mut self, p: &ProcSpec, me: ProcessId) -> Result<(), LaunchError> {
        let st = self.spawn_proc(p, me)?;
        self.serve_proc(st)
    }

    /// Start process `p` (its PMI and output threads come with [`Job::serve_proc`]).
    fn spawn_proc(&mut self, p: &ProcSpec, me: ProcessId) -> Result<Started, LaunchError> {
        let o = self.opts;
        let idx = self.procs.len();
        let spawned = p.job > 0;
        let label = if spawned {
            format!("s{}.{}", p.job, p.rank)
        } else {
            p.rank.to_string()
        };
        let (ours, theirs) = UnixStream::pair()
            .map_err(Self::io(format!("create the PMI socket of rank {label}")))?;
        // The child's end must not land on 0..2 (which the child's stdio replaces): duplicate it to >= 3.
        // SAFETY: fcntl on a descriptor we own.
        let fd = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(LaunchError::Io {
                what: format!("create the PMI socket of rank {label}"),
                source: std::io::Error::last_os_error(),
            });
        }
        drop(theirs);
        // SAFETY: fcntl just returned this new descriptor; we own it.
        let child_end = unsafe { OwnedFd::from_raw_fd(fd) };

        let mut cmd = match p.exe {
            Some(exe) => {
                let mut c = Command::new(exe);
                c.arg0(p.program);
                c
            }
            None => Command::new(p.program),
        };
        let n = p.size.to_string();
        // The CPUs of this host's job (the launcher's affinity mask): ranks compare their count with the
        // number of ranks to know whether they are oversubscribed, even when pinned to one CPU each.
        let cpus = vmf_pal::process::allowed_cpus();
        // Ranks outnumbering the CPUs stay in the launcher's session, so in one autogroup: sched_yield
        // only hands the CPU to a task of the same scheduling group, and the waiting policy yields to the
        // rank that shares our CPU (4 ranks on 2 CPUs, a session each: barrier 2.6-4.2 us, allreduce 8 B
        // 3.7; one: 2.1 and 2.3-3.2).
        let own_session = p.machine_ranks <= cpus.len();
        // `--bind core`: pinned before the program starts, where the fabric would pin it (by position
        // among the ranks of its host); the fabric applies `--bind auto` itself once it knows its region.
        let bind_cpu = o
            .bind_cores
            .then(|| vmf_pal::process::cpu_for_rank(p.host_pos.0, p.host_pos.1, &cpus))
            .flatten();
        if let Some(b) = &o.bind {
            cmd.env("VMF_BIND", b);
        }
        cmd.env("VMF_HOST_CPUS", cpus.len().to_string());
        // Every rank of this launch runs on this machine (emulated hosts included), whatever joins them.
        cmd.env("VMF_MACHINE_RANKS", p.machine_ranks.to_string());
        // Control socket (migration requests; ranks of job 0 only) and, with --hosts, the host this rank
        // starts on.
        let mut ctl: Option<(UnixStream, OwnedFd, i32)> = None;
        if !spawned {
            let (ctl_ours, ctl_theirs) = UnixStream::pair().map_err(Self::io(format!(
                "create the control socket of rank {label}"
            )))?;
            // SAFETY: fcntl on a descriptor we own.
            let ctl_fd = unsafe { libc::fcntl(ctl_theirs.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
            drop(ctl_theirs);
            if ctl_fd < 0 {
                return Err(LaunchError::Io {
                    what: "create a control socket".into(),
                    source: std::io::Error::last_os_error(),
                });
            }
            // SAFETY: fcntl just returned this descriptor.
            let ctl_child = unsafe { OwnedFd::from_raw_fd(ctl_fd) };
            cmd.env("VMF_CTL_FD", ctl_fd.to_string());
            ctl = Some((ctl_ours, ctl_child, ctl_fd));
        } else {
            cmd.env_remove("VMF_CTL_FD");
        }
        let ctl_fd = ctl.as_ref().map(|c| c.2);
        let mut ns_fd: Option<i32> = None;
        // The host name and /etc/hosts of the rank's emulated host (prepared before the fork: the child
        // only makes system calls).
        let mut identity: Option<(CString, CString)> = None;
        let host_env = self.topo.as_ref().map(|t| {
            let host = &t.hosts[p.host];
            ns_fd = Some(host.ns_fd());
            if hosts::names_enabled() {
                identity = CString::new(host.netns.as_str())
                    .ok()
                    .zip(CString::new(host.hosts_file().as_os_str().as_bytes()).ok());
            }
            (
                host.dir.clone(),
                host.ip.clone(),
                p.host,
                hosts::table(&t.hosts),
            )
        });
        cmd.env("LD_LIBRARY_PATH", library_path());
        if let Some(w) = p.wdir {
            cmd.current_dir(w);
        }
        let pjob = &self.jobs[p.job];
        cmd.args(p.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("PMI_PORT")
            .env_remove("PMI_ID")
            .env("PMI_FD", fd.to_string())
            .env("PMI_RANK", p.rank.to_string())
            .env("PMI_SIZE", &n)
            .env("PMI_JOBID", pjob.kvs.kvsname())
            .env("VMF_JOB_ID", &pjob.id)
            .env("VMF_LAUNCHER_PID", me.pid.to_string())
            .env("VMF_LAUNCHER_START", me.start_time.to_string())
            .env("VMF_REGION_DIR", &o.region_dir)
            .env("VMF_LOCAL_SIZE", &n)
            .env("MPI_LOCALNRANKS", &n)
            .env("MPI_LOCALRANKID", p.rank.to_string());
        if spawned {
            // MPICH's PMI_Init reads it: the process has a parent job to connect to.
            cmd.env("PMI_SPAWNED", "1");
        } else {
            cmd.env_remove("PMI_SPAWNED");
        }
        if let Some((dir, ip, h, table)) = host_env {
            cmd.env("VMF_REGION_DIR", dir)
                .env("VMF_TCP_ADDR", ip)
                .env("VMF_HOST", h.to_string())
                .env("VMF_HOSTS_TABLE", table);
            if identity.is_some() {
                // What is cached per machine (the calibration) stays keyed by the machine's name.
                cmd.env("VMF_MACHINE_NAME", vmf_pal::hostid::hostname());
            }
        }
        for (k, v) in &o.extra_env {
            cmd.env(k, v);
        }
        let parent = me.pid;
        let named = identity.is_some();
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls
        // (fcntl, setns, unshare, mount, sethostname, setsid, prctl, sched_setaffinity, getppid, raise).
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(c) = ctl_fd {
                    if libc::fcntl(c, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(ns) = ns_fd {
                    if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some((name, file)) = &identity {
                    vmf_pal::hostid::enter(name, file)?;
                }
                // A session (and so an autogroup) per rank: see the module documentation.
                if own_session && libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                set_parent_death_signal(libc::SIGKILL)?;
                if let Some(cpu) = bind_cpu {
                    vmf_pal::process::pin_to_cpu(cpu)?;
                }
                if libc::getppid() != parent {
                    // The launcher died before the death signal was armed.
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| {
            let why = match source.kind() {
                // EPERM (not EACCES): from unshare or mount before exec.
                _ if named && source.raw_os_error() == Some(libc::EPERM) => format!(
                    "cannot give it its emulated host's name and /etc/hosts ({source}); on a system \
                     that allows network namespaces but not mount or UTS ones, set VMF_HOSTS_NAMES=0"
                ),
                std::io::ErrorKind::NotFound => "the program was not found".to_string(),
                std::io::ErrorKind::PermissionDenied => {
                    "the program is not executable (permission denied)".into()
                }
                _ => source.to_string(),
            };
            LaunchError::Spawn {
                rank: p.rank,
                program: p.program.to_owned(),
                why,
                source,
            }
        })?;
        drop(child_end);
        let pid = child.id() as i32;
        if let Some((ctl_ours, ctl_child, _)) = ctl {
            drop(ctl_child);
            self.rank_ctl.lock().unwrap()[p.rank] = Some((ctl_ours, pid, false));
        }
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let job = p.job;
        self.procs.push(RankProc {
            child,
            pid,
            status: None,
            job: p.job,
            rank: p.rank,
            program: p.program.to_owned(),
            host: p.host,
            pmi_done: false,
            disconnected: None,
            discarded: false,
        });

        Ok(Started {
            idx,
            label,
            job,
            rank: p.rank,
            stdout,
            stderr,
            pmi: ours,
        })
    }

    /// Start the PMI and output threads of a process [`Job::spawn_proc`] started.
    fn serve_proc(&mut self, st: Started) -> Result<(), LaunchError> {
        let o = self.opts;
        let Started { idx, label, job, rank, stdout, stderr, pmi: ours } = st;
        // `[rank] `, `[sK.rank] ` for spawned job K.
        let prefix = o.tag_output.then(|| output::Framer::rank_prefix(&label));
        if let Some(s) = stdout {
            self.fwd
                .spawn(
                    format!("vmf-out-{label}"),
                    s,
                    prefix.clone(),
                    output::Sink::Stdout,
                )
                .map_err(Self::io("start an output thread"))?;
        }
        if let Some(s) = stderr {
            self.fwd
                .spawn(format!("vmf-err-{label}"), s, prefix, output::Sink::Stderr)
                .map_err(Self::io("start an output thread"))?;
        }

        self.pmi_socks.push(
            ours.try_clone()
                .map_err(Self::io(format!("create the PMI socket of rank {label}")))?,
        );
        let (kvs, tx) = (self.jobs[job].kvs.clone(), self.tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("vmf-pmi-{label}"))
            .spawn(move || {
                let etx = tx.clone();
                let _ = serve_connection(ours, rank, kvs, move |ev| {
                    let _ = etx.send(Msg::Pmi(idx, ev));
                });
                let _ = tx.send(Msg::PmiDone(idx));
            })
            .map_err(Self::io("start a PMI thread"))?;
        self.pmi_threads.push(h);
        Ok(())
    }

    /// Start the processes a spawn request of process `from` asks for, as a new PMI job; returns its index.
    /// Nothing is started unless every command checks out (program, info keys, the process limit); if
    /// starting one process fails, those already started are stopped.
    fn spawn_job(
        &mut self,
        from: usize,
        cmds: &[SpawnCmd],
        preput: &[(String, String)],
    ) -> Result<usize, String> {
        let total = cmds
            .iter()
            .try_fold(0usize, |a, c| a.checked_add(c.maxprocs))
            .unwrap_or(usize::MAX);
        if total == 0 {
            return Err("the request asks for no process".into());
        }
        let running = self.procs.iter().filter(|p| p.status.is_none()).count();
        if running.saturating_add(total) > MAX_RANKS {
            return Err(format!(
                "{total} more processes would make {} running processes, more than the launcher's limit of {MAX_RANKS}",
                running.saturating_add(total)
            ));
        }
        let cwd = std::env::current_dir()
            .map_err(|e| format!("the launcher's working directory is unusable: {e}"))?;
        let ips: Vec<(String, String)> = self
            .topo
            .as_ref()
            .map(|t| t.hosts.iter().map(|h| (h.netns.clone(), h.ip.clone())).collect())
            .unwrap_or_default();
        let prepared = cmds
            .iter()
            .enumerate()
            .map(|(i, c)| {
                spawn::prepare(c, &ips, &cwd).map_err(|why| {
                    if cmds.len() > 1 {
                        format!("command {}: {why}", i + 1)
                    } else {
                        why
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // By default the children start where the spawning process is now (it may have migrated).
        let from_host = {
            let p = &self.procs[from];
            if p.job == 0 {
                let info = self.info.lock().unwrap_or_else(|e| e.into_inner());
                info.placement.get(p.rank).copied().unwrap_or(p.host)
            } else {
                p.host
            }
        };
        let mut hosts_of = Vec::with_capacity(total);
        let mut appnums = Vec::with_capacity(total);
        for (i, c) in prepared.iter().enumerate() {
            for j in 0..c.count {
                hosts_of.push(c.hosts.as_ref().map_or(from_host, |h| h[j % h.len()]));
                appnums.push(i as i64);
            }
        }
        let k = self.jobs.len();
        let id = format!("{}-s{k}", self.jobid);
        let kvs = JobKvs::new(&format!("vmf-{id}"), total)
            .with_universe_size(self.universe)
            .with_appnums(appnums);
        // Before any child starts: a child's `get PARENT_ROOT_PORT_NAME` needs no fence.
        for (key, v) in preput {
            kvs.put(key, v);
        }
        self.jobs.push(PmiJob {
            id,
            kvs: Arc::new(kvs),
        });
        let first = self.procs.len();
        let me = ProcessId::current();
        let mut rank = 0;
        for c in &prepared {
            for _ in 0..c.count {
                let host = hosts_of[rank];
                let pos = hosts_of[..rank].iter().filter(|&&h| h == host).count();
                let on_host = hosts_of.iter().filter(|&&h| h == host).count();
                let spec = ProcSpec {
                    job: k,
                    rank,
                    size: total,
                    program: &c.name,
                    exe: Some(&c.exe),
                    args: &c.args,
                    host,
                    host_pos: (pos, on_host),
                    wdir: c.wdir.as_deref(),
                    machine_ranks: running + total,
                };
                if let Err(e) = self.start_proc(&spec, me) {
                    self.discard(first);
                    self.jobs[k].kvs.shutdown("the spawn request failed");
                    return Err(match e {
                        LaunchError::Spawn { why, .. } => {
                            format!("cannot start {} since {why}", c.name)
                        }
                        e => e.to_string(),
                    });
                }
                rank += 1;
            }
        }
        Ok(k)
    }

    /// Kill the processes from index `first` on, started for a spawn request that failed.
    fn discard(&mut self, first: usize) {
        for p in &mut self.procs[first..] {
            p.discarded = true;
            if p.status.is_none() {
                let _ = p.child.kill();
                p.status = p.child.wait().ok();
            }
        }
    }

    /// Act on one message. `ending`: the job is stopping, spawn requests are refused. Returns the exit
    /// status when the message ends the job (an abort).
    fn handle(&mut self, m: Msg, ending: bool) -> Option<i32> {
        match m {
            Msg::Pmi(idx, PmiEvent::Abort { code, .. }) if idx < self.procs.len() => {
                return Some(self.aborted(idx, code))
            }
            Msg::Pmi(idx, PmiEvent::Disconnected { .. }) => {
                if let Some(p) = self.procs.get_mut(idx) {
                    p.disconnected = Some(Instant::now());
                }
            }
            Msg::Pmi(
                idx,
                PmiEvent::Spawn {
                    cmds,
                    preput,
                    reply,
                    ..
                },
            ) => {
                if ending || idx >= self.procs.len() {
                    reply.send(Err("the job is ending".into()));
                    return None;
                }
                let res = self.spawn_job(idx, &cmds, &preput);
                match &res {
                    Ok(k) if self.opts.verbose => eprintln!(
                        "vmfabric: job {}: {} ranks of {} spawned by {}",
                        self.jobs[*k].id,
                        self.jobs[*k].kvs.size(),
                        cmds.iter()
                            .map(|c| c.exe.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        self.who(idx)
                    ),
                    Err(why) if !self.opts.quiet => eprintln!(
                        "vmfabric: warning: the spawn request of {} failed: {why}",
                        self.who(idx)
                    ),
                    _ => {}
                }
                if !reply.send(res.map(|_| ())) && !self.opts.quiet {
                    eprintln!(
                        "vmfabric: warning: {} left before the answer to its spawn request",
                        self.who(idx)
                    );
                }
            }
            Msg::PmiDone(idx) => {
                if let Some(p) = self.procs.get_mut(idx) {
                    p.pmi_done = true;
                }
            }
            Msg::Pmi(..) => {}
        }
        None
    }

    /// Reap processes that exited; returns the first failed one seen (index, status).
    fn reap(&mut self) -> Option<(usize, ExitStatus)> {
        let mut failed = None;
        for (i, p) in self.procs.iter_mut().enumerate() {
            if p.status.is_none() {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.status = Some(st);
                    if !st.success() && !p.discarded && failed.is_none() {
                        failed = Some((i, st));
                    }
                }
            }
        }
        failed
    }

    /// A more telling cause than a rank failure, arriving within [`SETTLE`]: the launcher's own signal or
    /// a PMI abort (MPICH's abort sends the request and exits at once). Returns the exit code if found.
    fn settle(&mut self) -> Option<i32> {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Some(code) = self.check_signal() {
                return Some(code);
            }
            match self
                .rx
                .recv_timeout(POLL.min(deadline.saturating_duration_since(Instant::now())))
            {
                Ok(m) => {
                    if let Some(code) = self.handle(m, true) {
                        return Some(code);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() >= deadline => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn check_signal(&mut self) -> Option<i32> {
        let sig = signals::pending();
        if sig == 0 {
            return None;
        }
        eprintln!(
            "vmfabric: received signal {sig} ({}); stopping the job",
            signals::name(sig)
        );
        self.stop(SIGNAL_GRACE);
        Some(128 + sig)
    }

    fn aborted(&mut self, idx: usize, code: i32) -> i32 {
        // A rank killed by a signal is the cause when others abort because they lost it (across hosts
        // they learn of it over TCP and abort before the launcher has looked at the dead one).
        let _ = self.reap();
        let killed = self.procs.iter().enumerate().find_map(|(k, p)| {
            let st = p.status?;
            (k != idx && !p.discarded && st.signal().is_some()).then_some((k, st))
        });
        if let Some((k, st)) = killed {
            eprintln!(
                "vmfabric: {} {}; stopping the job ({} called abort after it)",
                self.who_pid(k),
                describe(&st),
                self.who(idx)
            );
            self.stop(FAIL_GRACE);
            return status_code(&st);
        }
        eprintln!(
            "vmfabric: {} called abort with code {code}; stopping the job",
            self.who(idx)
        );
        self.stop(FAIL_GRACE);
        code
    }

    /// Watch the processes (the ranks and every process spawned since) until the job ends; returns the
    /// exit status.
    fn monitor(&mut self) -> i32 {
        let mut all_exited_at: Option<Instant> = None;
        loop {
            if let Some(code) = self.check_signal() {
                return code;
            }
            while let Ok(m) = self.rx.try_recv() {
                if let Some(code) = self.handle(m, false) {
                    return code;
                }
            }
            if let Some((idx, st)) = self.reap() {
                if let Some(code) = self.settle() {
                    return code;
                }
                eprintln!(
                    "vmfabric: {} {}; stopping the job",
                    self.who_pid(idx),
                    describe(&st)
                );
                self.stop(FAIL_GRACE);
                return status_code(&st);
            }
            let all_exited = self.procs.iter().all(|p| p.status.is_some());
            if !all_exited {
                all_exited_at = None;
                for idx in 0..self.procs.len() {
                    let p = &self.procs[idx];
                    let Some(t) = p.disconnected else { continue };
                    if p.discarded {
                        continue;
                    }
                    if p.status.is_some_and(|st| st.success()) {
                        // As Hydra does: the job stops, and its status stays 0 (OSU 7.4's osu_latency_mt
                        // returns from main without MPI_Finalize once its results are printed).
                        eprintln!(
                            "vmfabric: {} exited with status 0 without calling MPI_Finalize; \
                             stopping the job (status 0, as mpiexec.mpich)",
                            self.who_pid(idx)
                        );
                        self.stop(FAIL_GRACE);
                        return 0;
                    }
                    if p.status.is_some() || t.elapsed() >= DISCONNECT_GRACE {
                        eprintln!(
                            "vmfabric: {} closed its PMI connection without calling finalize; \
                             stopping the job",
                            self.who_pid(idx)
                        );
                        self.stop(FAIL_GRACE);
                        return 1;
                    }
                }
            } else {
                let t = *all_exited_at.get_or_insert_with(Instant::now);
                // Let the PMI handlers see the ends of their connections (an abort may still be in flight).
                if self.procs.iter().all(|p| p.pmi_done || p.discarded)
                    || t.elapsed() >= DISCONNECT_GRACE
                {
                    while let Ok(m) = self.rx.try_recv() {
                        if let Some(code) = self.handle(m, true) {
                            return code;
                        }
                    }
                    for idx in 0..self.procs.len() {
                        let p = &self.procs[idx];
                        if p.disconnected.is_some() && !p.discarded {
                            eprintln!(
                                "vmfabric: warning: {} exited without calling PMI finalize",
                                self.who(idx)
                            );
                        }
                    }
                    return 0;
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM every process still running, SIGKILL those left after `grace`, and reap them all.
    fn stop(&mut self, grace: Duration) {
        let _ = self.reap();
        let mut any = false;
        for p in self.procs.iter().filter(|p| p.status.is_none()) {
            // SAFETY: kill on the pid of our own unreaped child (it cannot have been reused).
            unsafe { libc::kill(p.pid, libc::SIGTERM) };
            any = true;
        }
        if !any {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let _ = self.reap();
            if self.procs.iter().all(|p| p.status.is_some()) {
                return;
            }
            std::thread::sleep(POLL);
        }
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            let _ = p.child.kill();
            p.status = p.child.wait().ok();
        }
    }

    /// Every path ends here: stop what still runs, end PMI, drain output, remove the regions of the job and
    /// of every job it spawned (`vmf-<jobid>-sK.shm` share the prefix).
    fn teardown(&mut self) {
        self.stop(FAIL_GRACE);
        for j in &self.jobs {
            j.kvs.shutdown("the job has ended");
        }
        while let Ok(m) = self.rx.try_recv() {
            if let Msg::Pmi(_, PmiEvent::Spawn { reply, .. }) = m {
                reply.send(Err("the job has ended".into()));
            }
        }
        for s in &self.pmi_socks {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for h in self.pmi_threads.drain(..) {
            let _ = h.join();
        }
        let fwd = std::mem::replace(&mut self.fwd, output::Forwarders::new());
        fwd.finish(Duration::from_millis(500), Duration::from_secs(5));
        remove_job_files(&self.opts.region_dir, &self.jobid);
        if let Some(mut t) = self.topo.take() {
            t.destroy();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_id_is_12_hex_works() {
        let a = new_job_id().unwrap();
        assert_eq!(a.len(), 12);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_job_id().unwrap());
    }

    #[test]
    fn invalid_options_fail() {
        let mut o = RunOptions::new(0, "true", vec![]);
        o.region_dir = std::env::temp_dir();
        assert!(run(&o)
            .unwrap_err()
            .to_string()
            .starts_with("Unable to start the job since"));
        o.np = MAX_RANKS + 1;
        assert!(run(&o).is_err());
        o.np = 1;
        o.program.clear();
        assert!(run(&o).is_err());
    }

    #[test]
    fn signal_names_work() {
        assert_eq!(signals::name(9), "SIGKILL");
        assert_eq!(signals::name(15), "SIGTERM");
    }
}
