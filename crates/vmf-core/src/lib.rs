//! vmfabric core (layer 3): endpoints, tag matching, protocols, progress, and the native Rust API.
//!
//! A [`Fabric`] is one rank's endpoint into a job started by `vmfabric run` (or any PMI-1 launcher such as
//! MPICH's Hydra). It offers MPI-style tagged point-to-point messaging: blocking and nonblocking sends and
//! receives, source and tag wildcards, MPI's non-overtaking order, requests with test/wait/wait_all/
//! wait_any, and probe.
//!
//! # Examples
//! Run as `vmfabric run -n 2 ./prog`:
//! ```no_run
//! use vmf_core::{Fabric, Source, TagSel};
//! let f = Fabric::init()?;
//! if f.rank() == 0 {
//!     f.send(b"ping", 1, 7)?;
//!     let mut buf = [0u8; 4];
//!     let st = f.recv(&mut buf, Source::Rank(1), TagSel::Any)?;
//!     assert_eq!((&buf, st.source), (b"pong", 1));
//! } else if f.rank() == 1 {
//!     let mut buf = [0u8; 16];
//!     let st = f.recv(&mut buf, Source::Any, TagSel::Tag(7))?;
//!     assert_eq!(&buf[..st.count], b"ping");
//!     let req = f.isend(b"pong", 0, 8)?;
//!     f.wait(req)?;
//! }
//! f.finalize()?;
//! # Ok::<(), vmf_core::Error>(())
//! ```
#![warn(missing_docs)]

pub mod calibrate;
pub mod config;
pub mod engine;
pub mod error;
pub mod gang;
pub mod pool;

pub use config::Config;
pub use engine::{Counters, Route, SendMode, Status, ANY_SOURCE, ANY_TAG};
pub use error::{Error, Op, Result};

use engine::{Engine, ReqId};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;
use vmf_pal::process::ProcessId;
use vmf_pmi::PmiClient;
pub use vmf_pmi::SpawnCmd;
use vmf_transport::shm::region::{Region, RegionSource};
use vmf_transport::shm::ShmTransport;
use vmf_transport::tcp::{TcpConfig, TcpTransport};

/// Where a receive or probe takes messages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Any rank.
    Any,
    /// This rank.
    Rank(usize),
}

impl Source {
    fn raw(self) -> i64 {
        match self {
            Source::Any => ANY_SOURCE as i64,
            Source::Rank(r) => r as i64,
        }
    }
}

impl From<usize> for Source {
    fn from(r: usize) -> Self {
        Source::Rank(r)
    }
}

/// Which tags a receive or probe accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagSel {
    /// Any tag.
    Any,
    /// Exactly this tag.
    Tag(i32),
}

impl TagSel {
    fn raw(self) -> i32 {
        match self {
            TagSel::Any => ANY_TAG,
            TagSel::Tag(t) => t,
        }
    }
}

/// The context (communicator) of the native API's messages.
const CTX_USER: u32 = 0;
/// The context of internal collective traffic.
const CTX_COLL: u32 = 1;

/// A pending nonblocking operation. It borrows its buffer until completed by [`Fabric::wait`] or
/// [`Fabric::test`]; dropping an unfinished request waits for it (a receive that never matched is cancelled).
#[must_use = "a request must be waited for"]
pub struct Request<'a> {
    fab: &'a Fabric,
    id: Option<ReqId>,
    is_recv: bool,
    _buf: PhantomData<&'a mut [u8]>,
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut e = self.fab.eng.get();
            if self.is_recv && e.cancel_recv(id) {
                let _ = e.take(id);
                return;
            }
            let _ = e.wait_until(Op::Wait, |e| e.is_done(id));
            let _ = e.take(id);
        }
    }
}

/// The engine's cell. One caller borrows it at a time (a second borrow is a bug and panics), except in
/// *shared* mode: the MPI library under `MPI_THREAD_MULTIPLE` serialises threads with a lock of its own
/// and lets a thread that waits inside the engine hand that lock to others (the engine's yield hook),
/// which then borrow the engine while the waiting thread's borrow is parked. The waiting thread touches
/// the engine again only after taking the lock back, through a pointer it passed to the hook, so the
/// compiler reloads whatever the other threads changed.
pub struct EngineCell {
    e: UnsafeCell<Engine>,
    borrows: Cell<u32>,
    shared: Cell<bool>,
}

/// A borrow of the engine (see [`EngineCell`]).
pub struct EngineRef<'a> {
    cell: &'a EngineCell,
}

impl EngineCell {
    fn new(e: Engine) -> EngineCell {
        EngineCell {
            e: UnsafeCell::new(e),
            borrows: Cell::new(0),
            shared: Cell::new(false),
        }
    }

    /// Borrow the engine.
    #[inline]
    pub fn get(&self) -> EngineRef<'_> {
        let b = self.borrows.get();
        if b > 0 && !self.shared.get() {
            already_borrowed();
        }
        self.borrows.set(b + 1);
        EngineRef { cell: self }
    }
}

#[cold]
#[inline(never)]
fn already_borrowed() -> ! {
    panic!("the engine is already borrowed (re-entrant use outside MPI_THREAD_MULTIPLE)")
}

impl std::ops::Deref for EngineRef<'_> {
    type Target = Engine;
    #[inline]
    fn deref(&self) -> &Engine {
        // SAFETY: borrows are exclusive outside shared mode (checked in `get`); in shared mode the MPI
        // library's lock serialises every access (see EngineCell).
        unsafe { &*self.cell.e.get() }
    }
}

