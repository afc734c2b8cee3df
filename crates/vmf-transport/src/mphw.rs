//! The `mphw` transport: vmfabric's own packets over the emulated message-passing hardware of `vmf-mphw`
//! (003_*), so the platform measures message-passing software directly. Chosen with `VMF_TRANSPORT=mphw`:
//! every pair of ranks then talks through single-writer buffers, status words and doorbells, with the
//! same VLB options and performance values as the vnic.
//!
//! A packet is the engine's header and payload inside one hardware packet (at most the buffer size).
//! Sending never queues: a busy buffer (and, with VLB, no free evade node) answers "no resource" and the
//! engine retries. VLB delivers packets out of order; the receiver restores each origin's order by the
//! hardware packet numbers (out-of-order packets wait in a per-origin stash), because the engine's
//! matching relies on it.
//!
//! Options (environment, read by every rank; the hardware's by rank 0, which creates the region):
//! `VMF_MPHW_BUFFER` (bytes per buffer, default 16384), `VMF_MPHW_VLB=1`, `VMF_MPHW_VLB_TIME_TO_LIVE`,
//! `VMF_MPHW_VLB_RANDOMIZE=1`, `VMF_MPHW_VLB_MAX_EVADE_RATIO`, `VMF_MPHW_VLB_MAX_FOREIGNERS`,
//! `VMF_MPHW_VLB_REDUCE_INTERRUPTS=1`, `VMF_MPHW_VLB_NEXT_HOPS` (`a,b,c`), `VMF_MPHW_VLB_EVADE_FREE_SLOT=1`,
//! `VMF_MPHW_UNIDIRECTIONAL=1`, `VMF_MPHW_SLOTS` (buffers per link, 1), `VMF_MPHW_SIGNAL_COST_NS`, `VMF_MPHW_IRQ_COST_NS`, `VMF_MPHW_BYTE_COST_PS`, `VMF_MPHW_TOPOLOGY`
//! (`full`, `ring`, `mesh:W`), `VMF_MPHW_HOP_COST_NS`, `VMF_MPHW_BROKEN_LINKS` (`a-b,...`),
//! `VMF_MPHW_STATS` (a file: rank 0 writes every node's performance values there as JSON at the end; `-`:
//! a table on stderr).
use crate::proto::{PktHeader, HDR_SIZE};
use crate::{Incoming, Transport, TransportError};
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vmf_mphw::{Hw, HwConfig, Mode, Nic, NicOptions, Snapshot, Topology};

/// Most packets one origin may have waiting for an earlier one before the stream is declared corrupt.
const STASH_MAX: usize = 1 << 16;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn num<T: std::str::FromStr>(name: &str) -> Result<Option<T>, TransportError> {
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| TransportError::Setup(format!("{name}={v} is not a number"))),
    }
}

fn flag(name: &str) -> Result<bool, TransportError> {
    match env(name).as_deref() {
        None | Some("0" | "false" | "no" | "off") => Ok(false),
        Some("1" | "true" | "yes" | "on") => Ok(true),
        Some(v) => Err(TransportError::Setup(format!("{name}={v} is not 0 or 1"))),
    }
}

/// The hardware configuration for `nodes` ranks from the environment.
pub fn hw_config_from_env(nodes: usize) -> Result<HwConfig, TransportError> {
    let buffer = num::<usize>("VMF_MPHW_BUFFER")?.unwrap_or(16 << 10);
    if buffer < 256 {
        return Err(TransportError::Setup(format!("VMF_MPHW_BUFFER={buffer} is below 256 bytes")));
    }
    let mut c = HwConfig::new(nodes, buffer);
    if flag("VMF_MPHW_UNIDIRECTIONAL")? {
        c.mode = Mode::Unidirectional;
    }
    c.signal_cost_ns = num("VMF_MPHW_SIGNAL_COST_NS")?.unwrap_or(0);
    c.byte_cost_ps = num("VMF_MPHW_BYTE_COST_PS")?.unwrap_or(0);
    c.irq_cost_ns = num("VMF_MPHW_IRQ_COST_NS")?.unwrap_or(0);
    c.slots = num("VMF_MPHW_SLOTS")?.unwrap_or(1) as usize;
    if !(1..=vmf_mphw::hw::MAX_SLOTS as u64).contains(&(c.slots as u64)) || !c.slots.is_power_of_two() {
        return Err(TransportError::Setup(format!(
            "VMF_MPHW_SLOTS={} is not a power of two in 1..={}",
            c.slots,
            vmf_mphw::hw::MAX_SLOTS
        )));
    }
    c.hop_cost_ns = num("VMF_MPHW_HOP_COST_NS")?.unwrap_or(0);
    if let Some(t) = env("VMF_MPHW_TOPOLOGY") {
        c.topology = Topology::parse(&t).map_err(|e| TransportError::Setup(format!("VMF_MPHW_TOPOLOGY: {e}")))?;
    }
    if let Some(b) = env("VMF_MPHW_BROKEN_LINKS") {
        c.broken = vmf_mphw::hw::parse_links(&b)
            .map_err(|e| TransportError::Setup(format!("VMF_MPHW_BROKEN_LINKS: {e}")))?;
    }
    Ok(c)
}

