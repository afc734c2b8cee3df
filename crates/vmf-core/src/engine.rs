//! The progress engine: requests, tag matching, the eager and rendezvous protocols, and waiting.
//!
//! Single-threaded (the caller serialises access). Message flow for a send to a co-resident rank:
//! `isend` → eager packet copied into the pair's ring (≤ eager limit) or an RTS packet carrying the buffer
//! address → the receiver's `progress` polls its rings, matches the packet against posted receives (in
//! posting order) or parks it as unexpected (in arrival order), and for an RTS copies the data with one
//! `process_vm_readv` and answers FIN (or, without CMA, answers CTS and receives pipelined DATA chunks).
//! Per-pair sequence numbers are checked on every packet.
use std::sync::atomic::{AtomicU64, Ordering};
use crate::config::{Config, WaitPolicy};
use crate::error::{Error, Op, Result};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use vmf_transport::proto::{
    CtsInfo, DataInfo, FinInfo, Kind, PktHeader, RtsInfo, FLAG_SYNC, FLAG_WRITTEN,
};
use vmf_transport::selfq::SelfTransport;
use vmf_transport::shm::ShmTransport;
use vmf_transport::mphw::MphwTransport;
use vmf_transport::tcp::TcpTransport;
use vmf_transport::{Transport, TransportError};

/// Live migration (see the module docs).
#[path = "engine_migrate.rs"]
pub mod migrate;

/// Engine operations needed by the MPI library (matched probe, status peeks, ...), kept in their own file.
#[path = "engine_mpi.rs"]
pub mod mpi_ext;

/// Wildcard source for receives and probes.
pub const ANY_SOURCE: i32 = -1;
/// Wildcard tag for receives and probes.
pub const ANY_TAG: i32 = -1;

/// Completion information of a receive (and, trivially, of a send).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Rank the message came from.
    pub source: usize,
    /// Its tag.
    pub tag: i32,
    /// Bytes received (for a truncated message: bytes delivered).
    pub count: usize,
    /// Length of the message as sent.
    pub msg_len: usize,
    /// The receive was cancelled.
    pub cancelled: bool,
}

impl Status {
    /// True if the message was longer than the buffer.
    pub fn truncated(&self) -> bool {
        self.msg_len > self.count
    }
}

/// Send modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMode {
    /// Completes when the buffer may be reused.
    Standard,
    /// Completes only once the receiver has matched the message.
    Synchronous,
}

/// Channel used to reach a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Loopback.
    SelfLoop,
    /// Shared memory.
    Shm,
    /// TCP.
    Tcp,
    /// The emulated message-passing hardware (`VMF_TRANSPORT=mphw`).
    Mphw,
    /// Not reachable.
    None,
}

impl Route {
    /// Name of the channel.
    pub fn name(&self) -> &'static str {
        match self {
            Route::SelfLoop => "self",
            Route::Shm => "shm",
            Route::Tcp => "tcp",
            Route::Mphw => "mphw",
            Route::None => "none",
        }
    }
}

/// A request handle: slot index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqId {
    idx: u32,
    gen: u32,
}

impl ReqId {
    fn wire(self) -> u64 {
        (self.gen as u64) << 32 | self.idx as u64
    }
    fn from_wire(w: u64) -> ReqId {
        ReqId {
            idx: w as u32,
            gen: (w >> 32) as u32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Active,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Send: waiting until written to the transport (eager) — also initial.
    Queued,
    /// Send: waiting for FIN / SyncAck / CTS.
    AwaitAck,
    /// Send: streaming pipelined chunks.
    Streaming { rreq: u64, want: usize, sent: usize },
    /// Recv: posted, unmatched.
    Posted,
    /// Recv: matched an RTS, receiving pipelined chunks.
    Receiving {
        peer: usize,
        want: usize,
        got: usize,
    },
}

struct Req {
    gen: u32,
    state: State,
    is_send: bool,
    buf: *mut u8,
    len: usize,
    peer: i32,
    tag: i32,
    ctx: u32,
    phase: Phase,
    status: Status,
    error: Option<Error>,
    /// A send whose RTS asked for a split copy ([`crate::calibrate::Strategy::Split`]).
    split: bool,
}

impl Req {
    fn empty() -> Req {
        Req {
            gen: 1,
            state: State::Free,
            is_send: false,
            buf: std::ptr::null_mut(),
            len: 0,
            peer: 0,
            tag: 0,
            ctx: 0,
            phase: Phase::Queued,
            status: Status::default(),
            error: None,
            split: false,
        }
    }
}

enum UnexpBody {
    Eager {
        data: Vec<u8>,
        sync_sreq: Option<u64>,
    },
    Rts {
        total: usize,
        info: RtsInfo,
    },
}

struct Unexp {
    src: usize,
    tag: i32,
    ctx: u32,
    body: UnexpBody,
}

/// A packet waiting for room in a full queue.
struct Pending {
    hdr: PktHeader,
    a: [u8; 48],
    a_len: u8,
    data: *const u8,
    data_len: usize,
    /// Standard-mode eager send to complete once written.
    complete: Option<ReqId>,
    /// The last packet on an old channel (a `MovedAck`): once it is written, retire the TCP connection
    /// to this peer, or forget its old shared-memory slot.
    retire_old: bool,
}

/// Per-peer state.
struct Peer {
    route: Route,
    tx_seq: u64,
    rx_seq: u64,
    pending: VecDeque<Pending>,
    /// Live migration: new sends wait here while the channel to this peer is being switched.
    holding: bool,
    held: VecDeque<Pending>,
    /// Route to use once the switch completes.
    next_route: Option<Route>,
    /// Mover side: waiting for this peer's MovedAck.
    awaiting_ack: bool,
}

impl Peer {
    /// A peer reached over `route`, with nothing sent or received yet.
    fn new(route: Route) -> Peer {
        Peer {
            route,
            tx_seq: 0,
            rx_seq: 0,
            pending: VecDeque::new(),
            holding: false,
            held: VecDeque::new(),
            next_route: None,
            awaiting_ack: false,
        }
    }
}

/// Counters of one rank's engine since it started (a snapshot; all monotonic except the `unexpected_now`
/// level). Read by the MPI tool interface's performance variables ([`Engine::counters`]). Counting is plain
/// integer increments on the paths that count: no atomics, locks, allocation or system calls.
///
/// A message is one user-level send (`isend`, or the blocking-send fast path `try_send_now`) of any size,
/// its bytes the payload; control packets (CTS, DATA chunks, FIN, acks, migration) are not messages. A wait
/// is one call of [`Engine::wait_until`] or [`Engine::wait_for_peers`] that succeeds, or a blocking receive
/// that [`Engine::recv_direct`] completes; each counts in exactly one of the `waits_*`, by how far it went.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Messages sent through shared memory (the channel that carries them: while a migration holds a
    /// peer's packets, the one they are released on).
    pub shm_msgs_sent: u64,
    /// Payload bytes sent through shared memory.
    pub shm_bytes_sent: u64,
    /// Messages sent over TCP.
    pub tcp_msgs_sent: u64,
    /// Payload bytes sent over TCP.
    pub tcp_bytes_sent: u64,
    /// Messages sent over the emulated message-passing hardware (`VMF_TRANSPORT=mphw`).
    pub mphw_msgs_sent: u64,
    /// Payload bytes sent over the emulated message-passing hardware.
    pub mphw_bytes_sent: u64,
    /// Messages this rank sent to itself.
    pub self_msgs_sent: u64,
    /// Payload bytes this rank sent to itself.
    pub self_bytes_sent: u64,
    /// Receives that matched a message and completed with its data (any transport, truncated ones
    /// included; cancelled or failed ones not), counted when they complete.
    pub msgs_recvd: u64,
    /// Payload bytes those receives delivered.
    pub bytes_recvd: u64,
    /// Messages in the unexpected queue now (arrived before a matching receive was posted; a
    /// rendezvous message counts once).
    pub unexpected_now: u64,
    /// The most messages the unexpected queue ever held.
    pub unexpected_max: u64,
    /// Messages sent with the rendezvous protocol (any transport).
    pub rendezvous_sent: u64,
    /// Times this rank's traffic to a peer moved to another transport because that peer or this rank
    /// migrated (one per peer whose channel changed: a rank that moves counts one for each such peer).
    pub migrations: u64,
    /// Blocking waits that finished while spinning, never having yielded or slept (a wait complete on
    /// entry and a blocking receive taken by the direct path count here).
    pub waits_spin: u64,
    /// Blocking waits that finished after yielding the CPU, without sleeping.
    pub waits_yield: u64,
    /// Blocking waits that finished after sleeping in the kernel.
    pub waits_sleep: u64,
}

/// The engine's counters as it keeps them: one writer (the engine, which its owner uses from one thread at
/// a time), readers anywhere (the MPI tool interface, from a tool's thread). Each update is a relaxed load
/// and store (a plain `mov`/`add`/`mov`, no locked instruction); a reader sees each counter whole.
#[derive(Debug, Default)]
pub struct Tally {
    shm_msgs_sent: AtomicU64,
    shm_bytes_sent: AtomicU64,
    tcp_msgs_sent: AtomicU64,
    tcp_bytes_sent: AtomicU64,
    mphw_msgs_sent: AtomicU64,
    mphw_bytes_sent: AtomicU64,
    self_msgs_sent: AtomicU64,
    self_bytes_sent: AtomicU64,
    msgs_recvd: AtomicU64,
    bytes_recvd: AtomicU64,
    unexpected_now: AtomicU64,
    unexpected_max: AtomicU64,
    rendezvous_sent: AtomicU64,
    migrations: AtomicU64,
    waits_spin: AtomicU64,
    waits_yield: AtomicU64,
    waits_sleep: AtomicU64,
}

impl Tally {
    /// A snapshot (each counter read once; not one instant across counters).
    pub fn snapshot(&self) -> Counters {
        Counters {
            shm_msgs_sent: self.shm_msgs_sent.load(Ordering::Relaxed),
            shm_bytes_sent: self.shm_bytes_sent.load(Ordering::Relaxed),
            tcp_msgs_sent: self.tcp_msgs_sent.load(Ordering::Relaxed),
            tcp_bytes_sent: self.tcp_bytes_sent.load(Ordering::Relaxed),
            mphw_msgs_sent: self.mphw_msgs_sent.load(Ordering::Relaxed),
            mphw_bytes_sent: self.mphw_bytes_sent.load(Ordering::Relaxed),
            self_msgs_sent: self.self_msgs_sent.load(Ordering::Relaxed),
            self_bytes_sent: self.self_bytes_sent.load(Ordering::Relaxed),
            msgs_recvd: self.msgs_recvd.load(Ordering::Relaxed),
            bytes_recvd: self.bytes_recvd.load(Ordering::Relaxed),
            unexpected_now: self.unexpected_now.load(Ordering::Relaxed),
            unexpected_max: self.unexpected_max.load(Ordering::Relaxed),
            rendezvous_sent: self.rendezvous_sent.load(Ordering::Relaxed),
            migrations: self.migrations.load(Ordering::Relaxed),
            waits_spin: self.waits_spin.load(Ordering::Relaxed),
            waits_yield: self.waits_yield.load(Ordering::Relaxed),
            waits_sleep: self.waits_sleep.load(Ordering::Relaxed),
        }
    }
}

/// Add `n` to a counter that only this engine writes.
#[inline(always)]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// How far a wait went before it ended ([`Counters`]'s `waits_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Never gave up the CPU.
    Spin,
    /// Yielded it.
    Yield,
    /// Slept in the kernel.
    Sleep,
}

/// Where the copier's helper thread announces that it wants a CPU (`vmf_bb::copier::set_beacon`): the
/// header of the region this engine maps. The guard holds that region, so the announcements can never
/// outlive its mapping, and takes them off the region when it is re-aimed or dropped.
struct CopierBeacon {
    region: Option<std::sync::Arc<vmf_transport::shm::region::Region>>,
}

impl CopierBeacon {
    /// Announce in `shm`'s region from now on (nowhere without one).
    fn new(shm: Option<&ShmTransport>) -> CopierBeacon {
        let mut b = CopierBeacon { region: None };
        b.aim(shm);
        b
    }

    /// Announce in `shm`'s region from now on, no longer in the previous one.
    fn aim(&mut self, shm: Option<&ShmTransport>) {
        let region = shm.map(|s| s.region().clone());
        let words = region
            .as_ref()
            .map_or(std::ptr::null(), |r| &r.header().copier_until as *const AtomicU64);
        // SAFETY: the header stays mapped while `self.region` holds it, which it does until the next
        // `set_beacon` has returned (below, or in `drop`).
        unsafe { vmf_bb::copier::set_beacon(words, vmf_pal::process::kernel_id()) };
        self.region = region;
    }
}

impl Drop for CopierBeacon {
    fn drop(&mut self) {
        // SAFETY: null is always valid.
        unsafe { vmf_bb::copier::set_beacon(std::ptr::null(), 0) };
    }
}

// `set_beacon` writes `copier_until` and the word after it.
const _: () = assert!(
    std::mem::offset_of!(vmf_transport::shm::region::RegionHeader, copier_kernel)
        == std::mem::offset_of!(vmf_transport::shm::region::RegionHeader, copier_until) + 8
);

/// The engine of one rank.
pub struct Engine {
    me: usize,
    n: usize,
    cfg: Config,
    /// Where large copies announce that they want a CPU (holds the current region).
    copier_beacon: CopierBeacon,
    shm: Option<ShmTransport>,
    tcp: Option<TcpTransport>,
    /// The emulated hardware, when `VMF_TRANSPORT=mphw` routes every peer there.
    mphw: Option<MphwTransport>,
    mphw_eager: usize,
    mphw_chunk: usize,
    tcp_eager: usize,
    tcp_chunk: usize,
    /// Peers reached over TCP (0: the TCP transport is never polled, so shm-only jobs make no syscalls).
    tcp_peers: usize,
    /// Progress passes, to poll TCP only every few passes when shared memory is busy too.
    passes: u32,
    selfq: SelfTransport,
    peers: Vec<Peer>,
    reqs: Vec<Req>,
    free: Vec<u32>,
    posted: VecDeque<ReqId>,
    unexpected: VecDeque<Unexp>,
    /// Performance counters (`counters`).
    ctr: std::sync::Arc<Tally>,
    streaming: Vec<ReqId>,
    pool: Vec<Vec<u8>>,
    n_pending: usize,
    eager_limit: usize,
    chunk: usize,
    cma: bool,
    /// Large-message choices (calibrated or configured): eager limit, chunk and strategy per size.
    large: crate::calibrate::LargePath,
    /// Ring-imposed maxima of the eager limit and the chunk.
    eager_max: usize,
    chunk_max: usize,
    cma_warned: bool,
    last_liveness: Instant,
    fatal: Option<Error>,
    /// Revoked contexts (MPIX_Comm_revoke; `engine_mpi.rs`), empty but in fault-tolerant programs.
    revoked: Vec<u32>,
    waiter: Waiter,
    /// Turns with the other vmfabric jobs of the machine (adaptive policy; see [`crate::gang`]).
    gang: Option<crate::gang::Gang>,
    /// Where every rank is (region UUID, slot, TCP address), kept current through migrations.
    locs: Vec<migrate::Loc>,
    /// How to move (hosts table, job key, region sizing), when started with emulated hosts.
    mig_ctx: Option<migrate::MigCtx>,
    /// This rank's partition of the region's shared pool (created on first use; none on emulated hosts,
    /// where a rank may move to another region).
    shared: Option<crate::pool::Pool>,
    /// Rendezvous messages copied straight out of a sender's pool partition.
    pool_copies: u64,
    /// A migration of this rank in progress.
    mig: Option<migrate::Moving>,
    /// Called by every wait when several threads share this engine (the MPI library's
    /// `MPI_THREAD_MULTIPLE`): between idle polls it lets other threads in, and around a sleep in the
    /// kernel it lets go and takes over. A thread whose progress delivers packets wakes the threads of
    /// this process that sleep (they may wait for what it delivered), and sleeps are short.
    yield_hook: Option<YieldHook>,
    /// Work a waiting rank does while idle (the one-sided agent's requests, served inline).
    idle_hook: Option<IdleHook>,
    /// Hash of this rank's job name (identity of its processes towards other jobs).
    job_hash: u64,
}

/// Where a wait calls the idle hook (see [`Engine::set_idle_hook`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleAt {
    /// The wait has been idle for a while (called every few dozen idle polls from then on).
    Poll,
    /// The wait that called `Poll` is about to sleep in the kernel (its thread cannot do the idle work
    /// meanwhile; it calls `Poll` again once awake).
    Sleep,
    /// The wait that called `Poll` ends.
    End,
}

/// See [`Engine::set_idle_hook`].
pub type IdleHook = fn(IdleAt);

/// See [`Engine::set_yield_hook`].
pub type YieldHook = unsafe fn(*mut Engine, HookPoint);

/// Where a wait calls the yield hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookPoint {
    /// Between idle polls: let other threads in for a moment.
    Poll,
    /// About to sleep in the kernel: let go entirely.
    Sleep,
    /// Back from the sleep: take over again.
    Wake,
}

/// State of the waiting policy of one rank.
#[derive(Debug, Clone)]
pub struct Waiter {
    /// Policy in force.
    pub policy: WaitPolicy,
    /// True when this host's ranks outnumber its CPUs.
    pub oversubscribed: bool,
    /// Current adaptive spin budget.
    pub spin: Duration,
    min_spin: Duration,
    max_spin: Duration,
    yield_for: Duration,
    min_yield: Duration,
    /// Waits that ended in a sleep.
    pub sleeps: u64,
    /// The one CPU this rank runs on (pinned by [`Engine::bind_cpu`] or by whoever started it).
    pub cpu: Option<usize>,
    /// Longest spin for peers that run on other CPUs when ranks outnumber cores.
    peer_spin: Duration,
    /// CPUs of this host, and the job's ranks competing for them (what `oversubscribed` compares).
    cpus: usize,
    ranks_here: usize,
    /// Yields that lasted a time slice, counted since `long_since` (see [`Waiter::timed_yield`]).
    long_yields: u32,
    long_since: Option<Instant>,
    /// Until then a wait sleeps where it would yield: the CPU is held by tasks that do not yield.
    foreign_until: Option<Instant>,
    /// Until then long yields are not looked into (the last look found only this job's ranks).
    quiet_until: Option<Instant>,
    /// Looks in a row that found foreign load.
    foreign_looks: u32,
    /// Times a wait switched to sleeping for that reason (statistics).
    pub foreign_switches: u64,
}

/// A `sched_yield` that returns only after this long gave the CPU to a task that kept it for a while: a
/// program of another job, or a rank of ours computing. A rank that waits too hands it back in
/// microseconds.
const LONG_YIELD: Duration = Duration::from_micros(300);
/// This many long yields within [`LONG_YIELD_WINDOW`] make a rank look at the machine's runnable tasks;
/// if more run than this job's ranks account for, waits sleep instead of yielding for [`FOREIGN_HOLD`],
/// else the rank looks again only after that long.
const LONG_YIELDS: u32 = 3;
const LONG_YIELD_WINDOW: Duration = Duration::from_millis(100);
const FOREIGN_HOLD: Duration = Duration::from_millis(500);
/// Looks that must find foreign load in a row (see [`Waiter::judge_load`]).
const FOREIGN_LOOKS: u32 = 3;

