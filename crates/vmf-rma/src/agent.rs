//! The agent: a thread of each rank that serves one-sided operations arriving over TCP on that rank's
//! window memory, without any action of the rank itself (a truly passive target, as an RDMA NIC is).
//!
//! One agent per process, started with its first window that peers must reach over TCP. It listens on
//! the address of the rank's TCP transport (port chosen by the kernel) and serves every window of the
//! process registered with it; origins connect on first use, one connection per (origin window, target).
//!
//! **Handshake** (mutual challenge-response with the job secret, as the TCP transport's, with roles of
//! its own so neither protocol's messages are accepted by the other):
//! `HELLO(job, src, dst, nonce_c, MAC_h)` → `REPLY(nonce_a, MAC_a)` → `PROOF(MAC_c)`. A connection that has
//! not completed it within [`HANDSHAKE_TIMEOUT`] is closed, and at most [`MAX_PENDING`] connections may be
//! in the handshake at once (the oldest is dropped first), so strangers cannot exhaust descriptors.
//!
//! **Serving**: requests ([`crate::wire`]) are executed in arrival order with the same code origins use on
//! mapped memory ([`crate::exec`]): CPU atomics on the process's own mapping, so an atomic served here is
//! atomic with respect to those of co-resident origins. The thread executes while holding the registry
//! lock, so a window is never unregistered (and its memory freed) under a running request.
//!
//! **Waiting**: after serving, the thread keeps polling for `VMF_RMA_AGENT_SPIN_US` before it sleeps in
//! `epoll_wait`, so back-to-back operations of one origin do not each pay a wake-up. While the rank's own
//! thread waits in the library (past a 5 µs spin), the engine's idle hook ([`engine_idle`]) serves the
//! connections from that thread and the agent thread stays asleep on a futex: on two cores an idle target
//! then answers without a thread switch. When the rank computes outside the library, answers carry
//! [`crate::wire::RESP_BY_AGENT_THREAD`], and origins sleep for the next answers instead of spinning
//! against the agent thread for the target's CPU.
use crate::exec::{Status, Target};
use crate::layout::{decode_runs, Layout, Run, RUN_WIRE};
use crate::reduce::{Elem, ROp};
use crate::wire::{Kind, ReqHeader, RespHeader, FLAG_EXCL, REQ_HDR};
use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handshake messages.
pub(crate) const HELLO_MAGIC: &[u8; 8] = b"VMFRMAH1";
pub(crate) const REPLY_MAGIC: &[u8; 8] = b"VMFRMAR1";
pub(crate) const PROOF_MAGIC: &[u8; 8] = b"VMFRMAP1";
pub(crate) const HELLO_LEN: usize = 48;
pub(crate) const REPLY_LEN: usize = 32;
pub(crate) const PROOF_LEN: usize = 16;
/// MAC roles (distinct from the TCP transport's).
pub(crate) const ROLE_HELLO: u8 = b'h';
pub(crate) const ROLE_ACCEPT: u8 = b'a';
pub(crate) const ROLE_CLIENT: u8 = b'c';
/// A connection must finish its handshake within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections in the handshake at once.
pub const MAX_PENDING: usize = 64;

/// Identity and credentials of the job, as the agent and its clients need them.
#[derive(Clone, Copy, Debug)]
pub struct Creds {
    /// The job secret.
    pub secret: [u8; 16],
    /// Hash of the job id.
    pub job: u64,
    /// This rank (world).
    pub rank: u32,
}

/// A service other layers register with the agent ([`Agent::add_service`]): requests of kind
/// [`Kind::Service`] naming it are handed to [`Service::call`] on the agent's thread (or the rank's thread
/// serving inline), in arrival order per connection. The minitransactions' two-phase commit is one.
///
/// A call must not block: the agent serves every window and service of the process from one thread.
pub trait Service: Send + Sync {
    /// Serve operation `op` with `data`, arriving on connection `session` (an id unique within this
    /// agent); append the answer's bytes to `out`. A status other than [`Status::Ok`] is answered with no
    /// bytes (what `out` holds is then dropped).
    fn call(&self, session: u64, op: u8, data: &[u8], out: &mut Vec<u8>) -> Status;
    /// Connection `session` has closed (the origin left or died): forget what it held.
    fn closed(&self, session: u64);
}