/// The engine options from the environment, for buffers of `buffer` bytes.
pub fn nic_options_from_env(buffer: usize) -> Result<NicOptions, TransportError> {
    let mut o = NicOptions {
        mtu: buffer - vmf_mphw::HEADER,
        // The engine keeps its own packets pending; only forwarded packets queue here, and none may be lost.
        queue_size: usize::MAX,
        max_tx_retries: u64::MAX,
        ..Default::default()
    };
    o.vlb = flag("VMF_MPHW_VLB")?;
    if let Some(v) = num("VMF_MPHW_VLB_TIME_TO_LIVE")? {
        o.vlb_time_to_live = v;
    }
    o.vlb_randomize = flag("VMF_MPHW_VLB_RANDOMIZE")?;
    if let Some(v) = num("VMF_MPHW_VLB_MAX_EVADE_RATIO")? {
        o.vlb_max_evade_ratio = v;
    }
    if let Some(v) = num::<u64>("VMF_MPHW_VLB_MAX_FOREIGNERS")? {
        o.vlb_max_foreigners = v.max(1);
    }
    o.vlb_reduce_interrupts = flag("VMF_MPHW_VLB_REDUCE_INTERRUPTS")?;
    o.vlb_evade_free_slot = flag("VMF_MPHW_VLB_EVADE_FREE_SLOT")?;
    if let Some(h) = env("VMF_MPHW_VLB_NEXT_HOPS") {
        o.vlb_next_hops = h
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|_| TransportError::Setup(format!("VMF_MPHW_VLB_NEXT_HOPS={h} is not a list of ranks")))?;
    }
    if let Some(v) = num::<u64>("VMF_MPHW_EXTRA_SIGNAL_EVERY")? {
        o.extra_signal_every = v.max(1);
    }
    Ok(o)
}

/// How a rank waiting on the emulated hardware may sleep ([`MphwTransport::sleep_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepKind {
    /// Every node runs under this kernel: a futex on the doorbell word.
    Futex,
    /// Nodes in other VMs (or in one VM's PCI BAR), and every one rings this rank's doorbell vector.
    Doorbell,
    /// A node in another VM cannot wake this rank: sleep in short, bounded steps.
    Poll,
}

/// The mphw transport of one rank.
pub struct MphwTransport {
    inner: Arc<Mutex<Inner>>,
    hw: Arc<Hw>,
    me: usize,
    max: usize,
    /// With VLB, the forwarding agent: a thread that passes on packets other nodes evaded through this one
    /// while the rank computes or waits outside the engine (the hardware forwards on its own; a rank in a
    /// PMI fence would not).
    agent: Option<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>,
}

/// The state the rank's thread and its forwarding agent share.
struct Inner {
    nic: Nic,
    /// In-order packets ready for the engine: (origin, header and payload).
    ready: VecDeque<(usize, Vec<u8>)>,
    /// Per origin, packets that arrived ahead of an earlier one.
    stash: Vec<BTreeMap<u32, Vec<u8>>>,
    /// Per origin, the next packet number to deliver.
    expect: Vec<u32>,
    free: Vec<Vec<u8>>,
    corrupt: Option<TransportError>,
}

impl MphwTransport {
    /// The hardware configuration for a job of `nodes` ranks (the environment's), if the hardware can
    /// have that many nodes.
    fn config_for(nodes: usize) -> Result<HwConfig, TransportError> {
        if nodes > vmf_mphw::hw::MAX_NODES {
            return Err(TransportError::Setup(format!(
                "the mphw transport emulates at most {} nodes; this job has {nodes} ranks",
                vmf_mphw::hw::MAX_NODES
            )));
        }
        hw_config_from_env(nodes)
    }

