//! Live migration of a rank to another host, with no message lost, duplicated or reordered.
//!
//! The rank R that moves:
//! 1. prepares its new home: enters the host's network namespace, attaches to that host's region (a new
//!    slot), listens on the host's address. Any failure here is undone and reported; R stays where it was.
//! 2. sends `Moved{uuid, slot, address}` to every peer on the *current* channel — the last packet there —
//!    and from then on holds every new packet for that peer;
//! 3. drains its old channels until each peer's `MovedAck` arrives (the peer's last packet on the old
//!    channel), then switches that peer to the new channel (shared memory if the peer maps the new
//!    region, else TCP), sends `Ready` there first and releases what it held;
//! 4. once every peer has answered, leaves its old region.
//!
//! A peer P, on `Moved` from R: records R's new place, answers `MovedAck` on the old channel, and holds
//! new packets for R until `Ready` arrives on the new channel; then it switches and releases them.
//!
//! Nobody writes to a new channel before the reader has finished with the old one, and per-pair sequence
//! numbers continue across channels (and are checked), so order is preserved exactly. Rendezvous in flight
//! simply continue on the new channel (requests do not depend on the channel). One migration at a time per
//! job (the launcher serialises `vmfabric migrate` requests).
use super::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vmf_transport::proto::MovedInfo;
use vmf_transport::shm::region::{Region, RegionSizing, RegionSource};

static REQUESTED: AtomicBool = AtomicBool::new(false);

macro_rules! mtrace {
    ($($a:tt)*) => { if vmf_transport::tcp::mig_trace_on() { eprintln!("[mig {:.6}] {}", monotonic_ns() as f64 / 1e9, format!($($a)*)); } };
}

extern "C" fn on_signal(_: libc::c_int) {
    REQUESTED.store(true, Ordering::Relaxed);
}

/// Install the SIGUSR2 handler through which the launcher asks this rank to move (the request itself
/// comes on the control socket). The fabric acts on it at its next progress call.
pub fn install_signal_handler() -> std::io::Result<()> {
    // SAFETY: sigaction with a handler that only stores to an atomic (async-signal-safe).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// Where a rank is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loc {
    /// UUID of the region it maps.
    pub uuid: [u64; 2],
    /// Its slot there.
    pub slot: u32,
    /// Its TCP listener.
    pub addr: Option<SocketAddr>,
}

/// One host a rank can move to.
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// Network namespace (a file under /run/netns).
    pub netns: PathBuf,
    /// Region directory.
    pub dir: PathBuf,
    /// Address to listen on.
    pub ip: IpAddr,
}

impl HostSpec {
    /// True for a host without a namespace of its own ("-" or empty): moving there keeps the rank's
    /// network (a VM leaving its ivshmem region for its own memory, or joining it again).
    pub fn keeps_network(&self) -> bool {
        self.netns.as_os_str() == "-" || self.netns.as_os_str().is_empty()
    }
}

/// What a rank needs to know to move.
pub struct MigCtx {
    /// Job key (region file name).
    pub job: String,
    /// Region sizing (for creating a region nobody mapped yet).
    pub sizing: RegionSizing,
    /// The launcher (recorded in regions for cleanup).
    pub launcher: Option<vmf_pal::process::ProcessId>,
    /// Hosts of the job.
    pub hosts: Vec<HostSpec>,
    /// Current host.
    pub current: usize,
    /// Control socket from the launcher (requests and answers).
    pub ctl: Option<std::os::unix::net::UnixStream>,
    /// Initialisation timeout for regions.
    pub timeout: Duration,
    /// When each peer's current migration started (from its Moved), CLOCK_MONOTONIC ns.
    moved_t0: Vec<u64>,
    /// (migration start, pause in ms) for every Ready this rank received.
    pauses: Vec<(u64, f64)>,
    /// Where the last switch of this rank spent its time: (phase, ms).
    phases: Vec<(&'static str, f64)>,
    /// When each peer answered after the tell in the last switch: (peer, ms).
    acked: Vec<(usize, f64)>,
    /// A region opened ahead of a move (`prepare <host>`): the host, and the helper thread opening it.
    standby: Option<(usize, std::thread::JoinHandle<Opened>)>,
}

/// A region opened and a slot claimed in it, or why not.
type Opened = std::result::Result<(Arc<Region>, u32, crate::VmBellSetup), String>;

impl Drop for MigCtx {
    /// A region prepared for a move that never came: leave the slot it claimed.
    fn drop(&mut self) {
        if let Some((_, t)) = self.standby.take() {
            if let Ok(Ok((reg, idx, _))) = t.join() {
                reg.detach(idx);
            }
        }
    }
}

/// Open the region of a host and claim a slot in it (the first step of a move, which [`Engine::migrate_to`]
/// does itself unless a `prepare` did it ahead).
fn open_region(
    dir: &std::path::Path,
    job: &str,
    sizing: RegionSizing,
    launcher: Option<vmf_pal::process::ProcessId>,
    timeout: Duration,
    me: usize,
) -> Opened {
    let source = region_source(dir)?;
    let reg = Arc::new(Region::open(&source, job, sizing, launcher, timeout).map_err(|e| e.to_string())?);
    let idx = reg.attach(me as u32).map_err(|e| e.to_string())?;
    let bell = crate::vm_bell_for(reg.path());
    Ok((reg, idx, bell))
}

pub use vmf_pal::monotonic_ns;

impl MigCtx {
    /// A context.
    pub fn new(
        job: String,
        sizing: RegionSizing,
        launcher: Option<vmf_pal::process::ProcessId>,
        hosts: Vec<HostSpec>,
        current: usize,
        timeout: Duration,
    ) -> MigCtx {
        MigCtx {
            job,
            sizing,
            launcher,
            hosts,
            current,
            ctl: None,
            timeout,
            moved_t0: Vec::new(),
            pauses: Vec::new(),
            phases: Vec::new(),
            acked: Vec::new(),
            standby: None,
        }
    }

