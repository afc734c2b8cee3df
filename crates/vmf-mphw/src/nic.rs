//! The packet engine of 003_*'s `sm_nic` / `sm_nic_vlb` (§4.10), over the emulated hardware: a TxFIFO per
//! target with retries, drops and extra signals, Valiant load-balanced routing through evade nodes, and
//! the performance values. The vnic (IP over the hardware) and the `mphw` transport both drive one [`Nic`]
//! per node.
//!
//! Every packet in a buffer starts with a 16-byte header: magic, origin, destination, time to live, hops,
//! payload length. A packet whose direct buffer is busy may, with VLB, be sent to an evade node with the
//! time to live it may still spend; the evade node decrements it on receipt and sends the packet on —
//! directly once it reaches zero, otherwise by the same rules as its own traffic.
use crate::counters::{Counters, Slot};
use crate::hw::{HwError, Link, Port, BROKEN};
use std::time::{Duration, Instant};
use std::collections::VecDeque;

/// Bytes of the header in front of every packet.
pub const HEADER: usize = 16;
const MAGIC: u16 = 0x4e56;
/// Evade hops after which a packet is no longer evaded (a bound on routes around broken links).
const MAX_HOPS: u8 = 16;
/// Fruitless TxFIFO rounds count against max_tx_retries at most once per this interval, so the budget
/// is time (max_tx_retries x 10 µs at least), not the caller's polling rate.
const RETRY_INTERVAL: Duration = Duration::from_micros(10);

/// 003_*'s module options (§4.10.2, §4.10.4) and the chapter-6 extensions.
#[derive(Debug, Clone)]
pub struct NicOptions {
    /// Largest payload accepted for sending.
    pub mtu: usize,
    /// Packets a TxFIFO holds per target (003_*'s queue_size); more are dropped and counted.
    pub queue_size: usize,
    /// Rounds without progress (counted at most every 10 µs) before all queued packets are dropped.
    pub max_tx_retries: u64,
    /// Every this many fruitless rounds, signal the targets of queued packets again.
    pub extra_signal_every: u64,
    /// Valiant load balancing on (sm_nic_vlb).
    pub vlb: bool,
    /// Evade hops a packet may make.
    pub vlb_time_to_live: u8,
    /// Scan evade nodes in a random order instead of linearly.
    pub vlb_randomize: bool,
    /// Indirect packets per target between two direct ones.
    pub vlb_max_evade_ratio: u64,
    /// Foreign packets accepted from each node before it is told to stop.
    pub vlb_max_foreigners: u64,
    /// Do not signal a target for packets forwarded to it.
    pub vlb_reduce_interrupts: bool,
    /// Nodes this node may evade to (empty: all).
    pub vlb_next_hops: Vec<usize>,
    /// Log routing decisions to stderr.
    pub vlb_debug: bool,
    /// Log packets from this origin.
    pub log_source: Option<usize>,
    /// Log packets to this destination.
    pub log_target: Option<usize>,
    /// §6.2.3: prefer evade nodes whose own buffer at the destination is free.
    pub vlb_evade_free_slot: bool,
    /// Also ring an evade node's forwarding doorbell (for nodes whose owner may not poll while
    /// packets wait to be passed on: the mphw transport's forwarding agent sleeps on it).
    pub forward_bell: bool,
}