/// True when more tasks are runnable on this machine than this job's `ours` (its awake ranks and their
/// threads), the CPUs outside its `cpus` and one more (a launcher or kernel thread caught running)
/// account for: some of them must share this job's CPUs. (System-wide counts: a job in a cpuset of a
/// larger, busy host is credited with the CPUs it leaves to the others.)
fn foreign_load(ours: usize, cpus: usize) -> bool {
    vmf_pal::runnable_tasks().is_some_and(|(running, online)| running > ours + online.saturating_sub(cpus) + 1)
}

/// What a wait still waits for, as the caller of [`Engine::wait_for_peers`] knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaiting {
    /// Nothing: the wait is over.
    Done,
    /// Peers that may need this CPU to make progress (or the caller cannot tell).
    Here,
    /// Only peers pinned to other CPUs than this rank's: spinning for them takes nothing they need.
    Elsewhere,
}

impl Waiter {
    fn new(cfg: &Config, local_ranks: usize) -> Waiter {
        let cpus = cfg.host_cpus.unwrap_or_else(vmf_pal::available_cpus).max(1);
        // Ranks joined by TCP on this machine (VMF_SHM=0, emulated hosts) compete for its CPUs too.
        let ranks_here = local_ranks.max(cfg.machine_ranks.unwrap_or(0));
        let oversubscribed = ranks_here > cpus;
        // With a core per rank the budget never drops below 200 us: under background load a preempted peer
        // makes some waits long, and a budget learnt down to nothing would put every later wait to sleep,
        // whose wake-up latency then makes the next waits long too. With more ranks than cores, 2 us.
        let min_spin = Duration::from_micros(if oversubscribed { 2 } else { 200 });
        // With fewer cores than ranks, spinning burns the time slice the awaited rank needs.
        let max_spin = if oversubscribed {
            min_spin
        } else {
            Duration::from_micros(cfg.wait_spin_max_us).max(min_spin)
        };
        // Then yield before sleeping: 50 us (VMF_WAIT_YIELD_US) when ranks outnumber cores; 20x that when
        // they do not, so that a peer preempted by a foreign program does not cost a wake-up every time
        // (a yielding rank stays runnable) while a rank blocked for long still sleeps.
        let yield_for = Duration::from_micros(if oversubscribed {
            cfg.wait_yield_us
        } else {
            20 * cfg.wait_yield_us
        });
        let (spin, yield_for) = match cfg.wait {
            WaitPolicy::Block => (Duration::from_micros(1), Duration::ZERO),
            _ => (max_spin, yield_for),
        };
        Waiter {
            policy: cfg.wait,
            oversubscribed,
            spin,
            min_spin,
            max_spin,
            yield_for,
            min_yield: Duration::from_micros(cfg.wait_yield_us),
            sleeps: 0,
            cpu: None,
            peer_spin: Duration::from_micros(cfg.wait_peer_spin_us),
            cpus,
            ranks_here,
            long_yields: 0,
            long_since: None,
            foreign_until: None,
            quiet_until: None,
            foreign_looks: 0,
            foreign_switches: 0,
        }
    }

    /// Yield the CPU and time it; true when long yields have piled up and the caller should look at the
    /// machine's runnable tasks ([`Engine::yield_cpu`], then [`Waiter::judge_load`]).
    fn timed_yield(&mut self) -> bool {
        let t0 = Instant::now();
        vmf_pal::yield_now();
        let t1 = Instant::now();
        if t1 - t0 < LONG_YIELD || self.quiet_until.is_some_and(|u| t1 < u) {
            return false;
        }
        match self.long_since {
            Some(s) if t1 - s < LONG_YIELD_WINDOW => self.long_yields += 1,
            _ => {
                self.long_since = Some(t1);
                self.long_yields = 1;
            }
        }
        if self.long_yields < LONG_YIELDS {
            return false;
        }
        self.long_yields = 0;
        self.long_since = None;
        true
    }

    /// After long yields: `foreign` says whether tasks other than this job's ranks seemed to share its
    /// CPUs. [`FOREIGN_LOOKS`] such looks in a row (a snapshot can catch a rank just woken, whose slot
    /// still says it sleeps, or a launcher thread) make waits sleep for [`FOREIGN_HOLD`]; a look that finds
    /// none stops the looking for as long.
    fn judge_load(&mut self, foreign: bool) {
        let now = Instant::now();
        if !foreign {
            self.foreign_looks = 0;
            self.quiet_until = Some(now + FOREIGN_HOLD);
            return;
        }
        self.foreign_looks += 1;
        if self.foreign_looks < FOREIGN_LOOKS {
            return;
        }
        self.foreign_looks = 0;
        if self.foreign_until.is_none_or(|u| u < now) {
            self.foreign_switches += 1;
        }
        self.foreign_until = Some(now + FOREIGN_HOLD);
    }

    /// True while waits sleep where they would yield (see [`Waiter::timed_yield`]).
    #[inline]
    fn sleeps_instead(&mut self) -> bool {
        match self.foreign_until {
            None => false,
            Some(u) if Instant::now() < u => true,
            Some(_) => {
                self.foreign_until = None;
                false
            }
        }
    }

    /// Large one-sided copies are shared with a helper thread (`vmf_bb::copier`) only when every rank of
    /// this host has a CPU: oversubscribed, the helper would take the time slice of a rank that needs it.
    fn share_copies(&self, cfg: &Config) {
        let min = (cfg.rma_copy_share_min > 0 && !self.oversubscribed)
            .then(|| usize::try_from(cfg.rma_copy_share_min).unwrap_or(usize::MAX));
        vmf_bb::copier::configure(min, Duration::from_micros(50));
    }

    fn budgets(&self) -> (Duration, Duration) {
        (self.spin, self.yield_for)
    }

    /// Learn from a finished wait: a wait that spinning up to the maximum budget would have caught pulls
    /// the budget towards twice its length; a longer one pulls it towards the minimum (spinning would only
    /// have burnt CPU). Exponential moving average, weight 1/4.
    fn record(&mut self, waited: Duration, _slept: bool) {
        if self.policy != WaitPolicy::Adaptive {
            return;
        }
        if self.oversubscribed {
            // Ranks outnumber cores: the spin stays short and it is the yield phase that is learnt, so that
            // waits of the usual length (a token going round 8 ranks on 2 cores) end while the rank is still
            // runnable instead of costing a wake-up (~45 us here).
            let (lo, hi) = (self.min_yield, Duration::from_millis(2));
            let target = if waited <= hi {
                (waited * 2).max(lo)
            } else {
                lo
            };
            self.yield_for = ((self.yield_for * 3 + target) / 4).clamp(lo, hi);
            return;
        }
        let target = if waited <= self.max_spin {
            (waited * 2).max(self.min_spin)
        } else {
            self.min_spin
        };
        let next = (self.spin * 3 + target) / 4;
        self.spin = next.clamp(self.min_spin, self.max_spin);
    }
}

const SYNC_PREFIX: usize = 8;

/// [`Engine::recv_direct`] on a shared-memory ring: looks before handing over to the general path (a look
/// is a few cache-line reads), and every how many idle looks a full progress pass.
const DIRECT_SHM_LOOKS: u32 = 16384;
const DIRECT_SHM_PROGRESS: u32 = 512;
/// The same on a TCP socket, where a look is a nonblocking `recv` (0.3-0.4 us here): about 100 us of
/// looks, and the other channels (the listener, other sockets, queued sends) served every 16.
const DIRECT_TCP_LOOKS: u32 = 256;
const DIRECT_TCP_PROGRESS: u32 = 16;

impl Engine {
    /// An engine for rank `me` of `n`, with an optional shared-memory transport (routes for its peers
    /// are set from `shm.reaches`).
    pub fn new(
        me: usize,
        n: usize,
        cfg: Config,
        shm: Option<ShmTransport>,
        tcp: Option<TcpTransport>,
    ) -> Engine {
        let mut peers: Vec<Peer> = (0..n).map(|_| Peer::new(Route::None)).collect();
        let cal = cfg.large.clone().unwrap_or_default();
        let mut eager_limit = cfg.shm_eager_limit.unwrap_or(cal.eager_limit);
        let mut chunk = cfg.shm_chunk.unwrap_or(cal.chunk);
        let (mut eager_max, mut chunk_max) = (usize::MAX, usize::MAX);
        if let Some(s) = &shm {
            for (r, p) in peers.iter_mut().enumerate() {
                if s.reaches(r) {
                    p.route = Route::Shm;
                }
            }
            let maxp = s.max_payload(0);
            eager_max = maxp - SYNC_PREFIX;
            chunk_max = maxp - DataInfo::SIZE;
            eager_limit = eager_limit.min(eager_max);
            chunk = chunk.min(chunk_max);
        }
        let mut tcp = tcp;
        if let Some(t) = tcp.as_mut() {
            t.set_accept_limits(
                Duration::from_millis(cfg.tcp_handshake_ms),
                cfg.tcp_pending_max,
            );
            for (r, p) in peers.iter_mut().enumerate() {
                if p.route == Route::None && t.reaches(r) {
                    p.route = Route::Tcp;
                }
            }
        }
        peers[me].route = Route::SelfLoop;
        let tcp_peers = peers.iter().filter(|p| p.route == Route::Tcp).count();
        let tcp_eager = cfg.tcp_eager_limit;
        let tcp_chunk = cfg.tcp_chunk;
        let cma = cfg.shm_cma && vmf_pal::cma::allow_any_ptracer().is_ok();
        let mut shm = shm;
        if let Some(s) = shm.as_mut() {
            s.set_wake_check(matches!(cfg.wait, WaitPolicy::Block | WaitPolicy::Adaptive));
        }
        // Which protocol moves a rendezvous message between co-resident ranks: as configured
        // (SHM_CMA_MIN), else single copy for every size when ranks outnumber cores (the pipeline stalls
        // whenever one side is descheduled), else what this host's calibration measured fastest per size
        // (see `calibrate`), else the pipelined copy.
        let local = shm.as_ref().map_or(1, |s| s.peer_count() + 1);
        use crate::calibrate::Strategy;
        let steps = match cfg.shm_cma_min {
            Some(m) => vec![(m, Strategy::Read)],
            None if local > vmf_pal::available_cpus() => vec![(0, Strategy::Read)],
            None => cal.steps,
        };
        let large = crate::calibrate::LargePath {
            eager_limit,
            chunk,
            steps,
        };
        Engine {
            me,
            n,
            copier_beacon: CopierBeacon::new(shm.as_ref()),
            shm,
            tcp,
            mphw: None,
            mphw_eager: 0,
            mphw_chunk: 0,
            tcp_eager,
            tcp_chunk,
            tcp_peers,
            passes: 0,
            selfq: SelfTransport::new(me),
            peers,
            reqs: (0..64).map(|_| Req::empty()).collect(),
            free: (0..64u32).rev().collect(),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            ctr: std::sync::Arc::new(Tally::default()),
            streaming: Vec::new(),
            pool: Vec::new(),
            n_pending: 0,
            eager_limit,
            chunk,
            cma,
            large,
            eager_max,
            chunk_max,
            cma_warned: false,
            last_liveness: Instant::now(),
            fatal: None,
            revoked: Vec::new(),
            waiter: {
                let w = Waiter::new(&cfg, local);
                w.share_copies(&cfg);
                w
            },
            gang: None,
            locs: vec![migrate::Loc::default(); n],
            mig_ctx: None,
            shared: None,
            pool_copies: 0,
            mig: None,
            yield_hook: None,
            idle_hook: None,
            job_hash: 0,
            cfg,
        }
    }

    // ---------------------------------------------------------------- processes of other jobs

    /// Name this rank's job (the hash its TCP handshakes carry); set by `Fabric::init`.
    pub fn set_job_hash(&mut self, h: u64) {
        self.job_hash = h;
    }

    /// Take turns with the CPUs with other vmfabric jobs of this machine when together they have more
    /// ranks than CPUs (adaptive policy, `VMF_GANG_SLICE_US` > 0): see [`crate::gang`].
    pub fn join_gang(&mut self) {
        if self.cfg.wait != WaitPolicy::Adaptive || self.cfg.gang_slice_us == 0 {
            return;
        }
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            std::path::PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        self.gang = crate::gang::Gang::join(
            &dir,
            self.job_hash,
            self.waiter.ranks_here,
            self.waiter.cpus,
            Duration::from_micros(self.cfg.gang_slice_us),
        );
    }

    /// In a wait: if it is another job's turn with the CPUs, sleep until ours. True if it slept.
    #[inline]
    fn gang_turn(&mut self) -> bool {
        let Some(g) = self.gang.as_mut() else {
            return false;
        };
        match g.off_turn(migrate::monotonic_ns()) {
            Some(d) => {
                std::thread::sleep(d);
                true
            }
            None => false,
        }
    }

    /// Make sure the TCP transport exists (a job of one rank, or one started with `VMF_TCP=0`, has none
    /// until it meets a process of another job) and return the address it listens on.
    pub fn tcp_listen_addr(&mut self) -> Result<std::net::SocketAddr> {
        if self.tcp.is_none() {
            let bind = self.cfg.tcp_addr.unwrap_or_else(|| {
                std::net::IpAddr::V4(
                    vmf_transport::tcp::default_ipv4().unwrap_or(std::net::Ipv4Addr::LOCALHOST),
                )
            });
            let mut secret = [0u8; 16];
            let _ = getrandom::fill(&mut secret);
            let tc = vmf_transport::tcp::TcpConfig {
                bind,
                secret,
                job: self.job_hash,
                max_frame: self.cfg.tcp_max_frame(),
            };
            let mut t = TcpTransport::new(self.me, self.n, tc)
                .map_err(|e| self.terr(self.me, Op::Init, e))?;
            t.set_accept_limits(
                Duration::from_millis(self.cfg.tcp_handshake_ms),
                self.cfg.tcp_pending_max,
            );
            if let Some(shm) = self.shm.as_mut() {
                if shm.doorbell_fd().is_none() {
                    // Sleep in epoll on both transports from now on.
                    shm.enable_socket_doorbell(self.job_hash)
                        .map_err(|e| Error::Setup {
                            rank: self.me,
                            op: Op::Init,
                            why: e.to_string(),
                        })?;
                }
            }
            self.tcp = Some(t);
        }
        Ok(self.tcp.as_ref().unwrap().local_addr())
    }

    /// Make rank `rank` of another job (hash `job`), listening at `addr`, a peer of this rank (MPI dynamic
    /// processes): returns its peer index, at least [`Engine::size`] (the same index for a process met
    /// before). Traffic with it goes over TCP, authenticated with `secret`, which it holds for us too.
    pub fn add_remote(
        &mut self,
        job: u64,
        rank: u32,
        secret: [u8; 16],
        addr: std::net::SocketAddr,
    ) -> Result<usize> {
        if job == self.job_hash && (rank as usize) < self.n {
            return Ok(rank as usize); // a rank of this job: reached as before
        }
        self.tcp_listen_addr()?;
        // Jobs that talk to each other (dynamic processes) must not take turns with the CPUs: each
        // message between them would wait for the other's slice. This rank stops taking part (its
        // job's entry goes quiet, so the others stop waiting for it).
        self.gang = None;
        let idx = self
            .tcp
            .as_mut()
            .unwrap()
            .add_remote(job, rank, secret, addr);
        if idx == self.peers.len() {
            self.peers.push(Peer::new(Route::Tcp));
            self.locs.push(migrate::Loc {
                addr: Some(addr),
                ..Default::default()
            });
            self.tcp_peers += 1;
        }
        Ok(idx)
    }

    /// Who peer `peer` is, the same in every process: (job hash, rank in that job).
    pub fn identity(&self, peer: usize) -> (u64, u32) {
        match &self.tcp {
            Some(t) if peer >= self.n => t.identity(peer),
            _ => (self.job_hash, peer as u32),
        }
    }

    /// The peer index of rank `rank` of job `job`, if this rank knows that process.
    pub fn index_of(&self, job: u64, rank: u32) -> Option<usize> {
        if job == self.job_hash {
            return ((rank as usize) < self.n).then_some(rank as usize);
        }
        self.tcp.as_ref().and_then(|t| t.index_of(job, rank))
    }

    /// Number of peers: the job's ranks, then the processes of other jobs met since.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Install `hook`, called by every wait between idle polls and around its sleeps, with a pointer to
    /// this engine (which the hook may let other threads use until it returns).
    ///
    /// # Safety
    /// Whoever uses the engine while the hook runs must be serialised with the waiting thread by the
    /// hook's lock; see `vmf_core::EngineCell`.
    pub unsafe fn set_yield_hook(&mut self, hook: Option<YieldHook>) {
        self.yield_hook = hook;
    }

    /// Install `hook`, which waits call once they have been idle for a few microseconds (every few dozen
    /// idle polls from then on) and once more when such a wait ends: the one-sided agent serves its
    /// connections from the waiting thread then.
    pub fn set_idle_hook(&mut self, hook: Option<IdleHook>) {
        self.idle_hook = hook;
    }

    /// Let other threads use the engine now (calls the yield hook, if any).
    #[inline]
    pub fn let_others_in(&mut self) {
        self.hook(HookPoint::Poll);
    }

    #[inline]
    fn hook(&mut self, at: HookPoint) {
        if let Some(h) = self.yield_hook {
            // SAFETY: the hook's contract (set_yield_hook).
            unsafe { h(self as *mut Engine, at) };
        }
    }

    /// The configuration this engine was built with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// This rank.
    pub fn rank(&self) -> usize {
        self.me
    }
    /// Job size.
    pub fn size(&self) -> usize {
        self.n
    }
    /// The channel to `peer`.
    pub fn route(&self, peer: usize) -> Route {
        self.peers.get(peer).map_or(Route::None, |p| p.route)
    }
    /// Largest eager message.
    pub fn eager_limit(&self) -> usize {
        self.eager_limit
    }
    /// Single copy (process_vm_readv/writev) with `peer`: enabled, and the peer runs under our kernel
    /// (a peer in another VM sharing an ivshmem region has no process we could read).
    #[inline]
    fn cma_with(&self, peer: usize) -> bool {
        self.cma && self.shm.as_ref().is_some_and(|s| s.same_kernel(peer))
    }
    /// True if some large messages use a single copy (`process_vm_readv` or `process_vm_writev`).
    pub fn cma_enabled(&self) -> bool {
        self.cma && !self.large.steps.is_empty()
    }
    /// The large-message choices in use (eager limit, chunk, strategy per size).
    pub fn large_path(&self) -> &crate::calibrate::LargePath {
        &self.large
    }
    /// Use other large-message choices from now on (calibration; the eager limit and chunk are capped by
    /// the rings). Only the sender's choices matter: a receiver follows what each message asks for.
    pub fn set_large_path(&mut self, p: &crate::calibrate::LargePath) {
        self.large = p.clone();
        self.large.eager_limit = p.eager_limit.min(self.eager_max);
        self.large.chunk = p.chunk.clamp(1, self.chunk_max);
        self.eager_limit = self.large.eager_limit;
        self.chunk = self.large.chunk;
    }
    /// The shm transport, if any.
    pub fn shm(&self) -> Option<&ShmTransport> {
        self.shm.as_ref()
    }
    /// The TCP transport, if any.
    pub fn tcp(&self) -> Option<&TcpTransport> {
        self.tcp.as_ref()
    }
    /// Route every peer not reached otherwise over the emulated message-passing hardware.
    pub fn set_mphw(&mut self, t: MphwTransport) {
        for (r, p) in self.peers.iter_mut().enumerate() {
            if p.route == Route::None && t.reaches(r) {
                p.route = Route::Mphw;
            }
        }
        let maxp = t.max_payload(0);
        self.mphw_eager = self.cfg.tcp_eager_limit.min(maxp - SYNC_PREFIX);
        self.mphw_chunk = maxp - DataInfo::SIZE;
        self.mphw = Some(t);
    }
    /// The mphw transport, if any.
    pub fn mphw(&self) -> Option<&MphwTransport> {
        self.mphw.as_ref()
    }
    /// Allocate `len` bytes (aligned to `align`, at most 4096) from this rank's partition of the region's
    /// shared pool. `None` without a region, without a pool, on emulated hosts, or when it is full.
    pub fn pool_alloc(&mut self, len: usize, align: usize) -> Option<*mut u8> {
        if self.shared.is_none() {
            // Emulated hosts hand a left slot to the next rank moving in at once: no pool there. A VM
            // (hosts without namespaces) keeps its pool; it cannot leave the region while it uses it.
            if self.mig_ctx.as_ref().is_some_and(|c| !c.keeps_pool()) {
                return None;
            }
            let shm = self.shm.as_ref()?;
            self.shared = crate::pool::Pool::new(shm.region().clone(), shm.local_index());
        }
        self.shared.as_mut()?.alloc(len, align).map(|(p, _)| p)
    }