impl std::ops::DerefMut for EngineRef<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Engine {
        // SAFETY: as for Deref.
        unsafe { &mut *self.cell.e.get() }
    }
}

impl Drop for EngineRef<'_> {
    #[inline]
    fn drop(&mut self) {
        self.cell.borrows.set(self.cell.borrows.get() - 1);
    }
}

/// One rank's endpoint into the job.
pub struct Fabric {
    eng: EngineCell,
    pmi: RefCell<Option<PmiClient>>,
    rank: usize,
    size: usize,
    job: String,
    finalized: Cell<bool>,
    coll_tag: Cell<i32>,
    /// The region watchdog this rank started (see `start_region_watchdog`), stopped and reaped at the end.
    watchdog: Cell<Option<i32>>,
}

/// The rank the launcher gave this process (`PMI_RANK`), before the fabric is up (for error messages).
pub fn launcher_rank() -> Option<usize> {
    std::env::var("PMI_RANK").ok()?.trim().parse().ok()
}

fn setup(rank: usize, why: impl std::fmt::Display) -> Error {
    Error::Setup {
        rank,
        op: Op::Init,
        why: why.to_string(),
    }
}

impl Fabric {
    /// Join the job described by the launcher's environment (PMI_FD / PMI_PORT, PMI_RANK, PMI_SIZE and the
    /// `VMF_*` tunables). Without a launcher the process is a job of one rank.
    pub fn init() -> Result<Fabric> {
        let r0 = launcher_rank().unwrap_or(0);
        let cfg = Config::from_env().map_err(|e| setup(r0, e))?;
        let mut pmi = PmiClient::from_env().map_err(|e| setup(r0, e))?;
        let (rank, size) = pmi.as_ref().map_or((0, 1), |p| (p.rank(), p.size()));
        if cfg.verbose {
            if let Some(p) = &pmi {
                let proto = if p.is_v2() { "PMI-2" } else { "PMI-1" };
                eprintln!("vmfabric: rank {rank}: {proto} job {} of {size} ranks", p.kvsname());
            }
        }
        let job = match std::env::var("VMF_JOB_ID") {
            Ok(j) if !j.is_empty() => sanitize(&j),
            _ => match &pmi {
                Some(p) => sanitize(p.kvsname()),
                None => format!("single-{}", std::process::id()),
            },
        };
        let mut shm = None;
        let mut tcp = None;
        let mut mphw = None;
        let mut locs = Vec::new();
        let mut mig_ctx = None;
        let mut watchdog = None;
        if size > 1 {
            let src = match cfg.region_device() {
                None => RegionSource::Dir(cfg.region_dir.clone().into()),
                Some(p) => RegionSource::Device(p),
            };
            let launcher = launcher_from_env();
            let timeout = Duration::from_secs(cfg.init_timeout_s);
            let mut sizing = cfg.region_sizing(size);
            // VMF_TRANSPORT=mphw in a device (an ivshmem BAR that VMs share): the emulated hardware takes
            // a window of the region's heap, which its rings (unused then) would otherwise fill.
            let mphw_len = match (&src, cfg.mphw) {
                (RegionSource::Device(_), true) => {
                    let l = vmf_transport::mphw::MphwTransport::window_size(size).map_err(|e| setup(rank, e))?;
                    sizing.heap += l + 4096;
                    Some(l)
                }
                _ => None,
            };
            if let RegionSource::Dir(d) = &src {
                // The pool is touched only as it is used, but a tmpfs smaller than the region would
                // kill a rank with SIGBUS when it does: keep the pool within half the free space.
                if let Some(avail) = vmf_pal::fs_available(d) {
                    let room = avail.saturating_sub(sizing.tables() + sizing.heap) / 2;
                    sizing.pool_per_slot = sizing
                        .pool_per_slot
                        .min(room / sizing.max_local.max(1) as u64);
                }
            }
            let reg =
                Region::open(&src, &job, sizing, launcher, timeout).map_err(|e| setup(rank, e))?;
            let reg = Arc::new(reg);
            let idx = reg.attach(rank as u32).map_err(|e| setup(rank, e))?;
            if launcher.is_none() && reg.is_file && idx == 0 {
                watchdog = start_region_watchdog(&reg);
            }
            // TCP: listen now, publish the address with the region's identity.
            let secret_env = std::env::var("VMF_JOB_SECRET")
                .ok()
                .and_then(|h| parse_secret(&h));
            // VMF_TRANSPORT=mphw: rank 0 makes the emulated hardware now; everyone attaches after the fence.
            let mphw_path = std::path::Path::new(&cfg.region_dir).join(format!("vmf-mphw-{job}"));
            let mut mphw_win = None;
            if cfg.mphw {
                // In VMs (a device region) the guests' agents set a hosts table for failover; elsewhere one
                // means emulated hosts, which share no region.
                if std::env::var_os("VMF_HOSTS_TABLE").is_some() && mphw_len.is_none() {
                    return Err(setup(rank, "VMF_TRANSPORT=mphw emulates hardware in one shared region: no emulated hosts"));
                }
                match mphw_len {
                    // In the device's region: rank 0 takes the window and tells the others where it is.
                    Some(len) if rank == 0 => {
                        let off = reg
                            .alloc(len + 4096)
                            .map_err(|_| {
                                setup(rank, format!(
                                    "the emulated hardware for {size} ranks needs {len} bytes of the region {}, which has no room for them (lower VMF_MPHW_BUFFER or VMF_MPHW_SLOTS, or give a larger device)",
                                    reg.path().display()
                                ))
                            })?
                            .div_ceil(4096)
                            * 4096;
                        vmf_transport::mphw::MphwTransport::create_window(reg.path(), off, len, size)
                            .map_err(|e| setup(rank, e))?;
                        mphw_win = Some((off, len));
                    }
                    Some(_) => {}
                    None if rank == 0 => {
                        vmf_transport::mphw::MphwTransport::create(&mphw_path, size).map_err(|e| setup(rank, e))?;
                    }
                    None => {}
                }
            }
            if cfg.tcp && !cfg.mphw {
                let bind = cfg.tcp_addr.unwrap_or_else(|| {
                    std::net::IpAddr::V4(
                        vmf_transport::tcp::default_ipv4().unwrap_or(std::net::Ipv4Addr::LOCALHOST),
                    )
                });
                let tc = TcpConfig {
                    bind,
                    secret: secret_env.unwrap_or([0; 16]),
                    job: vmf_transport::shm::region::job_hash(&job),
                    max_frame: cfg.tcp_max_frame(),
                };
                tcp = Some(TcpTransport::new(rank, size, tc).map_err(|e| setup(rank, e))?);
            }
            let p = pmi.as_mut().unwrap();
            let key = |r: usize| format!("vmf-addr-{r}");
            let addr = tcp.as_ref().map_or("-".to_string(), |t: &TcpTransport| {
                t.local_addr().to_string()
            });
            p.put(&key(rank), &format!("{}:{idx},{addr}", reg.uuid_hex()))
                .map_err(|e| setup(rank, e))?;
            if let Some((off, len)) = mphw_win {
                p.put("vmf-mphw-win", &format!("{off}:{len}")).map_err(|e| setup(rank, e))?;
            }
            if rank == 0 && secret_env.is_none() && tcp.is_some() {
                // Started by another launcher: rank 0 makes the job secret, shared through PMI.
                let mut s = [0u8; 16];
                let _ = getrandom::fill(&mut s);
                p.put("vmf-secret", &hex(&s)).map_err(|e| setup(rank, e))?;
            }
            p.fence().map_err(|e| setup(rank, e))?;
            if secret_env.is_none() {
                if let Some(t) = tcp.as_mut() {
                    let h = p.get("vmf-secret").map_err(|e| setup(rank, e))?;
                    t.set_secret(
                        parse_secret(&h).ok_or_else(|| setup(rank, "bad job secret from PMI"))?,
                    );
                }
            }
            // Every rank's card: in chunks of 256 per round trip from our launcher, one by one from others.
            let mut cards: Vec<String> = Vec::with_capacity(size);
            if launcher.is_some() {
                let mut from = 0;
                while from < size {
                    let count = (size - from).min(256);
                    match p.get_range("vmf-addr-", from, count) {
                        Ok(v) => cards.extend(v),
                        Err(_) => {
                            cards.clear(); // not our server after all: one key at a time
                            break;
                        }
                    }
                    from += count;
                }
            }
            let mut local = Vec::new();
            for r in 0..size {
                if r == rank {
                    locs.push(engine::migrate::Loc {
                        uuid: reg.uuid,
                        slot: idx,
                        addr: tcp.as_ref().map(|t: &TcpTransport| t.local_addr()),
                    });
                    continue;
                }
                let v = match cards.get_mut(r) {
                    Some(v) => std::mem::take(v),
                    None => p.get(&key(r)).map_err(|e| setup(rank, e))?,
                };
                let bad = || setup(rank, format!("bad bootstrap value {v:?} from rank {r}"));
                let (shm_part, tcp_part) = v.split_once(',').ok_or_else(bad)?;
                let (uuid, li) = shm_part.split_once(':').ok_or_else(bad)?;
                let li = li.parse::<u32>().map_err(|_| bad())?;
                let addr: Option<std::net::SocketAddr> = if tcp_part == "-" {
                    None
                } else {
                    Some(tcp_part.parse().map_err(|_| bad())?)
                };
                let u = parse_uuid(uuid).ok_or_else(bad)?;
                if mphw_len.is_some() && uuid != reg.uuid_hex() {
                    return Err(setup(rank, format!(
                        "VMF_TRANSPORT=mphw needs every rank in one shared region, and rank {r} is in another (VMs of different host groups)"
                    )));
                }
                locs.push(engine::migrate::Loc {
                    uuid: u,
                    slot: li,
                    addr,
                });
                if uuid == reg.uuid_hex() && cfg.shm && !cfg.mphw {
                    local.push((r, li));
                } else if let (Some(t), Some(a)) = (tcp.as_mut(), addr) {
                    t.set_peer_addr(r, a);
                }
            }
            // Where ranks move between regions (emulated hosts, VMs with agents), a pair's ring outlives
            // the ranks that made it and new pairs appear as ranks arrive: every ring is sized for a full
            // region, so that any mix of them fits the heap (sized for that). Rings made for the few
            // ranks present at the time (1 MiB) and later pairs filled an 8-slot region's 44 MB after
            // about 60 random moves.
            let ring = if std::env::var_os("VMF_HOSTS_TABLE").is_some() {
                cfg.ring_size_for(reg.max_local as usize)
            } else {
                cfg.ring_size_for(local.len() + 1)
            };
            let mut t = ShmTransport::new(reg.clone(), rank, idx, size, ring);
            // Duplex boxes are never carried over when a rank re-attaches, so not where ranks can migrate.
            t.set_duplex(cfg.shm_duplex && std::env::var_os("VMF_HOSTS_TABLE").is_none());
            for (r, li) in local {
                t.add_peer(r, li).map_err(|e| setup(rank, e))?;
            }
            if tcp.is_some() {
                t.enable_socket_doorbell(vmf_transport::shm::region::job_hash(&job))
                    .map_err(|e| setup(rank, e))?;
            }
            attach_vm_bell(&mut t);
            if cfg.verbose {
                eprintln!(
                    "vmfabric: rank {rank}: region {} (uuid {}), slot {idx}, {} co-resident peers, ring {} KiB{}",
                    reg.path().display(),
                    reg.uuid_hex(),
                    t.peer_count(),
                    ring >> 10,
                    tcp.as_ref().map_or(String::new(), |t| format!(", tcp {}", t.local_addr()))
                );
            }
            // Emulated hosts: what a live migration needs.
            if let Ok(table) = std::env::var("VMF_HOSTS_TABLE") {
                let hosts =
                    engine::migrate::MigCtx::parse_table(&table).map_err(|e| setup(rank, e))?;
                let current = std::env::var("VMF_HOST")
                    .ok()
                    .and_then(|h| h.parse().ok())
                    .unwrap_or(0);
                let mut ctx = engine::migrate::MigCtx::new(
                    job.clone(),
                    cfg.region_sizing(size),
                    launcher,
                    hosts,
                    current,
                    timeout,
                );
                if let Some(fd) = std::env::var("VMF_CTL_FD")
                    .ok()
                    .and_then(|v| v.parse::<i32>().ok())
                {
                    // SAFETY: the launcher passed this descriptor to us alone.
                    let s = unsafe {
                        <std::os::unix::net::UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd)
                    };
                    engine::migrate::install_signal_handler().map_err(|e| setup(rank, e))?;
                    // Now the launcher may signal us (before, SIGUSR2 would have killed the process).
                    let _ = std::io::Write::write_all(&mut &s, b"ready\n");
                    ctx.ctl = Some(s);
                }
                mig_ctx = Some(ctx);
            }
            shm = Some(t);
            if cfg.mphw {
                let t = match mphw_len {
                    Some(len) => {
                        let win = p.get("vmf-mphw-win").map_err(|e| setup(rank, e))?;
                        let off = win
                            .split_once(':')
                            .filter(|(_, l)| l.parse() == Ok(len))
                            .and_then(|(o, _)| o.parse::<u64>().ok())
                            .ok_or_else(|| setup(rank, format!("bad mphw window {win:?} from rank 0 (its VMF_MPHW_* settings differ from ours?)")))?;
                        let t = vmf_transport::mphw::MphwTransport::attach_window(reg.path(), off, len, rank)
                            .map_err(|e| setup(rank, e))?;
                        // Nodes in other VMs wake us, and we them, through the ivshmem doorbell.
                        if let Some((regs, own)) = vm_bell_for(reg.path()) {
                            t.enable_vm_bell(regs, own);
                        }
                        t
                    }
                    None => vmf_transport::mphw::MphwTransport::attach(&mphw_path, rank).map_err(|e| setup(rank, e))?,
                };
                // Once everyone has it mapped (and has published how to ring it), the file goes: nothing
                // is left behind, whatever happens later.
                p.fence().map_err(|e| setup(rank, e))?;
                if rank == 0 && mphw_len.is_none() {
                    let _ = std::fs::remove_file(&mphw_path);
                }
                mphw = Some(t);
            }
        }
        let verbose = cfg.verbose;
        let mut eng = Engine::new(rank, size, cfg, shm, tcp);
        if let Some(t) = mphw {
            eng.set_mphw(t);
        }
        eng.set_job_hash(vmf_transport::shm::region::job_hash(&job));
        if !locs.is_empty() {
            eng.set_locations(locs);
        }
        if let Some(c) = mig_ctx {
            eng.set_migration_context(c);
        }
        eng.bind_cpu();
        eng.join_gang();
        if verbose {
            let ch: Vec<String> = (0..size)
                .map(|p| format!("{p}:{}", eng.route(p).name()))
                .collect();
            eprintln!("vmfabric: rank {rank}: channels {}", ch.join(" "));
        }
        Ok(Fabric {
            eng: EngineCell::new(eng),
            pmi: RefCell::new(pmi),
            rank,
            size,
            job,
            finalized: Cell::new(false),
            coll_tag: Cell::new(0),
            watchdog: Cell::new(watchdog),
        })
    }

    /// This rank's number, 0-based.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The job identifier (from the launcher).
    pub fn job_id(&self) -> &str {
        &self.job
    }

    /// The shared region this rank mapped, if any.
    pub fn region_path(&self) -> Option<std::path::PathBuf> {
        self.eng.get()
            .shm()
            .map(|s| s.region().path().to_owned())
    }

    /// The channel used to reach `peer` ("self", "shm" or "none").
    pub fn channel(&self, peer: usize) -> Route {
        self.eng.get().route(peer)
    }

    /// Largest message sent eagerly through shared memory.
    pub fn eager_limit(&self) -> usize {
        self.eng.get().eager_limit()
    }

    /// True if large messages move by single copy (process_vm_readv).
    pub fn cma_enabled(&self) -> bool {
        self.eng.get().cma_enabled()
    }

    /// Blocking standard-mode send.
    pub fn send(&self, buf: &[u8], dest: usize, tag: i32) -> Result<()> {
        let mut e = self.eng.get();
        // SAFETY: `buf` is a live slice; the fast path copies it before returning and the slow path waits.
        unsafe {
            if e.try_send_now(buf.as_ptr(), buf.len(), dest as i64, tag, CTX_USER)? {
                return Ok(());
            }
            let id = e.isend(
                buf.as_ptr(),
                buf.len(),
                dest as i64,
                tag,
                CTX_USER,
                SendMode::Standard,
            )?;
            e.wait_until(Op::Wait, |e| e.is_done(id))?;
            e.take(id).map(|_| ())
        }
    }

    /// Blocking synchronous-mode send: returns once the receiver has matched the message.
    pub fn ssend(&self, buf: &[u8], dest: usize, tag: i32) -> Result<()> {
        let r = self.start_send(buf, dest, tag, CTX_USER, SendMode::Synchronous)?;
        self.wait(r).map(|_| ())
    }

    /// Nonblocking send.
    pub fn isend<'b>(&'b self, buf: &'b [u8], dest: usize, tag: i32) -> Result<Request<'b>> {
        self.start_send(buf, dest, tag, CTX_USER, SendMode::Standard)
    }

    fn start_send<'b>(
        &'b self,
        buf: &'b [u8],
        dest: usize,
        tag: i32,
        ctx: u32,
        mode: SendMode,
    ) -> Result<Request<'b>> {
        // SAFETY: the Request borrows `buf` until it completes.
        let id = unsafe {
            self.eng.get()
                .isend(buf.as_ptr(), buf.len(), dest as i64, tag, ctx, mode)?
        };
        Ok(Request {
            fab: self,
            id: Some(id),
            is_recv: false,
            _buf: PhantomData,
        })
    }

    /// Blocking receive. A message longer than `buf` yields [`Error::Truncated`].
    pub fn recv(&self, buf: &mut [u8], src: Source, tag: TagSel) -> Result<Status> {
        let mut e = self.eng.get();
        // SAFETY: `buf` is borrowed mutably for the call.
        if let Some(st) =
            unsafe { e.recv_direct(buf.as_mut_ptr(), buf.len(), src.raw(), tag.raw(), CTX_USER)? }
        {
            return Ok(st);
        }
        // SAFETY: `buf` stays borrowed until the request completes below.
        let id = unsafe { e.irecv(buf.as_mut_ptr(), buf.len(), src.raw(), tag.raw(), CTX_USER)? };
        if let Err(err) = e.wait_until(Op::Wait, |e| e.is_done(id)) {
            // Fatal error: withdraw the receive if it never matched, and release the request either way.
            e.cancel_recv(id);
            let _ = e.take(id);
            return Err(err);
        }
        e.take(id)
    }

    /// Nonblocking receive.
    pub fn irecv<'b>(&'b self, buf: &'b mut [u8], src: Source, tag: TagSel) -> Result<Request<'b>> {
        self.start_recv(buf, src, tag, CTX_USER)
    }

    fn start_recv<'b>(
        &'b self,
        buf: &'b mut [u8],
        src: Source,
        tag: TagSel,
        ctx: u32,
    ) -> Result<Request<'b>> {
        // SAFETY: the Request borrows `buf` mutably until it completes.
        let id = unsafe {
            self.eng.get()
                .irecv(buf.as_mut_ptr(), buf.len(), src.raw(), tag.raw(), ctx)?
        };
        Ok(Request {
            fab: self,
            id: Some(id),
            is_recv: true,
            _buf: PhantomData,
        })
    }

    /// Test a request: `Some(status)` (and the request is finished) if it completed.
    pub fn test(&self, req: &mut Request<'_>) -> Result<Option<Status>> {
        let Some(id) = req.id else {
            return Err(Error::InvalidRequest {
                rank: self.rank,
                op: Op::Wait,
            });
        };
        let mut e = self.eng.get();
        if !e.is_done(id) {
            e.progress()?;
            if !e.is_done(id) {
                return Ok(None);
            }
        }
        req.id = None;
        e.take(id).map(Some)
    }

    /// Wait for a request.
    pub fn wait(&self, mut req: Request<'_>) -> Result<Status> {
        let id = req.id.take().ok_or(Error::InvalidRequest {
            rank: self.rank,
            op: Op::Wait,
        })?;
        let mut e = self.eng.get();
        e.wait_until(Op::Wait, |e| e.is_done(id))?;
        e.take(id)
    }

    /// Wait for all requests; returns their statuses in order (the first error, if any, after all finished).
    pub fn wait_all(&self, reqs: Vec<Request<'_>>) -> Result<Vec<Status>> {
        let mut ids: Vec<ReqId> = Vec::with_capacity(reqs.len());
        for mut r in reqs {
            ids.push(r.id.take().ok_or(Error::InvalidRequest {
                rank: self.rank,
                op: Op::Wait,
            })?);
        }
        let mut e = self.eng.get();
        let waited = e.wait_until(Op::Wait, |e| ids.iter().all(|&id| e.is_done(id)));
        let mut out = Vec::with_capacity(ids.len());
        let mut first_err = waited.err();
        for id in ids {
            if e.is_done(id) {
                match e.take(id) {
                    Ok(s) => out.push(s),
                    Err(err) => {
                        first_err.get_or_insert(err);
                    }
                }
            }
        }
        match first_err {
            Some(err) => Err(err),
            None => Ok(out),
        }
    }

    /// Wait until one of `reqs` completes; removes it from the vector and returns its former index and status.
    pub fn wait_any(&self, reqs: &mut Vec<Request<'_>>) -> Result<(usize, Status)> {
        if reqs.is_empty() {
            return Err(Error::InvalidRequest {
                rank: self.rank,
                op: Op::Wait,
            });
        }
        let ids: Vec<ReqId> = reqs.iter().map(|r| r.id.expect("live request")).collect();
        let mut e = self.eng.get();
        e.wait_until(Op::Wait, |e| ids.iter().any(|&id| e.is_done(id)))?;
        let i = ids.iter().position(|&id| e.is_done(id)).unwrap();
        let mut r = reqs.remove(i);
        r.id = None;
        e.take(ids[i]).map(|s| (i, s))
    }

    /// Check for a matching message without receiving it.
    pub fn iprobe(&self, src: Source, tag: TagSel) -> Result<Option<Status>> {
        self.eng.get().iprobe(src.raw(), tag.raw(), CTX_USER)
    }

    /// Block until a matching message is available; return its status without receiving it.
    pub fn probe(&self, src: Source, tag: TagSel) -> Result<Status> {
        self.eng.get().probe(src.raw(), tag.raw(), CTX_USER)
    }

    /// Block until every rank has entered the barrier (dissemination algorithm, ⌈log₂ n⌉ rounds).
    pub fn barrier(&self) -> Result<()> {
        let t = self.coll_tag.get();
        self.coll_tag.set(t.wrapping_add(1) & 0x3fff_ffff);
        let n = self.size;
        let mut k = 1;
        while k < n {
            let to = (self.rank + k) % n;
            let from = (self.rank + n - k) % n;
            let mut b = [0u8; 0];
            let r = self.start_recv(&mut b, Source::Rank(from), TagSel::Tag(t), CTX_COLL)?;
            let s = self.start_send(&[], to, t, CTX_COLL, SendMode::Standard)?;
            self.wait(s)?;
            self.wait(r)?;
            k *= 2;
        }
        Ok(())
    }

    /// Move this rank to emulated host `host` (jobs started with `vmfabric run --hosts`), live: traffic
    /// with every peer switches channel with nothing lost, duplicated or reordered. Returns how long the
    /// switch took. On failure (unknown host, ...) the rank keeps working where it was.
    pub fn migrate_to(&self, host: usize) -> Result<Duration> {
        self.eng.get().migrate_to(host)
    }

    /// The emulated host this rank is on (None without `--hosts`).
    pub fn current_host(&self) -> Option<usize> {
        self.eng.get().current_host()
    }

    /// Number of emulated hosts (0 without `--hosts`).
    pub fn host_count(&self) -> usize {
        self.eng.get().host_count()
    }

    /// Drive progress once (for callers polling their own state).
    pub fn progress(&self) -> Result<usize> {
        self.eng.get().progress()
    }

    /// Finish: complete outstanding sends, synchronise with the other ranks, detach from the region.
    /// Idempotent; after it no more communication is possible. Called by `Drop` if not called before.
    pub fn finalize(&self) -> Result<()> {
        self.finalize_inner()
    }

    fn finalize_inner(&self) -> Result<()> {
        if self.finalized.replace(true) {
            return Ok(());
        }
        // Even after an error the rank leaves the job in an orderly way (PMI fence + finalize), so the
        // launcher can tell a rank that reported an error from one that vanished.
        let flushed = self.eng.get().flush();
        let fin = |e: vmf_pmi::PmiError| Error::Setup {
            rank: self.rank,
            op: Op::Finalize,
            why: e.to_string(),
        };
        if let Some(p) = self.pmi.borrow_mut().as_mut() {
            p.fence().map_err(fin)?;
        }
        if let Some(m) = self.eng.get().mphw() {
            m.report();
        }
        // A program that left a large put in flight (MPI forbids it) still finds its bytes in place.
        vmf_bb::copier::settle();
        let fs = self.eng.get().waiter().foreign_switches;
        if self.eng.get().config().verbose && fs > 0 {
            eprintln!(
                "vmfabric: rank {}: waits slept instead of yielding {fs} times (other programs kept this job's CPUs)",
                self.rank
            );
        }
        let c = vmf_bb::copier::stats();
        if self.eng.get().config().verbose && c.jobs > 0 {
            eprintln!(
                "vmfabric: rank {}: copier: {} large copies shared, {} chunks by the helper, {} stalls, {} moves off the caller's CPU",
                self.rank, c.jobs, c.helper_chunks, c.stalls, c.moves
            );
        }
        // The region this rank maps now (it may have moved since init).
        if let Some(shm) = self.eng.get().shm() {
            let reg = shm.region();
            reg.detach(shm.local_index());
            // Under a launcher of our own, it removes the region. Under another (Hydra, Slurm) the last rank
            // to leave removes the file, so nothing stays in the region directory (all ranks are past the
            // fence above, so nobody attaches any more).
            if launcher_from_env().is_none() && reg.is_file && reg.attached_count() == 0 {
                let _ = std::fs::remove_file(reg.path());
            }
        }
        stop_watchdog(&self.watchdog);
        if let Some(p) = self.pmi.borrow_mut().as_mut() {
            p.finalize().map_err(fin)?;
        }
        flushed
    }

    /// Ask the launcher to end the whole job with `code`.
    pub fn abort(&self, code: i32, msg: &str) -> ! {
        // The whole job ends: under a foreign launcher nobody else removes the region.
        if launcher_from_env().is_none() {
            if let Some(shm) = self.eng.get().shm() {
                if shm.region().is_file {
                    let _ = std::fs::remove_file(shm.region().path());
                }
            }
        }
        stop_watchdog(&self.watchdog);
        if let Some(p) = self.pmi.borrow_mut().as_mut() {
            let _ = p.abort(code, msg);
            std::thread::sleep(Duration::from_secs(2));
        }
        std::process::exit(code)
    }

    /// A value of this job's PMI key-value space (e.g. `PARENT_ROOT_PORT_NAME`, which the launcher put
    /// there for processes started by MPI_Comm_spawn); None without a launcher or when absent.
    pub fn pmi_get(&self, key: &str) -> Option<String> {
        self.pmi.borrow_mut().as_mut().and_then(|p| p.get(key).ok())
    }

    /// Ask the launcher to start new processes (MPI_Comm_spawn): `cmds` become a new job whose key-value
    /// space holds `preput`. Returns once the launcher has started them.
    pub fn spawn(&self, cmds: &[SpawnCmd], preput: &[(String, String)]) -> Result<()> {
        let why = |w: String| Error::Setup {
            rank: self.rank,
            op: Op::Init,
            why: w,
        };
        match self.pmi.borrow_mut().as_mut() {
            Some(p) => p.spawn(cmds, preput).map_err(|e| why(e.to_string())),
            None => Err(why(
                "this process was not started by a launcher (vmfabric run, mpiexec), so nobody can start processes for it"
                    .into(),
            )),
        }
    }

    /// The universe size the launcher reports (MPI_UNIVERSE_SIZE), if any.
    pub fn universe_size(&self) -> Option<usize> {
        self.pmi
            .borrow_mut()
            .as_mut()
            .and_then(|p| p.universe_size().ok().flatten())
    }

    /// This process's application number (MPI_APPNUM): which command of an MPMD launch or of
    /// MPI_Comm_spawn_multiple started it; None without a launcher.
    pub fn appnum(&self) -> Option<i64> {
        self.pmi.borrow().as_ref().map(|p| p.appnum())
    }

    /// Raw access to the engine (for the MPI library layered on top and for tests).
    #[doc(hidden)]
    pub fn engine(&self) -> EngineRef<'_> {
        self.eng.get()
    }

    /// Enter shared mode (see [`EngineCell`]): from now on the caller serialises every use of this
    /// fabric from several threads itself, and threads waiting in the engine may let others in.
    ///
    /// # Safety
    /// Every later call on this fabric, from any thread, must hold the caller's lock, and the engine's
    /// yield hook must release and retake exactly that lock.
    #[doc(hidden)]
    pub unsafe fn set_shared(&self) {
        self.eng.shared.set(true);
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // While unwinding from a panic, finalising would wait in a fence the others never reach: leave,
        // and let the launcher see this rank fail.
        if !self.finalized.get() && !std::thread::panicking() {
            let _ = self.finalize_inner();
        }
    }
}

