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
//!
//! then [`RunOptions::extra_env`], which may override any of these. Every rank's stdin is `/dev/null`.
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
mod signals;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
use vmf_pmi::{serve_connection, JobKvs, PmiEvent};
use vmf_transport::shm::region::{scan_regions, FILE_PREFIX};

/// Largest number of ranks [`run`] accepts.
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
    prepare_region_dir(&opts.region_dir)?;
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
    let placement: Vec<usize> = (0..opts.np)
        .map(|r| match opts.hosts {
            0 => 0,
            h if opts.map_block => r / opts.np.div_ceil(h),
            h => r % h,
        })
        .collect();
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
    let rank_ctl: control::RankCtl =
        Arc::new(std::sync::Mutex::new((0..opts.np).map(|_| None).collect()));
    if let Err(e) = control::serve(info.clone(), rank_ctl.clone()) {
        eprintln!(
            "vmfabric: warning: no control socket for job {jobid} ({e}); migrate will not reach it"
        );
    }
    let _signals = signals::Guard::install();
    let (tx, rx) = mpsc::channel();
    let mut job = Job {
        opts,
        kvs: Arc::new(JobKvs::new(&format!("vmf-{jobid}"), opts.np)),
        jobid,
        ranks: Vec::with_capacity(opts.np),
        pmi_socks: Vec::with_capacity(opts.np),
        pmi_threads: Vec::with_capacity(opts.np),
        fwd: output::Forwarders::new(),
        tx,
        rx,
        topo,
        placement,
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

fn prepare_region_dir(dir: &Path) -> Result<(), LaunchError> {
    let bad = |why: String| LaunchError::RegionDir {
        dir: dir.to_path_buf(),
        why,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(bad("it is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| bad(format!("it does not exist and cannot be created: {e}"))),
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
    Pmi(PmiEvent),
    PmiDone(usize),
}

struct RankProc {
    child: Child,
    pid: i32,
    status: Option<ExitStatus>,
}

struct Job<'a> {
    topo: Option<hosts::Topology>,
    placement: Vec<usize>,
    rank_ctl: control::RankCtl,
    opts: &'a RunOptions,
    jobid: String,
    kvs: Arc<JobKvs>,
    ranks: Vec<RankProc>,
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

impl Job<'_> {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
        let what = what.into();
        move |source| LaunchError::Io { what, source }
    }

    fn start(&mut self) -> Result<(), LaunchError> {
        let me = ProcessId::current();
        for rank in 0..self.opts.np {
            if signals::pending() != 0 {
                return Ok(()); // the monitor reports it
            }
            self.spawn_rank(rank, me)?;
        }
        Ok(())
    }

    fn spawn_rank(&mut self, rank: usize, me: ProcessId) -> Result<(), LaunchError> {
        let o = self.opts;
        let (ours, theirs) = UnixStream::pair()
            .map_err(Self::io(format!("create the PMI socket of rank {rank}")))?;
        // The child's end must not land on 0..2 (which the child's stdio replaces): duplicate it to >= 3.
        // SAFETY: fcntl on a descriptor we own.
        let fd = unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if fd < 0 {
            return Err(LaunchError::Io {
                what: format!("create the PMI socket of rank {rank}"),
                source: std::io::Error::last_os_error(),
            });
        }
        drop(theirs);
        // SAFETY: fcntl just returned this new descriptor; we own it.
        let child_end = unsafe { OwnedFd::from_raw_fd(fd) };

        let mut cmd = Command::new(&o.program);
        let n = o.np.to_string();
        // The CPUs of this host's job (the launcher's affinity mask): ranks compare their count with the
        // number of ranks to know whether they are oversubscribed, even when pinned to one CPU each.
        let cpus = vmf_pal::process::allowed_cpus();
        // `--bind core`: pinned before the program starts, where the fabric would pin it (by position
        // among the ranks of its host); the fabric applies `--bind auto` itself once it knows its region.
        let on_host: Vec<usize> = (0..o.np)
            .filter(|&r| self.placement[r] == self.placement[rank])
            .collect();
        let pos = on_host.iter().position(|&r| r == rank).unwrap_or(0);
        // Ranks outnumbering the CPUs stay in the launcher's session, so in one autogroup: sched_yield
        // only hands the CPU to a task of the same scheduling group, and the waiting policy yields to the
        // rank that shares our CPU (4 ranks on 2 CPUs, a session each: barrier 2.6-4.2 us, allreduce 8 B
        // 3.7; one: 2.1 and 2.3-3.2).
        let own_session = o.np <= cpus.len();
        let bind_cpu = o
            .bind_cores
            .then(|| vmf_pal::process::cpu_for_rank(pos, on_host.len(), &cpus))
            .flatten();
        if let Some(b) = &o.bind {
            cmd.env("VMF_BIND", b);
        }
        cmd.env("VMF_HOST_CPUS", cpus.len().to_string());
        // Every rank of this launch runs on this machine (emulated hosts included), whatever joins them.
        cmd.env("VMF_MACHINE_RANKS", o.np.to_string());
        // Control socket (migration requests) and, with --hosts, the host this rank starts on.
        let (ctl_ours, ctl_theirs) = UnixStream::pair().map_err(Self::io(format!(
            "create the control socket of rank {rank}"
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
        let mut ns_fd: Option<i32> = None;
        let host_env = self.topo.as_ref().map(|t| {
            let h = self.placement[rank];
            let host = &t.hosts[h];
            ns_fd = Some(host.ns_fd());
            (host.dir.clone(), host.ip.clone(), h, hosts::table(&t.hosts))
        });
        // Programs built against MPICH find our libmpich.so.12 first.
        let libdir = mpi_libdir();
        let ld = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut v = libdir.clone().into_os_string();
                v.push(":");
                v.push(old);
                v
            }
            _ => libdir.clone().into_os_string(),
        };
        cmd.env("LD_LIBRARY_PATH", ld);
        cmd.args(&o.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("PMI_PORT")
            .env_remove("PMI_ID")
            .env("PMI_FD", fd.to_string())
            .env("PMI_RANK", rank.to_string())
            .env("PMI_SIZE", &n)
            .env("PMI_JOBID", self.kvs.kvsname())
            .env("VMF_JOB_ID", &self.jobid)
            .env("VMF_LAUNCHER_PID", me.pid.to_string())
            .env("VMF_LAUNCHER_START", me.start_time.to_string())
            .env("VMF_REGION_DIR", &o.region_dir)
            .env("VMF_LOCAL_SIZE", &n)
            .env("MPI_LOCALNRANKS", &n)
            .env("MPI_LOCALRANKID", rank.to_string());
        if let Some((dir, ip, h, table)) = host_env {
            cmd.env("VMF_REGION_DIR", dir)
                .env("VMF_TCP_ADDR", ip)
                .env("VMF_HOST", h.to_string())
                .env("VMF_HOSTS_TABLE", table);
        }
        for (k, v) in &o.extra_env {
            cmd.env(k, v);
        }
        let parent = me.pid;
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls
        // (fcntl, setns, setsid, prctl, sched_setaffinity, getppid, raise).
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0
                    || libc::fcntl(ctl_fd, libc::F_SETFD, 0) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(ns) = ns_fd {
                    if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
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
                std::io::ErrorKind::NotFound => "the program was not found".to_string(),
                std::io::ErrorKind::PermissionDenied => {
                    "the program is not executable (permission denied)".into()
                }
                _ => source.to_string(),
            };
            LaunchError::Spawn {
                rank,
                program: o.program.clone(),
                why,
                source,
            }
        })?;
        drop(child_end);
        drop(ctl_child);
        let pid = child.id() as i32;
        self.rank_ctl.lock().unwrap()[rank] = Some((ctl_ours, pid));
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        self.ranks.push(RankProc {
            child,
            pid,
            status: None,
        });

        let prefix = o.tag_output.then(|| output::Framer::rank_prefix(rank));
        if let Some(s) = stdout {
            self.fwd
                .spawn(
                    format!("vmf-out-{rank}"),
                    s,
                    prefix.clone(),
                    output::Sink::Stdout,
                )
                .map_err(Self::io("start an output thread"))?;
        }
        if let Some(s) = stderr {
            self.fwd
                .spawn(format!("vmf-err-{rank}"), s, prefix, output::Sink::Stderr)
                .map_err(Self::io("start an output thread"))?;
        }

        self.pmi_socks.push(
            ours.try_clone()
                .map_err(Self::io(format!("create the PMI socket of rank {rank}")))?,
        );
        let (kvs, tx) = (self.kvs.clone(), self.tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("vmf-pmi-{rank}"))
            .spawn(move || {
                let etx = tx.clone();
                let _ = serve_connection(ours, rank, kvs, move |ev| {
                    let _ = etx.send(Msg::Pmi(ev));
                });
                let _ = tx.send(Msg::PmiDone(rank));
            })
            .map_err(Self::io("start a PMI thread"))?;
        self.pmi_threads.push(h);
        Ok(())
    }

    /// Reap ranks that exited; returns the first failed one seen (rank, status).
    fn reap(&mut self) -> Option<(usize, ExitStatus)> {
        let mut failed = None;
        for (r, p) in self.ranks.iter_mut().enumerate() {
            if p.status.is_none() {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.status = Some(st);
                    if !st.success() && failed.is_none() {
                        failed = Some((r, st));
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
                Ok(Msg::Pmi(PmiEvent::Abort { rank, code, .. })) => {
                    return Some(self.aborted(rank, code))
                }
                Ok(_) => {}
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

    fn aborted(&mut self, rank: usize, code: i32) -> i32 {
        eprintln!("vmfabric: rank {rank} called abort with code {code}; stopping the job");
        self.stop(FAIL_GRACE);
        code
    }

    /// Watch the ranks until the job ends; returns the exit status.
    fn monitor(&mut self) -> i32 {
        let np = self.ranks.len();
        let mut pmi_done = vec![false; np];
        let mut disconnected: Vec<Option<Instant>> = vec![None; np];
        let mut all_exited_at: Option<Instant> = None;
        loop {
            if let Some(code) = self.check_signal() {
                return code;
            }
            while let Ok(m) = self.rx.try_recv() {
                match m {
                    Msg::Pmi(PmiEvent::Abort { rank, code, .. }) => {
                        return self.aborted(rank, code)
                    }
                    Msg::Pmi(PmiEvent::Disconnected { rank }) if rank < np => {
                        disconnected[rank] = Some(Instant::now())
                    }
                    Msg::PmiDone(rank) if rank < np => pmi_done[rank] = true,
                    _ => {}
                }
            }
            if let Some((rank, st)) = self.reap() {
                if let Some(code) = self.settle() {
                    return code;
                }
                let pid = self.ranks[rank].pid;
                eprintln!(
                    "vmfabric: rank {rank} (pid {pid}) {}; stopping the job",
                    describe(&st)
                );
                self.stop(FAIL_GRACE);
                return status_code(&st);
            }
            let all_exited = self.ranks.iter().all(|p| p.status.is_some());
            if !all_exited {
                for (rank, t) in disconnected.iter().enumerate() {
                    let Some(t) = t else { continue };
                    let p = &self.ranks[rank];
                    if p.status.is_some_and(|st| st.success()) {
                        // As Hydra does: the job stops, and its status stays 0 (OSU 7.4's osu_latency_mt
                        // returns from main without MPI_Finalize once its results are printed).
                        eprintln!(
                            "vmfabric: rank {rank} (pid {}) exited with status 0 without calling MPI_Finalize; \
                             stopping the job (status 0, as mpiexec.mpich)",
                            p.pid
                        );
                        self.stop(FAIL_GRACE);
                        return 0;
                    }
                    if p.status.is_some() || t.elapsed() >= DISCONNECT_GRACE {
                        eprintln!(
                            "vmfabric: rank {rank} (pid {}) closed its PMI connection without calling finalize; \
                             stopping the job",
                            p.pid
                        );
                        self.stop(FAIL_GRACE);
                        return 1;
                    }
                }
            } else {
                let t = *all_exited_at.get_or_insert_with(Instant::now);
                // Let the PMI handlers see the ends of their connections (an abort may still be in flight).
                if pmi_done.iter().all(|&d| d) || t.elapsed() >= DISCONNECT_GRACE {
                    while let Ok(m) = self.rx.try_recv() {
                        match m {
                            Msg::Pmi(PmiEvent::Abort { rank, code, .. }) => {
                                return self.aborted(rank, code)
                            }
                            Msg::Pmi(PmiEvent::Disconnected { rank }) if rank < np => {
                                disconnected[rank] = Some(Instant::now())
                            }
                            _ => {}
                        }
                    }
                    for (rank, t) in disconnected.iter().enumerate() {
                        if t.is_some() {
                            eprintln!("vmfabric: warning: rank {rank} exited without calling PMI finalize");
                        }
                    }
                    return 0;
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM every rank still running, SIGKILL those left after `grace`, and reap them all.
    fn stop(&mut self, grace: Duration) {
        let _ = self.reap();
        let mut any = false;
        for p in self.ranks.iter().filter(|p| p.status.is_none()) {
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
            if self.ranks.iter().all(|p| p.status.is_some()) {
                return;
            }
            std::thread::sleep(POLL);
        }
        for p in self.ranks.iter_mut().filter(|p| p.status.is_none()) {
            let _ = p.child.kill();
            p.status = p.child.wait().ok();
        }
    }

    /// Every path ends here: stop what still runs, end PMI, drain output, remove the job's regions.
    fn teardown(&mut self) {
        self.stop(FAIL_GRACE);
        self.kvs.shutdown("the job has ended");
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
