//! The shared-memory transport: one region per host, one SPSC ring per ordered pair of co-resident ranks.
//!
//! A ring `i → j` is created by its producer `i` on first send (heap allocation in the region, published in
//! the pair table) and discovered by `j` while polling. Small messages are copied into the ring with no
//! system call, allocation or lock. Large messages are the core's business (rendezvous with a single copy by
//! `process_vm_readv`, or pipelined chunks through this ring); this transport only moves packets.
//!
//! Sleep/wake: a receiver that wants to block sets `sleeping` in its slot, issues a barrier, re-checks its
//! rings and waits on its `doorbell` futex; a sender checks `sleeping` after publishing (only when
//! [`ShmTransport::set_wake_check`] is on) and makes the one system call only if the receiver really sleeps.
//! The store-then-load on both sides needs a full barrier on each side (Dekker); we make it asymmetric: the
//! sleeper pays with `membarrier(GLOBAL_EXPEDITED)`, the sender's side is a compiler barrier and a plain load,
//! so a send to an awake receiver costs one cached load and no system call. Without membarrier both sides
//! use fences. Futexes do not cross kernels: peers in another VM (different kernel id) are never woken, and
//! a receiver with such peers sleeps in bounded exponential steps instead (see `can_futex`).
pub mod region;

use crate::proto::{Kind, PktHeader, HDR_SIZE};
use crate::{Incoming, Transport, TransportError};
use region::Region;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vmf_bb::duplex::{BoxRecord, DuplexEnd, DUPLEX_MAX_BODY};
use vmf_bb::ring::{Consumer, Producer, ReadRecord, Ring, RING_CTL_SIZE};
use vmf_pal::process::ProcessId;

struct ShmPeer {
    local: u32,
    tx: Option<Producer>,
    rx: Option<Consumer>,
    /// The pair's duplex box (in the control block of the ring from the lower rank to the higher).
    dx: Option<DuplexEnd>,
    proc_id: ProcessId,
    same_kernel: bool,
    /// The ring from a peer that moved away, kept only until the record being handled (its last one) is
    /// released; then the entry goes (see [`ShmTransport::forget_after_release`]).
    retiring: Option<Consumer>,
}

/// How senders find out that a receiver sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeMode {
    /// Nobody sleeps: senders never look.
    Off,
    /// Sleepers issue `membarrier`; senders do a plain load.
    Membarrier,
    /// Both sides fence.
    Fence,
}

/// The shared-memory transport of one rank.
pub struct ShmTransport {
    region: Arc<Region>,
    me: usize,
    me_local: u32,
    peers: Vec<Option<ShmPeer>>,
    rx_list: Vec<usize>,
    undiscovered: Vec<usize>,
    cursor: usize,
    ring_size: u64,
    wake: WakeMode,
    kernel: u64,
    /// Datagram socket (abstract namespace) a rank sleeping in epoll is woken through.
    db_sock: Option<std::os::unix::net::UnixDatagram>,
    job: u64,
    /// Use duplex boxes for small packets (see [`ShmTransport::set_duplex`]).
    duplex: bool,
    /// In a VM with an ivshmem doorbell: its registers (to ring peers) and this rank's vector's eventfd.
    vm_bell: Option<VmBell>,
}

/// A rank's use of its VM's ivshmem doorbell (see [`ShmTransport::enable_vm_bell`]).
pub struct VmBell {
    regs: Arc<vmf_pal::pci::IvshmemRegs>,
    /// The eventfd of the vector lent to this rank (not owned: it outlives transports), if any.
    own: Option<std::os::fd::RawFd>,
}

/// Where a packet handed out by [`ShmTransport`] lives, until it is released.
#[derive(Debug)]
pub enum ShmToken {
    /// A ring record.
    Ring(ReadRecord),
    /// The pair's duplex box.
    Box(BoxRecord),
}

const SLEEP_FUTEX: u32 = 1;
const SLEEP_SOCKET: u32 = 2;
/// Asleep in `poll` on the eventfd of its doorbell vector: ring it through the ivshmem device.
const SLEEP_BELL: u32 = 3;
/// `Slot::bell`: the owner can be rung (IVPosition and vector below are valid).
const BELL_VALID: u64 = 1 << 32;
/// `Slot::bell`: the owner rings sleepers in other VMs (its doorbell register is mapped).
const BELL_RINGS: u64 = 1 << 33;

fn doorbell_name(job: u64, rank: usize) -> String {
    format!("vmf-{job:016x}-{rank}")
}

fn box_misplaced(peer: usize, pos: u64, tail: u64) -> TransportError {
    TransportError::Corrupt {
        peer,
        what: format!("duplex box record placed at ring position {pos} but the ring is at {tail}"),
    }
}