struct Shared {
    wins: Mutex<HashMap<u64, Target>>,
    services: Mutex<HashMap<u64, Arc<dyn Service>>>,
    next: AtomicU64,
    stop: AtomicBool,
    served: AtomicU64,
    refused: AtomicU64,
}

/// A running agent.
pub struct Agent {
    shared: Arc<Shared>,
    server: Arc<Mutex<Server>>,
    addr: SocketAddr,
    wake: RawFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The agent thread held off the heap (see [`Agent::quiesce`]); released when dropped.
pub struct Quiet<'a> {
    _agent: &'a Agent,
    /// One quiescer at a time (threads of an MPI_THREAD_MULTIPLE program may create or free windows at
    /// once): the first to finish must not let the agent go while another is still moving memory. A
    /// static, like HOLD, off the heap.
    _one: std::sync::MutexGuard<'static, ()>,
}

static QUIESCERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Drop for Quiet<'_> {
    fn drop(&mut self) {
        HOLD.store(0, Ordering::SeqCst);
        vmf_pal::futex::wake(&HOLD, 1);
    }
}

/// 1 while the rank's thread moves memory in place ([`Agent::quiesce`]): the agent thread parks, and
/// writes no memory but statics of this library until it is 0 again. Statics, not the heap: memory that
/// moves in place may share a page with any heap data, the agent's own mutex included.
static HOLD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// 1 while the agent thread is parked for [`HOLD`].
static PARKED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Where the rank's own thread is, as the engine's idle hook reports it (a futex word the agent thread
/// sleeps on while it is [`MAIN_INLINE`]).
static INLINE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(MAIN_OUTSIDE);
/// Outside the library (computing): the agent thread serves, and its answers tell origins to sleep
/// rather than spin for them ([`crate::wire::RESP_BY_AGENT_THREAD`]).
const MAIN_OUTSIDE: u32 = 0;
/// Waiting in the library and serving the agent's connections itself: the agent thread stays off them.
const MAIN_INLINE: u32 = 1;
/// Asleep in the library: the agent thread serves, and the CPUs are free (origins may spin).
const MAIN_ASLEEP: u32 = 2;

/// What a waiting engine tells the agent (see [`engine_idle`]).
pub use vmf_core::engine::IdleAt;

/// The engine's idle hook: while the rank waits in the library for longer than a short spin, its own
/// thread serves requests that arrive over TCP, so an idle target answers with no thread wake-up; when
/// the wait ends, the agent thread takes over again. Installed by [`Agent::hook_into`].
pub fn engine_idle(at: IdleAt) {
    let Some(a) = AGENT.lock().ok().and_then(|g| g.clone()) else {
        return;
    };
    match at {
        IdleAt::Poll => {
            if INLINE.load(Ordering::Relaxed) != MAIN_INLINE {
                INLINE.store(MAIN_INLINE, Ordering::SeqCst);
            }
            if let Ok(mut s) = a.server.try_lock() {
                s.poll_once(0, true);
            }
        }
        IdleAt::Sleep | IdleAt::End => {
            let next = if at == IdleAt::Sleep { MAIN_ASLEEP } else { MAIN_OUTSIDE };
            if INLINE.swap(next, Ordering::SeqCst) == MAIN_INLINE {
                vmf_pal::futex::wake(&INLINE, 1);
            }
        }
    }
}

impl Shared {
    /// Tell every service that connection `key` has gone.
    fn session_closed(&self, key: u64) {
        let svcs: Vec<Arc<dyn Service>> =
            self.services.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for s in svcs {
            s.closed(key);
        }
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agent({})", self.addr)
    }
}

static AGENT: Mutex<Option<Arc<Agent>>> = Mutex::new(None);

impl Agent {
    /// The process's agent, started on `ip` if not running yet.
    pub fn get_or_start(ip: IpAddr, creds: Creds, spin: Duration) -> std::io::Result<Arc<Agent>> {
        let mut g = AGENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = g.as_ref() {
            return Ok(a.clone());
        }
        let a = Arc::new(Agent::start(ip, creds, spin)?);
        *g = Some(a.clone());
        Ok(a)
    }

    /// The process's agent if one runs.
    pub fn running() -> Option<Arc<Agent>> {
        AGENT.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn start(ip: IpAddr, creds: Creds, spin: Duration) -> std::io::Result<Agent> {
        let l = TcpListener::bind(SocketAddr::new(ip, 0))?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        // SAFETY: plain syscall; the descriptor is ours.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            wins: Mutex::new(HashMap::new()),
            services: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            served: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let server = Arc::new(Mutex::new(Server::new(l, wake, creds, shared.clone())));
        let (srv, sh) = (server.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("vmf-rma-agent".into())
            .spawn(move || run(srv, sh, spin))?;
        Ok(Agent {
            shared,
            server,
            addr,
            wake,
            thread: Some(thread),
        })
    }

    /// Where origins connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Let `engine` serve this agent's connections while it waits idle (see [`engine_idle`]).
    pub fn hook_into(engine: &mut vmf_core::engine::Engine) {
        engine.set_idle_hook(Some(engine_idle));
    }

    /// Keep the agent thread off the heap until the guard is dropped. It parks between requests, on
    /// statics only: were it held by its server mutex instead, as it once was, blocking on that mutex
    /// writes the mutex word, on the heap, and a page being moved in place could carry the write's
    /// older copy (a contended flag lost: the unlock then woke nobody, and the agent slept forever).
    pub fn quiesce(&self) -> Quiet<'_> {
        let turn = QUIESCERS.lock().unwrap_or_else(|e| e.into_inner());
        HOLD.store(1, Ordering::SeqCst);
        vmf_pal::futex::wake(&INLINE, 1);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd (wakes the agent out of epoll_wait).
        unsafe { libc::write(self.wake, one.as_ptr().cast(), 8) };
        while PARKED.load(Ordering::SeqCst) == 0 && !self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            vmf_pal::yield_now();
        }
        Quiet { _agent: self, _one: turn }
    }

    /// A new window id (registered later with [`Agent::register`]).
    pub fn new_id(&self) -> u64 {
        self.shared.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Serve `target` (this process's memory of window `id`).
    pub fn register(&self, id: u64, target: Target) {
        self.shared
            .wins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, target);
    }

    /// Stop serving window `id` (waits for a request on it that is being executed).
    pub fn unregister(&self, id: u64) {
        self.shared
            .wins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Serve `svc` under id `id` (replacing a service of that id).
    pub fn add_service(&self, id: u64, svc: Arc<dyn Service>) {
        self.shared.services.lock().unwrap_or_else(|e| e.into_inner()).insert(id, svc);
    }

    /// Stop serving service `id`.
    pub fn remove_service(&self, id: u64) {
        self.shared.services.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }

    /// Connections refused (failed or timed-out handshakes, protocol errors).
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        INLINE.store(MAIN_OUTSIDE, Ordering::SeqCst);
        vmf_pal::futex::wake(&INLINE, 1);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.wake, one.as_ptr().cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.wake) };
    }
}