    /// Free a block of [`Engine::pool_alloc`]; false if `p` is not one.
    pub fn pool_free(&mut self, p: *mut u8) -> bool {
        self.shared.as_mut().is_some_and(|s| s.free(p))
    }

    /// Drop this rank's reference to a pool block whose first word is a reader count (see
    /// [`crate::pool::Pool::release_shared`]).
    ///
    /// # Safety
    /// As for `release_shared`.
    pub unsafe fn pool_release_shared(&mut self, p: *mut u8) {
        if let Some(s) = self.shared.as_mut() {
            // SAFETY: caller's contract.
            unsafe { s.release_shared(p) };
        }
    }

    /// The region offset of pool block `p` of this rank (to publish to co-resident peers).
    pub fn pool_offset(&self, p: *const u8, len: usize) -> Option<u64> {
        let s = self.shared.as_ref()?;
        s.region()
            .pool_offset(p, len)
            .filter(|&(slot, _)| slot == s.slot())
            .map(|(_, o)| o)
    }

    /// A pointer to `len` bytes at region offset `off` inside co-resident `peer`'s pool partition
    /// (validated: an offset a peer sent that points anywhere else is an error).
    pub fn peer_pool_ptr(&self, peer: usize, off: u64, len: usize) -> Option<*mut u8> {
        let shm = self.shm.as_ref()?;
        let slot = if peer == self.me {
            shm.local_index()
        } else {
            shm.peer_local(peer)?
        };
        shm.region().pool_ptr(slot, off, len as u64).ok()
    }

    /// Wake co-resident `peer` if it sleeps (after writing shared memory it may be waiting on).
    #[inline]
    pub fn wake_peer(&self, peer: usize) {
        if let Some(shm) = &self.shm {
            shm.wake_peer(peer);
        }
    }

    /// Rendezvous messages received by copying straight out of the sender's pool partition.
    pub fn pool_copies(&self) -> u64 {
        self.pool_copies
    }

    /// True if this rank may move between regions (started on emulated hosts).
    pub fn may_migrate(&self) -> bool {
        self.mig_ctx.is_some()
    }

    /// The shm transport, mutably (test hooks).
    pub fn shm_mut(&mut self) -> Option<&mut ShmTransport> {
        self.shm.as_mut()
    }

    // ---------------------------------------------------------------- requests