    /// Create the region for `nodes` ranks at `path` (rank 0, before the others attach).
    pub fn create(path: &Path, nodes: usize) -> Result<(), TransportError> {
        let cfg = Self::config_for(nodes)?;
        // The file is sparse and fills as buffers are used: a tmpfs smaller than it would kill a rank
        // with SIGBUS mid-run.
        let need = vmf_mphw::hw::region_size(nodes, cfg.buffer_size, cfg.slots);
        if let Some(avail) = path.parent().and_then(vmf_pal::fs_available) {
            if need > avail {
                return Err(TransportError::Setup(format!(
                    "the emulated hardware for {nodes} ranks with {}-byte buffers needs {need} bytes in {}, which has {avail} free (lower VMF_MPHW_BUFFER)",
                    cfg.buffer_size,
                    path.parent().unwrap().display()
                )));
            }
        }
        Hw::create(path, &cfg)
            .map(|_| ())
            .map_err(|e| TransportError::Setup(e.to_string()))
    }

    /// Bytes (whole pages) the hardware for `nodes` ranks takes inside another region, as configured by
    /// the environment (every rank computes the same).
    pub fn window_size(nodes: usize) -> Result<u64, TransportError> {
        let cfg = Self::config_for(nodes)?;
        Ok(vmf_mphw::hw::region_size(nodes, cfg.buffer_size, cfg.slots).div_ceil(4096) * 4096)
    }

    /// Create the hardware for `nodes` ranks in `len` bytes at `offset` of the region at `path` (an
    /// ivshmem BAR that VMs share; rank 0, before the others attach).
    pub fn create_window(path: &Path, offset: u64, len: u64, nodes: usize) -> Result<(), TransportError> {
        let cfg = Self::config_for(nodes)?;
        Hw::create_window(path, offset, len, &cfg)
            .map(|_| ())
            .map_err(|e| TransportError::Setup(e.to_string()))
    }

    /// Attach rank `me` to the hardware in the window `offset`, `len` of the region at `path`.
    pub fn attach_window(path: &Path, offset: u64, len: u64, me: usize) -> Result<MphwTransport, TransportError> {
        let hw = Hw::open_window(path, offset, len).map_err(|e| TransportError::Setup(e.to_string()))?;
        Self::attach_hw(hw, me)
    }

    /// Attach rank `me` to the region at `path`.
    pub fn attach(path: &Path, me: usize) -> Result<MphwTransport, TransportError> {
        let hw = Hw::open(path).map_err(|e| TransportError::Setup(e.to_string()))?;
        Self::attach_hw(hw, me)
    }