enum HsState {
    Hello,
    Proof { src: u32, nonce_c: [u8; 16], nonce_a: [u8; 16] },
    Open,
}

struct Conn {
    s: TcpStream,
    /// The connection's key (also the session id services see).
    key: u64,
    state: HsState,
    started: Instant,
    inb: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    /// Waiting for room to write (registered for EPOLLOUT).
    want_out: bool,
}

pub(crate) struct Server {
    l: TcpListener,
    wake: RawFd,
    epoll: RawFd,
    creds: Creds,
    sh: Arc<Shared>,
    conns: HashMap<u64, Conn>,
    next_key: u64,
    looks: u32,
    runs: Vec<Run>,
    tmp: Vec<u8>,
}

const KEY_LISTENER: u64 = u64::MAX;
/// With at most this many connections, a spinning agent reads them directly (see `poll_direct`).
const DIRECT_MAX: usize = 2;
/// A spinning agent asks epoll (new connections, closed ones) every this many looks.
const ADMIN_EVERY: u32 = 64;
const KEY_WAKE: u64 = u64::MAX - 1;

fn epoll_ctl(ep: RawFd, op: i32, fd: RawFd, events: u32, key: u64) {
    let mut ev = libc::epoll_event { events, u64: key };
    // SAFETY: plain syscall on our epoll descriptor.
    unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
}