fn parse_uuid(h: &str) -> Option<[u64; 2]> {
    if h.len() != 32 {
        return None;
    }
    Some([
        u64::from_str_radix(&h[..16], 16).ok()?,
        u64::from_str_radix(&h[16..], 16).ok()?,
    ])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn parse_secret(h: &str) -> Option<[u8; 16]> {
    let h = h.trim();
    if h.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Under a launcher that is not ours (Hydra, Slurm), nobody removes the region when ranks are killed
/// (`kill -9` of one, and Hydra then SIGKILLs the others): a watchdog process does. Started by the rank in
/// slot 0 of a region file it maps, it checks every 200 ms whether any process attached to the region is
/// alive, and removes the file once none is (or exits when the ranks removed it themselves). It leaves the
/// session (signals to the job's process group miss it) and closes every inherited descriptor (the PMI
/// socket and the output pipes: a launcher waits for their ends). Between fork and exit it only reads the
/// mapped slot table and makes async-signal-safe calls (the application may have threads). The rank that
/// started it stops and reaps it at finalize or abort ([`stop_watchdog`]); only if that rank is killed
/// does the watchdog outlive it (and then it is init's to reap). Returns its pid.
fn start_region_watchdog(reg: &Region) -> Option<i32> {
    let path = std::ffi::CString::new(reg.path().as_os_str().as_encoded_bytes()).ok()?;
    let slots: Vec<&vmf_transport::shm::region::Slot> =
        (0..reg.max_local).filter_map(|i| reg.slot(i).ok()).collect();
    // SAFETY: fork; the child below only makes async-signal-safe calls and memory reads, then _exits.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        return (pid > 0).then_some(pid);
    }
    // SAFETY (whole child): async-signal-safe calls only; never returns.
    unsafe {
        libc::setsid();
        // Named for what it is in ps/top (otherwise it shows as one more copy of the program).
        libc::prctl(libc::PR_SET_NAME, c"vmf-watchdog".as_ptr() as libc::c_ulong, 0, 0, 0);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            for fd in 3..4096 {
                libc::close(fd);
            }
        }
        let mut seen = false;
        loop {
            if libc::access(path.as_ptr(), libc::F_OK) != 0 {
                libc::_exit(0); // removed at finalize (or by `vmfabric clean`)
            }
            let alive = slots.iter().any(|s| {
                s.state.load(std::sync::atomic::Ordering::Acquire) == 1 && {
                    let pid = s.pid.load(std::sync::atomic::Ordering::Acquire) as i32;
                    pid > 0 && libc::kill(pid, 0) == 0
                }
            });
            seen |= alive;
            if seen && !alive {
                libc::unlink(path.as_ptr());
                libc::_exit(0);
            }
            let ts = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
            libc::nanosleep(&ts, std::ptr::null_mut());
        }
    }
}