    fn alloc_req(&mut self) -> ReqId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                let old = self.reqs.len();
                self.reqs.extend((0..old).map(|_| Req::empty()));
                self.free.extend((old as u32 + 1..(2 * old) as u32).rev());
                old as u32
            }
        };
        let r = &mut self.reqs[idx as usize];
        r.state = State::Active;
        r.error = None;
        r.status = Status::default();
        r.split = false;
        ReqId { idx, gen: r.gen }
    }

    fn req(&self, id: ReqId) -> Option<&Req> {
        self.reqs
            .get(id.idx as usize)
            .filter(|r| r.gen == id.gen && r.state != State::Free)
    }

    fn req_mut(&mut self, id: ReqId) -> Option<&mut Req> {
        self.reqs
            .get_mut(id.idx as usize)
            .filter(|r| r.gen == id.gen && r.state != State::Free)
    }

    /// A snapshot of this rank's counters (see [`Counters`]).
    pub fn counters(&self) -> Counters {
        self.ctr.snapshot()
    }

    /// The counters themselves, to read from another thread (they outlive the engine).
    pub fn tally(&self) -> std::sync::Arc<Tally> {
        self.ctr.clone()
    }

    /// Count a message sent on `route`.
    #[inline]
    fn count_sent(&mut self, route: Route, len: usize, rendezvous: bool) {
        let c = &*self.ctr;
        let (msgs, bytes) = match route {
            Route::Shm => (&c.shm_msgs_sent, &c.shm_bytes_sent),
            Route::Tcp => (&c.tcp_msgs_sent, &c.tcp_bytes_sent),
            Route::Mphw => (&c.mphw_msgs_sent, &c.mphw_bytes_sent),
            // None: never (a send there fails before it is counted).
            Route::SelfLoop | Route::None => (&c.self_msgs_sent, &c.self_bytes_sent),
        };
        bump(msgs, 1);
        bump(bytes, len as u64);
        if rendezvous {
            bump(&c.rendezvous_sent, 1);
        }
    }

    /// Count a receive that completed with `len` bytes.
    #[inline]
    fn count_recvd(&mut self, len: usize) {
        bump(&self.ctr.msgs_recvd, 1);
        bump(&self.ctr.bytes_recvd, len as u64);
    }

    /// Count a finished wait.
    #[inline]
    fn count_wait(&mut self, stage: Stage) {
        let c = &*self.ctr;
        bump(
            match stage {
                Stage::Spin => &c.waits_spin,
                Stage::Yield => &c.waits_yield,
                Stage::Sleep => &c.waits_sleep,
            },
            1,
        );
    }

    /// Park a message that matched no posted receive.
    #[inline]
    fn park(&mut self, u: Unexp) {
        self.unexpected.push_back(u);
        let n = self.unexpected.len() as u64;
        let c = &*self.ctr;
        c.unexpected_now.store(n, Ordering::Relaxed);
        if n > c.unexpected_max.load(Ordering::Relaxed) {
            c.unexpected_max.store(n, Ordering::Relaxed);
        }
    }

    /// A message left the unexpected queue.
    #[inline]
    pub(crate) fn unparked(&self) {
        self.ctr.unexpected_now.store(self.unexpected.len() as u64, Ordering::Relaxed);
    }

    fn complete(&mut self, id: ReqId) {
        if let Some(r) = self.req_mut(id) {
            r.state = State::Done;
        }
    }

    fn fail(&mut self, id: ReqId, e: Error) {
        if let Some(r) = self.req_mut(id) {
            r.state = State::Done;
            r.error = Some(e);
        }
    }

    /// True if the request has completed (without freeing it).
    pub fn is_done(&self, id: ReqId) -> bool {
        self.req(id).is_none_or(|r| r.state == State::Done)
    }

    /// Free a completed request and return its status (or its error).
    pub fn take(&mut self, id: ReqId) -> Result<Status> {
        let me = self.me;
        let r = self.req_mut(id).ok_or(Error::InvalidRequest {
            rank: me,
            op: Op::Wait,
        })?;
        debug_assert_eq!(r.state, State::Done);
        r.state = State::Free;
        r.gen = r.gen.wrapping_add(1).max(1);
        let st = r.status;
        let err = r.error.take();
        self.free.push(id.idx);
        match err {
            Some(e) => Err(e),
            None => Ok(st),
        }
    }

    // ---------------------------------------------------------------- validation

    fn check_peer(&self, peer: i64, op: Op, allow_any: bool) -> Result<()> {
        if (allow_any && peer == ANY_SOURCE as i64)
            || (peer >= 0 && (peer as usize) < self.peers.len())
        {
            Ok(())
        } else {
            Err(Error::InvalidRank {
                rank: self.me,
                peer,
                size: self.peers.len(),
                op,
            })
        }
    }

    fn check_tag(&self, peer: i64, tag: i32, op: Op, allow_any: bool) -> Result<()> {
        if tag >= 0 || (allow_any && tag == ANY_TAG) {
            Ok(())
        } else {
            Err(Error::InvalidTag {
                rank: self.me,
                peer,
                tag,
                op,
            })
        }
    }

    fn terr(&self, peer: usize, op: Op, e: TransportError) -> Error {
        match e {
            TransportError::PeerDead { peer, pid } => Error::PeerDead {
                rank: self.me,
                peer,
                pid,
                op,
            },
            source => Error::Transport {
                rank: self.me,
                peer,
                op,
                source,
            },
        }
    }

    // ---------------------------------------------------------------- sending

    /// Send one packet now if possible. Assigns the sequence number on success.
    #[inline]
    fn try_packet(&mut self, peer: usize, hdr: &mut PktHeader, a: &[u8], b: &[u8]) -> Result<bool> {
        self.try_packet_ex(peer, hdr, a, b, false)
    }

    /// As [`Engine::try_packet`]; `borrowed`: `b` stays valid until the transport's backlog drains.
    #[inline]
    fn try_packet_ex(
        &mut self,
        peer: usize,
        hdr: &mut PktHeader,
        a: &[u8],
        b: &[u8],
        borrowed: bool,
    ) -> Result<bool> {
        let p = &mut self.peers[peer];
        hdr.seq = p.tx_seq;
        let r = match p.route {
            Route::Shm => self.shm.as_mut().unwrap().try_send(peer, hdr, a, b),
            Route::Tcp if borrowed => self
                .tcp
                .as_mut()
                .unwrap()
                .try_send_borrowed(peer, hdr, a, b),
            Route::Tcp => self.tcp.as_mut().unwrap().try_send(peer, hdr, a, b),
            Route::Mphw => self.mphw.as_mut().unwrap().try_send(peer, hdr, a, b),
            Route::SelfLoop => self.selfq.try_send(peer, hdr, a, b),
            Route::None => {
                return Err(Error::Unreachable {
                    rank: self.me,
                    peer,
                    op: Op::Send,
                })
            }
        };
        match r {
            Ok(true) => {
                self.peers[peer].tx_seq += 1;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => Err(self.terr(peer, Op::Send, e)),
        }
    }

    /// Send a packet, queueing it (in order) if the queue is full or others wait before it.
    fn send_packet(
        &mut self,
        peer: usize,
        mut hdr: PktHeader,
        a: &[u8],
        data: *const u8,
        data_len: usize,
        complete: Option<ReqId>,
    ) -> Result<bool> {
        let holding = self.peers[peer].holding;
        if !holding && self.peers[peer].pending.is_empty() {
            // The common case: straight into the transport, no bookkeeping.
            // SAFETY: data/data_len describe the caller's buffer, valid until the request completes.
            let b = unsafe { slice(data, data_len) };
            if self.try_packet(peer, &mut hdr, a, b)? {
                return Ok(true);
            }
        }
        let mut p = Pending {
            hdr,
            a: [0; 48],
            a_len: a.len() as u8,
            data,
            data_len,
            complete,
            retire_old: false,
        };
        p.a[..a.len()].copy_from_slice(a);
        if holding {
            self.peers[peer].held.push_back(p);
            return Ok(false);
        }
        self.peers[peer].pending.push_back(p);
        self.n_pending += 1;
        Ok(false)
    }

    /// Blocking-send fast path: an eager message to a peer whose queue is idle goes straight into the
    /// transport, with no request at all. `Ok(false)`: not taken (use [`Engine::isend`]).
    ///
    /// # Safety
    /// `buf..buf+len` must be readable (it is copied before returning).
    #[inline]
    pub unsafe fn try_send_now(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: i64,
        tag: i32,
        ctx: u32,
    ) -> Result<bool> {
        if dest < 0
            || dest as usize >= self.peers.len()
            || tag < 0
            || self.fatal.is_some()
            || !self.revoked.is_empty()
        {
            return Ok(false); // the slow path reports the error
        }
        let dest = dest as usize;
        let p = &self.peers[dest];
        if p.holding || !p.pending.is_empty() {
            return Ok(false);
        }
        let route = p.route;
        let limit = match route {
            Route::Shm => self.eager_limit,
            Route::Tcp => self.tcp_eager,
            Route::Mphw => self.mphw_eager,
            _ => return Ok(false),
        };
        if len > limit {
            return Ok(false);
        }
        let mut hdr = PktHeader::new(Kind::Eager, self.me as u32, tag, ctx, 0, len as u64);
        let sent = self.try_packet(dest, &mut hdr, &[], slice(buf, len))?;
        if sent {
            self.count_sent(route, len, false);
        }
        Ok(sent)
    }

    /// Blocking-receive fast path: wait for an eager message from `src` by watching its channel alone
    /// (its shared-memory ring, or its TCP socket) and copy it straight into `buf`, with no request, no
    /// posted-queue entry and no general progress pass per look. Returns `Ok(None)` whenever the general
    /// path must decide — another receive is posted (it may match first), a matching message is already
    /// queued, the next packet is anything but a fitting eager message for this receive (that packet is
    /// handled first), ranks outnumber cores (waiting must yield), or the message takes long — and the
    /// caller then posts the receive normally. Every [`DIRECT_SHM_PROGRESS`] (shared memory) or
    /// [`DIRECT_TCP_PROGRESS`] (TCP: each look is a system call) idle looks, a full progress pass keeps
    /// other channels moving (a sender blocked on us must never wait for this loop). When several
    /// threads share the engine (MPI_THREAD_MULTIPLE), every 64 idle looks the yield hook lets the
    /// others in, and the loop gives up if they posted or queued what this receive could match.
    ///
    /// Over TCP this saves the request, the matching and the general poll between a message's arrival
    /// and the application's answer: 8-byte half round trip on loopback, from the successful `recv` to
    /// the next `send`, 550-680 cycles through the general path against 400-540 here.
    ///
    /// # Safety
    /// `buf..buf+cap` must be valid for writes.
    pub unsafe fn recv_direct(
        &mut self,
        buf: *mut u8,
        cap: usize,
        src: i64,
        tag: i32,
        ctx: u32,
    ) -> Result<Option<Status>> {
        if src < 0
            || src as usize >= self.peers.len()
            || (tag < 0 && tag != ANY_TAG)
            || self.fatal.is_some()
            || self.mig.is_some()
            || self.waiter.oversubscribed
            || !self.posted.is_empty()
            || !self.revoked.is_empty()
        {
            return Ok(None);
        }
        let peer = src as usize;
        let queued = self.queued_match(peer, tag, ctx);
        match self.peers[peer].route {
            Route::Shm if self.shm.is_some() && !queued => self.recv_direct_on(
                |e| e.shm.as_mut().map(|t| (t, &e.reqs[..])),
                peer,
                (buf, cap, tag, ctx),
                (DIRECT_SHM_LOOKS, DIRECT_SHM_PROGRESS),
            ),
            Route::Tcp if self.tcp.is_some() && !queued && self.n_pending == 0 => self
                .recv_direct_on(
                    |e| e.tcp.as_mut().map(|t| (t, &e.reqs[..])),
                    peer,
                    (buf, cap, tag, ctx),
                    (DIRECT_TCP_LOOKS, DIRECT_TCP_PROGRESS),
                ),
            _ => Ok(None),
        }
    }

    /// A message from `src` that a receive for `tag` in `ctx` would match is already queued.
    fn queued_match(&self, src: usize, tag: i32, ctx: u32) -> bool {
        self.unexpected
            .iter()
            .any(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))
    }

    /// [`Engine::recv_direct`]'s loop on the transport `pick` returns (with the requests, for placing
    /// data a look may bring). `want`: buffer, capacity, tag, context; `every`: how many looks at most,
    /// and every how many idle ones a full progress pass.
    ///
    /// # Safety
    /// As [`Engine::recv_direct`].
    #[inline(always)]
    unsafe fn recv_direct_on<T, F>(
        &mut self,
        pick: F,
        peer: usize,
        want: (*mut u8, usize, i32, u32),
        every: (u32, u32),
    ) -> Result<Option<Status>>
    where
        T: Transport,
        F: Fn(&mut Engine) -> Option<(&mut T, &[Req])>,
    {
        let (buf, cap, tag, ctx) = want;
        let (looks, progress_every) = every;
        let direct = self.cfg.tcp_direct;
        for polls in 1..=looks {
            let Some((t, reqs)) = pick(self) else {
                return Ok(None);
            };
            let inc = match t.poll_from(peer, &mut |p, h, a| {
                place_target(direct, reqs, p, h, a)
            }) {
                Ok(i) => i,
                Err(e) => {
                    let e = self.terr(peer, Op::Recv, e);
                    return self.latch(Err(e));
                }
            };
            let Some(inc) = inc else {
                // Under MPI_THREAD_MULTIPLE let the other threads in now and then (they may take what
                // this receive waits for: then the general path below finds it).
                let shared = self.yield_hook.is_some() && polls % 64 == 0;
                if shared {
                    self.hook(HookPoint::Poll);
                }
                if polls % progress_every == 0 || shared {
                    if polls % progress_every == 0 {
                        self.progress()?;
                    }
                    if self.queued_match(peer, tag, ctx)
                        || !self.posted.is_empty()
                        || self.fatal.is_some()
                        || self.mig.is_some()
                        || !self.revoked.is_empty()
                    {
                        return Ok(None);
                    }
                }
                continue;
            };
            let h = inc.hdr;
            let fits = h.kind == Kind::Eager as u8
                && h.flags == 0
                && h.ctx == ctx
                && (tag == ANY_TAG || h.tag == tag)
                && h.seq == self.peers[peer].rx_seq
                && h.len == inc.len() as u64
                && inc.len() <= cap
                && inc.placed == 0;
            if fits {
                self.peers[peer].rx_seq += 1;
                if !inc.is_empty() {
                    // SAFETY: the payload lies in the validated record; buf has cap >= len bytes.
                    unsafe { std::ptr::copy_nonoverlapping(inc.payload_ptr(), buf, inc.len()) };
                }
                let st = Status {
                    source: peer,
                    tag: h.tag,
                    count: inc.len(),
                    msg_len: inc.len(),
                    cancelled: false,
                };
                if let Some((t, _)) = pick(self) {
                    t.release(inc);
                }
                self.count_recvd(st.count);
                self.count_wait(Stage::Spin);
                return Ok(Some(st));
            }
            // Anything else (control, rendezvous, synchronous, other tag, truncation, bad sequence number)
            // goes through the general handler, which also reports what is corrupt.
            // SAFETY: payload valid until release below.
            let payload = unsafe { slice(inc.payload_ptr(), inc.len()) };
            let r = self.handle(peer, &h, payload, inc.placed);
            if let Some((t, _)) = pick(self) {
                t.release(inc);
            }
            return self.latch(r).map(|()| None);
        }
        Ok(None)
    }

    /// Start a send of `len` bytes at `buf` to `dest` with `tag` in context `ctx`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unmodified until the request completes.
    pub unsafe fn isend(
        &mut self,
        buf: *const u8,
        len: usize,
        dest: i64,
        tag: i32,
        ctx: u32,
        mode: SendMode,
    ) -> Result<ReqId> {
        self.check_peer(dest, Op::Send, false)?;
        self.check_tag(dest, tag, Op::Send, false)?;
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        self.check_revoked(ctx, Op::Send)?;
        let dest = dest as usize;
        let id = self.alloc_req();
        {
            let r = &mut self.reqs[id.idx as usize];
            r.is_send = true;
            r.buf = buf as *mut u8;
            r.len = len;
            r.peer = dest as i32;
            r.tag = tag;
            r.ctx = ctx;
            r.phase = Phase::Queued;
            r.status = Status {
                source: self.me,
                tag,
                count: len,
                msg_len: len,
                cancelled: false,
            };
        }
        let route = self.peers[dest].route;
        let limit = match route {
            Route::SelfLoop => usize::MAX,
            Route::Tcp => self.tcp_eager,
            Route::Mphw => self.mphw_eager,
            _ => self.eager_limit,
        };
        let eager = len <= limit;
        let res = if eager {
            let mut hdr = PktHeader::new(Kind::Eager, self.me as u32, tag, ctx, 0, len as u64);
            if mode == SendMode::Synchronous {
                hdr.flags |= FLAG_SYNC;
                self.reqs[id.idx as usize].phase = Phase::AwaitAck;
                let w = id.wire().to_le_bytes();
                self.send_packet(dest, hdr, &w, buf, len, None).map(|_| ())
            } else {
                match self.send_packet(dest, hdr, &[], buf, len, Some(id)) {
                    Ok(true) => {
                        self.complete(id);
                        Ok(())
                    }
                    Ok(false) => Ok(()),
                    Err(e) => Err(e),
                }
            }
        } else {
            let hdr = PktHeader::new(Kind::Rts, self.me as u32, tag, ctx, 0, len as u64);
            let strategy = if route == Route::Shm && self.cma_with(dest) {
                self.large.pick(len)
            } else {
                crate::calibrate::Strategy::Pipelined
            };
            let pid = if strategy == crate::calibrate::Strategy::Pipelined {
                0
            } else {
                std::process::id() as u64
            };
            let pool = if route == Route::Shm {
                self.pool_offset(buf, len).unwrap_or(0)
            } else {
                0
            };
            let info = RtsInfo {
                sreq: id.wire(),
                addr: buf as u64,
                pid,
                pool,
                write: match strategy {
                    crate::calibrate::Strategy::Write => 1,
                    crate::calibrate::Strategy::Split => 2,
                    _ => 0,
                },
            };
            self.reqs[id.idx as usize].phase = Phase::AwaitAck;
            self.reqs[id.idx as usize].split = strategy == crate::calibrate::Strategy::Split;
            self.send_packet(dest, hdr, info.as_bytes(), std::ptr::null(), 0, None)
                .map(|_| ())
        };
        if let Err(e) = res {
            self.reqs[id.idx as usize].state = State::Done;
            let _ = self.take(id);
            return Err(e);
        }
        // Counted on the channel that carries the message: while a migration holds this peer's packets,
        // the one they will be released on.
        let p = &self.peers[dest];
        let via = if p.holding {
            p.next_route.unwrap_or(route)
        } else {
            route
        };
        self.count_sent(via, len, !eager);
        Ok(id)
    }

    // ---------------------------------------------------------------- receiving

    /// Post a receive into `buf` (capacity `cap`) from `src` (or [`ANY_SOURCE`]) with `tag` (or [`ANY_TAG`]).
    ///
    /// # Safety
    /// `buf..buf+cap` must stay valid and otherwise untouched until the request completes.
    pub unsafe fn irecv(
        &mut self,
        buf: *mut u8,
        cap: usize,
        src: i64,
        tag: i32,
        ctx: u32,
    ) -> Result<ReqId> {
        self.check_peer(src, Op::Recv, true)?;
        self.check_tag(src, tag, Op::Recv, true)?;
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        self.check_revoked(ctx, Op::Recv)?;
        let id = self.alloc_req();
        {
            let r = &mut self.reqs[id.idx as usize];
            r.is_send = false;
            r.buf = buf;
            r.len = cap;
            r.peer = src as i32;
            r.tag = tag;
            r.ctx = ctx;
            r.phase = Phase::Posted;
        }
        // Earliest matching unexpected message first (non-overtaking).
        if let Some(pos) = self
            .unexpected
            .iter()
            .position(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))
        {
            let u = self.unexpected.remove(pos).unwrap();
            self.unparked();
            self.deliver_unexpected(id, u)?;
        } else {
            self.posted.push_back(id);
        }
        Ok(id)
    }

    fn deliver_unexpected(&mut self, id: ReqId, u: Unexp) -> Result<()> {
        match u.body {
            UnexpBody::Eager { data, sync_sreq } => {
                self.fill_recv(id, u.src, u.tag, &data);
                self.recycle(data);
                if let Some(s) = sync_sreq {
                    self.send_ctl(u.src, Kind::SyncAck, FinInfo { sreq: s }.as_bytes())?;
                }
                Ok(())
            }
            UnexpBody::Rts { total, info } => self.start_rndv_recv(id, u.src, u.tag, total, info),
        }
    }

    fn fill_recv(&mut self, id: ReqId, src: usize, tag: i32, data: &[u8]) {
        let me = self.me;
        let r = &mut self.reqs[id.idx as usize];
        let n = data.len().min(r.len);
        if n > 0 {
            // SAFETY: r.buf has r.len bytes (irecv contract); data is a valid slice.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), r.buf, n) };
        }
        r.status = Status {
            source: src,
            tag,
            count: n,
            msg_len: data.len(),
            cancelled: false,
        };
        if data.len() > r.len {
            r.error = Some(Error::Truncated {
                rank: me,
                peer: src,
                tag,
                len: data.len(),
                cap: r.len,
            });
        }
        r.state = State::Done;
        self.count_recvd(n);
    }

    fn start_rndv_recv(
        &mut self,
        id: ReqId,
        src: usize,
        tag: i32,
        total: usize,
        info: RtsInfo,
    ) -> Result<()> {
        let me = self.me;
        let (buf, cap) = {
            let r = &self.reqs[id.idx as usize];
            (r.buf, r.len)
        };
        let want = total.min(cap);
        {
            let r = &mut self.reqs[id.idx as usize];
            r.status = Status {
                source: src,
                tag,
                count: want,
                msg_len: total,
                cancelled: false,
            };
            if total > cap {
                r.error = Some(Error::Truncated {
                    rank: me,
                    peer: src,
                    tag,
                    len: total,
                    cap,
                });
            }
        }
        if info.pool != 0 && want > 0 {
            // The data is in the sender's pool partition (MPI_Alloc_mem): one copy, no system call. The
            // offset is checked to lie in that partition; an offset that does not is a protocol error.
            let Some(p) = self.peer_pool_ptr(src, info.pool, want) else {
                let err = self.corrupt(
                    src,
                    format!(
                        "rendezvous offset {} ({want} bytes) is outside its pool partition",
                        info.pool
                    ),
                );
                self.fail(id, err.clone());
                return Err(err);
            };
            // SAFETY: p is validated for `want` bytes in the mapped region; buf has cap >= want (irecv).
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf, want) };
            self.pool_copies += 1;
            self.complete(id);
            self.count_recvd(want);
            return self.send_ctl(src, Kind::Fin, FinInfo { sreq: info.sreq }.as_bytes());
        }
        // The sender asks to copy the data itself: the CTS names our buffer, and the sender answers with a
        // FIN flagged FLAG_WRITTEN once the data is here, or with DATA chunks if the kernel refuses the copy.
        let cma = self.cma_with(src);
        let written = info.pid != 0 && cma && want > 0 && info.write == 1;
        let split = info.pid != 0 && cma && want > 0 && info.write == 2;
        if split {
            return self.split_recv(id, src, want, buf, &info);
        }
        if info.pid != 0 && cma && want > 0 && !written {
            // SAFETY: buf has cap >= want bytes (irecv contract).
            let dst = unsafe { std::slice::from_raw_parts_mut(buf, want) };
            match vmf_pal::cma::read_from(info.pid as i32, info.addr, dst) {
                Ok(()) => {
                    self.complete(id);
                    self.count_recvd(want);
                    return self.send_ctl(src, Kind::Fin, FinInfo { sreq: info.sreq }.as_bytes());
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EACCES)
                    ) =>
                {
                    self.cma_refused("process_vm_readv", &e);
                }
                Err(e) => {
                    let err = Error::Transport {
                        rank: me,
                        peer: src,
                        op: Op::Recv,
                        source: TransportError::Corrupt {
                            peer: src,
                            what: format!(
                                "single-copy read of {want} bytes at {:#x} failed: {e}",
                                info.addr
                            ),
                        },
                    };
                    self.fail(id, err.clone());
                    return Err(err);
                }
            }
        }
        self.reqs[id.idx as usize].phase = Phase::Receiving {
            peer: src,
            want,
            got: 0,
        };
        let cts = CtsInfo {
            sreq: info.sreq,
            rreq: id.wire(),
            want: want as u64,
            addr: if written { buf as u64 } else { 0 },
            pid: if written { std::process::id() as u64 } else { 0 },
        };
        self.send_ctl(src, Kind::Cts, cts.as_bytes())?;
        if want == 0 {
            self.complete(id);
            self.count_recvd(0);
        }
        Ok(())
    }

    /// The receiver's side of a split copy: name our buffer in the CTS (the sender then writes the second
    /// half and says so with a FIN flagged [`FLAG_WRITTEN`], which completes the receive), read the first
    /// half meanwhile, and tell the sender with a FIN that its buffer is free.
    fn split_recv(&mut self, id: ReqId, src: usize, want: usize, buf: *mut u8, info: &RtsInfo) -> Result<()> {
        let h = crate::calibrate::split_point(want);
        self.reqs[id.idx as usize].phase = Phase::Receiving { peer: src, want, got: 0 };
        let cts = CtsInfo {
            sreq: info.sreq,
            rreq: id.wire(),
            want: want as u64,
            addr: buf as u64,
            pid: std::process::id() as u64,
        };
        self.send_ctl(src, Kind::Cts, cts.as_bytes())?;
        // SAFETY: buf has cap >= want >= h bytes (irecv contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(buf, h) };
        if let Err(e) = vmf_pal::cma::read_from(info.pid as i32, info.addr, dst) {
            // The sender is writing the other half already: no way back to another protocol.
            let err = Error::Transport {
                rank: self.me,
                peer: src,
                op: Op::Recv,
                source: TransportError::Corrupt {
                    peer: src,
                    what: format!("single-copy read of {h} bytes at {:#x} (first half of a split copy) failed: {e}", info.addr),
                },
            };
            self.fail(id, err.clone());
            return Err(err);
        }
        self.send_ctl(src, Kind::Fin, FinInfo { sreq: info.sreq }.as_bytes())
    }

    /// The sender's side of a split copy: write the second half of send `id` into the receiver's buffer
    /// named by `c` and say so; the send completes when the receiver's FIN says it has read the first.
    fn split_send(&mut self, peer: usize, id: ReqId, c: &CtsInfo) -> Result<()> {
        let buf = self.reqs[id.idx as usize].buf;
        let want = c.want as usize;
        let h = crate::calibrate::split_point(want);
        // SAFETY: want <= the send's length (checked by the caller); valid until completion.
        let data = unsafe { slice(buf.add(h), want - h) };
        if let Err(e) = vmf_pal::cma::write_to(c.pid as i32, c.addr + h as u64, data) {
            return Err(self.corrupt(
                peer,
                format!("single-copy write of {} bytes to {:#x} (second half of a split copy) failed: {e}", want - h, c.addr + h as u64),
            ));
        }
        let hdr = PktHeader {
            flags: FLAG_WRITTEN,
            ..PktHeader::new(Kind::Fin, self.me as u32, 0, 0, 0, 0)
        };
        self.send_packet(peer, hdr, FinInfo { sreq: c.rreq }.as_bytes(), std::ptr::null(), 0, None)?;
        Ok(())
    }

    /// Sender-side single copy: write the message of send `id` into the receiver's buffer named by `c`
    /// and tell the receiver (a FIN flagged [`FLAG_WRITTEN`]). `Ok(false)`: the kernel forbids the copy
    /// (single copies are then off for this rank); the caller streams DATA chunks instead, which the
    /// receiver accepts just as well.
    fn write_to_receiver(&mut self, peer: usize, id: ReqId, c: &CtsInfo) -> Result<bool> {
        let buf = self.reqs[id.idx as usize].buf;
        let want = c.want as usize;
        // SAFETY: want <= the send's length (checked by the caller); the buffer is valid until completion.
        let data = unsafe { slice(buf, want) };
        match vmf_pal::cma::write_to(c.pid as i32, c.addr, data) {
            Ok(()) => {
                let hdr = PktHeader {
                    flags: FLAG_WRITTEN,
                    ..PktHeader::new(Kind::Fin, self.me as u32, 0, 0, 0, 0)
                };
                self.send_packet(peer, hdr, FinInfo { sreq: c.rreq }.as_bytes(), std::ptr::null(), 0, None)?;
                self.complete(id);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EACCES) | Some(libc::ESRCH)
                ) =>
            {
                self.cma_refused("process_vm_writev", &e);
                Ok(false)
            }
            Err(e) => Err(self.corrupt(
                peer,
                format!("single-copy write of {want} bytes to {:#x} failed: {e}", c.addr),
            )),
        }
    }

    /// The kernel forbids single copies here (Yama, containers, seccomp): use the pipelined path from now
    /// on, and say so once when verbose.
    fn cma_refused(&mut self, call: &str, e: &std::io::Error) {
        self.cma = false;
        if self.cfg.verbose && !self.cma_warned {
            eprintln!("vmfabric: rank {}: {call} not permitted ({e}); using pipelined copies", self.me);
        }
        self.cma_warned = true;
    }

    fn send_ctl(&mut self, peer: usize, kind: Kind, a: &[u8]) -> Result<()> {
        let hdr = PktHeader::new(kind, self.me as u32, 0, 0, 0, 0);
        self.send_packet(peer, hdr, a, std::ptr::null(), 0, None)
            .map(|_| ())
    }

    fn pooled(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(data);
        v
    }

    fn recycle(&mut self, v: Vec<u8>) {
        if self.pool.len() < 256 && v.capacity() <= 1 << 20 {
            self.pool.push(v);
        }
    }

    fn corrupt(&self, peer: usize, what: String) -> Error {
        Error::Transport {
            rank: self.me,
            peer,
            op: Op::Progress,
            source: TransportError::Corrupt { peer, what },
        }
    }

    /// Look up a request named by a peer on the wire and check it is what the packet says it is.
    fn wire_req(&self, peer: usize, w: u64, send: bool) -> Result<ReqId> {
        let id = ReqId::from_wire(w);
        match self.req(id) {
            Some(r)
                if r.is_send == send
                    && r.state == State::Active
                    && (r.peer == peer as i32 || !send) =>
            {
                Ok(id)
            }
            _ => Err(self.corrupt(peer, format!("packet names unknown request {w:#x}"))),
        }
    }

    /// Handle one incoming packet.
    fn handle(
        &mut self,
        peer: usize,
        hdr: &PktHeader,
        payload: &[u8],
        placed: usize,
    ) -> Result<()> {
        let expected = self.peers[peer].rx_seq;
        if hdr.seq != expected {
            return Err(self.corrupt(
                peer,
                format!("sequence number {} where {} was due", hdr.seq, expected),
            ));
        }
        self.peers[peer].rx_seq += 1;
        let kind = Kind::from_u8(hdr.kind)
            .ok_or_else(|| self.corrupt(peer, format!("unknown kind {}", hdr.kind)))?;
        match kind {
            Kind::Eager => {
                let (sync, data) = if hdr.flags & FLAG_SYNC != 0 {
                    if payload.len() < SYNC_PREFIX {
                        return Err(self.corrupt(peer, "short synchronous packet".into()));
                    }
                    (
                        Some(u64::from_le_bytes(payload[..8].try_into().unwrap())),
                        &payload[8..],
                    )
                } else {
                    (None, payload)
                };
                if hdr.len != data.len() as u64 {
                    return Err(self.corrupt(
                        peer,
                        format!("eager length {} but {} bytes", hdr.len, data.len()),
                    ));
                }
                if let Some(id) = self.match_posted(peer, hdr.tag, hdr.ctx) {
                    self.fill_recv(id, peer, hdr.tag, data);
                    if let Some(s) = sync {
                        self.send_ctl(peer, Kind::SyncAck, FinInfo { sreq: s }.as_bytes())?;
                    }
                } else if self.is_revoked(hdr.ctx) {
                    if let Some(s) = sync {
                        self.send_ctl(peer, Kind::SyncAck, FinInfo { sreq: s }.as_bytes())?;
                    }
                } else {
                    let data = self.pooled(data);
                    self.park(Unexp {
                        src: peer,
                        tag: hdr.tag,
                        ctx: hdr.ctx,
                        body: UnexpBody::Eager {
                            data,
                            sync_sreq: sync,
                        },
                    });
                }
            }
            Kind::Rts => {
                let info = RtsInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short RTS".into()))?;
                let total = usize::try_from(hdr.len)
                    .map_err(|_| self.corrupt(peer, "RTS length".into()))?;
                let u = Unexp {
                    src: peer,
                    tag: hdr.tag,
                    ctx: hdr.ctx,
                    body: UnexpBody::Rts { total, info },
                };
                if let Some(id) = self.match_posted(peer, hdr.tag, hdr.ctx) {
                    self.start_rndv_recv(id, peer, hdr.tag, total, info)?;
                } else if self.is_revoked(hdr.ctx) {
                    self.release_sender(u)?;
                } else {
                    self.park(u);
                }
            }
            Kind::Cts => {
                let c = CtsInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short CTS".into()))?;
                let id = self.wire_req(peer, c.sreq, true)?;
                let len = self.reqs[id.idx as usize].len;
                if c.want as usize > len || self.reqs[id.idx as usize].phase != Phase::AwaitAck {
                    return Err(
                        self.corrupt(peer, format!("CTS asks for {} of {len} bytes", c.want))
                    );
                }
                if c.want == 0 {
                    self.complete(id);
                } else if c.pid != 0 && self.reqs[id.idx as usize].split {
                    // Split copy: our half now; the receiver's FIN (its half read) completes the send.
                    self.split_send(peer, id, &c)?;
                } else if c.pid != 0 && self.cma_with(peer) && self.write_to_receiver(peer, id, &c)? {
                    // Written by a single copy; the receiver has been told.
                } else {
                    self.reqs[id.idx as usize].phase = Phase::Streaming {
                        rreq: c.rreq,
                        want: c.want as usize,
                        sent: 0,
                    };
                    self.streaming.push(id);
                }
            }
            Kind::Data => {
                let d = DataInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short DATA".into()))?;
                let chunk = &payload[DataInfo::SIZE..];
                let len = if placed > 0 { placed } else { chunk.len() };
                let id = self.wire_req(peer, d.rreq, false)?;
                let r = &mut self.reqs[id.idx as usize];
                match r.phase {
                    Phase::Receiving { peer: p, want, got }
                        if p == peer && d.offset as usize == got && got + len <= want =>
                    {
                        if placed == 0 {
                            // SAFETY: got + len <= want <= r.len (checked).
                            unsafe {
                                std::ptr::copy_nonoverlapping(chunk.as_ptr(), r.buf.add(got), len)
                            };
                        }
                        let got = got + len;
                        r.phase = Phase::Receiving { peer: p, want, got };
                        if got == want {
                            r.state = State::Done;
                            self.count_recvd(want);
                        }
                    }
                    _ => {
                        return Err(self.corrupt(
                            peer,
                            format!("DATA at offset {} does not fit its request", d.offset),
                        ))
                    }
                }
            }
            Kind::Moved | Kind::MovedAck | Kind::Ready => {
                self.handle_migration(peer, kind, payload)?
            }
            Kind::Revoke => self.handle_revoke(peer, payload)?,
            Kind::Fin if hdr.flags & FLAG_WRITTEN != 0 => {
                // The sender wrote the whole message into our buffer (sender-side single copy).
                let f = FinInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short FIN".into()))?;
                let id = self.wire_req(peer, f.sreq, false)?;
                let r = &mut self.reqs[id.idx as usize];
                match r.phase {
                    Phase::Receiving { peer: p, want, got: 0 } if p == peer => {
                        r.state = State::Done;
                        self.count_recvd(want);
                    }
                    _ => return Err(self.corrupt(peer, "FIN for a receive not waiting for a write".into())),
                }
            }
            Kind::Fin | Kind::SyncAck => {
                let f = FinInfo::parse(payload)
                    .ok_or_else(|| self.corrupt(peer, "short FIN".into()))?;
                let id = self.wire_req(peer, f.sreq, true)?;
                if self.reqs[id.idx as usize].phase != Phase::AwaitAck {
                    return Err(self.corrupt(peer, "FIN for a send not waiting for one".into()));
                }
                self.complete(id);
            }
        }
        Ok(())
    }

    #[inline]
    fn match_posted(&mut self, src: usize, tag: i32, ctx: u32) -> Option<ReqId> {
        let reqs = &self.reqs;
        let pos = self.posted.iter().position(|id| {
            let r = &reqs[id.idx as usize];
            matches(r.peer, r.tag, r.ctx, src, tag, ctx)
        })?;
        self.posted.remove(pos)
    }

    // ---------------------------------------------------------------- progress

    /// Poll every channel once: deliver arrived packets, flush queued packets, stream pipelined chunks.
    /// Returns how many things happened.
    pub fn progress(&mut self) -> Result<usize> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        let r = self.progress_inner();
        self.latch(r)
    }

    /// Remember a transport failure or a dead peer as fatal: every later call reports it.
    fn latch<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if matches!(e, Error::Transport { .. } | Error::PeerDead { .. }) {
                self.fatal = Some(e.clone());
            }
        }
        r
    }

    fn progress_inner(&mut self) -> Result<usize> {
        let n = self.progress_pass()?;
        if n > 0 && self.yield_hook.is_some() {
            // Another thread of this rank may sleep waiting for what was just delivered.
            if let Some(shm) = &self.shm {
                shm.wake_self();
            }
        }
        Ok(n)
    }

    fn progress_pass(&mut self) -> Result<usize> {
        let mut n = 0;
        if migrate::requested() && !self.is_migrating() {
            self.serve_migration_request();
        }
        if self.mig.as_ref().is_some_and(|m| m.old_shm.is_some()) {
            n += self.poll_old_shm()?;
        }
        n += self.poll_transport(|e| e.shm.as_mut())?;
        n += self.poll_transport(|e| e.mphw.as_mut())?;
        while !self.selfq.is_empty() {
            let Some(inc) = self.selfq.poll().expect("self transport cannot fail") else {
                break;
            };
            // SAFETY: the token owns the payload.
            let payload = unsafe { slice(inc.payload_ptr(), inc.len()) };
            let r = self.handle(inc.peer, &inc.hdr, payload, 0);
            self.selfq.release(inc);
            r?;
            n += 1;
        }
        self.passes = self.passes.wrapping_add(1);
        // TCP costs a system call per look; with shared-memory peers too, look every 8th pass (and always
        // when shared memory had nothing).
        // With emulated hosts a peer may move away and connect to us over TCP before it routes there:
        // look at the listener every 16th pass even without TCP peers.
        let look_tcp = (self.tcp_peers > 0
            && (self.shm.is_none() || n == 0 || self.passes % 8 == 0))
            || (self.tcp.is_some() && self.mig_ctx.is_some() && self.passes % 16 == 0);
        if look_tcp {
            for i in 0..32 {
                // After the first packet, continue only with bytes already read: another look at the
                // sockets would put system calls between a delivery and the application's answer.
                if i > 0 && !self.tcp.as_ref().unwrap().has_buffered() {
                    break;
                }
                let reqs = &self.reqs;
                let direct = self.cfg.tcp_direct;
                let tcp = self.tcp.as_mut().unwrap();
                let inc = match tcp.poll_placed(&mut |peer, hdr, a| {
                    place_target(direct, reqs, peer, hdr, a)
                }) {
                        Ok(Some(i)) => i,
                        Ok(None) => break,
                        Err(e) => {
                            let peer = match &e {
                                TransportError::Corrupt { peer, .. }
                                | TransportError::ConnectionLost { peer, .. } => *peer,
                                _ => self.me,
                            };
                            return Err(self.terr(peer, Op::Progress, e));
                        }
                    };
                // SAFETY: payload valid until release below.
                let payload = unsafe { slice(inc.payload_ptr(), inc.len()) };
                let r = self.handle(inc.peer, &inc.hdr, payload, inc.placed);
                self.tcp.as_mut().unwrap().release(inc);
                r?;
                n += 1;
            }
        }
        if self.n_pending > 0 {
            n += self.flush_pending()?;
        }
        if !self.streaming.is_empty() {
            n += self.pump_streams()?;
        }
        Ok(n)
    }

    /// Hand up to 32 packets of the transport `pick` returns (none: nothing to do) to the protocol.
    #[inline(always)]
    fn poll_transport<T, F>(&mut self, pick: F) -> Result<usize>
    where
        T: Transport,
        F: Fn(&mut Engine) -> Option<&mut T>,
    {
        let mut n = 0;
        while n < 32 {
            let Some(t) = pick(self) else { break };
            let inc = match t.poll() {
                Ok(Some(i)) => i,
                Ok(None) => break,
                Err(e) => {
                    let peer = match &e {
                        TransportError::Corrupt { peer, .. } => *peer,
                        _ => self.me,
                    };
                    return Err(self.terr(peer, Op::Progress, e));
                }
            };
            // SAFETY: payload valid until release below.
            let payload = unsafe { slice(inc.payload_ptr(), inc.len()) };
            let r = self.handle(inc.peer, &inc.hdr, payload, 0);
            if let Some(t) = pick(self) {
                t.release(inc);
            }
            r?;
            n += 1;
        }
        Ok(n)
    }

    fn flush_pending(&mut self) -> Result<usize> {
        let mut n = 0;
        for peer in 0..self.peers.len() {
            while let Some(p) = self.peers[peer].pending.front() {
                let mut hdr = p.hdr;
                let a = p.a;
                let a_len = p.a_len as usize;
                // SAFETY: the data pointer belongs to an incomplete request (buffer still valid).
                let b = unsafe { slice(p.data, p.data_len) };
                let done = p.complete;
                let retire = p.retire_old;
                if !self.try_packet(peer, &mut hdr, &a[..a_len], b)? {
                    break;
                }
                self.peers[peer].pending.pop_front();
                self.n_pending -= 1;
                if let Some(id) = done {
                    self.complete(id);
                }
                if retire {
                    match self.peers[peer].route {
                        Route::Tcp => {
                            if let Some(t) = self.tcp.as_mut() {
                                t.retire(peer);
                            }
                        }
                        Route::Shm => {
                            if let Some(s) = self.shm.as_mut() {
                                s.remove_peer(peer);
                            }
                        }
                        _ => {}
                    }
                }
                n += 1;
            }
        }
        Ok(n)
    }

    fn pump_streams(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut i = 0;
        while i < self.streaming.len() {
            let id = self.streaming[i];
            let (peer, buf) = {
                let r = &self.reqs[id.idx as usize];
                (r.peer as usize, r.buf)
            };
            let tcp = self.peers[peer].route == Route::Tcp;
            let chunk = match self.peers[peer].route {
                Route::Tcp => self.tcp_chunk,
                Route::Mphw => self.mphw_chunk,
                _ => self.chunk,
            };
            while let Phase::Streaming { rreq, want, sent } = self.reqs[id.idx as usize].phase {
                if sent == want || !self.peers[peer].pending.is_empty() || self.peers[peer].holding
                {
                    break;
                }
                let len = chunk.min(want - sent);
                let mut hdr = PktHeader::new(Kind::Data, self.me as u32, 0, 0, 0, len as u64);
                let info = DataInfo {
                    rreq,
                    offset: sent as u64,
                };
                // SAFETY: sent + len <= want <= request length; buffer valid until the send completes.
                let b = unsafe { slice(buf.add(sent), len) };
                if !self.try_packet_ex(peer, &mut hdr, info.as_bytes(), b, tcp)? {
                    break;
                }
                n += 1;
                self.reqs[id.idx as usize].phase = Phase::Streaming {
                    rreq,
                    want,
                    sent: sent + len,
                };
            }
            // Over TCP the last bytes may still be referenced by the socket backlog.
            let drained = !tcp || !self.tcp.as_ref().unwrap().has_backlog(peer);
            if drained
                && matches!(self.reqs[id.idx as usize].phase, Phase::Streaming { want, sent, .. } if want == sent)
            {
                self.complete(id);
                self.streaming.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(n)
    }

    fn find_unexpected(&self, src: i64, tag: i32, ctx: u32) -> Option<Status> {
        self.unexpected
            .iter()
            .find(|u| matches(src as i32, tag, ctx, u.src, u.tag, u.ctx))
            .map(|u| {
                let len = match &u.body {
                    UnexpBody::Eager { data, .. } => data.len(),
                    UnexpBody::Rts { total, .. } => *total,
                };
                Status {
                    source: u.src,
                    tag: u.tag,
                    count: len,
                    msg_len: len,
                    cancelled: false,
                }
            })
    }

    /// Probe for a matching message without receiving it.
    pub fn iprobe(&mut self, src: i64, tag: i32, ctx: u32) -> Result<Option<Status>> {
        self.check_peer(src, Op::Probe, true)?;
        self.check_tag(src, tag, Op::Probe, true)?;
        self.check_revoked(ctx, Op::Probe)?;
        self.progress()?;
        self.check_revoked(ctx, Op::Probe)?;
        Ok(self.find_unexpected(src, tag, ctx))
    }

    /// Wait for a matching message and return its status without receiving it.
    pub fn probe(&mut self, src: i64, tag: i32, ctx: u32) -> Result<Status> {
        self.check_peer(src, Op::Probe, true)?;
        self.check_tag(src, tag, Op::Probe, true)?;
        self.check_revoked(ctx, Op::Probe)?;
        self.wait_until(Op::Probe, |e| {
            e.is_revoked(ctx) || e.find_unexpected(src, tag, ctx).is_some()
        })?;
        self.check_revoked(ctx, Op::Probe)?;
        Ok(self.find_unexpected(src, tag, ctx).expect("found above"))
    }

    /// Cancel a posted receive that has not matched. Returns true if it was cancelled.
    pub fn cancel_recv(&mut self, id: ReqId) -> bool {
        if let Some(pos) = self.posted.iter().position(|&p| p == id) {
            self.posted.remove(pos);
            let r = &mut self.reqs[id.idx as usize];
            r.status.cancelled = true;
            r.state = State::Done;
            true
        } else {
            false
        }
    }

    /// Wait until `done(self)` holds, driving progress, with the configured [`WaitPolicy`]:
    ///
    /// - `spin`: poll continuously;
    /// - `yield`: poll `SPIN_COUNT` times, then `sched_yield` between polls;
    /// - `block`: poll for about a microsecond, then sleep on the doorbell until a sender rings it;
    /// - `adaptive`: spin for a budget learnt from recent waits (up to `WAIT_SPIN_MAX_US`), then — only when
    ///   this host's ranks outnumber its CPUs — yield for `WAIT_YIELD_US`, then sleep.
    ///
    /// Co-resident peers are checked for death every `LIVENESS_MS` whatever the policy.
    pub fn wait_until(&mut self, op: Op, mut done: impl FnMut(&Engine) -> bool) -> Result<()> {
        self.wait_inner(
            op,
            |e| {
                if done(e) {
                    Awaiting::Done
                } else {
                    Awaiting::Here
                }
            },
            false,
        )
    }

    /// [`Engine::wait_until`] for a caller that knows whom it waits for: while `awaiting` says
    /// [`Awaiting::Elsewhere`] and ranks outnumber cores, the rank spins for up to `WAIT_PEER_SPIN_US`
    /// instead of yielding at once, since the peers it waits for run on other CPUs (their CPU-mates that
    /// wait too spin or yield alike) and a yield would only hand our CPU to a rank that has nothing to do
    /// (a context switch costs 1.3 us here).
    ///
    /// `awaiting` watches shared memory that peers write directly (not only what `progress` delivers), so
    /// between idle polls of the channels it is looked at a few more times: a stamp from the other core
    /// is then seen tens of nanoseconds sooner (2 ranks, 64-byte alltoall).
    pub fn wait_for_peers(
        &mut self,
        op: Op,
        awaiting: impl FnMut(&Engine) -> Awaiting,
    ) -> Result<()> {
        self.wait_inner(op, awaiting, true)
    }

    fn wait_inner(
        &mut self,
        op: Op,
        awaiting: impl FnMut(&Engine) -> Awaiting,
        watches_memory: bool,
    ) -> Result<()> {
        let mut idled = false;
        let r = self.wait_loop(op, awaiting, watches_memory, &mut idled);
        if idled {
            if let Some(h) = self.idle_hook {
                h(IdleAt::End);
            }
        }
        r
    }

    fn wait_loop(
        &mut self,
        op: Op,
        mut awaiting: impl FnMut(&Engine) -> Awaiting,
        watches_memory: bool,
        idled: &mut bool,
    ) -> Result<()> {
        let a = std::cell::Cell::new(awaiting(self));
        if a.get() == Awaiting::Done {
            self.count_wait(Stage::Spin);
            return Ok(());
        }
        let mut done = |e: &Engine| {
            a.set(awaiting(e));
            a.get() == Awaiting::Done
        };
        let mut polls: u32 = 0;
        let mut start: Option<Instant> = None;
        let mut slept = false;
        // How far this wait went (a sleep phase may only yield: `block_once_for` says what it did).
        let mut stage = Stage::Spin;
        let mut backoff = Duration::from_micros(1);
        let live_every = Duration::from_millis(self.cfg.liveness_ms);
        // Ranks outnumber cores and what we wait for is written straight into shared memory by a rank that
        // needs our CPU: hand it over before polling the channels, and after each such yield look at the
        // awaited lines before polling them again. Traced with rdtsc (4 ranks on 2 cores, back-to-back
        // barriers), arriving to yielding went from 90-100 ns to 50 and coming back from the yield to
        // leaving from 150 ns to 120: the mate we yielded to has usually done what we wait for.
        let hand_over = watches_memory
            && self.waiter.policy == WaitPolicy::Adaptive
            && self.waiter.oversubscribed;
        let mut look_first = hand_over && a.get() == Awaiting::Here && !self.waiter.sleeps_instead();
        if look_first {
            self.yield_cpu();
            stage = Stage::Yield;
        }
        loop {
            let seen = std::mem::take(&mut look_first) && done(self);
            let n = if seen {
                0
            } else {
                self.progress().map_err(|e| retag(e, op))?
            };
            if seen || done(self) {
                if let Some(st) = start {
                    self.waiter.record(st.elapsed(), slept);
                }
                self.count_wait(stage);
                return Ok(());
            }
            if n > 0 {
                continue;
            }
            polls = polls.wrapping_add(1);
            if self.yield_hook.is_some() {
                // Several threads share the engine: let them in between polls; after a while yield the
                // CPU too, and after the yield budget sleep (briefly: a thread of this process may
                // complete what we wait for, and it wakes us only when its progress delivers packets).
                self.hook(HookPoint::Poll);
                if polls > 64 {
                    let now = Instant::now();
                    let el = now - *start.get_or_insert(now);
                    self.idle(el, idled);
                    if el < self.waiter.budgets().1.max(Duration::from_micros(50)) {
                        vmf_pal::yield_now();
                        stage = stage.max(Stage::Yield);
                    } else {
                        let most = Duration::from_millis(1);
                        stage = stage.max(self.sleep_step(op, &mut backoff, &mut done, idled, &mut slept, most)?);
                    }
                }
                if polls % 256 == 0 && self.last_liveness.elapsed() >= live_every {
                    self.check_liveness(op)?;
                }
                continue;
            }
            match self.waiter.policy {
                WaitPolicy::Spin => {
                    if polls > 1024 {
                        vmf_pal::cpu_relax();
                    }
                    if polls % 8192 == 0 && self.last_liveness.elapsed() >= live_every {
                        self.check_liveness(op)?;
                    }
                }
                WaitPolicy::Yield => {
                    if polls > self.cfg.spin_count {
                        vmf_pal::yield_now();
                        stage = stage.max(Stage::Yield);
                    } else {
                        vmf_pal::cpu_relax();
                    }
                    if polls % 256 == 0 && self.last_liveness.elapsed() >= live_every {
                        self.check_liveness(op)?;
                    }
                }
                WaitPolicy::Adaptive if self.waiter.oversubscribed => {
                    // Beside tasks that keep the CPU, yielding only hands them their slices: sleep.
                    if self.waiter.sleeps_instead() {
                        stage = stage.max(self.sleep_step(op, &mut backoff, &mut done, idled, &mut slept, live_every)?);
                        if self.last_liveness.elapsed() >= live_every {
                            self.check_liveness(op)?;
                        }
                        continue;
                    }
                    // Ranks outnumber cores: the rank we wait for is most likely waiting for a CPU, maybe
                    // ours. Yield from the first idle poll (measured 2-3x faster collectives at 4 ranks on
                    // 2 cores than spinning first), reading the clock every 64 polls to decide on sleeping.
                    // Peers that run on other CPUs are spun for first (see `wait_for_peers`).
                    let elsewhere = a.get() == Awaiting::Elsewhere;
                    if polls % 64 != 0 {
                        if elsewhere {
                            // Watch the awaited lines closely, polling the channels less often: the
                            // other CPU's rank is about to write them.
                            for _ in 0..16 {
                                vmf_pal::cpu_relax();
                                if done(self) {
                                    break;
                                }
                            }
                        } else {
                            self.yield_cpu();
                            stage = stage.max(Stage::Yield);
                            look_first = hand_over;
                        }
                        continue;
                    }
                    if self.gang_turn() {
                        slept = true;
                        stage = stage.max(Stage::Sleep);
                        continue;
                    }
                    let now = Instant::now();
                    let el = now - *start.get_or_insert(now);
                    self.idle(el, idled);
                    let (_, yield_for) = self.waiter.budgets();
                    if elsewhere && el < self.waiter.peer_spin {
                        vmf_pal::cpu_relax();
                    } else if el < yield_for {
                        self.yield_cpu();
                        stage = stage.max(Stage::Yield);
                    } else {
                        stage = stage.max(self.sleep_step(op, &mut backoff, &mut done, idled, &mut slept, live_every)?);
                    }
                    if self.last_liveness.elapsed() >= live_every {
                        self.check_liveness(op)?;
                    }
                }
                WaitPolicy::Block | WaitPolicy::Adaptive => {
                    // Read the clock only every 64 idle polls (~20 ns a read here): short waits never touch
                    // it. No PAUSE for the first polls: a message arriving during one is seen tens of ns later.
                    if polls % 64 != 0 {
                        if polls > 1024 {
                            vmf_pal::cpu_relax();
                        }
                        if watches_memory {
                            for _ in 0..8 {
                                if done(self) {
                                    break;
                                }
                            }
                        }
                        continue;
                    }
                    if self.gang_turn() {
                        slept = true;
                        stage = stage.max(Stage::Sleep);
                        continue;
                    }
                    let now = Instant::now();
                    let el = now - *start.get_or_insert(now);
                    self.idle(el, idled);
                    let (spin, yield_for) = self.waiter.budgets();
                    // A copier's helper wants a CPU: sleep at once and leave it ours (yielding would keep
                    // us runnable here, and the helper on its caller's CPU).
                    let copier = self.copier_wants_cpu();
                    if el < spin && !copier {
                        vmf_pal::cpu_relax();
                    } else if el < spin + yield_for && !copier && !self.waiter.sleeps_instead() {
                        self.yield_cpu();
                        stage = stage.max(Stage::Yield);
                    } else {
                        stage = stage.max(self.sleep_step(op, &mut backoff, &mut done, idled, &mut slept, live_every)?);
                    }
                    if self.last_liveness.elapsed() >= live_every {
                        self.check_liveness(op)?;
                    }
                }
            }
        }
    }

    /// Yield the CPU while waiting. Yielding pays while the tasks that want this CPU are ranks of this job:
    /// they hand it back as soon as they wait too, and a rank that computes is one the others wait for.
    /// Beside tasks of other programs that keep the CPU (CPU hogs), each yield hands them their time
    /// slice and the awaited rank runs no sooner. So after [`LONG_YIELDS`] yields of at least
    /// [`LONG_YIELD`] within [`LONG_YIELD_WINDOW`] the rank counts the machine's runnable tasks: more than
    /// this job's ranks that are awake (the others' slots say they sleep) with as many runnable threads
    /// each as this rank has, the CPUs the job leaves to others and one more mean foreign load; seen
    /// [`FOREIGN_LOOKS`] times in a row, waits sleep instead of yielding for [`FOREIGN_HOLD`]: a
    /// sleeping rank is woken by its sender and, having slept, runs ahead of the hogs. Measured, 4 ranks
    /// on 2 CPUs beside two CPU hogs, 8-byte allreduce: 949 us a call yielding, 196 us sleeping (2.5 us
    /// against 107 us on a quiet machine); 8 ranks on 2 CPUs whose alltoall rounds compute 50 us yield to
    /// each other for 0.4 ms and more (p90 0.8 ms), with no foreign load: they keep yielding, 270-330 us a
    /// round against 696 sleeping.
    fn yield_cpu(&mut self) {
        if self.waiter.timed_yield() {
            let asleep = self.shm.as_ref().map_or(0, |s| s.peers_asleep());
            let awake = self.waiter.ranks_here.saturating_sub(asleep);
            // Ranks of one program have the same threads: as many runnable beside each awake rank as
            // beside this one (a BLAS's workers spin after each call).
            let per_rank = 1 + vmf_pal::process::other_runnable_threads();
            let foreign = foreign_load(awake * per_rank, self.waiter.cpus);
            self.waiter.judge_load(foreign);
        }
    }

    /// True while a rank of this kernel announces that its copier's helper thread wants a CPU
    /// (`vmf_bb::copier`): spinning or yielding then keeps the helper off this CPU (it shares its caller's
    /// instead, halving the caller's copy rate, or waits a time slice while its caller waits for a chunk
    /// it claimed). One load when no copier ever announced itself.
    fn copier_wants_cpu(&self) -> bool {
        let Some(s) = self.shm.as_ref() else {
            return false;
        };
        let h = s.region().header();
        let until = h.copier_until.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        // An announcement lasts BEACON_NS; one further ahead is another kernel's clock (the two words
        // are written apart, so a kernel id and another kernel's time can meet).
        let now = vmf_pal::monotonic_ns();
        until > now
            && until <= now + vmf_bb::copier::BEACON_NS
            && h.copier_kernel.load(Ordering::Relaxed) == vmf_pal::process::kernel_id()
    }

    /// A wait idle for `el`: past a few microseconds, let the idle hook work.
    #[inline]
    fn idle(&mut self, el: Duration, idled: &mut bool) {
        if let Some(h) = self.idle_hook {
            if el >= Duration::from_micros(5) {
                *idled = true;
                h(IdleAt::Poll);
            }
        }
    }

    /// Before sleeping in the kernel: hand the idle work back (a sleeping thread cannot do it).
    #[inline]
    fn idle_end(&mut self, idled: &mut bool) {
        if *idled {
            if let Some(h) = self.idle_hook {
                h(IdleAt::Sleep);
            }
        }
    }

    /// The sleep step of a wait: note that it slept, end the idle period, block once for at most `most`
    /// (between the engine's threads' `Sleep` and `Wake` hooks when it has any).
    fn sleep_step(
        &mut self,
        op: Op,
        backoff: &mut Duration,
        done: &mut impl FnMut(&Engine) -> bool,
        idled: &mut bool,
        slept: &mut bool,
        most: Duration,
    ) -> Result<Stage> {
        *slept = true;
        self.idle_end(idled);
        self.hook(HookPoint::Sleep);
        let r = self.block_once_for(op, backoff, done, most);
        self.hook(HookPoint::Wake);
        r
    }

    /// Sleep until something may have arrived, at most `most` (the liveness period in an ordinary wait).
    /// Returns what it did: slept, only yielded (queued sends, a migration, no doorbell), or neither
    /// (something is there).
    fn block_once_for(
        &mut self,
        op: Op,
        backoff: &mut Duration,
        done: &mut impl FnMut(&Engine) -> bool,
        most: Duration,
    ) -> Result<Stage> {
        let live_every = Duration::from_millis(self.cfg.liveness_ms);
        // Queued sends wait for a peer to consume, and consumers do not ring doorbells: keep polling. While
        // this rank moves, answers arrive on the old region, whose doorbell it no longer sleeps on.
        if self.n_pending > 0 || !self.streaming.is_empty() || self.mig.is_some() {
            vmf_pal::yield_now();
            return Ok(Stage::Yield);
        }
        if let Some(m) = self.mphw.as_mut() {
            // Every peer is on the emulated hardware: sleep on its doorbell (senders ring it after
            // filling a buffer; we look once more after reading it).
            let bell = m.bell();
            if m.has_incoming() {
                return Ok(Stage::Spin);
            }
            // Peers in other VMs ring our ivshmem doorbell vector (long sleeps, as on shm); one that
            // cannot is polled in bounded exponential steps (1 us .. 1 ms).
            let t = match m.sleep_kind() {
                vmf_transport::mphw::SleepKind::Futex => most.min(Duration::from_millis(10)),
                vmf_transport::mphw::SleepKind::Doorbell => most,
                vmf_transport::mphw::SleepKind::Poll => {
                    let t = *backoff;
                    *backoff = (*backoff * 2).min(Duration::from_millis(1));
                    t
                }
            };
            if done(self) {
                return Ok(Stage::Spin);
            }
            self.mphw.as_mut().unwrap().wait(bell, t);
            self.waiter.sleeps += 1;
            if self.last_liveness.elapsed() >= live_every {
                self.check_liveness(op)?;
            }
            return Ok(Stage::Sleep);
        }
        if self.tcp.is_some() {
            if self.tcp.as_ref().is_some_and(|t| t.has_buffered()) {
                return Ok(Stage::Spin);
            }
            // Sleep in epoll on every socket plus the shared-memory doorbell socket, so a message from
            // either transport wakes us.
            let db = match &self.shm {
                Some(shm) if shm.can_futex() => {
                    shm.prepare_sleep_socket();
                    if shm.has_incoming() || done(self) {
                        shm.cancel_sleep();
                        return Ok(Stage::Spin);
                    }
                    shm.doorbell_fd()
                }
                // Peers in other VMs: sleep on our ivshmem doorbell vector, which they ring.
                Some(shm) if shm.bell_fd().is_some() => {
                    shm.prepare_sleep_bell();
                    if shm.has_incoming() || done(self) {
                        shm.cancel_sleep();
                        return Ok(Stage::Spin);
                    }
                    shm.bell_fd()
                }
                Some(_) => None,
                None => None,
            };
            let t = if self
                .shm
                .as_ref()
                .is_some_and(|s| !s.can_futex() && (s.bell_fd().is_none() || !s.remote_peers_ring()))
            {
                *backoff
            } else {
                most
            };
            let tcp = self.tcp.as_mut().unwrap();
            tcp.wait(db, t);
            *backoff = (*backoff * 2).min(Duration::from_millis(1));
            if let Some(shm) = &self.shm {
                shm.cancel_sleep();
                shm.drain_doorbell();
                shm.drain_bell();
            }
            self.waiter.sleeps += 1;
            if self.last_liveness.elapsed() >= live_every {
                self.check_liveness(op)?;
            }
            return Ok(Stage::Sleep);
        }
        let stage = match &self.shm {
            Some(shm) if shm.can_futex() => {
                let d = shm.prepare_sleep();
                // `done` may watch shared memory other ranks write (collective areas): they ring our
                // doorbell after writing, and we look once more after announcing the sleep.
                if shm.has_incoming() || done(self) {
                    shm.cancel_sleep();
                    return Ok(Stage::Spin);
                }
                shm.sleep(d, most);
                self.waiter.sleeps += 1;
                Stage::Sleep
            }
            Some(shm) if shm.bell_fd().is_some() => {
                // Peers in other VMs ring our ivshmem doorbell vector.
                shm.prepare_sleep_bell();
                if shm.has_incoming() || done(self) {
                    shm.cancel_sleep();
                    return Ok(Stage::Spin);
                }
                // Long only when every peer in another VM rings: one that cannot is polled.
                let t = if shm.remote_peers_ring() { most } else { *backoff };
                shm.sleep_bell(t);
                *backoff = (*backoff * 2).min(Duration::from_millis(1));
                self.waiter.sleeps += 1;
                Stage::Sleep
            }
            Some(_) => {
                // A peer in another VM cannot wake us: bounded exponential sleep (1 us .. 1 ms).
                std::thread::sleep(*backoff);
                *backoff = (*backoff * 2).min(Duration::from_millis(1));
                Stage::Sleep
            }
            None => {
                vmf_pal::yield_now();
                Stage::Yield
            }
        };
        if self.last_liveness.elapsed() >= live_every {
            self.check_liveness(op)?;
        }
        Ok(stage)
    }

    /// Apply `VMF_BIND` once the region's ranks are known, and publish the CPU this rank runs on when it
    /// is a single one. `auto` pins only when the ranks of this region (on this kernel) outnumber the
    /// CPUs they may use, in blocks of consecutive ranks (4 ranks on 2 CPUs: 0 and 1 on the first, 2 and 3
    /// on the second), and never where ranks may migrate. Pinning is what lets a waiting rank know
    /// whether the peer it waits for shares its CPU (yield to it) or runs on another (spin for it), and
    /// it keeps the scheduler from stacking both ranks of a pair on one CPU. Returns the CPU pinned to.
    pub fn bind_cpu(&mut self) -> Option<usize> {
        let cpus = vmf_pal::process::allowed_cpus();
        let mut pinned = None;
        // Without a region this rank cannot tell its place among the machine's ranks: only the
        // launcher's pinning (`--bind core`) applies.
        let mut local: Vec<usize> = self
            .shm
            .as_ref()
            .map_or(Vec::new(), |s| s.same_kernel_peers().collect());
        local.push(self.me);
        local.sort_unstable();
        let n = local.len();
        let pos = local.iter().position(|&r| r == self.me).unwrap_or(0);
        let pin = self.shm.is_some()
            && match self.cfg.bind {
                crate::config::Bind::None => false,
                crate::config::Bind::Core => true,
                crate::config::Bind::Auto => n > cpus.len() && self.mig_ctx.is_none(),
            };
        if let Some(cpu) = vmf_pal::process::cpu_for_rank(pos, n, &cpus).filter(|_| pin) {
            match vmf_pal::process::pin_to_cpu(cpu) {
                Ok(()) => pinned = Some(cpu),
                Err(e) if self.cfg.verbose => {
                    eprintln!("vmfabric: rank {}: cannot pin to CPU {cpu}: {e}", self.me)
                }
                Err(_) => {}
            }
        }
        let one = match pinned {
            Some(c) => Some(c),
            None if cpus.len() == 1 => Some(cpus[0]),
            None => None,
        };
        if let Some(shm) = &self.shm {
            shm.set_cpu(one);
        }
        self.waiter.cpu = one;
        if self.cfg.verbose {
            match (pinned, one) {
                (Some(c), _) => eprintln!("vmfabric: rank {}: pinned to CPU {c}", self.me),
                (None, Some(c)) => {
                    eprintln!("vmfabric: rank {}: runs on CPU {c} only", self.me)
                }
                _ => {}
            }
        }
        pinned
    }

    /// The one CPU co-resident `peer` runs on, as it published (None: unknown or several).
    pub fn peer_cpu(&self, peer: usize) -> Option<usize> {
        if peer == self.me {
            return self.waiter.cpu;
        }
        self.shm.as_ref()?.peer_cpu(peer)
    }

    /// The waiting state (policy, learnt spin budget, counters).
    pub fn waiter(&self) -> &Waiter {
        &self.waiter
    }

    /// Report the first co-resident peer that died without detaching.
    pub fn check_liveness(&mut self, op: Op) -> Result<()> {
        self.last_liveness = Instant::now();
        if self.tcp_peers == 0 {
            // Nobody polls the listener of a rank without TCP peers: accept and time out strangers here,
            // so they hold no descriptor (and do not keep waking the sleep in epoll).
            if let Some(t) = self.tcp.as_mut() {
                let _ = t.progress();
            }
        }
        if let Some((peer, pid)) = self.mphw.as_ref().and_then(|m| m.find_dead_peer()) {
            let e = Error::PeerDead {
                rank: self.me,
                peer,
                pid,
                op,
            };
            self.fatal = Some(e.clone());
            return Err(e);
        }
        if let Some(shm) = &self.shm {
            if let Some((peer, pid)) = shm.find_dead_peer() {
                let e = Error::PeerDead {
                    rank: self.me,
                    peer,
                    pid,
                    op,
                };
                self.fatal = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// Complete all queued and in-flight sends (used at finalisation).
    pub fn flush(&mut self) -> Result<()> {
        self.wait_until(Op::Finalize, |e| {
            e.n_pending == 0
                && e.streaming.is_empty()
                && e.reqs
                    .iter()
                    .all(|r| !(r.is_send && r.state == State::Active))
        })
    }
}

/// Where the data of an incoming DATA packet goes, if the packet is valid (mirrors the checks of `handle`);
/// None always unless `direct` (TCP_DIRECT: data is read straight into receive buffers).
fn place_target(
    direct: bool,
    reqs: &[Req],
    peer: usize,
    hdr: &PktHeader,
    a: &[u8],
) -> Option<*mut u8> {
    if !direct || hdr.kind != Kind::Data as u8 {
        return None;
    }
    let d = DataInfo::parse(a)?;
    let id = ReqId::from_wire(d.rreq);
    let r = reqs.get(id.idx as usize)?;
    if r.gen != id.gen || r.state != State::Active || r.is_send {
        return None;
    }
    match r.phase {
        Phase::Receiving { peer: p, want, got }
            if p == peer
                && d.offset as usize == got
                && (hdr.len as usize) <= want - got
                && hdr.len > 0 =>
        {
            // SAFETY: got < want <= r.len, so the pointer stays inside the receive buffer.
            Some(unsafe { r.buf.add(got) })
        }
        _ => None,
    }
}

#[inline(always)]
fn matches(want_src: i32, want_tag: i32, want_ctx: u32, src: usize, tag: i32, ctx: u32) -> bool {
    want_ctx == ctx
        && (want_src == ANY_SOURCE || want_src as usize == src)
        && (want_tag == ANY_TAG || want_tag == tag)
}

fn retag(e: Error, op: Op) -> Error {
    match e {
        Error::Transport {
            rank, peer, source, ..
        } => Error::Transport {
            rank,
            peer,
            op,
            source,
        },
        Error::PeerDead {
            rank, peer, pid, ..
        } => Error::PeerDead {
            rank,
            peer,
            pid,
            op,
        },
        e => e,
    }
}

#[inline(always)]
unsafe fn slice<'a>(p: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(p, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use crate::calibrate::{LargePath, Strategy};
    use vmf_transport::shm::region::{Region, RegionSizing, RegionSource};

    /// Foreign load must be seen FOREIGN_LOOKS times in a row before waits sleep instead of yielding; a
    /// look that finds none starts the count over and stops looking for FOREIGN_HOLD; the switch ends
    /// after FOREIGN_HOLD.
    #[test]
    fn waits_sleep_instead_of_yielding_only_after_foreign_load_is_seen_in_a_row() {
        let cfg = Config::from_lookup(|_| None).unwrap();
        let mut w = Waiter::new(&cfg, 4);
        assert!(!w.sleeps_instead());
        for _ in 0..FOREIGN_LOOKS - 1 {
            w.judge_load(true);
            assert!(!w.sleeps_instead());
        }
        w.judge_load(false);
        assert!(w.quiet_until.is_some(), "a quiet look holds off the next ones");
        for _ in 0..FOREIGN_LOOKS - 1 {
            w.judge_load(true);
        }
        assert!(!w.sleeps_instead(), "the quiet look started the count over");
        w.judge_load(true);
        assert!(w.sleeps_instead());
        assert_eq!(w.foreign_switches, 1);
        // Seen again while switched: extended, not counted twice.
        for _ in 0..FOREIGN_LOOKS {
            w.judge_load(true);
        }
        assert_eq!(w.foreign_switches, 1);
        w.foreign_until = Some(Instant::now() - Duration::from_millis(1));
        assert!(!w.sleeps_instead(), "the switch ends after FOREIGN_HOLD");
        assert!(w.foreign_until.is_none());
    }

    /// Two engines (ranks 0 and 1) sharing a real region in one thread.
    fn pair(name: &str, env: &[(&str, &str)]) -> (Engine, Engine, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!("vmf-engine-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let cfg = Config::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        let sz = RegionSizing {
            max_local: 2,
            heap: 4 << 20,
            pool_per_slot: 1 << 20,
        };
        let r = Arc::new(
            Region::open(
                &RegionSource::Dir(d.clone()),
                "t",
                sz,
                None,
                Duration::from_secs(1),
            )
            .unwrap(),
        );
        let (l0, l1) = (r.attach(0).unwrap(), r.attach(1).unwrap());
        let ring = cfg.shm_ring_size.min(1 << 20);
        let mut t0 = ShmTransport::new(r.clone(), 0, l0, 2, ring);
        let mut t1 = ShmTransport::new(r.clone(), 1, l1, 2, ring);
        t0.add_peer(1, l1).unwrap();
        t1.add_peer(0, l0).unwrap();
        (
            Engine::new(0, 2, cfg.clone(), Some(t0), None),
            Engine::new(1, 2, cfg, Some(t1), None),
            d,
        )
    }

    fn drive(a: &mut Engine, b: &mut Engine, ids: &[(bool, ReqId)]) {
        for _ in 0..1_000_000 {
            a.progress().unwrap();
            b.progress().unwrap();
            if ids
                .iter()
                .all(|&(on_a, id)| if on_a { a.is_done(id) } else { b.is_done(id) })
            {
                return;
            }
        }
        panic!("requests did not complete");
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn roundtrip_sizes(env: &[(&str, &str)], name: &str) {
        roundtrip_sizes_with(env, name, None)
    }

    fn roundtrip_sizes_with(env: &[(&str, &str)], name: &str, path: Option<LargePath>) {
        let (mut a, mut b, d) = pair(name, env);
        if let Some(p) = &path {
            a.set_large_path(p);
            b.set_large_path(p);
        }
        for &n in &[
            0usize, 1, 8, 100, 4000, 16384, 16385, 65536, 300_000, 3_000_001,
        ] {
            let s = pattern(n, n as u8);
            let mut r = vec![0u8; n];
            let rid = unsafe { b.irecv(r.as_mut_ptr(), n, 0, 5, 0).unwrap() };
            let sid = unsafe { a.isend(s.as_ptr(), n, 1, 5, 0, SendMode::Standard).unwrap() };
            drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
            a.take(sid).unwrap();
            let st = b.take(rid).unwrap();
            assert_eq!((st.source, st.tag, st.count), (0, 5, n));
            assert!(r == s, "payload mismatch at size {n}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn all_protocols_cma_work() {
        roundtrip_sizes(&[("VMF_SHM_CMA_MIN", "0")], "cma");
    }

    #[test]
    fn sender_side_single_copy_and_calibrated_paths_work() {
        // Sender-side single copy at every rendezvous size, with a 16 KiB eager limit.
        let write = LargePath {
            eager_limit: 16 << 10,
            chunk: 16 << 10,
            steps: vec![(0, Strategy::Write)],
        };
        roundtrip_sizes_with(&[], "write", Some(write));
        // A mixed path: 8 KiB eager, 16 KiB chunks to 64 KiB, read to 1 MB, write above.
        let mixed = LargePath {
            eager_limit: 8 << 10,
            chunk: 16 << 10,
            steps: vec![(65_537, Strategy::Read), (1_000_001, Strategy::Write)],
        };
        roundtrip_sizes_with(&[], "mixed", Some(mixed));
        // Split copies (the receiver reads the first half, the sender writes the second) at every size.
        let split = LargePath {
            eager_limit: 1024,
            chunk: 16 << 10,
            steps: vec![(0, Strategy::Split)],
        };
        roundtrip_sizes_with(&[], "split", Some(split));
    }

    #[test]
    fn a_receiver_that_forbids_single_copy_still_gets_a_write_request_by_chunks() {
        // The receiver has single copies off (as where the kernel refuses them): it answers the sender's
        // write request with a plain CTS and the data comes in DATA chunks.
        let (mut a, mut b, d) = pair("write-refused", &[]);
        a.set_large_path(&LargePath {
            eager_limit: 1024,
            chunk: 16 << 10,
            steps: vec![(0, Strategy::Write)],
        });
        b.cma = false;
        let s = pattern(300_000, 9);
        let mut r = vec![0u8; s.len()];
        let rid = unsafe { b.irecv(r.as_mut_ptr(), r.len(), 0, 5, 0).unwrap() };
        let sid = unsafe { a.isend(s.as_ptr(), s.len(), 1, 5, 0, SendMode::Standard).unwrap() };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        assert_eq!(b.take(rid).unwrap().count, s.len());
        assert!(r == s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn direct_receive_takes_only_what_the_general_path_would_give_it() {
        let (mut a, mut b, d) = pair("direct", &[("VMF_HOST_CPUS", "4")]);
        direct_receive_cases(&mut a, &mut b, Duration::ZERO);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn direct_receive_over_tcp_takes_only_what_the_general_path_would_give_it() {
        let (mut a, mut b) = tcp_pair();
        assert_eq!((a.route(1), b.route(0)), (Route::Tcp, Route::Tcp));
        // Loopback delivers within the sender's system call; the pause covers a delivery the kernel
        // defers to its softirq thread on a loaded machine.
        direct_receive_cases(&mut a, &mut b, Duration::from_millis(20));
    }

    /// Rendezvous over TCP, its DATA frames read through the connection buffer (the default) and
    /// straight into the receive buffer (TCP_DIRECT=1): several frames per message, both directions,
    /// byte for byte.
    #[test]
    fn tcp_rendezvous_through_the_buffer_and_placed_works() {
        for direct in ["0", "1"] {
            let (mut a, mut b) = tcp_pair_with(&[("VMF_TCP_DIRECT", direct), ("VMF_TCP_CHUNK", "256K")]);
            for (n, seed) in [(1_000_000usize, 3u8), (300_001, 4)] {
                let s = pattern(n, seed);
                let mut r = vec![0u8; n];
                let rid = unsafe { b.irecv(r.as_mut_ptr(), n, 0, 9, 0).unwrap() };
                let sid = unsafe { a.isend(s.as_ptr(), n, 1, 9, 0, SendMode::Standard).unwrap() };
                drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
                a.take(sid).unwrap();
                assert_eq!(b.take(rid).unwrap().count, n);
                assert!(r == s, "TCP_DIRECT={direct}: {n} bytes arrived altered");
                let mut back = vec![0u8; n];
                let rid = unsafe { a.irecv(back.as_mut_ptr(), n, 1, 10, 0).unwrap() };
                let sid = unsafe { b.isend(r.as_ptr(), n, 0, 10, 0, SendMode::Standard).unwrap() };
                drive(&mut a, &mut b, &[(false, sid), (true, rid)]);
                b.take(sid).unwrap();
                a.take(rid).unwrap();
                assert!(back == s, "TCP_DIRECT={direct}: {n} bytes came back altered");
            }
        }
    }

    /// Two engines (ranks 0 and 1) joined only by TCP on loopback, connected by one exchange.
    fn tcp_pair() -> (Engine, Engine) {
        tcp_pair_with(&[])
    }

    /// [`tcp_pair`] with these variables set (and VMF_HOST_CPUS=4).
    fn tcp_pair_with(env: &[(&str, &str)]) -> (Engine, Engine) {
        use vmf_transport::tcp::TcpConfig;
        let cfg = Config::from_lookup(|k| {
            env.iter()
                .chain(&[("VMF_HOST_CPUS", "4")])
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        let tc = TcpConfig {
            bind: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            secret: [3; 16],
            job: 99,
            max_frame: cfg.tcp_max_frame(),
        };
        let mut t0 = TcpTransport::new(0, 2, tc.clone()).unwrap();
        let mut t1 = TcpTransport::new(1, 2, tc).unwrap();
        let (at0, at1) = (t0.local_addr(), t1.local_addr());
        t0.set_peer_addr(1, at1);
        t1.set_peer_addr(0, at0);
        let mut a = Engine::new(0, 2, cfg.clone(), None, Some(t0));
        let mut b = Engine::new(1, 2, cfg, None, Some(t1));
        let mut buf = [0u8; 4];
        let rid = unsafe { b.irecv(buf.as_mut_ptr(), 4, 0, 99, 0).unwrap() };
        let sid = unsafe {
            a.isend(b"ping".as_ptr(), 4, 1, 99, 0, SendMode::Standard)
                .unwrap()
        };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        b.take(rid).unwrap();
        assert_eq!(&buf, b"ping");
        (a, b)
    }

    /// What [`Engine::recv_direct`] must take and what it must leave to the general path, for any
    /// transport joining `a` (rank 0) to `b`; `settle`: a pause after each send for the bytes to arrive.
    fn direct_receive_cases(a: &mut Engine, b: &mut Engine, settle: Duration) {
        // Eager sends complete at once; b must not progress (it would queue the message itself).
        let send = |a: &mut Engine, _b: &mut Engine, data: &[u8], tag: i32| {
            let id = unsafe {
                a.isend(data.as_ptr(), data.len(), 1, tag, 0, SendMode::Standard)
                    .unwrap()
            };
            a.progress().unwrap();
            assert!(a.is_done(id));
            a.take(id).unwrap();
            std::thread::sleep(settle);
        };
        let mut buf = [0u8; 64];
        // Nothing there: gives up (the caller then posts a receive).
        assert!(unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 1, 0) }
            .unwrap()
            .is_none());
        // A fitting eager message: taken, with its status.
        send(a, b, b"hello", 1);
        let st = unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, ANY_TAG, 0) }
            .unwrap()
            .unwrap();
        assert_eq!((st.source, st.tag, st.count), (0, 1, 5));
        assert_eq!(&buf[..5], b"hello");
        // Another tag first: handed to the general path (queued as unexpected), never skipped over.
        send(a, b, b"first", 7);
        send(a, b, b"second", 8);
        assert!(unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 8, 0) }
            .unwrap()
            .is_none());
        assert_eq!(b.unexpected.len(), 1);
        // With a matching message queued, the fast path stands aside for the general one.
        send(a, b, b"third", 7);
        assert!(unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 7, 0) }
            .unwrap()
            .is_none());
        let id = unsafe { b.irecv(buf.as_mut_ptr(), 64, 0, 7, 0).unwrap() };
        drive(a, b, &[(false, id)]);
        assert_eq!(&buf[..5], b"first", "non-overtaking order kept");
        b.take(id).unwrap();
        // Too long for the buffer: the general path reports the truncation.
        let mut small = [0u8; 2];
        let st = unsafe { b.recv_direct(small.as_mut_ptr(), 2, 0, 8, 0) }.unwrap();
        assert!(st.is_none());
        // What is left (second, third) goes through the general path, whether a progress pass already
        // queued it or it still waits in the channel.
        for (tag, want) in [(8, &b"second"[..]), (7, &b"third"[..])] {
            let id = unsafe { b.irecv(buf.as_mut_ptr(), 64, 0, tag, 0).unwrap() };
            drive(a, b, &[(false, id)]);
            assert_eq!(b.take(id).unwrap().count, want.len());
            assert_eq!(&buf[..want.len()], want);
        }
        assert!(b.unexpected.is_empty());
        // A posted receive elsewhere has precedence.
        let mut other = [0u8; 64];
        let pid = unsafe {
            b.irecv(other.as_mut_ptr(), 64, ANY_SOURCE as i64, ANY_TAG, 0)
                .unwrap()
        };
        send(a, b, b"fourth", 7);
        assert!(unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 7, 0) }
            .unwrap()
            .is_none());
        drive(a, b, &[(false, pid)]);
        assert_eq!(&other[..6], b"fourth");
        b.take(pid).unwrap();
    }

    #[test]
    fn rendezvous_from_pool_blocks_is_one_copy_out_of_the_region() {
        let (mut a, mut b, d) = pair("pool", &[("VMF_SHM_CMA", "0")]);
        for &(n, cap) in &[
            (100_000usize, 100_000usize),
            (700_000, 700_000),
            (300_000, 1000),
        ] {
            let p = a.pool_alloc(n, 4096).expect("pool block");
            let s = pattern(n, 9);
            // SAFETY: a fresh pool block of n bytes.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), p, n) };
            let before = b.pool_copies();
            let mut r = vec![0u8; cap];
            let rid = unsafe { b.irecv(r.as_mut_ptr(), cap, 0, 5, 0).unwrap() };
            let sid = unsafe { a.isend(p, n, 1, 5, 0, SendMode::Standard).unwrap() };
            drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
            a.take(sid).unwrap();
            let got = b.take(rid);
            assert_eq!(
                b.pool_copies(),
                before + 1,
                "size {n}: not copied out of the pool"
            );
            assert_eq!(
                r[..cap.min(n)],
                s[..cap.min(n)],
                "payload mismatch at size {n}"
            );
            if cap < n {
                assert!(matches!(got, Err(Error::Truncated { .. })), "{got:?}");
            } else {
                assert_eq!(got.unwrap().count, n);
            }
            assert!(a.pool_free(p));
        }
        // An ordinary buffer goes the usual way.
        let s = pattern(200_000, 1);
        let mut r = vec![0u8; 200_000];
        let before = b.pool_copies();
        let rid = unsafe { b.irecv(r.as_mut_ptr(), r.len(), 0, 5, 0).unwrap() };
        let sid = unsafe {
            a.isend(s.as_ptr(), s.len(), 1, 5, 0, SendMode::Standard)
                .unwrap()
        };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        b.take(rid).unwrap();
        assert_eq!(b.pool_copies(), before);
        assert!(r == s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn all_protocols_pipelined_work() {
        roundtrip_sizes(
            &[
                ("VMF_SHM_CMA", "0"),
                ("VMF_SHM_CHUNK", "8K"),
                ("VMF_SHM_RING_SIZE", "64K"),
            ],
            "pipe",
        );
    }

    #[test]
    fn unexpected_messages_keep_order_and_wildcards_work() {
        let (mut a, mut b, d) = pair("order", &[]);
        // Send 50 messages with tags 0..5 before any receive is posted, mixing eager and rendezvous.
        let msgs: Vec<Vec<u8>> = (0..50)
            .map(|i| pattern(if i % 7 == 0 { 40_000 } else { 8 + i }, i as u8))
            .collect();
        let mut sids = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            sids.push(unsafe {
                a.isend(
                    m.as_ptr(),
                    m.len(),
                    1,
                    (i % 5) as i32,
                    0,
                    SendMode::Standard,
                )
                .unwrap()
            });
        }
        for _ in 0..100 {
            a.progress().unwrap();
            b.progress().unwrap();
        }
        // Receive tag 3 first (in order among tag 3), then everything else with ANY_TAG (in order).
        let mut got: Vec<usize> = Vec::new();
        let mut order = Vec::new();
        let mut bufs: Vec<Vec<u8>> = (0..50).map(|_| vec![0u8; 40_000]).collect();
        for (k, buf) in bufs.iter_mut().enumerate() {
            let tag = if k < 10 { 3 } else { ANY_TAG };
            let id = unsafe {
                b.irecv(buf.as_mut_ptr(), buf.len(), ANY_SOURCE as i64, tag, 0)
                    .unwrap()
            };
            order.push(id);
        }
        let all: Vec<(bool, ReqId)> = sids
            .iter()
            .map(|&s| (true, s))
            .chain(order.iter().map(|&r| (false, r)))
            .collect();
        drive(&mut a, &mut b, &all);
        for &s in &sids {
            a.take(s).unwrap();
        }
        for (k, id) in order.iter().enumerate() {
            let st = b.take(*id).unwrap();
            let i = msgs
                .iter()
                .enumerate()
                .position(|(i, m)| {
                    !got.contains(&i)
                        && i % 5 == st.tag as usize
                        && m.len() == st.count
                        && bufs[k][..st.count] == m[..]
                })
                .unwrap();
            got.push(i);
        }
        let tag3: Vec<usize> = got[..10].to_vec();
        assert_eq!(tag3, (0..50).filter(|i| i % 5 == 3).collect::<Vec<_>>());
        let rest: Vec<usize> = got[10..].to_vec();
        assert_eq!(rest, (0..50).filter(|i| i % 5 != 3).collect::<Vec<_>>());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn counters_count_messages_per_channel_the_unexpected_queue_and_rendezvous() {
        let (mut a, mut b, d) = pair("counters", &[("VMF_HOST_CPUS", "4")]);
        assert_eq!(a.counters(), Counters::default());
        let big = 100_000;
        assert!(big > a.eager_limit());
        // Five eager messages and one above the eager limit, all before any receive is posted.
        let msgs: Vec<Vec<u8>> = (0..6)
            .map(|i| pattern(if i == 5 { big } else { 100 }, i as u8))
            .collect();
        let sids: Vec<ReqId> = msgs
            .iter()
            .enumerate()
            .map(|(i, m)| unsafe {
                a.isend(m.as_ptr(), m.len(), 1, i as i32, 0, SendMode::Standard)
                    .unwrap()
            })
            .collect();
        for _ in 0..100 {
            a.progress().unwrap();
            b.progress().unwrap();
        }
        let sent = 5 * 100 + big as u64;
        let c = a.counters();
        assert_eq!(
            (c.shm_msgs_sent, c.shm_bytes_sent, c.rendezvous_sent),
            (6, sent, 1)
        );
        assert_eq!(
            (
                c.tcp_msgs_sent,
                c.tcp_bytes_sent,
                c.self_msgs_sent,
                c.self_bytes_sent
            ),
            (0, 0, 0, 0)
        );
        let c = b.counters();
        assert_eq!(
            (c.unexpected_now, c.unexpected_max, c.msgs_recvd),
            (6, 6, 0)
        );
        // Each receive takes its message out of the queue; the high-water mark stays.
        let mut bufs = vec![vec![0u8; big]; 6];
        let mut rids = Vec::new();
        for (i, buf) in bufs.iter_mut().enumerate() {
            rids.push(unsafe {
                b.irecv(buf.as_mut_ptr(), buf.len(), 0, i as i32, 0)
                    .unwrap()
            });
            let c = b.counters();
            assert_eq!((c.unexpected_now, c.unexpected_max), (5 - i as u64, 6));
        }
        let all: Vec<(bool, ReqId)> = sids
            .iter()
            .map(|&s| (true, s))
            .chain(rids.iter().map(|&r| (false, r)))
            .collect();
        drive(&mut a, &mut b, &all);
        // Receives count when they complete, before their requests are collected.
        let c = b.counters();
        assert_eq!((c.msgs_recvd, c.bytes_recvd), (6, sent));
        for (&s, &r) in sids.iter().zip(&rids) {
            a.take(s).unwrap();
            b.take(r).unwrap();
        }
        for (m, buf) in msgs.iter().zip(&bufs) {
            assert_eq!(&buf[..m.len()], &m[..]);
        }
        // The rendezvous' control packets (CTS and DATA, or FIN) are not messages, either way.
        let c = b.counters();
        assert_eq!(
            (
                c.msgs_recvd,
                c.bytes_recvd,
                c.unexpected_now,
                c.unexpected_max
            ),
            (6, sent, 0, 6)
        );
        assert_eq!(
            (c.shm_msgs_sent, c.shm_bytes_sent, c.rendezvous_sent),
            (0, 0, 0)
        );
        let c = a.counters();
        assert_eq!(
            (
                c.shm_msgs_sent,
                c.msgs_recvd,
                c.bytes_recvd,
                c.unexpected_max
            ),
            (6, 0, 0, 0)
        );
        // A message whose receive is posted first never enters the queue.
        let m = pattern(10, 9);
        let mut r = [0u8; 10];
        let rid = unsafe { b.irecv(r.as_mut_ptr(), 10, 0, 77, 0).unwrap() };
        let sid = unsafe {
            a.isend(m.as_ptr(), 10, 1, 77, 0, SendMode::Standard)
                .unwrap()
        };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        b.take(rid).unwrap();
        let c = b.counters();
        assert_eq!(
            (
                c.msgs_recvd,
                c.bytes_recvd,
                c.unexpected_now,
                c.unexpected_max
            ),
            (7, sent + 10, 0, 6)
        );
        // A truncated receive counts what it delivered; a cancelled one counts nothing.
        let rid = unsafe { b.irecv(r.as_mut_ptr(), 4, 0, 78, 0).unwrap() };
        let sid = unsafe {
            a.isend(m.as_ptr(), 10, 1, 78, 0, SendMode::Standard)
                .unwrap()
        };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        assert!(b.take(rid).is_err());
        let rid = unsafe { b.irecv(r.as_mut_ptr(), 10, 0, 79, 0).unwrap() };
        assert!(b.cancel_recv(rid));
        b.take(rid).unwrap();
        let c = b.counters();
        assert_eq!((c.msgs_recvd, c.bytes_recvd), (8, sent + 10 + 4));
        assert_eq!(a.counters().shm_msgs_sent, 8);
        // Nothing here waited (drive only polls).
        for c in [a.counters(), b.counters()] {
            assert_eq!(
                (c.waits_spin, c.waits_yield, c.waits_sleep, c.migrations),
                (0, 0, 0, 0)
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn counters_count_the_blocking_fast_paths() {
        let (mut a, mut b, d) = pair("counters-fast", &[("VMF_HOST_CPUS", "4")]);
        let m = pattern(40, 3);
        // The blocking send's fast path counts like isend; the blocking receive's counts a receive and a
        // wait that ended spinning.
        assert!(unsafe { a.try_send_now(m.as_ptr(), 40, 1, 5, 0) }.unwrap());
        let c = a.counters();
        assert_eq!(
            (c.shm_msgs_sent, c.shm_bytes_sent, c.rendezvous_sent),
            (1, 40, 0)
        );
        let mut buf = [0u8; 64];
        let st = unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 5, 0) }
            .unwrap()
            .unwrap();
        assert_eq!((st.count, &buf[..40]), (40, &m[..]));
        let c = b.counters();
        assert_eq!((c.msgs_recvd, c.bytes_recvd, c.unexpected_max), (1, 40, 0));
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (1, 0, 0));
        // Declined sends and receives count nothing (their slow paths do).
        let big = pattern(a.eager_limit() + 1, 1);
        assert!(!unsafe { a.try_send_now(big.as_ptr(), big.len(), 1, 6, 0) }.unwrap());
        assert!(!unsafe { a.try_send_now(m.as_ptr(), 40, 0, 6, 0) }.unwrap());
        assert!(unsafe { b.recv_direct(buf.as_mut_ptr(), 64, 0, 5, 0) }
            .unwrap()
            .is_none());
        assert_eq!(a.counters().shm_msgs_sent, 1);
        let c = b.counters();
        assert_eq!((c.msgs_recvd, c.waits_spin), (1, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A one-rank engine (self messages only, no shared memory).
    fn solo(env: &[(&str, &str)]) -> Engine {
        let cfg = Config::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        Engine::new(0, 1, cfg, None, None)
    }

    #[test]
    fn counters_count_self_messages_and_how_waits_end() {
        let mut e = solo(&[("VMF_WAIT", "spin")]);
        // Self messages are copied whatever their size: no rendezvous.
        for (n, tag) in [(10usize, 1), (200_000, 2)] {
            let s = pattern(n, tag as u8);
            let mut r = vec![0u8; n];
            let rid = unsafe { e.irecv(r.as_mut_ptr(), n, 0, tag, 0).unwrap() };
            let sid = unsafe {
                e.isend(s.as_ptr(), n, 0, tag, 0, SendMode::Standard)
                    .unwrap()
            };
            e.wait_until(Op::Wait, |e| e.is_done(rid) && e.is_done(sid))
                .unwrap();
            e.take(sid).unwrap();
            e.take(rid).unwrap();
            assert_eq!(r, s);
        }
        let c = e.counters();
        assert_eq!(
            (c.self_msgs_sent, c.self_bytes_sent, c.rendezvous_sent),
            (2, 200_010, 0)
        );
        assert_eq!((c.shm_msgs_sent, c.tcp_msgs_sent), (0, 0));
        assert_eq!((c.msgs_recvd, c.bytes_recvd), (2, 200_010));
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (2, 0, 0));
        // A wait complete on entry ended spinning too; so does a long one under the spin policy.
        e.wait_until(Op::Wait, |_| true).unwrap();
        let t0 = Instant::now();
        e.wait_until(Op::Wait, |_| t0.elapsed() > Duration::from_millis(5))
            .unwrap();
        let c = e.counters();
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (4, 0, 0));
        // The yield policy yields after SPIN_COUNT idle polls.
        let mut e = solo(&[("VMF_WAIT", "yield"), ("VMF_SPIN_COUNT", "0")]);
        let t0 = Instant::now();
        e.wait_until(Op::Wait, |_| t0.elapsed() > Duration::from_millis(5))
            .unwrap();
        let c = e.counters();
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (0, 1, 0));
        // The block policy sleeps on the doorbell (here for a millisecond at a time, LIVENESS_MS); without
        // one (no shared memory) it can only yield.
        let (mut a, _b, d) = pair(
            "counters-sleep",
            &[("VMF_WAIT", "block"), ("VMF_LIVENESS_MS", "1")],
        );
        let t0 = Instant::now();
        a.wait_until(Op::Wait, |_| t0.elapsed() > Duration::from_millis(20))
            .unwrap();
        let c = a.counters();
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (0, 0, 1));
        std::fs::remove_dir_all(&d).unwrap();
        let mut e = solo(&[("VMF_WAIT", "block"), ("VMF_LIVENESS_MS", "1")]);
        let t0 = Instant::now();
        e.wait_until(Op::Wait, |_| t0.elapsed() > Duration::from_millis(5))
            .unwrap();
        let c = e.counters();
        assert_eq!((c.waits_spin, c.waits_yield, c.waits_sleep), (0, 1, 0));
    }

    fn send_blocking(e: &mut Engine, to: usize, tag: i32, m: &[u8]) -> Result<()> {
        let id = unsafe { e.isend(m.as_ptr(), m.len(), to as i64, tag, 0, SendMode::Standard)? };
        e.wait_until(Op::Wait, |e| e.is_done(id))?;
        e.take(id).map(|_| ())
    }

    fn recv_blocking(e: &mut Engine, from: usize, tag: i32, buf: &mut [u8]) -> Result<Status> {
        let id = unsafe { e.irecv(buf.as_mut_ptr(), buf.len(), from as i64, tag, 0)? };
        e.wait_until(Op::Wait, |e| e.is_done(id))?;
        e.take(id)
    }

    /// Two ranks on one emulated host (shared memory and TCP on loopback, both "hosts" in this network
    /// namespace), one thread each; rank 0 moves to the other host between two exchanges, so each side's
    /// channel to the other moves from shared memory to TCP once, and what follows is sent over TCP.
    #[test]
    fn counters_count_a_migration_and_the_channel_after_it() {
        use migrate::{HostSpec, Loc, MigCtx};
        use std::net::{IpAddr, Ipv4Addr};
        use std::os::fd::AsRawFd;
        use vmf_transport::shm::region::job_hash;
        use vmf_transport::tcp::TcpConfig;
        // The move enters the target host's network namespace: here the one we are in, which takes
        // CAP_SYS_ADMIN all the same.
        let ns = std::fs::File::open("/proc/self/ns/net").unwrap();
        // SAFETY: setns into the namespace this thread is in already.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            eprintln!(
                "skipped: setns is not permitted here ({})",
                std::io::Error::last_os_error()
            );
            return;
        }
        let base =
            std::env::temp_dir().join(format!("vmf-engine-test-{}-migrate", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let hosts: Vec<HostSpec> = (0..2)
            .map(|h| HostSpec {
                netns: "/proc/self/ns/net".into(),
                dir: base.join(format!("h{h}")),
                ip: lo,
            })
            .collect();
        for h in &hosts {
            std::fs::create_dir_all(&h.dir).unwrap();
        }
        let job = "t";
        let sz = RegionSizing {
            max_local: 2,
            heap: 4 << 20,
            pool_per_slot: 1 << 20,
        };
        // Both "hosts" share this network namespace, where the doorbell sockets of a rank's old and new
        // home would collide: the ranks spin (no doorbells), and only the new home binds one.
        let env = [("VMF_HOST_CPUS", "4"), ("VMF_WAIT", "spin")];
        let cfg = Config::from_lookup(|k| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
        .unwrap();
        let src = RegionSource::Dir(hosts[0].dir.clone());
        let region = Arc::new(Region::open(&src, job, sz, None, Duration::from_secs(5)).unwrap());
        let slots = [region.attach(0).unwrap(), region.attach(1).unwrap()];
        let tc = TcpConfig {
            bind: lo,
            secret: [7; 16],
            job: job_hash(job),
            max_frame: cfg.tcp_max_frame(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // Each rank tells the other where it listens (a transport stays on the thread that made it).
        let (to0, at0) = std::sync::mpsc::channel();
        let (to1, at1) = std::sync::mpsc::channel();
        for (me, to_peer, at_me) in [(0, to1, at0), (1, to0, at1)] {
            let (region, cfg, hosts, tc, tx) = (
                region.clone(),
                cfg.clone(),
                hosts.clone(),
                tc.clone(),
                tx.clone(),
            );
            std::thread::spawn(move || {
                let peer = 1 - me;
                let tcp = TcpTransport::new(me, 2, tc).unwrap();
                to_peer.send(tcp.local_addr()).unwrap();
                let mut addrs = [None; 2];
                addrs[me] = Some(tcp.local_addr());
                addrs[peer] = Some(at_me.recv().unwrap());
                let locs: Vec<Loc> = (0..2)
                    .map(|r| Loc {
                        uuid: region.uuid,
                        slot: slots[r],
                        addr: addrs[r],
                    })
                    .collect();
                let mut t = ShmTransport::new(region, me, slots[me], 2, cfg.ring_size_for(2));
                t.set_duplex(false);
                t.add_peer(peer, slots[peer]).unwrap();
                let mut e = Engine::new(me, 2, cfg, Some(t), Some(tcp));
                e.set_locations(locs);
                e.set_migration_context(MigCtx::new(
                    job.into(),
                    sz,
                    None,
                    hosts,
                    0,
                    Duration::from_secs(5),
                ));
                let mut run = || -> Result<[Route; 2]> {
                    let m = pattern(100, me as u8);
                    let mut buf = [0u8; 100];
                    let before = e.route(peer);
                    // An exchange on shared memory, the move, another exchange (on TCP).
                    for tag in [1, 3] {
                        if me == 0 {
                            if tag == 3 {
                                e.migrate_to(1)?;
                            }
                            send_blocking(&mut e, peer, tag, &m)?;
                            recv_blocking(&mut e, peer, tag + 1, &mut buf)?;
                        } else {
                            recv_blocking(&mut e, peer, tag, &mut buf)?;
                            send_blocking(&mut e, peer, tag + 1, &m)?;
                        }
                        assert_eq!(buf, &pattern(100, peer as u8)[..]);
                    }
                    Ok([before, e.route(peer)])
                };
                let r = run();
                let _ = tx.send((me, r.map(|routes| (routes, e.counters()))));
            });
        }
        drop(tx);
        let mut got = [None, None];
        for _ in 0..2 {
            let (me, r) = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("a rank failed or hung");
            got[me] = Some(r.unwrap());
        }
        for (me, g) in got.iter().enumerate() {
            let (routes, c) = g.unwrap();
            assert_eq!(routes, [Route::Shm, Route::Tcp], "rank {me}");
            // Moved, MovedAck and Ready are not messages.
            assert_eq!(
                (
                    c.shm_msgs_sent,
                    c.shm_bytes_sent,
                    c.tcp_msgs_sent,
                    c.tcp_bytes_sent
                ),
                (1, 100, 1, 100),
                "rank {me}"
            );
            assert_eq!(
                (c.msgs_recvd, c.bytes_recvd, c.migrations),
                (2, 200, 1),
                "rank {me}"
            );
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn truncation_reports_error_works() {
        let (mut a, mut b, d) = pair("trunc", &[]);
        for &n in &[100usize, 100_000] {
            let s = pattern(n, 1);
            let mut r = vec![0u8; 50];
            let rid = unsafe { b.irecv(r.as_mut_ptr(), 50, 0, 1, 0).unwrap() };
            let sid = unsafe { a.isend(s.as_ptr(), n, 1, 1, 0, SendMode::Standard).unwrap() };
            drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
            a.take(sid).unwrap();
            match b.take(rid) {
                Err(Error::Truncated {
                    len,
                    cap: 50,
                    peer: 0,
                    ..
                }) => assert_eq!(len, n),
                other => panic!("expected truncation, got {other:?}"),
            }
            assert_eq!(r[..], s[..50]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn synchronous_send_waits_for_match_works() {
        let (mut a, mut b, d) = pair("sync", &[]);
        let s = pattern(16, 2);
        let sid = unsafe {
            a.isend(s.as_ptr(), 16, 1, 9, 0, SendMode::Synchronous)
                .unwrap()
        };
        for _ in 0..1000 {
            a.progress().unwrap();
            b.progress().unwrap();
        }
        assert!(
            !a.is_done(sid),
            "synchronous send completed before a receive matched"
        );
        let mut r = vec![0u8; 16];
        let rid = unsafe { b.irecv(r.as_mut_ptr(), 16, 0, 9, 0).unwrap() };
        drive(&mut a, &mut b, &[(true, sid), (false, rid)]);
        a.take(sid).unwrap();
        b.take(rid).unwrap();
        assert_eq!(r, s);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn revocation_fails_receives_releases_senders_and_spares_other_contexts() {
        let (mut a, mut b, d) = pair("revoke", &[]);
        let big = pattern(300_000, 1);
        let small = pattern(16, 2);
        // On context 4: b waits for a message a never sends; a sends a rendezvous and a synchronous
        // message b never receives. Context 6 carries on meanwhile.
        let mut r = vec![0u8; 16];
        let rid = unsafe { b.irecv(r.as_mut_ptr(), 16, 0, 1, 4).unwrap() };
        let big_id = unsafe { a.isend(big.as_ptr(), big.len(), 1, 2, 4, SendMode::Standard).unwrap() };
        let sync_id = unsafe { a.isend(small.as_ptr(), 16, 1, 3, 4, SendMode::Synchronous).unwrap() };
        let mut keep = vec![0u8; 16];
        let keep_r = unsafe { b.irecv(keep.as_mut_ptr(), 16, 0, 1, 6).unwrap() };
        for _ in 0..1000 {
            a.progress().unwrap();
            b.progress().unwrap();
        }
        assert!(!a.is_done(big_id) && !a.is_done(sync_id) && !b.is_done(rid));
        // b revokes contexts 4 and 5: its receive fails at once, and a's sends end once a reads the
        // packet and b's releases.
        b.revoke(&[4, 5], &[0, 1]).unwrap();
        assert!(b.is_done(rid));
        assert!(matches!(b.take(rid), Err(Error::Revoked { ctx: 4, .. })));
        drive(&mut a, &mut b, &[(true, big_id), (true, sync_id)]);
        assert!(matches!(a.take(big_id), Err(Error::Revoked { ctx: 4, .. })));
        assert!(matches!(a.take(sync_id), Err(Error::Revoked { ctx: 4, .. })));
        assert!(a.is_revoked(4) && a.is_revoked(5) && !a.is_revoked(6));
        // Every new operation on a revoked context fails, on both sides; a second revocation is harmless.
        assert!(matches!(
            unsafe { a.isend(small.as_ptr(), 16, 1, 1, 5, SendMode::Standard) },
            Err(Error::Revoked { ctx: 5, .. })
        ));
        assert!(matches!(
            unsafe { b.irecv(r.as_mut_ptr(), 16, 0, 1, 4) },
            Err(Error::Revoked { .. })
        ));
        assert!(matches!(b.iprobe(-1, -1, 4), Err(Error::Revoked { .. })));
        a.revoke(&[4], &[1]).unwrap();
        assert_eq!(a.revocations(), 2);
        // Context 6 is untouched.
        let sid = unsafe { a.isend(small.as_ptr(), 16, 1, 1, 6, SendMode::Standard).unwrap() };
        drive(&mut a, &mut b, &[(true, sid), (false, keep_r)]);
        a.take(sid).unwrap();
        b.take(keep_r).unwrap();
        assert_eq!(keep, small);
        // A corrupt Revoke packet is an error, not a crash.
        assert!(b.handle_revoke(0, &[1, 2, 3]).is_err());
        assert!(b.handle_revoke(0, &[]).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn full_ring_queues_and_both_directions_large_work() {
        let (mut a, mut b, d) = pair(
            "full",
            &[("VMF_SHM_RING_SIZE", "64K"), ("VMF_SHM_CMA", "0")],
        );
        // 200 eager messages of 8 KiB each way without receives posted: the rings fill and sends queue.
        let n = 8000;
        let s = pattern(n, 3);
        let big = pattern(2_000_000, 4);
        let mut ids = Vec::new();
        for _ in 0..200 {
            ids.push((true, unsafe {
                a.isend(s.as_ptr(), n, 1, 1, 0, SendMode::Standard).unwrap()
            }));
            ids.push((false, unsafe {
                b.isend(s.as_ptr(), n, 0, 1, 0, SendMode::Standard).unwrap()
            }));
        }
        ids.push((true, unsafe {
            a.isend(big.as_ptr(), big.len(), 1, 2, 0, SendMode::Standard)
                .unwrap()
        }));
        ids.push((false, unsafe {
            b.isend(big.as_ptr(), big.len(), 0, 2, 0, SendMode::Standard)
                .unwrap()
        }));
        let mut ra = vec![vec![0u8; n]; 200];
        let mut rb = vec![vec![0u8; n]; 200];
        let mut bigs = [vec![0u8; big.len()], vec![0u8; big.len()]];
        for i in 0..200 {
            ids.push((true, unsafe {
                a.irecv(ra[i].as_mut_ptr(), n, 1, 1, 0).unwrap()
            }));
            ids.push((false, unsafe {
                b.irecv(rb[i].as_mut_ptr(), n, 0, 1, 0).unwrap()
            }));
        }
        let [ba, bb] = &mut bigs;
        ids.push((true, unsafe {
            a.irecv(ba.as_mut_ptr(), big.len(), 1, 2, 0).unwrap()
        }));
        ids.push((false, unsafe {
            b.irecv(bb.as_mut_ptr(), big.len(), 0, 2, 0).unwrap()
        }));
        drive(&mut a, &mut b, &ids);
        for (on_a, id) in ids {
            if on_a {
                a.take(id).unwrap()
            } else {
                b.take(id).unwrap()
            };
        }
        assert!(ra.iter().chain(rb.iter()).all(|r| *r == s));
        assert!(bigs.iter().all(|r| *r == big));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn invalid_arguments_fail() {
        let (mut a, _b, d) = pair("args", &[]);
        let s = [0u8; 4];
        assert!(matches!(
            unsafe { a.isend(s.as_ptr(), 4, 2, 0, 0, SendMode::Standard) },
            Err(Error::InvalidRank { peer: 2, .. })
        ));
        assert!(matches!(
            unsafe { a.isend(s.as_ptr(), 4, -1, 0, 0, SendMode::Standard) },
            Err(Error::InvalidRank { .. })
        ));
        assert!(matches!(
            unsafe { a.isend(s.as_ptr(), 4, 1, -5, 0, SendMode::Standard) },
            Err(Error::InvalidTag { tag: -5, .. })
        ));
        let mut r = [0u8; 4];
        assert!(matches!(
            unsafe { a.irecv(r.as_mut_ptr(), 4, 7, 0, 0) },
            Err(Error::InvalidRank { .. })
        ));
        let e = unsafe { a.isend(s.as_ptr(), 4, 9, 0, 0, SendMode::Standard) }
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0") && e.contains("rank 9") && e.contains("send"),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn self_messages_and_probe_work() {
        let (mut a, _b, d) = pair("self", &[]);
        let s = pattern(100_000, 5);
        let sid = unsafe {
            a.isend(s.as_ptr(), s.len(), 0, 4, 0, SendMode::Standard)
                .unwrap()
        };
        let st = a.probe(0, ANY_TAG, 0).unwrap();
        assert_eq!((st.source, st.tag, st.count), (0, 4, 100_000));
        let mut r = vec![0u8; 100_000];
        let rid = unsafe {
            a.irecv(r.as_mut_ptr(), r.len(), ANY_SOURCE as i64, 4, 0)
                .unwrap()
        };
        a.wait_until(Op::Wait, |e| e.is_done(rid) && e.is_done(sid))
            .unwrap();
        a.take(sid).unwrap();
        a.take(rid).unwrap();
        assert_eq!(r, s);
        assert!(a.iprobe(0, ANY_TAG, 0).unwrap().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupted_sequence_fails_without_hang() {
        let (mut a, mut b, d) = pair("seq", &[]);
        let s = [1u8; 8];
        a.peers[1].tx_seq = 5; // as if packets were lost
        let sid = unsafe { a.isend(s.as_ptr(), 8, 1, 0, 0, SendMode::Standard).unwrap() };
        a.take(sid).unwrap();
        let e = b.progress().unwrap_err();
        assert!(e.to_string().contains("sequence"), "{e}");
        assert!(b.progress().is_err(), "the failure is sticky");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