impl Server {
    fn new(l: TcpListener, wake: RawFd, creds: Creds, sh: Arc<Shared>) -> Server {
        // SAFETY: plain syscall.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        epoll_ctl(epoll, libc::EPOLL_CTL_ADD, l.as_raw_fd(), libc::EPOLLIN as u32, KEY_LISTENER);
        epoll_ctl(epoll, libc::EPOLL_CTL_ADD, wake, libc::EPOLLIN as u32, KEY_WAKE);
        Server {
            l,
            wake,
            epoll,
            creds,
            sh,
            conns: HashMap::new(),
            next_key: 0,
            looks: 0,
            runs: Vec::new(),
            tmp: Vec::new(),
        }
    }

    /// Look at each open connection by reading it (no `epoll_wait` first: on a loopback round trip the
    /// saved system call is a tenth of the latency), when there are few; every [`ADMIN_EVERY`] looks,
    /// and with many connections or handshakes under way, ask epoll instead. True if requests were served.
    fn poll_direct(&mut self, inline: bool) -> bool {
        self.looks = self.looks.wrapping_add(1);
        if self.conns.len() > DIRECT_MAX
            || self.looks % ADMIN_EVERY == 0
            || self.has_pending_handshakes()
        {
            return self.poll_once(0, inline);
        }
        let keys: Vec<u64> = self.conns.keys().copied().collect();
        let mut worked = false;
        for k in keys {
            worked |= self.serve(k, inline);
        }
        worked
    }

    /// Wait up to `timeout_ms` (0: just look) for events and handle them; true if requests were served.
    /// `inline`: false when the rank computes outside the library (answers then say so).
    fn poll_once(&mut self, timeout_ms: i32, inline: bool) -> bool {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: evs has room for its length in events.
        let n = unsafe { libc::epoll_wait(self.epoll, evs.as_mut_ptr(), evs.len() as i32, timeout_ms) };
        let n = if n < 0 { 0 } else { n as usize };
        let mut worked = false;
        for ev in &evs[..n] {
            let key = ev.u64;
            match key {
                KEY_LISTENER => self.accept(),
                KEY_WAKE => {
                    let mut b = [0u8; 8];
                    // SAFETY: reading 8 bytes from our eventfd.
                    unsafe { libc::read(self.wake, b.as_mut_ptr().cast(), 8) };
                }
                k => worked |= self.serve(k, inline),
            }
        }
        self.expire();
        worked
    }

    fn has_pending_handshakes(&self) -> bool {
        self.conns.values().any(|c| !matches!(c.state, HsState::Open))
    }