    /// True when every host keeps this network namespace (a VM moving between its ivshmem region and its
    /// own memory): ranks may use the region's pool, and must give it back before they leave.
    pub fn keeps_pool(&self) -> bool {
        self.hosts.iter().all(HostSpec::keeps_network)
    }

    /// Parse `VMF_HOSTS_TABLE` (`i=netns_path,region_dir,ip;...`; netns `-`: none, region `ivshmem`:
    /// this VM's ivshmem BAR, or a file or device path instead of a directory).
    pub fn parse_table(s: &str) -> Result<Vec<HostSpec>, String> {
        let mut v = Vec::new();
        for (k, item) in s.split(';').filter(|x| !x.is_empty()).enumerate() {
            let (i, rest) = item
                .split_once('=')
                .ok_or_else(|| format!("bad host entry {item:?}"))?;
            if i.parse::<usize>().ok() != Some(k) {
                return Err(format!("host entries out of order at {item:?}"));
            }
            let mut p = rest.splitn(3, ',');
            let (ns, dir, ip) = (p.next(), p.next(), p.next());
            let (Some(ns), Some(dir), Some(ip)) = (ns, dir, ip) else {
                return Err(format!("bad host entry {item:?}"));
            };
            v.push(HostSpec {
                netns: ns.into(),
                dir: dir.into(),
                ip: ip.parse().map_err(|_| format!("bad address in {item:?}"))?,
            });
        }
        Ok(v)
    }
}

/// State of this rank's migration in progress.
pub struct Moving {
    pub(super) old_shm: Option<ShmTransport>,
    acks_left: usize,
    old_routes: Vec<Route>,
    /// The new shared-memory transport is in place (answers arriving earlier are deferred until then).
    swapped: bool,
    early_acks: Vec<usize>,
    /// When the Moved packets were out, and each answer's arrival after that (peer, ms): reported with
    /// the phases, so a slow switch names the peer it waited for.
    told: Instant,
    acked: Vec<(usize, f64)>,
}

fn mig_err(rank: usize, why: impl std::fmt::Display) -> Error {
    Error::Setup {
        rank,
        op: Op::Progress,
        why: format!("migration failed: {why}"),
    }
}

/// Where a host's region is: `ivshmem` (BAR 2 of this VM's ivshmem device, looked up now: it may have
/// been plugged in since the job started), an existing file or device, or a directory for region files.
pub fn region_source(dir: &std::path::Path) -> std::result::Result<RegionSource, String> {
    if dir.as_os_str() == "ivshmem" {
        return vmf_pal::pci::region_device()
            .map(|d| RegionSource::Device(d.bar2))
            .ok_or_else(|| "this VM has no ivshmem device (it is unplugged)".to_string());
    }
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => Ok(RegionSource::Device(dir.to_owned())),
        _ => Ok(RegionSource::Dir(dir.to_owned())),
    }
}