/// What a ring or duplex box held that an honest peer never writes.
fn corrupt(peer: usize, e: impl std::fmt::Display) -> TransportError {
    TransportError::Corrupt {
        peer,
        what: e.to_string(),
    }
}

impl ShmTransport {
    /// A transport for global rank `me`, attached to `region` at slot `me_local`. Rings this rank creates
    /// have `ring_size` data bytes.
    pub fn new(
        region: Arc<Region>,
        me: usize,
        me_local: u32,
        nranks: usize,
        ring_size: u64,
    ) -> Self {
        ShmTransport {
            region,
            me,
            me_local,
            peers: (0..nranks).map(|_| None).collect(),
            rx_list: Vec::new(),
            undiscovered: Vec::new(),
            cursor: 0,
            ring_size,
            wake: WakeMode::Off,
            kernel: vmf_pal::process::kernel_id(),
            db_sock: None,
            job: 0,
            duplex: false,
            vm_bell: None,
        }
    }

    /// In a VM whose ivshmem device has a doorbell: ring sleeping peers through `regs`, and, given the
    /// eventfd of a vector (`own`: vector and descriptor, lent by the guest's agent, which routes the
    /// device's MSI-X vector to it), sleep on it when peers in other VMs cannot reach a futex. Published
    /// in this rank's slot as `1 << 32 | IVPosition << 16 | vector`.
    pub fn enable_vm_bell(&mut self, regs: Arc<vmf_pal::pci::IvshmemRegs>, own: Option<(u16, std::os::fd::RawFd)>) {
        let pos = regs.position();
        if let Ok(s) = self.region.slot(self.me_local) {
            let word = match own {
                Some((v, _)) if pos <= 0xffff => BELL_RINGS | BELL_VALID | u64::from(pos) << 16 | u64::from(v),
                _ => BELL_RINGS,
            };
            s.bell.store(word, Ordering::Release);
        }
        self.vm_bell = Some(VmBell {
            regs,
            own: own.filter(|_| pos <= 0xffff).map(|(_, fd)| fd),
        });
    }

    /// True when every peer on another kernel says it rings sleepers through its doorbell (a peer whose
    /// registers could not be mapped does not): only then may a sleep on [`ShmTransport::bell_fd`] be
    /// long; otherwise it stays in bounded steps, as without a doorbell.
    pub fn remote_peers_ring(&self) -> bool {
        self.peers.iter().flatten().filter(|p| !p.same_kernel).all(|p| {
            self.region
                .slot(p.local)
                .is_ok_and(|s| s.bell.load(Ordering::Acquire) & BELL_RINGS != 0)
        })
    }

    /// The eventfd this rank sleeps on when peers in other VMs must wake it (see
    /// [`ShmTransport::enable_vm_bell`]); None without one or when nobody rings.
    pub fn bell_fd(&self) -> Option<std::os::fd::RawFd> {
        if self.wake == WakeMode::Off {
            return None;
        }
        self.vm_bell.as_ref().and_then(|b| b.own)
    }

    /// Before sleeping on [`ShmTransport::bell_fd`]: announce it and issue the barrier. The caller then
    /// checks for incoming packets, sleeps, and calls [`ShmTransport::cancel_sleep`] and
    /// [`ShmTransport::drain_bell`].
    pub fn prepare_sleep_bell(&self) {
        let s = self.region.slot(self.me_local).expect("own slot");
        s.sleeping.store(SLEEP_BELL, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.wake == WakeMode::Membarrier {
            let _ = vmf_pal::membarrier::global_expedited();
        }
    }

    /// After [`ShmTransport::prepare_sleep_bell`] and a last look: sleep until the doorbell rings or
    /// `timeout` passes (keep it short unless [`ShmTransport::remote_peers_ring`]), then clear
    /// `sleeping` and consume the count.
    pub fn sleep_bell(&self, timeout: Duration) {
        if let Some(fd) = self.bell_fd() {
            vmf_pal::wait_readable(fd, timeout);
        }
        self.cancel_sleep();
        self.drain_bell();
    }

    /// Consume the doorbell's count after a sleep.
    pub fn drain_bell(&self) {
        if let Some(fd) = self.vm_bell.as_ref().and_then(|b| b.own) {
            vmf_pal::drain_eventfd(fd);
        }
    }

    /// Declare `peer` co-resident at local slot `local` (learnt from the bootstrap exchange of region UUIDs).
    pub fn add_peer(&mut self, peer: usize, local: u32) -> Result<(), TransportError> {
        if peer == self.me || peer >= self.peers.len() {
            return Err(TransportError::Setup(format!("invalid shm peer {peer}")));
        }
        // Re-adding (a peer that moved back): forget its old entry first.
        self.remove_peer(peer);
        let proc_id = self.region.slot_process(local)?;
        let same_kernel = self.region.slot_kernel(local)? == self.kernel && self.kernel != 0;
        self.peers[peer] = Some(ShmPeer {
            local,
            tx: None,
            rx: None,
            dx: None,
            proc_id,
            same_kernel,
            retiring: None,
        });
        self.undiscovered.push(peer);
        Ok(())
    }

    /// Forget `peer` (it moved away): stop polling its ring and drop ours to it.
    pub fn remove_peer(&mut self, peer: usize) {
        if let Some(p) = self.peers.get_mut(peer) {
            *p = None;
        }
        self.rx_list.retain(|&r| r != peer);
        self.undiscovered.retain(|&r| r != peer);
        self.cursor = 0;
    }

    /// Forget `peer`, which moved away and whose last record (its `Moved`) is being handled now: nothing
    /// more is read from or written to its slot, and the entry goes once that record is released. The
    /// slot may be taken by another rank as soon as the peer has our answer, so a stale entry must never
    /// read what the next occupant writes there.
    pub fn forget_after_release(&mut self, peer: usize) {
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return;
        };
        p.tx = None;
        p.dx = None;
        p.retiring = p.rx.take();
        if p.retiring.is_none() {
            self.remove_peer(peer);
            return;
        }
        self.rx_list.retain(|&r| r != peer);
        self.undiscovered.retain(|&r| r != peer);
        self.cursor = 0;
    }