    fn attach_hw(hw: Arc<Hw>, me: usize) -> Result<MphwTransport, TransportError> {
        let setup = |e: vmf_mphw::HwError| TransportError::Setup(e.to_string());
        let mut opts = nic_options_from_env(hw.buffer_size())?;
        opts.forward_bell = opts.vlb;
        let vlb = opts.vlb;
        let nic = Nic::new(hw.port(me).map_err(setup)?, opts).map_err(TransportError::Setup)?;
        let n = hw.nodes();
        let inner = Arc::new(Mutex::new(Inner {
            nic,
            ready: VecDeque::new(),
            stash: (0..n).map(|_| BTreeMap::new()).collect(),
            expect: vec![0; n],
            free: Vec::new(),
            corrupt: None,
        }));
        let agent = if vlb {
            let stop = Arc::new(AtomicBool::new(false));
            let (inner, hw, stop2) = (inner.clone(), hw.clone(), stop.clone());
            let h = std::thread::Builder::new()
                .name(format!("vmf-mphw-fwd-{me}"))
                .spawn(move || forward_agent(&inner, &hw, me, &stop2))
                .map_err(|e| TransportError::Setup(format!("cannot start the forwarding agent: {e}")))?;
            Some((h, stop))
        } else {
            None
        };
        Ok(MphwTransport {
            max: hw.buffer_size() - vmf_mphw::HEADER - HDR_SIZE,
            inner,
            hw,
            me,
            agent,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current doorbell value (read before [`MphwTransport::has_incoming`], then pass to `wait`).
    pub fn bell(&self) -> u32 {
        self.hw.doorbell(self.me)
    }

    /// Whether a packet waits (delivered in order, or in a buffer), or forwarded traffic is queued.
    pub fn has_incoming(&self) -> bool {
        let i = self.lock();
        !i.ready.is_empty()
            // Forwarded packets wait for a buffer elsewhere: keep polling (the agent does too, with VLB).
            || i.nic.queued() > 0
            || i.corrupt.is_some()
            || (0..self.hw.nodes()).any(|s| s != self.me && !i.nic.is_dead(s) && !self.hw.peer_buffer_free(self.me, s))
    }

    /// In a VM whose ivshmem device has a doorbell: ring nodes in other VMs through it, and sleep on this
    /// rank's vector (`own`) when they are to wake it (see [`vmf_mphw::Hw::enable_vm_bell`]).
    pub fn enable_vm_bell(&self, regs: Arc<vmf_pal::pci::IvshmemRegs>, own: Option<(u16, std::os::fd::RawFd)>) {
        self.hw.enable_vm_bell(self.me, regs, own);
    }

    /// How a wait for a peer may sleep: every node under this kernel (a futex wakes us), nodes that all
    /// ring our doorbell vector (in other VMs, or any in a PCI BAR, where futexes fail), or some node
    /// that cannot wake us (poll in short steps).
    pub fn sleep_kind(&self) -> SleepKind {
        if self.hw.futex_ok() && !self.hw.has_remote_nodes() {
            SleepKind::Futex
        } else if self.hw.remote_nodes_ring() && self.hw.vm_bell_fd().is_some() {
            SleepKind::Doorbell
        } else {
            SleepKind::Poll
        }
    }

    /// Sleep on the doorbell until it moves past `seen` or `timeout` passes; a wake-up counts as an
    /// interrupt for VLB_AveragePacketsPerIRQ.
    pub fn wait(&mut self, seen: u32, timeout: Duration) {
        if self.hw.wait_doorbell(self.me, seen, timeout) {
            self.lock().nic.irq();
        }
    }

    /// A peer whose process died without detaching (pid), if any. Only peers under this kernel: a pid
    /// in another VM says nothing here (the launcher's agents report ranks that die there).
    pub fn find_dead_peer(&self) -> Option<(usize, i32)> {
        (0..self.hw.nodes()).filter(|&p| p != self.me && self.hw.same_kernel(p)).find_map(|p| {
            let pid = self.hw.owner_pid(p) as i32;
            let dead = pid > 0 && !(vmf_pal::process::ProcessId { pid, start_time: 0 }).is_alive();
            dead.then_some((p, pid))
        })
    }

    /// Every node's performance values as JSON (`{"nodes": [{"node": 0, "rx_packets": .., ..}, ..]}`).
    pub fn stats_json(&self) -> String {
        let nodes: Vec<String> = (0..self.hw.nodes())
            .map(|i| {
                let s = Snapshot::read(&self.hw, i);
                let kv: Vec<String> = s.values.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
                format!("{{\"node\": {i}, {}}}", kv.join(", "))
            })
            .collect();
        format!("{{\"nodes\": [{}]}}\n", nodes.join(",\n  "))
    }

    /// Every node's performance values as a table.
    pub fn stats_table(&self) -> String {
        let snaps: Vec<Snapshot> = (0..self.hw.nodes()).map(|i| Snapshot::read(&self.hw, i)).collect();
        let mut out = format!("{:<26}", "mphw performance value");
        for s in &snaps {
            out.push_str(&format!("{:>12}", format!("rank{}", s.node)));
        }
        out.push('\n');
        for (k, (name, _)) in snaps[0].values.iter().enumerate() {
            out.push_str(&format!("{name:<26}"));
            for s in &snaps {
                let v = s.values[k].1;
                out.push_str(&if v.fract() == 0.0 { format!("{v:>12}") } else { format!("{v:>12.2}") });
            }
            out.push('\n');
        }
        out
    }

}

impl Inner {
    /// Take what the hardware holds into the in-order queue (and pass on what we hold for others).
    fn fill(&mut self) {
        self.nic.poll_tx();
        let Inner {
            nic,
            ready,
            stash,
            expect,
            free,
            corrupt,
            ..
        } = self;
        nic.receive(&mut |origin, seq, bytes| {
            let mut v = free.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(bytes);
            if seq == expect[origin] {
                ready.push_back((origin, v));
                expect[origin] = expect[origin].wrapping_add(1);
                while let Some(v) = stash[origin].remove(&expect[origin]) {
                    ready.push_back((origin, v));
                    expect[origin] = expect[origin].wrapping_add(1);
                }
            } else if seq.wrapping_sub(expect[origin]) < (1 << 31) && stash[origin].len() < STASH_MAX {
                stash[origin].insert(seq, v);
            } else if corrupt.is_none() {
                *corrupt = Some(TransportError::Corrupt {
                    peer: origin,
                    what: format!("packet number {seq} while expecting {}", expect[origin]),
                });
            }
            true
        });
        // A corrupt link or packet loses a packet of the stream: fatal here (the vnic only counts it).
        if let Some((peer, what)) = nic.take_error() {
            if corrupt.is_none() {
                *corrupt = Some(TransportError::Corrupt { peer, what });
            }
        }
    }
}

/// The forwarding agent's loop: sleep on the forwarding doorbell (rung by nodes that evade packets
/// through us), then take what the buffers hold; while forwarded packets wait for their next buffer,
/// look again every 50 µs.
fn forward_agent(inner: &Mutex<Inner>, hw: &Hw, me: usize, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let seen = hw.forward_bell(me);
        let queued = {
            let mut i = inner.lock().unwrap_or_else(|e| e.into_inner());
            i.fill();
            i.nic.queued()
        };
        if queued > 0 {
            std::thread::sleep(Duration::from_micros(50));
        } else if !hw.futex_ok() {
            // In a PCI BAR futexes fail, and the one doorbell vector the guest lends this rank is its
            // main thread's (which forwards too, when it is in the engine): look every millisecond.
            std::thread::sleep(Duration::from_millis(1));
        } else if hw.has_remote_nodes() {
            // Nodes in other VMs cannot reach this futex: look every millisecond.
            hw.wait_forward(me, seen, Duration::from_millis(1));
        } else {
            hw.wait_forward(me, seen, Duration::from_millis(20));
        }
    }
}

impl Drop for MphwTransport {
    fn drop(&mut self) {
        if let Some((h, stop)) = self.agent.take() {
            stop.store(true, Ordering::Release);
            self.hw.ring_forward(self.me);
            let _ = h.join();
        }
    }
}

impl MphwTransport {
    /// VMF_MPHW_STATS: rank 0 reports every node's performance values (the module printed them on
    /// unload). Called when the job ends, after the ranks' last synchronisation.
    pub fn report(&self) {
        if self.me != 0 {
            return;
        }
        match env("VMF_MPHW_STATS").as_deref() {
            None => {}
            Some("-") => eprint!("{}", self.stats_table()),
            Some(f) => {
                if let Err(e) = std::fs::write(f, self.stats_json()) {
                    eprintln!("vmfabric: cannot write VMF_MPHW_STATS={f}: {e}");
                }
            }
        }
    }
}

impl Transport for MphwTransport {
    type Token = Vec<u8>;

    fn name(&self) -> &'static str {
        "mphw"
    }

    fn reaches(&self, peer: usize) -> bool {
        peer < self.hw.nodes() && peer != self.me
    }

    fn max_payload(&self, _peer: usize) -> usize {
        self.max
    }

    fn try_send(&mut self, peer: usize, hdr: &PktHeader, a: &[u8], b: &[u8]) -> Result<bool, TransportError> {
        let len = a.len() + b.len();
        if len > self.max {
            return Err(TransportError::TooLarge { peer, len, max: self.max });
        }
        let mut i = self.lock();
        match i.nic.send_now(peer, &[hdr.as_bytes(), a, b]) {
            Ok(true) => Ok(true),
            Ok(false) => {
                // No resource: forward what we hold for others meanwhile (it may be what blocks us).
                i.nic.poll_tx();
                Ok(false)
            }
            Err(why) => Err(TransportError::ConnectionLost { peer, why }),
        }
    }

    fn poll(&mut self) -> Result<Option<Incoming<Vec<u8>>>, TransportError> {
        let mut i = self.lock();
        if let Some(e) = &i.corrupt {
            return Err(e.clone());
        }
        if i.ready.is_empty() {
            i.fill();
        }
        let Some((origin, v)) = i.ready.pop_front() else {
            return Ok(None);
        };
        drop(i);
        if v.len() < HDR_SIZE {
            return Err(TransportError::Corrupt {
                peer: origin,
                what: format!("a {}-byte packet has no header", v.len()),
            });
        }
        // SAFETY: at least HDR_SIZE bytes (checked).
        let hdr = unsafe { PktHeader::read_from(v.as_ptr()) };
        if hdr.src as usize != origin {
            return Err(TransportError::Corrupt {
                peer: origin,
                what: format!("a packet from rank {origin} claims to come from rank {}", hdr.src),
            });
        }
        // SAFETY: the payload lies inside the vector, which the token keeps until release.
        let payload = unsafe { v.as_ptr().add(HDR_SIZE) };
        let len = v.len() - HDR_SIZE;
        Ok(Some(Incoming::new(origin, hdr, payload, len, v)))
    }

    fn release(&mut self, inc: Incoming<Vec<u8>>) {
        let mut i = self.lock();
        if i.free.len() < 256 {
            i.free.push(inc.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Kind;

    #[test]
    fn an_undecodable_packet_is_an_error_not_a_hang() {
        let path = std::env::temp_dir().join(format!("vmf-mphw-transport-corrupt-{}", std::process::id()));
        Hw::create(&path, &HwConfig::new(2, 1024)).unwrap();
        let mut t = MphwTransport::attach(&path, 1).unwrap();
        // Node 0 puts 8 zero bytes in its buffer at node 1: a packet without a valid hardware header, which
        // loses a packet of node 0's stream.
        let hw = Hw::open(&path).unwrap();
        let mut raw = hw.port(0).unwrap();
        assert!(raw.try_send(1, &[&[0u8; 8]]).unwrap());
        let e = loop {
            match t.poll() {
                Err(e) => break e,
                Ok(Some(_)) => panic!("garbage delivered"),
                Ok(None) => {}
            }
        };
        assert!(matches!(e, TransportError::Corrupt { peer: 0, .. }), "{e}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn in_order_delivery_through_vlb_between_threads() {
        let path = std::env::temp_dir().join(format!("vmf-mphw-transport-{}", std::process::id()));
        std::env::set_var("VMF_MPHW_BUFFER", "1024");
        std::env::set_var("VMF_MPHW_VLB", "1");
        MphwTransport::create(&path, 4).unwrap();
        const N: u64 = 20_000;
        // Ranks 0..2 send numbered packets to rank 3 with VLB; rank 3 must see each origin's in order.
        let hs: Vec<_> = (0..4usize)
            .map(|me| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut t = MphwTransport::attach(&path, me).unwrap();
                    assert!(t.agent.is_some());
                    let mut next = [0u64; 4];
                    let mut sent = 0u64;
                    let deadline = std::time::Instant::now() + Duration::from_secs(60);
                    loop {
                        assert!(std::time::Instant::now() < deadline, "rank {me} stuck");
                        if me != 3 && sent < N {
                            let h = PktHeader::new(Kind::Eager, me as u32, 5, 0, sent, 8);
                            let body = sent.to_le_bytes();
                            if t.try_send(3, &h, &body, &[0u8; 100][..(sent % 100) as usize]).unwrap() {
                                sent += 1;
                            }
                        }
                        while let Some(inc) = t.poll().unwrap() {
                            assert_eq!(me, 3);
                            let o = inc.peer;
                            assert_eq!(inc.hdr.seq, next[o], "origin {o} in order");
                            // SAFETY: until release.
                            let p = unsafe { inc.payload() };
                            assert_eq!(u64::from_le_bytes(p[..8].try_into().unwrap()), next[o]);
                            assert_eq!(p.len(), 8 + (next[o] % 100) as usize);
                            next[o] += 1;
                            t.release(inc);
                        }
                        if me == 3 && next[..3].iter().all(|&x| x == N) {
                            return t.stats_json();
                        }
                        if me != 3 && sent == N && t.lock().nic.queued() == 0 && t.hw.owner_pid(3) == 0 {
                            return String::new();
                        }
                        if me != 3 && sent == N {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in hs.into_iter().rev() {
            out.push(h.join().unwrap());
        }
        std::fs::remove_file(&path).unwrap();
        let node3 = out[0].split("{\"node\": 3").nth(1).unwrap();
        assert!(node3.contains("\"rx_packets\": 60000"), "{}", out[0]);
        let indirect: f64 = node3.split("\"VLB_RX_Indirect\": ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        eprintln!("indirect packets at rank 3: {indirect}");
        assert!(indirect > 0.0, "VLB took no detour, so order restoration went untested: {node3}");
    }
}