    fn accept(&mut self) {
        loop {
            match self.l.accept() {
                Ok((s, _)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    let pending: Vec<(u64, Instant)> = self
                        .conns
                        .iter()
                        .filter(|(_, c)| !matches!(c.state, HsState::Open))
                        .map(|(k, c)| (*k, c.started))
                        .collect();
                    if pending.len() >= MAX_PENDING {
                        if let Some((k, _)) = pending.iter().min_by_key(|(_, t)| *t) {
                            self.close(*k);
                        }
                    }
                    let key = self.next_key;
                    self.next_key += 1;
                    epoll_ctl(
                        self.epoll,
                        libc::EPOLL_CTL_ADD,
                        s.as_raw_fd(),
                        libc::EPOLLIN as u32,
                        key,
                    );
                    self.conns.insert(
                        key,
                        Conn {
                            s,
                            key,
                            state: HsState::Hello,
                            started: Instant::now(),
                            inb: Vec::new(),
                            out: Vec::new(),
                            out_pos: 0,
                            want_out: false,
                        },
                    );
                }
                Err(_) => return,
            }
        }
    }

    fn close(&mut self, key: u64) {
        if let Some(c) = self.conns.remove(&key) {
            epoll_ctl(self.epoll, libc::EPOLL_CTL_DEL, c.s.as_raw_fd(), 0, key);
            if !matches!(c.state, HsState::Open) {
                self.sh.refused.fetch_add(1, Ordering::Relaxed);
            } else {
                self.sh.session_closed(key);
            }
        }
    }