/// Stop and reap the region watchdog (the ranks end in an orderly way: finalize removes the region).
fn stop_watchdog(w: &Cell<Option<i32>>) {
    if let Some(pid) = w.take() {
        // SAFETY: our own child, not yet reaped (so its pid cannot have been reused).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
}

fn launcher_from_env() -> Option<ProcessId> {
    let pid = std::env::var("VMF_LAUNCHER_PID").ok()?.parse().ok()?;
    let start_time = std::env::var("VMF_LAUNCHER_START")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Some(ProcessId { pid, start_time })
}

/// In a VM whose region is an ivshmem BAR and that has an `ivshmem-doorbell` device (the region's own,
/// or an interrupts-only one beside it): let `t` ring sleeping peers through the device, and sleep on the doorbell vector the guest's agent lent this rank (`VMF_IVSHMEM_BELL=<vector>:<fd>`,
/// an eventfd the device's MSI-X vector signals). Elsewhere nothing happens.
pub(crate) fn attach_vm_bell(t: &mut vmf_transport::shm::ShmTransport) {
    if let Some((regs, own)) = vm_bell_for(t.region().path()) {
        t.enable_vm_bell(regs, own);
    }
}

/// What [`attach_vm_bell`] needs for a region at `path`: the doorbell registers and this rank's vector,
/// found by scanning the guest's PCI devices (milliseconds of emulated file reads under TCG, so a move's
/// `prepare` does it ahead, on its helper thread). None where the region has no peers in other VMs or
/// no doorbell device rings them.
pub(crate) type VmBellSetup = Option<(std::sync::Arc<vmf_pal::pci::IvshmemRegs>, Option<(u16, std::os::fd::RawFd)>)>;

pub(crate) fn vm_bell_for(path: &std::path::Path) -> VmBellSetup {
    static OWN: std::sync::OnceLock<Option<(u16, std::os::fd::RawFd)>> = std::sync::OnceLock::new();
    // Parsed once, whatever the region: the descriptor outlives every transport of this process (a rank
    // that leaves and rejoins the region keeps its vector), and programs this rank starts must not get it.
    let own = *OWN.get_or_init(|| {
        let v = std::env::var("VMF_IVSHMEM_BELL").ok()?;
        let (vec, fd) = v.split_once(':')?;
        let (vec, fd) = (vec.parse::<u16>().ok()?, fd.parse::<i32>().ok()?);
        // Only an inherited, nonblocking eventfd (a stale number reused by a pipe or socket would block
        // the rank's sleeps or eat its data).
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        // SAFETY: F_GETFL only inspects the descriptor.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if link.as_os_str() != "anon_inode:[eventfd]" || fl < 0 || fl & libc::O_NONBLOCK == 0 {
            eprintln!("vmfabric: VMF_IVSHMEM_BELL={v} does not name a nonblocking eventfd; ignored");
            return None;
        }
        // SAFETY: mark the inherited descriptor close-on-exec.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        Some((vec, fd))
    });
    // Only a region in an ivshmem BAR has peers in other VMs (a guest's own region file does not).
    if !path.starts_with("/sys/") {
        return None;
    }
    let devs = vmf_pal::pci::ivshmem_devices();
    if !devs.iter().any(|d| d.bar2 == path) {
        return None;
    }
    let dev = vmf_pal::pci::doorbell_device_of(&devs)?;
    // The registers are mapped once per device: a rank that leaves and rejoins the region keeps them
    // (the doorbell device stays while the region's device comes and goes).
    static REGS: std::sync::Mutex<Option<(String, std::sync::Arc<vmf_pal::pci::IvshmemRegs>)>> = std::sync::Mutex::new(None);
    let mut cached = REGS.lock().unwrap_or_else(|p| p.into_inner());
    let regs = match cached.as_ref().filter(|(a, _)| *a == dev.address) {
        Some((_, r)) => r.clone(),
        None => match vmf_pal::pci::IvshmemRegs::map(dev) {
            Ok(r) => {
                let r = std::sync::Arc::new(r);
                *cached = Some((dev.address.clone(), r.clone()));
                r
            }
            Err(e) => {
                eprintln!("vmfabric: cannot map the doorbell registers of {} ({e}); peers in other VMs are polled", dev.address);
                return None;
            }
        },
    };
    drop(cached);
    Some((regs, own))
}