/// After a move between emulated hosts: take the new host's name (its namespace's name, as the
/// launcher gave it at start), but only in a UTS namespace of our own, never the launcher's (the
/// machine's). Its /etc/hosts names every host of the job already.
fn take_host_name(netns: &Path) {
    let Some(name) = netns.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let launcher = std::env::var("VMF_LAUNCHER_PID").ok().and_then(|p| p.parse::<i32>().ok());
    if let Some(pid) = launcher {
        if vmf_pal::hostid::own_uts_namespace(pid) && vmf_pal::hostid::hostname() != name {
            if let Err(e) = vmf_pal::hostid::set_hostname(name) {
                mtrace!("cannot take the host name {name}: {e}");
            }
        }
    }
}

struct NsGuard(Option<std::fs::File>);
impl Drop for NsGuard {
    // Any early return before the move completes leaves the rank in its old namespace.
    fn drop(&mut self) {
        self.restore();
    }
}
impl NsGuard {
    fn restore(&mut self) {
        if let Some(f) = self.0.take() {
            // SAFETY: setns back to the namespace we came from.
            unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        }
    }
}

impl Engine {
    /// Record where every rank is (from the bootstrap exchange).
    pub fn set_locations(&mut self, locs: Vec<Loc>) {
        self.locs = locs;
    }

    /// Enable migration (the rank was started on an emulated host).
    pub fn set_migration_context(&mut self, ctx: MigCtx) {
        self.mig_ctx = Some(ctx);
    }

    /// The host this rank is on, when started with emulated hosts.
    pub fn current_host(&self) -> Option<usize> {
        self.mig_ctx.as_ref().map(|c| c.current)
    }

    /// Number of emulated hosts of the job (0 without).
    pub fn host_count(&self) -> usize {
        self.mig_ctx.as_ref().map_or(0, |c| c.hosts.len())
    }

    /// True while this rank is moving.
    pub fn is_migrating(&self) -> bool {
        self.mig.is_some()
    }

    /// Pause samples seen by this rank, as (migration start in CLOCK_MONOTONIC ns, ms): for each `Ready`
    /// received, the time from the start of that peer's migration until `Ready` — the first packet over
    /// the new channel — was delivered here. The pause of a migration is the smallest sample over all peers.
    pub fn take_pause_samples(&mut self) -> Vec<(u64, f64)> {
        self.mig_ctx
            .as_mut()
            .map_or(Vec::new(), |c| std::mem::take(&mut c.pauses))
    }