    fn expire(&mut self) {
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                !matches!(c.state, HsState::Open) && c.started.elapsed() > HANDSHAKE_TIMEOUT
            })
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            self.close(k);
        }
    }

    /// Read what arrived on connection `key`, act on it, write the answers. True if requests were served.
    fn serve(&mut self, key: u64, inline: bool) -> bool {
        let mut c = match self.conns.remove(&key) {
            Some(c) => c,
            None => return false,
        };
        let mut closed = false;
        let mut buf = [0u8; 64 << 10];
        loop {
            match c.s.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    c.inb.extend_from_slice(&buf[..n]);
                    if n < buf.len() {
                        // The socket is drained (no second read just to hear EAGAIN).
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let mut worked = false;
        let ok = match self.process(&mut c, &mut worked, inline) {
            Ok(()) => flush(&mut c),
            Err(()) => false,
        };
        if !ok || (closed && c.out_pos >= c.out.len()) {
            let open = matches!(c.state, HsState::Open);
            epoll_ctl(self.epoll, libc::EPOLL_CTL_DEL, c.s.as_raw_fd(), 0, key);
            if !open || !ok {
                self.sh.refused.fetch_add(1, Ordering::Relaxed);
            }
            if open {
                self.sh.session_closed(key);
            }
            return worked;
        }
        let want_out = c.out_pos < c.out.len();
        if want_out != c.want_out {
            c.want_out = want_out;
            let ev = libc::EPOLLIN as u32 | if want_out { libc::EPOLLOUT as u32 } else { 0 };
            epoll_ctl(self.epoll, libc::EPOLL_CTL_MOD, c.s.as_raw_fd(), ev, key);
        }
        self.conns.insert(key, c);
        worked
    }

    /// Handle complete messages in `c.inb`; `Err` closes the connection.
    fn process(&mut self, c: &mut Conn, worked: &mut bool, inline: bool) -> Result<(), ()> {
        let mut pos = 0usize;
        loop {
            let avail = &c.inb[pos..];
            match c.state {
                HsState::Hello => {
                    if avail.len() < HELLO_LEN {
                        break;
                    }
                    let h = &avail[..HELLO_LEN];
                    let job = u64::from_le_bytes(h[8..16].try_into().unwrap());
                    let src = u32::from_le_bytes(h[16..20].try_into().unwrap());
                    let dst = u32::from_le_bytes(h[20..24].try_into().unwrap());
                    let nonce_c: [u8; 16] = h[24..40].try_into().unwrap();
                    let mh = u64::from_le_bytes(h[40..48].try_into().unwrap());
                    let cr = self.creds;
                    if &h[..8] != HELLO_MAGIC
                        || job != cr.job
                        || dst != cr.rank
                        || mh != vmf_transport::tcp::mac(&cr.secret, ROLE_HELLO, job, src, dst, &nonce_c, &[0; 16])
                    {
                        return Err(());
                    }
                    let nonce_a = vmf_transport::tcp::nonce();
                    let ma = vmf_transport::tcp::mac(&cr.secret, ROLE_ACCEPT, job, src, dst, &nonce_c, &nonce_a);
                    c.out.extend_from_slice(REPLY_MAGIC);
                    c.out.extend_from_slice(&nonce_a);
                    c.out.extend_from_slice(&ma.to_le_bytes());
                    c.state = HsState::Proof { src, nonce_c, nonce_a };
                    pos += HELLO_LEN;
                }
                HsState::Proof { src, nonce_c, nonce_a } => {
                    if avail.len() < PROOF_LEN {
                        break;
                    }
                    let cr = self.creds;
                    let mc = u64::from_le_bytes(avail[8..16].try_into().unwrap());
                    if &avail[..8] != PROOF_MAGIC
                        || mc != vmf_transport::tcp::mac(&cr.secret, ROLE_CLIENT, cr.job, src, cr.rank, &nonce_a, &nonce_c)
                    {
                        return Err(());
                    }
                    c.state = HsState::Open;
                    pos += PROOF_LEN;
                }
                HsState::Open => {
                    if avail.len() < REQ_HDR {
                        break;
                    }
                    let h = ReqHeader::decode(&avail[..REQ_HDR]).ok_or(())?;
                    let runs_len = h.nruns as usize * RUN_WIRE;
                    let total = REQ_HDR + runs_len + h.data_len as usize;
                    if avail.len() < total {
                        break;
                    }
                    decode_runs(&avail[REQ_HDR..REQ_HDR + runs_len], h.nruns as usize, &mut self.runs)
                        .ok_or(())?;
                    let data = &avail[REQ_HDR + runs_len..total];
                    let flags = if inline { 0 } else { crate::wire::RESP_BY_AGENT_THREAD };
                    execute(&self.sh, c.key, &h, &self.runs, data, &mut c.out, &mut self.tmp, flags)?;
                    self.sh.served.fetch_add(1, Ordering::Relaxed);
                    *worked = true;
                    pos += total;
                }
            }
        }
        c.inb.drain(..pos);
        Ok(())
    }
}

/// The agent thread: sleep in `epoll_wait` (not holding the server, which the rank's own thread may use
/// meanwhile), serve what arrived, keep looking for `spin` after serving; stay off the sockets while the
/// rank's thread serves them inline.
fn run(server: Arc<Mutex<Server>>, sh: Arc<Shared>, spin: Duration) {
    let epoll = server.lock().unwrap_or_else(|e| e.into_inner()).epoll;
    let mut last_work: Option<Instant> = None;
    while !sh.stop.load(Ordering::Acquire) {
        if HOLD.load(Ordering::SeqCst) != 0 {
            PARKED.store(1, Ordering::SeqCst);
            while HOLD.load(Ordering::SeqCst) != 0 && !sh.stop.load(Ordering::Acquire) {
                vmf_pal::futex::wait(&HOLD, 1, Some(Duration::from_millis(10)));
            }
            PARKED.store(0, Ordering::SeqCst);
            continue;
        }
        if INLINE.load(Ordering::SeqCst) == MAIN_INLINE {
            vmf_pal::futex::wait(&INLINE, MAIN_INLINE, Some(Duration::from_millis(10)));
            last_work = None;
            continue;
        }
        let spinning = last_work.is_some_and(|t| t.elapsed() < spin);
        let pending = server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .has_pending_handshakes();
        let timeout = if spinning {
            0
        } else if pending {
            200
        } else {
            // Bounded: the thread looks at INLINE again at least this often.
            10
        };
        // While spinning, poll under the lock at once (one epoll_wait per look); otherwise sleep in a
        // readiness probe first, not holding the server, which the rank's own thread may use meanwhile.
        let n = if spinning {
            1
        } else {
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 1];
            // SAFETY: one event of room.
            unsafe { libc::epoll_wait(epoll, ev.as_mut_ptr(), 1, timeout) }
        };
        if n > 0 || pending {
            // Answers flag a busy target only when the rank computes outside the library.
            let busy = INLINE.load(Ordering::Relaxed) == MAIN_OUTSIDE;
            let mut srv = server.lock().unwrap_or_else(|e| e.into_inner());
            let worked = if spinning {
                srv.poll_direct(!busy)
            } else {
                srv.poll_once(0, !busy)
            };
            drop(srv);
            if worked {
                last_work = Some(Instant::now());
            }
        } else if spinning {
            std::hint::spin_loop();
        }
    }
}