impl Default for NicOptions {
    fn default() -> Self {
        NicOptions {
            mtu: 1500,
            queue_size: 1024,
            max_tx_retries: 10_000,
            extra_signal_every: 64,
            vlb: false,
            vlb_time_to_live: 1,
            vlb_randomize: false,
            vlb_max_evade_ratio: 4,
            vlb_max_foreigners: 16,
            vlb_reduce_interrupts: false,
            vlb_next_hops: Vec::new(),
            vlb_debug: false,
            log_source: None,
            log_target: None,
            vlb_evade_free_slot: false,
            forward_bell: false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Header {
    origin: usize,
    dest: usize,
    ttl: u8,
    hops: u8,
    len: usize,
    /// Per (origin, destination) packet number: receivers that need the origin's order restore it.
    seq: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&(self.origin as u16).to_le_bytes());
        b[4..6].copy_from_slice(&(self.dest as u16).to_le_bytes());
        b[6] = self.ttl;
        b[7] = self.hops;
        b[8..12].copy_from_slice(&(self.len as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    fn decode(b: &[u8], nodes: usize) -> Option<Header> {
        if b.len() < HEADER || u16::from_le_bytes([b[0], b[1]]) != MAGIC {
            return None;
        }
        let h = Header {
            origin: u16::from_le_bytes([b[2], b[3]]) as usize,
            dest: u16::from_le_bytes([b[4], b[5]]) as usize,
            ttl: b[6],
            hops: b[7],
            len: u32::from_le_bytes(b[8..12].try_into().ok()?) as usize,
            seq: u32::from_le_bytes(b[12..16].try_into().ok()?),
        };
        (h.origin < nodes && h.dest < nodes && h.len == b.len() - HEADER).then_some(h)
    }
}

struct Queued {
    hdr: Header,
    payload: Vec<u8>,
    /// The node a foreign packet came from (its foreigner count drops when the packet leaves).
    from: Option<usize>,
}

/// What happened to a packet handed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Into the destination's buffer.
    Direct,
    /// Into an evade node's buffer.
    Indirect(usize),
    /// Into the TxFIFO for later.
    Queued,
    /// Dropped (TxFIFO full) and counted.
    Dropped,
}

/// One node's engine. Single owner: callers serialise access (the vnic holds it in a mutex).
pub struct Nic {
    port: Port,
    opts: NicOptions,
    n: usize,
    me: usize,
    txq: Vec<VecDeque<Queued>>,
    tx_seq: Vec<u32>,
    queued: usize,
    retries: u64,
    next_extra_signal: u64,
    /// Indirect packets sent per destination since its last direct one.
    evaded: Vec<u64>,
    /// Indirect packets sent per destination since the last signal to it (vlb_reduce_interrupts).
    unsignalled: Vec<bool>,
    /// Foreign packets held per source node, and whether that source has been told to stop.
    foreigners: Vec<u64>,
    stopped: Vec<bool>,
    foreign_total: u64,
    evade_order: Vec<usize>,
    dead: Vec<bool>,
    rng: u64,
    in_irq: bool,
    ctr: Counters,
    last_retry: Instant,
    /// The first link or packet error (peer, what): the vnic counts and goes on, a transport that needs
    /// every packet turns it into an error ([`Nic::take_error`]).
    error: Option<(usize, String)>,
    /// Sources whose packet [`Nic::take_local`] handed out and [`Nic::finish_local`] has not released.
    rx_held: Vec<bool>,
    /// [`Nic::receive`]'s list of packets to deliver, kept between calls.
    scratch: Vec<Local>,
}

/// A packet for this node handed out by [`Nic::take_local`]: it stays in the source's buffer (which the
/// source does not write until released) until [`Nic::finish_local`], which takes it (so it cannot be
/// read after).
#[derive(Debug)]
pub struct Local {
    /// The node whose buffer holds it.
    pub source: usize,
    /// The node that sent it.
    pub origin: usize,
    /// Its number among the origin's packets to this node.
    pub seq: u32,
    ptr: *const u8,
    len: usize,
}

// SAFETY: a pointer into the shared region, valid while the engine (which owns the mapping) lives and
// until the packet is released; only read.
unsafe impl Send for Local {}

impl Local {
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        // SAFETY: see `Local`: the packet stays put until finish_local.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Nic {
    /// An engine for `port` (the node's attachment) with `opts`.
    pub fn new(port: Port, opts: NicOptions) -> Result<Nic, String> {
        let n = port.hw().nodes();
        let me = port.me();
        if opts.mtu + HEADER > port.hw().buffer_size() {
            return Err(format!(
                "an mtu of {} needs buffers of {} bytes; the region's hold {}",
                opts.mtu,
                opts.mtu + HEADER,
                port.hw().buffer_size()
            ));
        }
        if let Some(&h) = opts.vlb_next_hops.iter().find(|&&h| h >= n) {
            return Err(format!("vlb_next_hops names node {h}, outside 0..{n}"));
        }
        let evade_order: Vec<usize> = if opts.vlb_next_hops.is_empty() {
            (0..n).filter(|&x| x != me).collect()
        } else {
            opts.vlb_next_hops.iter().copied().filter(|&x| x != me).collect()
        };
        let mut seed = [0u8; 8];
        let _ = getrandom::fill(&mut seed);
        let nic = Nic {
            n,
            me,
            txq: (0..n).map(|_| VecDeque::new()).collect(),
            tx_seq: vec![0; n],
            queued: 0,
            retries: opts.max_tx_retries,
            next_extra_signal: opts.extra_signal_every.max(1),
            evaded: vec![0; n],
            unsignalled: vec![false; n],
            foreigners: vec![0; n],
            stopped: vec![false; n],
            foreign_total: 0,
            evade_order,
            dead: vec![false; n],
            rng: u64::from_le_bytes(seed) | 1,
            in_irq: false,
            ctr: Counters::new(port.hw(), me),
            last_retry: Instant::now(),
            error: None,
            rx_held: vec![false; n],
            scratch: Vec::with_capacity(n),
            opts,
            port,
        };
        let c = nic.counters();
        c.reset();
        c.set(Slot::Up, 1);
        Ok(nic)
    }

    /// This node.
    pub fn me(&self) -> usize {
        self.me
    }

    /// Nodes on the hardware.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// The options.
    pub fn options(&self) -> &NicOptions {
        &self.opts
    }

    /// The hardware attachment (for its doorbell).
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// The first corrupt link or packet seen since the last call: (the peer, what was wrong).
    pub fn take_error(&mut self) -> Option<(usize, String)> {
        self.error.take()
    }

    /// Whether the link from or to `peer` was found corrupt and is no longer used.
    pub fn is_dead(&self, peer: usize) -> bool {
        self.dead.get(peer).copied().unwrap_or(true)
    }

    fn note_error(&mut self, peer: usize, what: String) {
        eprintln!("smn{}: {what}", self.me);
        if self.error.is_none() {
            self.error = Some((peer, what));
        }
    }

    /// Packets waiting in the TxFIFOs.
    pub fn queued(&self) -> usize {
        self.queued
    }

    fn counters(&self) -> Counters {
        self.ctr
    }

    fn log(&self, what: &str, h: &Header) {
        let wanted = self.opts.log_source == Some(h.origin) || self.opts.log_target == Some(h.dest);
        if wanted {
            eprintln!(
                "smn{}: {what} packet {}->{} len {} ttl {} hops {}",
                self.me, h.origin, h.dest, h.len, h.ttl, h.hops
            );
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*: routing randomness only.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Send `payload` from this node to `dest` (never blocks: queues or drops when it cannot send now).
    pub fn send(&mut self, dest: usize, payload: &[u8]) -> Sent {
        let c = self.counters();
        if dest >= self.n || dest == self.me || payload.len() > self.opts.mtu {
            c.add(Slot::TxErrors, 1);
            return Sent::Dropped;
        }
        let hdr = self.own_header(dest, payload.len());
        self.log("send", &hdr);
        let r = self.route(hdr, &[payload], None);
        if r != Sent::Dropped {
            self.tx_seq[dest] = self.tx_seq[dest].wrapping_add(1);
            self.count_sent(payload.len(), matches!(r, Sent::Direct | Sent::Indirect(_)));
        }
        r
    }

    fn own_header(&self, dest: usize, len: usize) -> Header {
        Header {
            origin: self.me,
            dest,
            ttl: if self.opts.vlb { self.opts.vlb_time_to_live } else { 0 },
            hops: 0,
            len,
            seq: self.tx_seq[dest],
        }
    }

    /// With VLB, whether some allowed evade node has working links from us and to `dest`.
    fn can_route_around(&self, dest: usize) -> bool {
        let hw = self.port.hw();
        self.opts.vlb
            && self.evade_order.iter().any(|&e| {
                e != dest && !self.dead[e] && hw.link_cost(self.me, e) != BROKEN && hw.link_cost(e, dest) != BROKEN
            })
    }

    fn count_sent(&self, len: usize, immediate: bool) {
        let c = self.counters();
        c.add(Slot::TxPackets, 1);
        c.add(Slot::TxBytes, len as u64);
        c.packet_size(len as u64);
        if immediate {
            c.add(Slot::ImmediatePacketsTx, 1);
        }
    }

    /// Send the concatenation of `parts` (at most 3) to `dest` now — directly or, with VLB, through an
    /// evade node — or not at all: `Ok(false)` leaves nothing queued (a transport's "no resource; retry").
    /// `Err` names a packet this engine can never send (too large, no such node, link unusable).
    pub fn send_now(&mut self, dest: usize, parts: &[&[u8]]) -> Result<bool, String> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if dest >= self.n || dest == self.me {
            return Err(format!("node {dest} is not a peer of node {} among {}", self.me, self.n));
        }
        if len > self.opts.mtu || parts.len() > 3 {
            return Err(format!("a {len}-byte packet exceeds the mtu of {}", self.opts.mtu));
        }
        let hdr = self.own_header(dest, len);
        let sent = match self.try_direct(&hdr, parts, false) {
            Ok(true) => true,
            Ok(false) => self.try_evade(&hdr, parts).is_some(),
            Err(()) => return Err(format!("the link from node {} to node {dest} is unusable", self.me)),
        };
        if !sent && self.port.hw().link_cost(self.me, dest) == BROKEN && !self.can_route_around(dest) {
            return Err(format!(
                "the link from node {} to node {dest} is broken and {}",
                self.me,
                if self.opts.vlb { "no evade node has a working link to it" } else { "VLB is off" }
            ));
        }
        if sent {
            self.tx_seq[dest] = self.tx_seq[dest].wrapping_add(1);
            self.count_sent(len, true);
        }
        Ok(sent)
    }

    /// Room for a packet to `dest` written in place (no copy through the caller's memory), by a caller
    /// that may let go of the engine meanwhile: with its TxFIFO empty and its buffer free, a pointer to
    /// `mtu` writable bytes. Until [`Nic::commit`] or [`Nic::let_go`] the room is ours: nobody reads an
    /// uncommitted buffer, and every other send to `dest` (forwarded packets, the TxFIFO) finds it busy.
    pub fn hold(&mut self, dest: usize) -> Option<*mut u8> {
        if dest >= self.n || dest == self.me || !self.txq[dest].is_empty() || self.dead[dest] {
            return None;
        }
        match self.port.hold(dest) {
            // SAFETY: the data area holds buffer_size >= mtu + HEADER bytes (checked in Nic::new).
            Ok(Some(p)) => Some(unsafe { p.add(HEADER) }),
            _ => None,
        }
    }

    /// Give up a [`Nic::hold`] without sending.
    pub fn let_go(&mut self, dest: usize) {
        self.port.let_go(dest);
    }

    /// Send the `len` bytes written at [`Nic::hold`]'s room for `dest`.
    pub fn commit(&mut self, dest: usize, len: usize) -> Sent {
        if len > self.opts.mtu {
            self.port.let_go(dest);
            self.counters().add(Slot::TxErrors, 1);
            return Sent::Dropped;
        }
        let hdr = self.own_header(dest, len);
        self.log("send", &hdr);
        // The header goes in front of the payload already in place.
        let room = match self.port.held(dest) {
            Some(p) => Ok(Some(p)),
            None => self.port.reserve(dest),
        };
        match room {
            Ok(Some(p)) => {
                // SAFETY: our own free buffer's first HEADER bytes.
                unsafe { std::ptr::copy_nonoverlapping(hdr.encode().as_ptr(), p, HEADER) };
            }
            _ => {
                self.counters().add(Slot::TxErrors, 1);
                return Sent::Dropped;
            }
        }
        if self.port.commit(dest, HEADER + len).is_err() {
            self.counters().add(Slot::TxErrors, 1);
            return Sent::Dropped;
        }
        self.tx_seq[dest] = self.tx_seq[dest].wrapping_add(1);
        self.evaded[dest] = 0;
        self.unsignalled[dest] = false;
        self.port.signal(dest);
        let c = self.counters();
        c.add(Slot::SignalsSent, 1);
        c.add(Slot::VlbTxDirect, 1);
        self.count_sent(len, true);
        Sent::Direct
    }

    /// Send `payload` to every other node (Ethernet broadcast; sm_nic could not).
    pub fn broadcast(&mut self, payload: &[u8]) {
        for d in 0..self.n {
            if d != self.me {
                self.send(d, payload);
            }
        }
    }

    /// Try `hdr` now (directly, or through an evade node), else queue it.
    fn route(&mut self, hdr: Header, payload: &[&[u8]], from: Option<usize>) -> Sent {
        let dest = hdr.dest;
        // FIFO order per destination without VLB: nothing overtakes a queued packet.
        if self.txq[dest].is_empty() || self.opts.vlb {
            match self.try_direct(&hdr, payload, from.is_some()) {
                Ok(true) => return Sent::Direct,
                Ok(false) => {}
                Err(()) => return Sent::Dropped,
            }
            if let Some(e) = self.try_evade(&hdr, payload) {
                return Sent::Indirect(e);
            }
        }
        self.enqueue(hdr, payload, from)
    }

    fn enqueue(&mut self, hdr: Header, payload: &[&[u8]], from: Option<usize>) -> Sent {
        let c = self.counters();
        if self.txq[hdr.dest].len() >= self.opts.queue_size {
            c.add(Slot::TxDropped, 1);
            self.log("drop (TxFIFO full)", &hdr);
            return Sent::Dropped;
        }
        self.txq[hdr.dest].push_back(Queued {
            hdr,
            payload: payload.concat(),
            from,
        });
        self.queued += 1;
        c.max(Slot::QueuedPacketsMaximum, self.queued as u64);
        c.max(Slot::AllocatedPacketsMax, self.queued as u64 + 1);
        if let Some(f) = from {
            self.foreigners[f] += 1;
            self.foreign_total += 1;
            c.max(Slot::VlbMaxSeenForeigners, self.foreign_total);
            c.set(Slot::ForeignersHeld, self.foreign_total);
        }
        Sent::Queued
    }

    /// Ok(true) sent, Ok(false) busy or broken, Err(()) a hardware error (counted).
    fn try_direct(&mut self, hdr: &Header, payload: &[&[u8]], foreign: bool) -> Result<bool, ()> {
        let dest = hdr.dest;
        if self.dead[dest] {
            self.counters().add(Slot::TxErrors, 1);
            return Err(());
        }
        let h = hdr.encode();
        let r = self.port.try_send(dest, &with_header(&h, payload));
        let c = self.ctr;
        // Every status word read in other nodes' memory so far (direct tries, evade scans, reservations).
        c.set(Slot::RemoteStatusReads, self.port.remote_reads());
        match r {
            Ok(true) => {
                if !foreign {
                    c.add(Slot::VlbTxDirect, 1);
                }
                self.evaded[dest] = 0;
                // Forwarded packets to their target carry no signal with vlb_reduce_interrupts; the
                // origin's next direct packet (or its kick when its queues empty) wakes the target.
                if !(foreign && self.opts.vlb_reduce_interrupts) {
                    self.unsignalled[dest] = false;
                    self.port.signal(dest);
                    c.add(Slot::SignalsSent, 1);
                }
                if self.opts.vlb_debug {
                    eprintln!("smn{}: direct {}->{} (hops {})", self.me, hdr.origin, dest, hdr.hops);
                }
                Ok(true)
            }
            Ok(false) => {
                c.add(Slot::DirectBusy, 1);
                Ok(false)
            }
            Err(HwError::Broken { .. }) => {
                c.add(Slot::BrokenLinkHits, 1);
                Ok(false)
            }
            Err(e) => {
                self.note_error(dest, format!("link to node {dest} is unusable: {e}"));
                self.dead[dest] = true;
                c.add(Slot::TxErrors, 1);
                Err(())
            }
        }
    }

    /// With VLB and time to live left, send through a free evade node.
    fn try_evade(&mut self, hdr: &Header, payload: &[&[u8]]) -> Option<usize> {
        let dest = hdr.dest;
        // Over a broken link every packet must evade, whatever its time to live (the hop limit bounds
        // it), and the ratio (which a direct packet resets) cannot apply.
        let broken = self.port.hw().link_cost(self.me, dest) == BROKEN;
        if !self.opts.vlb || (hdr.ttl == 0 && !broken) || hdr.hops >= MAX_HOPS {
            return None;
        }
        let own = hdr.origin == self.me;
        let c = self.ctr;
        if !broken && self.evaded[dest] >= self.opts.vlb_max_evade_ratio {
            if own {
                c.add(Slot::VlbTxLimitedBySender, 1);
            }
            return None;
        }
        let mut order = std::mem::take(&mut self.evade_order);
        if self.opts.vlb_randomize {
            for i in (1..order.len()).rev() {
                let j = (self.random() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        let mut forbidden = false;
        let mut chosen = None;
        // §6.2.3: first the evade nodes whose own buffer at the destination is free, then the rest.
        let passes = if self.opts.vlb_evade_free_slot { 2 } else { 1 };
        'outer: for pass in 0..passes {
            for &e in &order {
                // An evade node must be there (attached) and able to pass the packet on.
                let hw = self.port.hw();
                if e == dest || e == hdr.origin || self.dead[e] || hw.link_cost(e, dest) == BROKEN || hw.owner_pid(e) == 0 {
                    continue;
                }
                if passes == 2 && (pass == 0) != self.port.hw().peer_buffer_free(dest, e) {
                    continue;
                }
                match self.port.link(e) {
                    Ok(Link::Free { foreign_ok: true }) => {}
                    Ok(Link::Free { foreign_ok: false }) => {
                        forbidden = true;
                        continue;
                    }
                    _ => continue,
                }
                let mut h = *hdr;
                h.hops = h.hops.saturating_add(1);
                let he = h.encode();
                if let Ok(true) = self.port.try_send(e, &with_header(&he, payload)) {
                    chosen = Some(e);
                    break 'outer;
                }
            }
        }
        self.evade_order = order;
        match chosen {
            Some(e) => {
                self.port.signal(e);
                if self.opts.forward_bell {
                    self.port.hw().ring_forward(e);
                }
                c.add(Slot::SignalsSent, 1);
                self.evaded[dest] += 1;
                self.unsignalled[dest] = true;
                if own {
                    c.add(Slot::VlbTxIndirect, 1);
                }
                if self.opts.vlb_debug {
                    eprintln!("smn{}: evade {}->{} via {e}", self.me, hdr.origin, dest);
                }
                Some(e)
            }
            None => {
                if forbidden && own {
                    c.add(Slot::VlbTxLimitedByReceiver, 1);
                }
                None
            }
        }
    }

    /// Work the TxFIFOs once: send what the buffers take. Counts a fruitless round against the retry
    /// budget (extra signals, then drops, as 003_* §4.10.2 describes). Returns packets sent.
    pub fn poll_tx(&mut self) -> usize {
        if self.queued == 0 {
            self.kick_unsignalled();
            return 0;
        }
        let mut sent = 0;
        for d in 0..self.n {
            while let Some(q) = self.txq[d].pop_front() {
                let foreign = q.from.is_some();
                let ok = match self.try_direct(&q.hdr, &[&q.payload], foreign) {
                    Ok(true) => Some(true),
                    Ok(false) => self.try_evade(&q.hdr, &[&q.payload]).map(|_| true),
                    // Link unusable: the packet is lost (counted, not progress).
                    Err(()) => Some(false),
                };
                let Some(delivered) = ok else {
                    self.txq[d].push_front(q);
                    break;
                };
                self.queued -= 1;
                if delivered {
                    sent += 1;
                } else {
                    self.counters().add(Slot::TxDropped, 1);
                }
                if let Some(f) = q.from {
                    self.foreign_left(f);
                    if delivered {
                        self.counters().add(Slot::Forwarded, 1);
                    }
                }
            }
        }
        let c = self.counters();
        if sent > 0 {
            c.max(Slot::MaximumTxRetries, self.opts.max_tx_retries - self.retries);
            self.retries = self.opts.max_tx_retries;
        } else if self.queued > 0 && self.last_retry.elapsed() >= RETRY_INTERVAL {
            self.last_retry = Instant::now();
            self.retries = self.retries.saturating_sub(1);
            self.next_extra_signal = self.next_extra_signal.saturating_sub(1);
            if self.next_extra_signal == 0 {
                self.next_extra_signal = self.opts.extra_signal_every.max(1);
                for d in 0..self.n {
                    if !self.txq[d].is_empty() {
                        self.port.signal(d);
                        c.add(Slot::ExtraSignalsSent, 1);
                        c.add(Slot::SignalsSent, 1);
                    }
                }
            }
            if self.retries == 0 {
                c.max(Slot::MaximumTxRetries, self.opts.max_tx_retries);
                for d in 0..self.n {
                    while let Some(q) = self.txq[d].pop_front() {
                        c.add(Slot::TxDropped, 1);
                        if let Some(f) = q.from {
                            self.foreign_left(f);
                        }
                    }
                }
                self.queued = 0;
                self.retries = self.opts.max_tx_retries;
            }
        }
        if self.queued == 0 {
            self.kick_unsignalled();
        }
        sent
    }

    /// With the TxFIFOs empty, signal each target that got indirect packets since its last signal.
    fn kick_unsignalled(&mut self) {
        for d in 0..self.n {
            if self.unsignalled[d] {
                self.unsignalled[d] = false;
                self.port.signal(d);
                self.counters().add(Slot::SignalsSent, 1);
            }
        }
    }

    fn foreign_left(&mut self, f: usize) {
        self.foreigners[f] -= 1;
        self.foreign_total -= 1;
        self.counters().set(Slot::ForeignersHeld, self.foreign_total);
        if self.stopped[f] && self.foreigners[f] < self.opts.vlb_max_foreigners {
            self.stopped[f] = false;
            self.port.allow_foreign(f, true);
        }
    }

    /// Mark the start of servicing a signal (an "interrupt"): packets taken until the next call count
    /// towards VLB_AveragePacketsPerIRQ.
    pub fn irq(&mut self) {
        self.in_irq = true;
        self.counters().add(Slot::Irqs, 1);
        self.port.hw().pay_irq();
    }

    /// Take every packet waiting in this node's buffers: packets for this node go to `deliver(origin,
    /// seq, payload)` (false = dropped by the stack, counted; `seq` numbers the origin's packets to this
    /// node, which VLB may deliver out of order), foreign ones are routed on. Returns packets taken.
    pub fn receive(&mut self, deliver: &mut dyn FnMut(usize, u32, &[u8]) -> bool) -> usize {
        // A scratch list kept between calls: no allocation per poll.
        let mut local = std::mem::take(&mut self.scratch);
        let taken = self.take(&mut local);
        for l in local.drain(..) {
            let ok = deliver(l.origin, l.seq, l.payload());
            self.finish_local(l, ok);
        }
        self.scratch = local;
        taken
    }

    /// Like [`Nic::receive`], but the packets for this node are handed out in `out` instead of delivered:
    /// the caller delivers them without holding the engine (the vnic writes them to its TAP meanwhile,
    /// while its transmit thread uses the engine), then calls [`Nic::finish_local`] for each. Foreign
    /// packets are routed on here. Returns packets taken.
    pub fn take_local(&mut self, out: &mut Vec<Local>) -> usize {
        self.take(out)
    }

    /// The end of a packet [`Nic::take_local`] handed out: release its buffer; `delivered` false counts it
    /// dropped by the stack.
    pub fn finish_local(&mut self, l: Local, delivered: bool) {
        if !delivered {
            self.ctr.add(Slot::RxDropped, 1);
        }
        self.rx_held[l.source] = false;
        self.port.release(l.source, self.stopped[l.source]);
    }

    fn take(&mut self, out: &mut Vec<Local>) -> usize {
        let mut taken = 0;
        for s in 0..self.n {
            if s == self.me || self.dead[s] || self.rx_held[s] {
                continue;
            }
            let pkt = match self.port.peek(s) {
                Ok(Some(p)) => (p.as_ptr(), p.len()),
                Ok(None) => continue,
                Err(e) => {
                    self.note_error(s, format!("link from node {s} is unusable: {e}"));
                    self.dead[s] = true;
                    self.counters().add(Slot::RxErrors, 1);
                    continue;
                }
            };
            // SAFETY: the packet lies in our own buffer from `s`, which stays ours (the sender does not
            // write it) until the release below; the mapping outlives this call.
            let bytes = unsafe { std::slice::from_raw_parts(pkt.0, pkt.1) };
            taken += 1;
            let c = self.ctr;
            if self.in_irq {
                c.add(Slot::IrqPackets, 1);
            }
            let Some(mut h) = Header::decode(bytes, self.n) else {
                c.add(Slot::RxErrors, 1);
                self.note_error(s, format!("a {}-byte packet from node {s} has no valid header", bytes.len()));
                self.port.release(s, self.stopped[s]);
                continue;
            };
            let payload = &bytes[HEADER..];
            if h.dest == self.me {
                self.log("receive", &h);
                c.add(Slot::RxPackets, 1);
                c.add(Slot::RxBytes, h.len as u64);
                c.max(Slot::VlbLongestRoute, h.hops as u64);
                c.add(if h.hops == 0 { Slot::VlbRxDirect } else { Slot::VlbRxIndirect }, 1);
                // Released by finish_local, once delivered.
                self.rx_held[s] = true;
                out.push(Local { source: s, origin: h.origin, seq: h.seq, ptr: payload.as_ptr(), len: payload.len() });
                continue;
            } else if !self.opts.vlb || h.origin == self.me {
                // Not for us and we do not forward: a misrouted packet.
                c.add(Slot::RxErrors, 1);
                self.note_error(s, format!("a packet {}->{} reached node {} over node {s}, which does not forward (VLB off here?)", h.origin, h.dest, self.me));
            } else {
                h.ttl = h.ttl.saturating_sub(1);
                self.log("forward", &h);
                match self.route(h, &[payload], Some(s)) {
                    Sent::Direct | Sent::Indirect(_) => c.add(Slot::Forwarded, 1),
                    Sent::Queued => {
                        if self.foreigners[s] >= self.opts.vlb_max_foreigners {
                            self.stopped[s] = true;
                        }
                    }
                    Sent::Dropped => {}
                }
            }
            self.port.release(s, self.stopped[s]);
        }
        if taken == 0 {
            self.in_irq = false;
        }
        taken
    }
}

/// The header then up to three parts, as one gather list (on the stack: no allocation per packet).
fn with_header<'a>(h: &'a [u8; HEADER], parts: &[&'a [u8]]) -> [&'a [u8]; 4] {
    let mut v: [&[u8]; 4] = [&h[..], &[], &[], &[]];
    for (d, p) in v[1..].iter_mut().zip(parts) {
        *d = p;
    }
    v
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.counters().set(Slot::Up, 0);
    }
}