    /// The region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// This rank's slot index.
    pub fn local_index(&self) -> u32 {
        self.me_local
    }

    /// Use a duplex box per pair for packets of up to [`DUPLEX_MAX_BODY`] bytes (header included) besides
    /// the rings: a request and its reply then share one cache line. Both ends of every pair must agree, and
    /// the rings must be fresh (a box is never carried over to a re-attached ring), so the core enables it
    /// only in jobs where no rank can migrate. Set before the first packet.
    pub fn set_duplex(&mut self, on: bool) {
        self.duplex = on;
    }

    /// Enable the sender-side check for sleeping receivers (needed when any rank may block). Every rank
    /// of the job must agree; returns the mode chosen.
    pub fn set_wake_check(&mut self, on: bool) -> WakeMode {
        self.wake = if !on {
            WakeMode::Off
        } else if vmf_pal::membarrier::register_global_expedited() {
            WakeMode::Membarrier
        } else {
            WakeMode::Fence
        };
        self.wake
    }

    /// Create this rank's doorbell socket (for sleeping in epoll together with other transports). Abstract
    /// Unix sockets live in the network namespace, which co-resident ranks share.
    pub fn enable_socket_doorbell(&mut self, job: u64) -> Result<(), TransportError> {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(
            doorbell_name(job, self.me).as_bytes(),
        )
        .map_err(|e| TransportError::Setup(e.to_string()))?;
        let s = std::os::unix::net::UnixDatagram::bind_addr(&addr).map_err(|e| {
            TransportError::Setup(format!("Unable to create the doorbell socket since {e}"))
        })?;
        s.set_nonblocking(true)
            .map_err(|e| TransportError::Setup(e.to_string()))?;
        self.db_sock = Some(s);
        self.job = job;
        Ok(())
    }

    /// Give up the doorbell socket (to the transport that replaces this one in the same network
    /// namespace, where its name can only be bound once).
    pub fn take_socket_doorbell(&mut self) -> Option<std::os::unix::net::UnixDatagram> {
        self.db_sock.take()
    }

    /// Use a doorbell socket another transport of this rank bound (see [`Self::take_socket_doorbell`]).
    pub fn adopt_socket_doorbell(&mut self, s: std::os::unix::net::UnixDatagram, job: u64) {
        self.db_sock = Some(s);
        self.job = job;
    }