    /// Move this rank to emulated host `host`, live. Returns how long the switch took (until every peer
    /// answered). On an error before any peer was told, nothing has changed and the rank keeps working.
    pub fn migrate_to(&mut self, host: usize) -> Result<Duration> {
        let me = self.me;
        if self.mig.is_some() {
            return Err(mig_err(
                me,
                "a migration of this rank is already in progress",
            ));
        }
        let Some(ctx) = self.mig_ctx.as_ref() else {
            return Err(mig_err(
                me,
                "this rank was not started on emulated hosts (vmfabric run --hosts)",
            ));
        };
        if host >= ctx.hosts.len() {
            return Err(mig_err(
                me,
                format!(
                    "host {host} does not exist (the job has {} hosts)",
                    ctx.hosts.len()
                ),
            ));
        }
        if host == ctx.current {
            return Err(mig_err(me, format!("rank {me} is already on host {host}")));
        }
        if self.fatal.is_some() {
            return Err(self.fatal.clone().unwrap());
        }
        // Pool blocks (MPI_Alloc_mem memory, windows' memory) live in the region being left.
        if let Some(n) = self.shared.as_ref().map(|p| p.in_use()).filter(|&n| n > 0) {
            return Err(mig_err(
                me,
                format!("{n} blocks of its shared-memory pool (MPI_Alloc_mem memory or one-sided windows) are still in use in the region it would leave; free them first"),
            ));
        }
        let t0 = Instant::now();
        let t0_ns = monotonic_ns();
        mtrace!("{me}: migrate to host {host} starts");
        let spec = ctx.hosts[host].clone();
        // A previous migration (ours or a peer's) must have fully settled here: no peer still held
        // waiting for its Ready, or our Moved would queue behind it and mix with later traffic.
        self.wait_until(Op::Progress, |e| {
            e.peers.iter().all(|p| !p.holding && p.next_route.is_none())
        })?;
        // 1. The new home; undone on any failure. A host without a namespace ("-": a VM leaving its
        // ivshmem region for its own memory, or joining it again) keeps the network it has.
        let mut back = NsGuard(None);
        let same_ns = spec.keeps_network();
        if !same_ns {
            back = NsGuard(Some(
                std::fs::File::open("/proc/self/ns/net").map_err(|e| mig_err(me, e))?,
            ));
            let ns = std::fs::File::open(&spec.netns)
                .map_err(|e| mig_err(me, format!("cannot open {}: {e}", spec.netns.display())))?;
            // SAFETY: setns on a namespace file we opened; single-threaded rank contract.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(mig_err(
                    me,
                    format!(
                        "cannot enter the network namespace of host {host}: {}",
                        std::io::Error::last_os_error()
                    ),
                ));
            }
        }
        mtrace!("{me}: settled");
        let mut phases: Vec<(&'static str, f64)> = Vec::with_capacity(6);
        let mut lap = Instant::now();
        let mut phase = |name: &'static str| {
            let n = Instant::now();
            phases.push((name, (n - lap).as_secs_f64() * 1e3));
            lap = n;
        };
        phase("settle");
        // The new region: opened ahead by `prepare` (a helper thread, while this rank worked), or now.
        let standby = match self.mig_ctx.as_mut().unwrap().standby.take() {
            Some((h, t)) if h == host => Some(t.join().unwrap_or_else(|_| Err("the thread preparing the move failed".into()))),
            Some((_, t)) => {
                // Prepared for another host: leave what it claimed.
                if let Ok(Ok((reg, idx, _))) = t.join() {
                    reg.detach(idx);
                }
                None
            }
            None => None,
        };
        let opened = match standby {
            Some(r) => r,
            None => {
                let ctx = self.mig_ctx.as_ref().unwrap();
                open_region(&spec.dir, &ctx.job, ctx.sizing, ctx.launcher, ctx.timeout, me)
            }
        };
        let (reg, idx, bell) = match opened {
            Ok(x) => x,
            Err(e) => {
                back.restore();
                return Err(mig_err(me, e));
            }
        };
        mtrace!("{me}: region opened and attached");
        let (claimed, claimed_idx) = (reg.clone(), idx);
        let prepared = (|| -> Result<(ShmTransport, Option<SocketAddr>)> {
            let ctx = self.mig_ctx.as_ref().unwrap();
            // Rings sized for a full region, as at start (lib.rs): the rings of pairs made by earlier
            // occupants stay, and any mix must fit the heap.
            let ring = self.cfg.ring_size_for(reg.max_local as usize);
            let mut t = ShmTransport::new(reg, me, idx, self.n, ring);
            t.set_wake_check(matches!(
                self.cfg.wait,
                WaitPolicy::Block | WaitPolicy::Adaptive
            ));
            if let Some((regs, own)) = bell {
                t.enable_vm_bell(regs, own);
            }
            let mut addr = None;
            if let Some(tcp) = self.tcp.as_mut() {
                let job = vmf_transport::shm::region::job_hash(&ctx.job);
                if same_ns {
                    // The doorbell's name is bound once per namespace: the new transport takes the old
                    // one's socket when it replaces it (below); until then the old one keeps it. The
                    // same namespace and address (a VM leaving its ivshmem region): the listener stays.
                    addr = Some(if tcp.local_addr().ip() == spec.ip {
                        tcp.local_addr()
                    } else {
                        tcp.rebind(spec.ip).map_err(|e| mig_err(me, e))?
                    });
                } else {
                    t.enable_socket_doorbell(job).map_err(|e| mig_err(me, e))?;
                    addr = Some(tcp.rebind(spec.ip).map_err(|e| mig_err(me, e))?);
                }
            }
            Ok((t, addr))
        })();
        mtrace!("{me}: transports prepared");
        phase("prepare");
        let (new_shm, new_addr) = match prepared {
            Ok(x) => x,
            Err(e) => {
                claimed.detach(claimed_idx);
                back.restore();
                return Err(e);
            }
        };
        drop(claimed);
        let new_uuid = new_shm.region().uuid;
        let new_slot = new_shm.local_index();
        // 2. Tell every peer, on the current channel, and hold what follows.
        let ip = match new_addr.map(|a| a.ip()) {
            Some(IpAddr::V4(v)) => u32::from(v) as u64,
            _ => 0,
        };
        let info = MovedInfo {
            uuid0: new_uuid[0],
            uuid1: new_uuid[1],
            slot: new_slot as u64,
            ip,
            port: new_addr.map_or(0, |a| a.port() as u64),
            t0_ns,
        };
        let mut old_routes = Vec::with_capacity(self.n);
        let mut acks = 0;
        for p in 0..self.n {
            old_routes.push(self.peers[p].route);
            if p == me || self.peers[p].route == Route::None {
                continue;
            }
            let hdr = PktHeader::new(Kind::Moved, me as u32, 0, 0, 0, 0);
            let sent = self.send_packet(p, hdr, info.as_bytes(), std::ptr::null(), 0, None)?;
            mtrace!("{me}: Moved -> {p} on {:?} sent={sent}", self.peers[p].route);
            self.peers[p].holding = true;
            self.peers[p].awaiting_ack = true;
            self.peers[p].next_route = Some(if self.locs[p].uuid == new_uuid {
                Route::Shm
            } else {
                Route::Tcp
            });
            acks += 1;
        }

        phase("tell");
        // Every Moved must be written before the shared-memory transport is replaced.
        self.mig = Some(Moving {
            old_shm: None,
            acks_left: acks,
            old_routes,
            swapped: false,
            early_acks: Vec::new(),
            told: Instant::now(),
            acked: Vec::with_capacity(acks),
        });
        self.wait_until(Op::Progress, |e| {
            e.peers.iter().all(|p| p.pending.is_empty())
        })?;
        let mut old = self.shm.replace(new_shm);
        // Copier announcements go to the new region at once (before anything below can fail).
        self.copier_beacon.aim(self.shm.as_ref());
        if same_ns && self.tcp.is_some() {
            let job = vmf_transport::shm::region::job_hash(&self.mig_ctx.as_ref().unwrap().job);
            let new = self.shm.as_mut().unwrap();
            match old.as_mut().and_then(|o| o.take_socket_doorbell()) {
                Some(s) => new.adopt_socket_doorbell(s, job),
                None => new.enable_socket_doorbell(job).map_err(|e| mig_err(me, e))?,
            }
        }
        // The old transport's doorbell socket closes with it: out of the TCP wait set (the next sleep
        // names the new one).
        if let Some(t) = self.tcp.as_mut() {
            t.set_extra_fd(None);
        }
        let m = self.mig.as_mut().unwrap();
        m.old_shm = old;
        m.swapped = true;
        for peer in std::mem::take(&mut m.early_acks) {
            self.on_moved_ack(peer)?;
        }
        // 3. Drain the old channels until every peer has answered.
        self.wait_until(Op::Progress, |e| {
            e.mig.as_ref().is_some_and(|m| m.acks_left == 0)
        })?;
        phase("answers");
        // 4. Leave the old region.
        let mut m = self.mig.take().unwrap();
        let acked = std::mem::take(&mut m.acked);
        if let Some(mut old) = m.old_shm {
            old.region().detach(old.local_index());
            // Its doorbell socket's name stays bound in the old host's namespace until the socket is
            // closed: close it now, not on the unmapping thread, or a move straight back to that host
            // fails to bind it ("Address already in use", seen once in the migration stress test).
            drop(old.take_socket_doorbell());
            // Unmapping the old region (256 MiB of an ivshmem BAR, say) takes milliseconds in a TCG
            // guest: a thread of its own does it, while this rank goes back to work.
            std::thread::Builder::new()
                .name("vmf-unmap".into())
                .spawn(move || drop(old))
                .ok();
        }
        if let Some(t) = self.tcp.as_mut() {
            t.drop_old_listeners();
        }
        self.locs[me] = Loc {
            uuid: new_uuid,
            slot: new_slot,
            addr: new_addr,
        };
        // The (empty) pool was the old region's: the next allocation takes one in the new region.
        self.shared = None;
        phase("leave");
        let ctx = self.mig_ctx.as_mut().unwrap();
        ctx.current = host;
        ctx.phases = phases;
        ctx.acked = acked;
        drop(back.0.take()); // stay in the new namespace
        if !same_ns {
            take_host_name(&spec.netns);
        }
        mtrace!("{me}: migrate to host {host} done");
        Ok(t0.elapsed())
    }

    pub(super) fn poll_old_shm(&mut self) -> Result<usize> {
        let mut n = 0;
        for _ in 0..32 {
            let shm = self.mig.as_mut().unwrap().old_shm.as_mut().unwrap();
            let inc = match shm.poll() {
                Ok(Some(i)) => i,
                Ok(None) => break,
                Err(e) => return Err(self.terr(self.me, Op::Progress, e)),
            };
            // SAFETY: valid until release.
            let payload = unsafe { slice(inc.payload_ptr(), inc.len()) };
            let r = self.handle(inc.peer, &inc.hdr, payload, 0);
            if let Some(old) = self.mig.as_mut().and_then(|m| m.old_shm.as_mut()) {
                old.release(inc);
            }
            r?;
            n += 1;
            if self.mig.as_ref().is_none_or(|m| m.old_shm.is_none()) {
                break;
            }
        }
        Ok(n)
    }

    pub(super) fn handle_migration(
        &mut self,
        peer: usize,
        kind: Kind,
        payload: &[u8],
    ) -> Result<()> {
        match kind {
            Kind::Moved => {
                let info = MovedInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short Moved".into()))?;
                let addr = (info.port != 0 && info.port <= u16::MAX as u64).then(|| {
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(info.ip as u32)), info.port as u16)
                });
                let uuid = [info.uuid0, info.uuid1];
                self.locs[peer] = Loc {
                    uuid,
                    slot: info.slot as u32,
                    addr,
                };
                if let Some(c) = self.mig_ctx.as_mut() {
                    c.moved_t0.resize(self.n, 0);
                    c.moved_t0[peer] = info.t0_ns;
                }
                let mine = self.shm.as_ref().map(|s| s.region().uuid);
                let new_route = if mine == Some(uuid) {
                    Route::Shm
                } else {
                    Route::Tcp
                };
                if new_route == Route::Tcp && self.tcp.is_none() {
                    return Err(self.corrupt(peer, "moved out of reach (no TCP transport)".into()));
                }
                // The answer is the last packet on the old channel, which is retired after it: a TCP
                // connection is closed, and the old shared-memory slot forgotten at once — the mover
                // leaves it when every answer is in, and another rank may take it right away.
                let old_route = self.peers[peer].route;
                let hdr = PktHeader::new(Kind::MovedAck, self.me as u32, 0, 0, 0, 0);
                let sent = self.send_packet(peer, hdr, &[], std::ptr::null(), 0, None)?;
                mtrace!("{}: Moved from {peer}; MovedAck on {old_route:?} sent={sent}", self.me);
                match (old_route, sent) {
                    (Route::Tcp, true) => self.tcp.as_mut().unwrap().retire(peer),
                    // The Moved being handled came from that slot's ring: forget after its release.
                    (Route::Shm, true) => self.shm.as_mut().unwrap().forget_after_release(peer),
                    (Route::Tcp | Route::Shm, false) => {
                        if let Some(p) = self.peers[peer].pending.back_mut() {
                            p.retire_old = true;
                        }
                    }
                    _ => {}
                }
                self.peers[peer].holding = true;
                self.peers[peer].next_route = Some(new_route);
                match new_route {
                    Route::Shm => {
                        let slot = info.slot as u32;
                        self.shm
                            .as_mut()
                            .unwrap()
                            .add_peer(peer, slot)
                            .map_err(|e| self.terr(peer, Op::Progress, e))?;
                    }
                    _ => {
                        if let Some(a) = addr {
                            self.tcp.as_mut().unwrap().set_peer_addr(peer, a);
                        }
                    }
                }
            }
            Kind::MovedAck => {
                let ok = self.mig.is_some() && self.peers[peer].awaiting_ack;
                if !ok {
                    return Err(self.corrupt(peer, "MovedAck without a migration".into()));
                }
                mtrace!("{}: MovedAck from {peer} swapped={}", self.me, self.mig.as_ref().unwrap().swapped);
                let m = self.mig.as_mut().unwrap();
                m.acked.push((peer, m.told.elapsed().as_secs_f64() * 1e3));
                // The peer's last packet on a TCP connection, which it closes after: retire it now, even
                // when the answer itself must wait for the new transport, or its end would read as a
                // lost connection.
                if m.old_routes[peer] == Route::Tcp {
                    self.tcp.as_mut().unwrap().retire(peer);
                }
                let m = self.mig.as_mut().unwrap();
                if m.swapped {
                    self.on_moved_ack(peer)?;
                } else {
                    m.early_acks.push(peer);
                }
            }
            Kind::Ready => {
                let Some(new_route) = self.peers[peer].next_route.take() else {
                    return Err(self.corrupt(peer, "Ready without a Moved".into()));
                };
                if let Some(c) = self.mig_ctx.as_mut() {
                    let t0 = c.moved_t0.get(peer).copied().unwrap_or(0);
                    if t0 != 0 {
                        c.pauses
                            .push((t0, monotonic_ns().saturating_sub(t0) as f64 / 1e6));
                    }
                }
                let old_route = self.peers[peer].route;
                mtrace!("{}: Ready from {peer}: {old_route:?} -> {new_route:?}", self.me);
                if old_route == Route::Shm && new_route != Route::Shm {
                    if let Some(s) = self.shm.as_mut() {
                        s.remove_peer(peer);
                    }
                }
                self.switch_route(peer, new_route);
                self.release_held(peer);
            }
            _ => unreachable!(),
        }
        Ok(())
    }

    /// The mover's side of an answer: switch this peer to the new channel, say Ready there, release.
    fn on_moved_ack(&mut self, peer: usize) -> Result<()> {
        let me = self.me;
        let new_route = self.peers[peer].next_route.take().unwrap_or(Route::Tcp);
        self.peers[peer].awaiting_ack = false;
        if new_route == Route::Shm {
            let slot = self.locs[peer].slot;
            self.shm
                .as_mut()
                .unwrap()
                .add_peer(peer, slot)
                .map_err(|e| self.terr(peer, Op::Progress, e))?;
        }
        if new_route == Route::Tcp {
            if let Some(a) = self.locs[peer].addr {
                self.tcp
                    .as_mut()
                    .ok_or_else(|| mig_err(me, "no TCP transport"))?
                    .set_peer_addr(peer, a);
            }
        }
        self.switch_route(peer, new_route);
        // Ready goes first on the new channel, ahead of what was held (sent while holding, it would have
        // queued behind megabytes of held data, and the peer holds its own sends to us until it arrives).
        let held = std::mem::take(&mut self.peers[peer].held);
        self.peers[peer].holding = false;
        let hdr = PktHeader::new(Kind::Ready, me as u32, 0, 0, 0, 0);
        let sent = self.send_packet(peer, hdr, &[], std::ptr::null(), 0, None)?;
        mtrace!("{me}: Ready -> {peer} on {new_route:?} sent={sent}");
        self.peers[peer].held = held;
        self.release_held(peer);
        self.mig.as_mut().unwrap().acks_left -= 1;
        Ok(())
    }

    fn switch_route(&mut self, peer: usize, route: Route) {
        if self.peers[peer].route != route {
            let m = &self.ctr.migrations;
            m.store(m.load(std::sync::atomic::Ordering::Relaxed) + 1, std::sync::atomic::Ordering::Relaxed);
        }
        let was_tcp = self.peers[peer].route == Route::Tcp;
        self.peers[peer].route = route;
        let is_tcp = route == Route::Tcp;
        if was_tcp != is_tcp {
            self.tcp_peers = if is_tcp {
                self.tcp_peers + 1
            } else {
                self.tcp_peers.saturating_sub(1)
            };
        }
    }

    fn release_held(&mut self, peer: usize) {
        self.peers[peer].holding = false;
        let held = std::mem::take(&mut self.peers[peer].held);
        self.n_pending += held.len();
        self.peers[peer].pending.extend(held);
    }

    /// `prepare <host>`: open that host's region and claim a slot in it on a helper thread, while this
    /// rank keeps working; the helper answers on the control socket (`prepare ok in T ms`), and the next
    /// `migrate <host>` starts from there. What the move costs in system calls and page faults (an
    /// ivshmem BAR or a region file mapped, its header checked) is then off the rank's switch.
    fn prepare_move(&mut self, h: &str, ctl: &std::os::unix::net::UnixStream) -> std::result::Result<(), String> {
        let host: usize = h.parse().map_err(|_| format!("bad host {h:?}"))?;
        let me = self.me;
        let ctx = self.mig_ctx.as_mut().ok_or("this rank cannot move")?;
        if host >= ctx.hosts.len() || host == ctx.current {
            return Err(format!("no move to host {host} to prepare"));
        }
        if let Some((_, t)) = ctx.standby.take() {
            if let Ok(Ok((reg, idx, _))) = t.join() {
                reg.detach(idx);
            }
        }
        let answer = ctl.try_clone().map_err(|e| e.to_string())?;
        let (dir, job, sizing, launcher, timeout) =
            (ctx.hosts[host].dir.clone(), ctx.job.clone(), ctx.sizing, ctx.launcher, ctx.timeout);
        let same_ns = ctx.hosts[host].keeps_network();
        let t = std::thread::Builder::new()
            .name("vmf-prepare".into())
            .spawn(move || {
                let t0 = Instant::now();
                let r = open_region(&dir, &job, sizing, launcher, timeout, me);
                // Tagged: a late answer must not be taken for the next request's.
                let line = match &r {
                    Ok(_) => format!("prepare ok in {:.1} ms\n", t0.elapsed().as_secs_f64() * 1e3),
                    Err(e) => format!("prepare error {e}\n"),
                };
                // Not through the stream's blocking mode: that is the descriptor's, shared with the rank's
                // thread, which reads the socket without blocking.
                let mut left = line.as_bytes();
                while !left.is_empty() {
                    // SAFETY: sending from a live buffer on our descriptor.
                    let n = unsafe { libc::send(answer.as_raw_fd(), left.as_ptr().cast(), left.len(), libc::MSG_NOSIGNAL) };
                    if n > 0 {
                        left = &left[n as usize..];
                        continue;
                    }
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::Interrupted {
                        break;
                    }
                    let mut p = libc::pollfd { fd: answer.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                    // SAFETY: one pollfd.
                    unsafe { libc::poll(&mut p, 1, 100) };
                }
                drop(answer);
                r
            })
            .map_err(|e| e.to_string())?;
        if same_ns {
            // A move that keeps this rank's network (a VM leaving its ivshmem region, or joining it): the
            // peers it will reach over TCP after the switch are those it has no connection to yet; connect
            // now, while the region opens, instead of after each peer's answer (a connect between TCG
            // guests takes milliseconds). A peer that stays on shared memory just keeps an idle connection.
            if let Some(tcp) = self.tcp.as_mut() {
                for p in 0..self.n {
                    if p != me && self.peers[p].route != Route::None {
                        if let Some(a) = self.locs[p].addr {
                            tcp.set_peer_addr(p, a);
                            tcp.connect_ahead(p);
                        }
                    }
                }
            }
        }
        self.mig_ctx.as_mut().unwrap().standby = Some((host, t));
        Ok(())
    }

    /// Act on a request from the launcher's control socket (after SIGUSR2).
    pub(super) fn serve_migration_request(&mut self) {
        REQUESTED.store(false, Ordering::Relaxed);
        let Some(mut ctl) = self.mig_ctx.as_mut().and_then(|c| c.ctl.take()) else {
            return;
        };
        use std::io::{Read, Write};
        let _ = ctl.set_nonblocking(true);
        let mut buf = [0u8; 128];
        let mut line = String::new();
        while let Ok(k) = ctl.read(&mut buf) {
            if k == 0 {
                break;
            }
            line.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
        for req in line.lines() {
            let reply = match req.split_whitespace().collect::<Vec<_>>().as_slice() {
                // The emulated hardware lives in the region being left; its nodes have nowhere to go.
                [op @ ("prepare" | "migrate"), _] if self.mphw.is_some() => {
                    let p = if *op == "prepare" { "prepare " } else { "" };
                    format!("{p}error rank {} cannot move: its channels are on the emulated hardware (VMF_TRANSPORT=mphw), which lives in the region it would leave", self.me)
                }
                ["prepare", h] => match self.prepare_move(h, &ctl) {
                    // The helper thread answers once the region is open.
                    Ok(()) => continue,
                    Err(e) => format!("prepare error {e}"),
                },
                ["migrate", h] => match h.parse::<usize>() {
                    Ok(h) => match self.migrate_to(h) {
                        Ok(d) => {
                            let (ph, at): (Vec<String>, Vec<String>) = self
                                .mig_ctx
                                .as_ref()
                                .map(|c| {
                                    (c.phases.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect(),
                                     c.acked.iter().map(|(p, ms)| format!("{p}@{ms:.1}")).collect())
                                })
                                .unwrap_or_default();
                            // Each peer's answer after the tell, "[1@0.4 3@2.1]": no letters, since
                            // readers of the phase list take `name value` pairs.
                            let at = if at.is_empty() { String::new() } else { format!(" [{}]", at.join(" ")) };
                            format!("ok {:.3} ms ({}){at}", d.as_secs_f64() * 1e3, ph.join(", "))
                        }
                        Err(e) => format!("error {e}"),
                    },
                    Err(_) => format!("error bad host {h:?}"),
                },
                _ => format!("error unknown request {req:?}"),
            };
            let _ = ctl.set_nonblocking(false);
            let _ = ctl.write_all(format!("{reply}\n").as_bytes());
            let _ = ctl.set_nonblocking(true);
        }
        if let Some(c) = self.mig_ctx.as_mut() {
            c.ctl = Some(ctl);
        }
    }
}