/// Write what is queued on `c`; false if the connection failed.
fn flush(c: &mut Conn) -> bool {
    while c.out_pos < c.out.len() {
        match crate::sock::sendv(c.s.as_raw_fd(), &[&c.out[c.out_pos..]]) {
            Ok(0) => return false,
            Ok(n) => c.out_pos += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    c.out.clear();
    c.out_pos = 0;
    true
}

/// Execute one request and append its response to `out`. `Err` for a request that is malformed in a way
/// that makes the rest of the stream untrustworthy.
#[allow(clippy::too_many_arguments)]
fn execute(
    sh: &Shared,
    session: u64,
    h: &ReqHeader,
    runs: &[Run],
    data: &[u8],
    out: &mut Vec<u8>,
    tmp: &mut Vec<u8>,
    flags: u32,
) -> Result<(), ()> {
    let kind = Kind::from_u8(h.kind).ok_or(())?;
    let resp = |out: &mut Vec<u8>, st: Status, len: u64| {
        RespHeader {
            status: st as u32,
            flags,
            len,
        }
        .encode(out)
    };
    if kind == Kind::Flush {
        resp(out, Status::Ok, 0);
        return Ok(());
    }
    if kind == Kind::Service {
        if h.nruns != 0 || data.len() as u64 != h.data_len {
            return Err(());
        }
        let svc = sh.services.lock().unwrap_or_else(|e| e.into_inner()).get(&h.win).cloned();
        let Some(svc) = svc else {
            resp(out, Status::NoWin, 0);
            return Ok(());
        };
        tmp.clear();
        let st = svc.call(session, h.op, data, tmp);
        if st == Status::Ok {
            resp(out, st, tmp.len() as u64);
            out.extend_from_slice(tmp);
        } else {
            resp(out, st, 0);
        }
        return Ok(());
    }
    let wins = sh.wins.lock().unwrap_or_else(|e| e.into_inner());
    let Some(t) = wins.get(&h.win) else {
        resp(out, Status::NoWin, 0);
        return Ok(());
    };
    let count = usize::try_from(h.count).map_err(|_| ())?;
    let extent = isize::try_from(h.extent).map_err(|_| ())?;
    let layout = Layout {
        runs,
        count,
        extent,
    };
    let bytes = layout.bytes();
    let need = |n: usize| if data.len() == n { Ok(()) } else { Err(()) };
    match kind {
        Kind::Put => {
            need(bytes)?;
            // SAFETY: data holds layout.bytes() bytes (checked).
            let st = unsafe { t.put(h.disp, &layout, data.as_ptr()) };
            resp(out, st, 0);
        }
        Kind::Get => {
            need(0)?;
            if bytes as u64 > crate::wire::MAX_DATA {
                return Err(());
            }
            let at = out.len() + crate::wire::RESP_HDR;
            resp(out, Status::Ok, bytes as u64);
            out.resize(at + bytes, 0);
            // SAFETY: `bytes` writable bytes at `at`.
            let st = unsafe { t.get(h.disp, &layout, out.as_mut_ptr().add(at)) };
            if st != Status::Ok {
                out.truncate(at - crate::wire::RESP_HDR);
                resp(out, st, 0);
            }
        }
        Kind::Acc | Kind::GetAcc => {
            need(bytes)?;
            let (Some(e), Some(op)) = (Elem::from_u8(h.elem), ROp::from_u8(h.op)) else {
                return Err(());
            };
            if !t.can_rmw() {
                resp(out, Status::Bad, 0);
                return Ok(());
            }
            if kind == Kind::Acc {
                // SAFETY: data holds `bytes` bytes.
                let st = unsafe { t.acc(h.disp, &layout, e, op, data.as_ptr(), None) };
                resp(out, st, 0);
            } else {
                tmp.clear();
                tmp.resize(bytes, 0);
                // SAFETY: data and tmp hold `bytes` bytes.
                let st = unsafe { t.acc(h.disp, &layout, e, op, data.as_ptr(), Some(tmp.as_mut_ptr())) };
                if st == Status::Ok {
                    resp(out, st, bytes as u64);
                    out.extend_from_slice(tmp);
                } else {
                    resp(out, st, 0);
                }
            }
        }
        Kind::Cas => {
            let e = Elem::from_u8(h.elem).ok_or(())?;
            let s = e.packed_size();
            need(2 * s)?;
            if !t.can_rmw() {
                resp(out, Status::Bad, 0);
                return Ok(());
            }
            let mut res = [0u8; 32];
            // SAFETY: data holds two elements; res has room for one.
            let st = unsafe { t.cas(h.disp, e, data.as_ptr(), data.as_ptr().add(s), res.as_mut_ptr()) };
            if st == Status::Ok {
                resp(out, st, s as u64);
                out.extend_from_slice(&res[..s]);
            } else {
                resp(out, st, 0);
            }
        }
        Kind::Lock => resp(out, t.try_lock(h.flags & FLAG_EXCL != 0), 0),
        Kind::Unlock => resp(out, t.unlock(h.flags & FLAG_EXCL != 0), 0),
        Kind::Flush | Kind::Service => unreachable!(),
    }
    Ok(())
}

/// Connect to the agent at `addr` as origin `creds.rank` for target rank `dst` and authenticate.
pub(crate) fn connect(addr: SocketAddr, creds: &Creds, dst: u32) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, HANDSHAKE_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut s = s;
    let nonce_c = vmf_transport::tcp::nonce();
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(HELLO_MAGIC);
    hello.extend_from_slice(&creds.job.to_le_bytes());
    hello.extend_from_slice(&creds.rank.to_le_bytes());
    hello.extend_from_slice(&dst.to_le_bytes());
    hello.extend_from_slice(&nonce_c);
    let mh = vmf_transport::tcp::mac(&creds.secret, ROLE_HELLO, creds.job, creds.rank, dst, &nonce_c, &[0; 16]);
    hello.extend_from_slice(&mh.to_le_bytes());
    crate::sock::send_all(s.as_raw_fd(), &hello)?;
    let mut r = [0u8; REPLY_LEN];
    s.read_exact(&mut r)?;
    let nonce_a: [u8; 16] = r[8..24].try_into().unwrap();
    let ma = u64::from_le_bytes(r[24..32].try_into().unwrap());
    if &r[..8] != REPLY_MAGIC
        || ma != vmf_transport::tcp::mac(&creds.secret, ROLE_ACCEPT, creds.job, creds.rank, dst, &nonce_c, &nonce_a)
    {
        return Err(std::io::Error::new(
            ErrorKind::PermissionDenied,
            "the agent failed authentication (wrong job secret)",
        ));
    }
    let mc = vmf_transport::tcp::mac(&creds.secret, ROLE_CLIENT, creds.job, creds.rank, dst, &nonce_a, &nonce_c);
    let mut p = Vec::with_capacity(PROOF_LEN);
    p.extend_from_slice(PROOF_MAGIC);
    p.extend_from_slice(&mc.to_le_bytes());
    crate::sock::send_all(s.as_raw_fd(), &p)?;
    s.set_read_timeout(None)?;
    s.set_nonblocking(true)?;
    Ok(s)
}