    /// The doorbell socket's descriptor, if enabled.
    pub fn doorbell_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.db_sock.as_ref().map(|s| s.as_raw_fd())
    }

    /// Before sleeping in epoll (with the doorbell socket in the set): announce it and issue the barrier.
    pub fn prepare_sleep_socket(&self) {
        let s = self.region.slot(self.me_local).expect("own slot");
        s.sleeping.store(
            if self.db_sock.is_some() {
                SLEEP_SOCKET
            } else {
                SLEEP_FUTEX
            },
            Ordering::SeqCst,
        );
        fence(Ordering::SeqCst);
        if self.wake == WakeMode::Membarrier {
            let _ = vmf_pal::membarrier::global_expedited();
        }
    }

    /// Empty the doorbell socket after waking.
    pub fn drain_doorbell(&self) {
        if let Some(s) = &self.db_sock {
            let mut b = [0u8; 16];
            while s.recv(&mut b).is_ok() {}
        }
    }

    /// The wake mode in force.
    pub fn wake_mode(&self) -> WakeMode {
        self.wake
    }

    /// True if every co-resident peer shares our kernel, so a futex sleep will be woken by senders.
    pub fn can_futex(&self) -> bool {
        self.wake != WakeMode::Off && self.peers.iter().flatten().all(|p| p.same_kernel)
    }

    /// Number of co-resident peers.
    pub fn peer_count(&self) -> usize {
        self.peers.iter().filter(|p| p.is_some()).count()
    }

    /// True if `peer` shares our kernel (processes, containers); false for a peer in another VM or unknown.
    #[inline]
    pub fn same_kernel(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .and_then(|p| p.as_ref())
            .is_some_and(|p| p.same_kernel)
    }

    /// True if `peer`'s process is alive (reads /proc: not for the hot path). A peer under another kernel
    /// (another VM sharing an ivshmem region) cannot be seen and counts as alive: its death is the
    /// launcher's to detect (the guest agent reports every rank's exit).
    pub fn peer_alive(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .and_then(|p| p.as_ref())
            .is_none_or(|p| !p.same_kernel || p.proc_id.is_alive())
    }

    /// The first co-resident peer whose process died while still attached (a peer that detached in an
    /// orderly way and exited is not dead for this purpose).
    pub fn find_dead_peer(&self) -> Option<(usize, i32)> {
        self.peers.iter().enumerate().find_map(|(r, p)| {
            let p = p.as_ref()?;
            let attached = self
                .region
                .slot(p.local)
                .is_ok_and(|s| s.state.load(Ordering::Acquire) == 1);
            (attached && p.same_kernel && !p.proc_id.is_alive()).then_some((r, p.proc_id.pid))
        })
    }

    fn create_tx(&mut self, peer: usize) -> Result<(), TransportError> {
        let local = self.peers[peer].as_ref().unwrap().local;
        let entry = self.region.pair(self.me_local, local)?;
        let off = entry.load(Ordering::Acquire);
        let fresh = off == 0;
        let (base, cap) = if !fresh {
            // Re-attaching to a ring this slot created before (restart of the transport object).
            self.region.ring_at(off, None)?
        } else {
            let off = self.region.alloc(RING_CTL_SIZE as u64 + self.ring_size)?;
            let (base, cap) = self.region.ring_at(off, Some(self.ring_size))?;
            // SAFETY: freshly allocated, in bounds, 128-aligned, nobody else knows the offset yet.
            unsafe { Ring::init(base, cap) }.map_err(|e| corrupt(peer, e))?;
            entry.store(off, Ordering::Release);
            (base, cap)
        };
        // SAFETY: validated in bounds of the region, which the Arc keeps mapped.
        let p = unsafe { Ring::producer(base, cap) }.map_err(|e| corrupt(peer, e))?;
        let sp = self.peers[peer].as_mut().unwrap();
        sp.tx = Some(p);
        if self.duplex && fresh && self.me < peer {
            // SAFETY: the control block of a ring we just initialised (box zeroed), mapped while the Arc lives.
            sp.dx = Some(unsafe { DuplexEnd::new(Ring::duplex_area(base), true) });
            if !self.rx_list.contains(&peer) {
                self.rx_list.push(peer);
            }
        }
        Ok(())
    }

    fn discover(&mut self) -> Result<(), TransportError> {
        let mut i = 0;
        while i < self.undiscovered.len() {
            let peer = self.undiscovered[i];
            let local = self.peers[peer].as_ref().unwrap().local;
            let off = self
                .region
                .pair(local, self.me_local)?
                .load(Ordering::Acquire);
            if off == 0 {
                i += 1;
                continue;
            }
            let (base, cap) =
                self.region
                    .ring_at(off, None)
                    .map_err(|e| TransportError::Corrupt {
                        peer,
                        what: e.to_string(),
                    })?;
            // SAFETY: validated in bounds; this rank is the ring's only consumer.
            let c = unsafe { Ring::consumer(base, cap) }.map_err(|e| corrupt(peer, e))?;
            let sp = self.peers[peer].as_mut().unwrap();
            sp.rx = Some(c);
            if self.duplex && peer < self.me {
                // SAFETY: the box in the control block of the low end's ring, validated in bounds above.
                sp.dx = Some(unsafe { DuplexEnd::new(Ring::duplex_area(base), false) });
            }
            if !self.rx_list.contains(&peer) {
                self.rx_list.push(peer);
            }
            self.undiscovered.swap_remove(i);
        }
        Ok(())
    }

    /// Before sleeping: announce it, issue the heavy side of the barrier, and return the doorbell value to
    /// wait on. The caller must then check for incoming packets ([`ShmTransport::has_incoming`]) before
    /// calling [`ShmTransport::sleep`].
    pub fn prepare_sleep(&self) -> u32 {
        let s = self.region.slot(self.me_local).expect("own slot");
        let d = s.doorbell.load(Ordering::Acquire);
        s.sleeping.store(SLEEP_FUTEX, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.wake == WakeMode::Membarrier && vmf_pal::membarrier::global_expedited().is_err() {
            // Cannot happen after a successful registration; the fence above still orders our side.
        }
        d
    }

    /// True if any incoming ring or duplex box has a record (or a new ring appeared).
    pub fn has_incoming(&self) -> bool {
        self.rx_list.iter().any(|&p| {
            let sp = self.peers[p].as_ref().unwrap();
            sp.rx.as_ref().is_some_and(|r| r.has_data())
                || sp.dx.as_ref().is_some_and(|d| d.has_data())
        }) || self.undiscovered.iter().any(|&p| {
            let l = self.peers[p].as_ref().unwrap().local;
            self.region
                .pair(l, self.me_local)
                .is_ok_and(|e| e.load(Ordering::Acquire) != 0)
        })
    }

    /// Sleep on the doorbell until a sender rings it or `timeout` passes; then clear `sleeping`.
    pub fn sleep(&self, doorbell: u32, timeout: Duration) {
        let s = self.region.slot(self.me_local).expect("own slot");
        vmf_pal::futex::wait(&s.doorbell, doorbell, Some(timeout));
        s.sleeping.store(0, Ordering::Relaxed);
    }

    /// Clear `sleeping` without sleeping.
    pub fn cancel_sleep(&self) {
        let s = self.region.slot(self.me_local).expect("own slot");
        s.sleeping.store(0, Ordering::Relaxed);
    }

    /// The next packet from `peer` only (a receiver waiting for one sender looks at one ring); `None`
    /// when there is none, or no ring from `peer` yet.
    #[inline]
    pub fn poll_peer(&mut self, peer: usize) -> Result<Option<Incoming<ShmToken>>, TransportError> {
        if !self.undiscovered.is_empty() {
            self.discover()?;
        }
        self.peek_ring(peer)
    }

    /// Look at the next packet from `peer` — the head record of its ring or the record in the pair's duplex
    /// box, whichever it sent first — and validate its header.
    #[inline]
    fn peek_ring(&mut self, peer: usize) -> Result<Option<Incoming<ShmToken>>, TransportError> {
        let Some(Some(sp)) = self.peers.get_mut(peer) else {
            return Ok(None);
        };
        // Ring first, box second: a sender that writes the box and then the ring has made the box visible
        // to whoever sees the ring record, so this order never takes a later ring record for the next one.
        let rec = match sp.rx.as_mut() {
            Some(rx) => rx.peek().map_err(|e| corrupt(peer, e))?,
            None => None,
        };
        let boxed = match sp.dx.as_ref() {
            Some(d) => d.peek().map_err(|e| corrupt(peer, e))?,
            None => None,
        };
        let (ptr, len, token) = match (boxed, rec) {
            (None, None) => return Ok(None),
            (None, Some(rec)) => (rec.ptr(), rec.len(), ShmToken::Ring(rec)),
            // The box record goes after every ring record before its position `b.pos`, before the others.
            (Some(b), rec) => match sp.rx.as_mut() {
                None if b.pos != 0 => return Ok(None), // its ring is not discovered yet
                None => (b.ptr, b.len, ShmToken::Box(b)),
                Some(rx) => {
                    // Ring records before `b.pos` were published before the box (acquired above): look
                    // again if the first look came too early.
                    let rec = match rec {
                        None if rx.tail() < b.pos => rx.peek().map_err(|e| corrupt(peer, e))?,
                        r => r,
                    };
                    // Padding does not order anything: the box is next when its position lies between the
                    // last record released and the ring's current position.
                    if rx.done() <= b.pos && b.pos <= rx.tail() {
                        (b.ptr, b.len, ShmToken::Box(b))
                    } else {
                        match rec {
                            Some(r) if rx.tail() < b.pos => (r.ptr(), r.len(), ShmToken::Ring(r)),
                            _ => return Err(box_misplaced(peer, b.pos, rx.tail())),
                        }
                    }
                }
            },
        };
        if len < HDR_SIZE {
            return Err(TransportError::Corrupt {
                peer,
                what: format!("packet of {len} bytes"),
            });
        }
        // SAFETY: record validated to hold at least HDR_SIZE bytes inside the ring or box.
        let hdr = unsafe { PktHeader::read_from(ptr) };
        if hdr.src as usize != peer || Kind::from_u8(hdr.kind).is_none() {
            return Err(TransportError::Corrupt {
                peer,
                what: format!("packet claims source {} and kind {}", hdr.src, hdr.kind),
            });
        }
        // SAFETY: payload lies inside the validated record.
        let payload = unsafe { ptr.add(HDR_SIZE) };
        Ok(Some(Incoming::new(
            peer,
            hdr,
            payload,
            len - HDR_SIZE,
            token,
        )))
    }

    /// The slot of co-resident `peer`, if it is one.
    pub fn peer_local(&self, peer: usize) -> Option<u32> {
        self.peers.get(peer)?.as_ref().map(|p| p.local)
    }

    /// The co-resident peers that share our kernel (ranks in the same VM or container host).
    pub fn same_kernel_peers(&self) -> impl Iterator<Item = usize> + '_ {
        self.peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.as_ref().is_some_and(|p| p.same_kernel))
            .map(|(r, _)| r)
    }

    /// How many co-resident peers of this kernel are asleep (or about to be) in the library right now: a
    /// snapshot of their slots, for counting the CPU's other users.
    pub fn peers_asleep(&self) -> usize {
        self.peers
            .iter()
            .flatten()
            .filter(|p| p.same_kernel)
            .filter(|p| {
                self.region
                    .slot(p.local)
                    .is_ok_and(|s| s.sleeping.load(Ordering::Relaxed) != 0)
            })
            .count()
    }

    /// Publish the one CPU this rank is pinned to (None: it may run on several).
    pub fn set_cpu(&self, cpu: Option<usize>) {
        if let Ok(s) = self.region.slot(self.me_local) {
            s.cpu
                .store(cpu.map_or(0, |c| c as u32 + 1), Ordering::Release);
        }
    }

    /// The one CPU co-resident `peer` published that it is pinned to (a hint: nothing depends on it for
    /// correctness, so a stale or bogus value only costs waiting time).
    pub fn peer_cpu(&self, peer: usize) -> Option<usize> {
        let p = self.peers.get(peer)?.as_ref()?;
        // CPU numbers of another kernel (a peer in another VM) say nothing about ours.
        if !p.same_kernel {
            return None;
        }
        let c = self.region.slot(p.local).ok()?.cpu.load(Ordering::Acquire);
        c.checked_sub(1).map(|c| c as usize)
    }

    /// Wake `peer` if it is asleep (after writing shared memory other than a ring that it may wait on).
    #[inline]
    pub fn wake_peer(&self, peer: usize) {
        if let Some(l) = self.peer_local(peer) {
            self.ring_doorbell(peer, l);
        }
    }

    /// Wake the threads of this rank that sleep on its doorbell (several threads share one rank under
    /// the MPI library's `MPI_THREAD_MULTIPLE`; one that delivers packets wakes the others).
    #[inline]
    pub fn wake_self(&self) {
        self.ring_doorbell(self.me, self.me_local);
    }

    #[inline]
    fn ring_doorbell(&self, peer: usize, local: u32) {
        match self.wake {
            WakeMode::Off => return,
            // Light side of the asymmetric barrier: only the compiler must not hoist the load.
            WakeMode::Membarrier => std::sync::atomic::compiler_fence(Ordering::SeqCst),
            WakeMode::Fence => fence(Ordering::SeqCst),
        }
        if self.vm_bell.is_some() && self.wake == WakeMode::Membarrier {
            // A sleeper in another VM: its membarrier does not reach this kernel's CPUs.
            fence(Ordering::SeqCst);
        }
        if let Ok(s) = self.region.slot(local) {
            match s.sleeping.load(Ordering::Relaxed) {
                0 => {}
                SLEEP_SOCKET => self.ring_socket(peer),
                SLEEP_BELL => self.ring_bell(s),
                _ => {
                    s.doorbell.fetch_add(1, Ordering::Release);
                    vmf_pal::futex::wake(&s.doorbell, 1);
                }
            }
        }
    }

    /// Ring a sleeper's doorbell vector through our VM's ivshmem device (a value from shared memory: only
    /// a well-formed one is used; a bad one at worst rings the wrong vector, which wakes nobody harmfully).
    #[cold]
    fn ring_bell(&self, s: &region::Slot) {
        let v = s.bell.load(Ordering::Acquire);
        if let (Some(b), true) = (&self.vm_bell, v & !0xffff_ffff & !BELL_RINGS == BELL_VALID) {
            b.regs.ring((v >> 16) as u16, v as u16);
        }
    }

    #[cold]
    fn ring_socket(&self, peer: usize) {
        use std::os::linux::net::SocketAddrExt;
        if let Some(sock) = &self.db_sock {
            if let Ok(a) = std::os::unix::net::SocketAddr::from_abstract_name(
                doorbell_name(self.job, peer).as_bytes(),
            ) {
                let _ = sock.send_to_addr(&[1], &a);
            }
        }
    }

    /// Test hook: a pointer to the control block of the ring `me → peer` (creating it if needed), so
    /// integration tests can corrupt a live ring. Not for applications.
    #[doc(hidden)]
    pub fn debug_tx_ring(&mut self, peer: usize) -> Result<*mut u8, TransportError> {
        if self.peers.get(peer).and_then(|p| p.as_ref()).is_none() {
            return Err(TransportError::Unreachable {
                peer,
                transport: "shm",
            });
        }
        if self.peers[peer].as_ref().unwrap().tx.is_none() {
            self.create_tx(peer)?;
        }
        Ok(self.peers[peer]
            .as_ref()
            .unwrap()
            .tx
            .as_ref()
            .unwrap()
            .ctl() as *const _ as *mut u8)
    }
}

impl Transport for ShmTransport {
    type Token = ShmToken;

    fn name(&self) -> &'static str {
        "shm"
    }

    fn reaches(&self, peer: usize) -> bool {
        self.peers.get(peer).is_some_and(|p| p.is_some())
    }

    fn max_payload(&self, _peer: usize) -> usize {
        (self.ring_size as usize) / 4 - HDR_SIZE - vmf_bb::ring::REC_HDR
    }

    #[inline]
    fn poll_from(
        &mut self,
        peer: usize,
        _place: &mut crate::Place<'_>,
    ) -> Result<Option<Incoming<ShmToken>>, TransportError> {
        self.poll_peer(peer)
    }

    #[inline]
    fn try_send(
        &mut self,
        peer: usize,
        hdr: &PktHeader,
        a: &[u8],
        b: &[u8],
    ) -> Result<bool, TransportError> {
        let Some(Some(p)) = self.peers.get_mut(peer) else {
            return Err(TransportError::Unreachable {
                peer,
                transport: "shm",
            });
        };
        if p.tx.is_none() {
            self.create_tx(peer)?;
        }
        let p = self.peers[peer].as_mut().unwrap();
        let body = HDR_SIZE + a.len() + b.len();
        if body <= DUPLEX_MAX_BODY {
            if let Some(dx) = p.dx.as_mut() {
                let pos = p.tx.as_ref().map_or(0, |t| t.head());
                if dx.try_write(pos, &[hdr.as_bytes(), a, b]) {
                    if self.wake != WakeMode::Off && (p.same_kernel || self.vm_bell.is_some()) {
                        let l = p.local;
                        self.ring_doorbell(peer, l);
                    }
                    return Ok(true);
                }
            }
        }
        let tx = p.tx.as_mut().unwrap();
        if body > tx.max_body() {
            return Err(TransportError::TooLarge {
                peer,
                len: a.len() + b.len(),
                max: tx.max_body() - HDR_SIZE,
            });
        }
        match tx.reserve(body).map_err(|e| corrupt(peer, e))? {
            None => Ok(false),
            Some(slot) => {
                // SAFETY: the slot holds `body` bytes.
                unsafe {
                    slot.write(0, hdr.as_bytes());
                    slot.write(HDR_SIZE, a);
                    slot.write(HDR_SIZE + a.len(), b);
                }
                tx.commit(slot);
                if self.wake != WakeMode::Off && (p.same_kernel || self.vm_bell.is_some()) {
                    let l = p.local;
                    self.ring_doorbell(peer, l);
                }
                Ok(true)
            }
        }
    }

    #[inline]
    fn poll(&mut self) -> Result<Option<Incoming<ShmToken>>, TransportError> {
        if !self.undiscovered.is_empty() {
            self.discover()?;
        }
        let n = self.rx_list.len();
        for k in 0..n {
            let idx = (self.cursor + k) % n;
            let peer = self.rx_list[idx];
            if let Some(inc) = self.peek_ring(peer)? {
                self.cursor = idx + 1;
                return Ok(Some(inc));
            }
        }
        Ok(None)
    }

    #[inline]
    fn release(&mut self, inc: Incoming<ShmToken>) {
        if let Some(Some(p)) = self.peers.get_mut(inc.peer) {
            match inc.token {
                ShmToken::Ring(rec) => {
                    if let Some(rx) = p.rx.as_mut() {
                        rx.release(rec);
                    } else if let Some(mut rx) = p.retiring.take() {
                        rx.release(rec);
                        self.peers[inc.peer] = None;
                    }
                }
                ShmToken::Box(rec) => {
                    if let Some(dx) = p.dx.as_mut() {
                        dx.release(rec);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::region::{RegionSizing, RegionSource};
    use super::*;

    fn pair_region(tag: &str) -> (std::path::PathBuf, Arc<Region>) {
        let d = std::env::temp_dir().join(format!("vmf-shm-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let sz = RegionSizing {
            max_local: 2,
            heap: 1 << 20,
            pool_per_slot: 0,
        };
        let r = Region::open(
            &RegionSource::Dir(d.clone()),
            tag,
            sz,
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        (d, Arc::new(r))
    }

    /// Both directions at once, through a small ring (so it fills and wraps) and the duplex box, with packet
    /// sizes on both sides of the box's limit: every packet arrives once, intact and in order.
    fn stress_both_directions(duplex: bool) {
        let (d, r) = pair_region(if duplex { "dx" } else { "nodx" });
        let (l0, l1) = (r.attach(0).unwrap(), r.attach(1).unwrap());
        const N: u64 = 60_000;
        let run = move |me: usize, mut t: ShmTransport| {
            let peer = 1 - me;
            let (mut next_tx, mut next_rx) = (0u64, 0u64);
            let mut boxed = 0u64;
            let size = |i: u64| -> usize {
                [0usize, 8, 24, 72, 73, 200, 1000][(i * 7 + i / 3) as usize % 7]
            };
            let buf: Vec<u8> = (0..1000u32).map(|x| x as u8).collect();
            while next_tx < N || next_rx < N {
                if next_tx < N {
                    let n = size(next_tx);
                    let h = PktHeader::new(Kind::Eager, me as u32, 0, 0, next_tx, n as u64);
                    let mut b = buf[..n].to_vec();
                    if n >= 8 {
                        b[..8].copy_from_slice(&next_tx.to_le_bytes());
                    }
                    if t.try_send(peer, &h, &[], &b).unwrap() {
                        next_tx += 1;
                    }
                }
                for _ in 0..3 {
                    let Some(inc) = t.poll().unwrap() else { break };
                    assert_eq!(inc.hdr.seq, next_rx, "rank {me}: out of order");
                    let n = size(next_rx);
                    let p = unsafe { inc.payload() };
                    assert_eq!(p.len(), n);
                    if n >= 8 {
                        assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), next_rx);
                        assert_eq!(&p[8..], &buf[8..n]);
                    }
                    if matches!(inc.token, ShmToken::Box(_)) {
                        boxed += 1;
                    }
                    t.release(inc);
                    next_rx += 1;
                }
            }
            boxed
        };
        let mut t0 = ShmTransport::new(r.clone(), 0, l0, 2, 4096);
        let mut t1 = ShmTransport::new(r.clone(), 1, l1, 2, 4096);
        t0.set_duplex(duplex);
        t1.set_duplex(duplex);
        t0.add_peer(1, l1).unwrap();
        t1.add_peer(0, l0).unwrap();
        let h = std::thread::spawn(move || run(1, t1));
        let b0 = run(0, t0);
        let b1 = h.join().unwrap();
        if duplex {
            assert!(b0 > 0 && b1 > 0, "the box carried nothing ({b0}, {b1})");
        } else {
            assert_eq!(b0 + b1, 0);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn both_directions_in_order_through_rings_and_duplex_box() {
        stress_both_directions(true);
    }

    #[test]
    fn both_directions_in_order_through_rings_alone() {
        stress_both_directions(false);
    }

    #[test]
    fn two_endpoints_in_one_process_exchange_works() {
        let (d, r) = pair_region("t");
        let (l0, l1) = (r.attach(0).unwrap(), r.attach(1).unwrap());
        let mut t0 = ShmTransport::new(r.clone(), 0, l0, 2, 65536);
        let mut t1 = ShmTransport::new(r.clone(), 1, l1, 2, 65536);
        t0.add_peer(1, l1).unwrap();
        t1.add_peer(0, l0).unwrap();
        assert!(t1.poll().unwrap().is_none());
        for i in 0..1000u64 {
            let h = PktHeader::new(Kind::Eager, 0, i as i32, 0, i, 8);
            while !t0.try_send(1, &h, &[], &i.to_le_bytes()).unwrap() {}
            let inc = loop {
                if let Some(x) = t1.poll().unwrap() {
                    break x;
                }
            };
            assert_eq!(inc.hdr.seq, i);
            assert_eq!(unsafe { inc.payload() }, &i.to_le_bytes());
            t1.release(inc);
        }
        // A header lying about its source is rejected.
        let h = PktHeader::new(Kind::Eager, 5, 0, 0, 0, 0);
        t0.try_send(1, &h, &[], &[]).unwrap();
        assert!(matches!(
            t1.poll(),
            Err(TransportError::Corrupt { peer: 0, .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
