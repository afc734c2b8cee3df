//! The emulated hardware: a region shared by N nodes holding, for every ordered pair (target, source), one
//! receive buffer written only by its source, with a status word, plus one doorbell per node. A link may
//! have K such buffers (`slots`, 1 as in 003_*): packet q of a link goes to slot q mod K, so a sender can
//! fill the next slot while the target still holds the last packets, and a target woken once takes them
//! all (K = 1 is the stop-and-wait hardware of 003_*, where every packet waits for its target).
//!
//! ```text
//! 0       header (magic, version, nodes, buffer size, mode, signal and byte costs, slots)
//! 4096    node blocks, 512 bytes each: doorbell, sleepers, owner pid, forwarding doorbell, owner's
//!         kernel, its ivshmem doorbell address, performance counters
//! 36864   link table: N*N words, the emulated cost of a transfer target<-source in ns (u64::MAX = broken)
//! 69632   buffers: ((target*N + source)*K + slot) * stride; each a 64-byte header (status, ack) and data
//! ```
//!
//! **Status word** (`RxBuffer` T/S, 003_* §4.10.1): bits 0-7 flags (`FULL`, `NO_FOREIGN`), bits 8-31 a
//! sequence number (one more per packet on the link), bits 32-63 the packet length.
//! - *Bidirectional* (003_*'s sm_nic): the source sets `FULL` with length and sequence, the target clears
//!   `FULL` when it has copied the packet out. The source reads the status word in the target's memory.
//! - *Unidirectional* (003_* §4.11 strategy 2 and §6.2.4): the source alone writes the status word (a new
//!   sequence number means a new packet); the target acknowledges by writing the sequence number it has
//!   consumed into the `ack` word of the reverse buffer S/T, which lives in the source's memory. No word is
//!   written by two nodes and the source never reads the target's memory to find a free buffer.
//!
//! **Signals.** A node that sleeps announces it in its block; a sender that fills a buffer moves the
//! target's doorbell word on and, if it sleeps, wakes it: with a futex when both run under one kernel,
//! and through the ivshmem doorbell (a store to the sender's BAR 0, an MSI-X interrupt in the target's
//! VM, an eventfd the target sleeps on) when the region is an ivshmem BAR shared by VMs
//! ([`Hw::enable_vm_bell`]).
//!
//! Everything read from the region is validated: a length above the buffer size, a sequence number that
//! is not the next one, unknown flag bits or an acknowledgement of a packet never sent are
//! [`HwError::Corrupt`], never an out-of-bounds access.
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use vmf_bb::segment::{Segment, SegmentError};

/// Node block word: the kernel the node's owner runs under ([`vmf_pal::process::kernel_id`]).
const NB_KERNEL: u64 = 24;
/// Node block word: how to ring the node from another VM, `BELL_VALID | IVPosition << 16 | vector`.
const NB_VM_BELL: u64 = 32;
const BELL_VALID: u64 = 1 << 32;

/// Most nodes a region holds.
pub const MAX_NODES: usize = 64;
/// Largest buffer a region may declare (64 MiB).
pub const MAX_BUFFER: usize = 64 << 20;
const MAGIC: u64 = u64::from_le_bytes(*b"VMFMPHW1");
const VERSION: u64 = 2;
/// Most buffers per link.
pub const MAX_SLOTS: usize = 16;
const NODE_BLOCKS: u64 = 4096;
const NODE_BLOCK: u64 = 512;
/// Offset of the counters inside a node block; [`COUNTER_SLOTS`] u64 words.
const COUNTERS_AT: u64 = 64;
/// Counter words per node.
pub const COUNTER_SLOTS: usize = 56;
const LINKS: u64 = NODE_BLOCKS + NODE_BLOCK * MAX_NODES as u64;
const BUFFERS: u64 = LINKS + (MAX_NODES * MAX_NODES * 8) as u64;
const BUF_HDR: u64 = 64;
/// Largest emulated cost of one event, ns (costs are capped here when a region is made or read).
pub const MAX_COST_NS: u64 = 1_000_000_000;
/// A link whose cost word holds this is broken.
pub const BROKEN: u64 = u64::MAX;

const FULL: u64 = 1;
const NO_FOREIGN: u64 = 2;
const FLAGS: u64 = 0xff;
const SEQ_MASK: u32 = 0xff_ffff;

// header words
const H_MAGIC: u64 = 0;
const H_VERSION: u64 = 8;
const H_NODES: u64 = 16;
const H_BUF: u64 = 24;
const H_MODE: u64 = 32;
const H_SIGNAL_NS: u64 = 40;
const H_BYTE_PS: u64 = 48;
const H_READY: u64 = 56;
const H_IRQ_NS: u64 = 64;
const H_SLOTS: u64 = 72;

/// Errors of the emulated hardware.
#[derive(Debug, Error)]
pub enum HwError {
    /// The region could not be created, opened or addressed.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The region's header is not an mphw region of a version we read, or its geometry is impossible.
    #[error("Unable to use {path} as emulated message-passing hardware since {why}")]
    BadRegion {
        /// The region's path.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A word in shared memory holds a value the protocol cannot produce.
    #[error("Unable to {op} on link {source_node}->{target} since its {what} is corrupt (read {value:#x})")]
    Corrupt {
        /// What was being done.
        op: &'static str,
        /// Sending node.
        source_node: usize,
        /// Receiving node.
        target: usize,
        /// Which word.
        what: &'static str,
        /// The bad value.
        value: u64,
    },
    /// The link is declared broken: the packet must be routed around it.
    #[error("Unable to send from node {source_node} to node {target} since the link is broken")]
    Broken {
        /// Sending node.
        source_node: usize,
        /// Receiving node.
        target: usize,
    },
    /// A node index outside the region, or the caller's own index as a peer.
    #[error("Unable to use node {node} since the region has nodes 0..{nodes}")]
    NoSuchNode {
        /// The index given.
        node: usize,
        /// Nodes in the region.
        nodes: usize,
    },
    /// The packet does not fit the buffer.
    #[error("Unable to send a {len}-byte packet since buffers hold {cap} bytes")]
    TooLarge {
        /// Packet length.
        len: usize,
        /// Buffer size.
        cap: usize,
    },
    /// Another live process drives this node.
    #[error("Unable to attach node {node} since process {pid} drives it")]
    NodeBusy {
        /// The node.
        node: usize,
        /// The process holding it.
        pid: u64,
    },
}

/// How buffers are acknowledged (003_* §4.10.1 versus §4.11/§6.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The target clears the status word in its own memory; the source reads it there.
    Bidirectional,
    /// The target acknowledges into the source's memory; every word has one writer.
    Unidirectional,
}

/// Emulated non-uniform costs (003_* §6.2.1): a per-hop penalty on a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// Every node one hop from every other.
    Full,
    /// A ring: hops = shorter way round.
    Ring,
    /// A 2-D mesh `width` nodes wide: hops = Manhattan distance.
    Mesh {
        /// Nodes per row.
        width: usize,
    },
}

impl Topology {
    /// Parse `full`, `ring` or `mesh:W`.
    pub fn parse(s: &str) -> Result<Topology, String> {
        match s {
            "full" => Ok(Topology::Full),
            "ring" => Ok(Topology::Ring),
            _ => match s.strip_prefix("mesh:").map(str::parse::<usize>) {
                Some(Ok(w)) if w > 0 => Ok(Topology::Mesh { width: w }),
                _ => Err(format!("topology '{s}' is not full, ring or mesh:WIDTH")),
            },
        }
    }

    /// Hops between `a` and `b` among `n` nodes.
    pub fn hops(&self, a: usize, b: usize, n: usize) -> u64 {
        if a == b {
            return 0;
        }
        match *self {
            Topology::Full => 1,
            Topology::Ring => {
                let d = a.abs_diff(b);
                d.min(n - d) as u64
            }
            Topology::Mesh { width } => {
                let (ax, ay) = (a % width, a / width);
                let (bx, by) = (b % width, b / width);
                (ax.abs_diff(bx) + ay.abs_diff(by)) as u64
            }
        }
    }
}

/// Geometry and emulated costs of a new region.
#[derive(Debug, Clone)]
pub struct HwConfig {
    /// Nodes (2..=64).
    pub nodes: usize,
    /// Data bytes per receive buffer.
    pub buffer_size: usize,
    /// Acknowledgement scheme.
    pub mode: Mode,
    /// Cost of raising a signal, ns (the sender spins this long before ringing).
    pub signal_cost_ns: u64,
    /// Cost per byte moved, picoseconds (the sender spins `len * ps / 1000` ns per transfer).
    pub byte_cost_ps: u64,
    /// Cost of servicing a signal (an interrupt), ns: the receiving node spins this long each time it
    /// wakes for its doorbell — what makes many packets per interrupt pay (003_* §2.6, §4.10.3).
    pub irq_cost_ns: u64,
    /// Topology for the per-hop penalty.
    pub topology: Topology,
    /// Penalty per hop, ns (0: uniform, 003_*'s behaviour).
    pub hop_cost_ns: u64,
    /// Links declared broken (both directions of each pair).
    pub broken: Vec<(usize, usize)>,
    /// Buffers per link (a power of two, 1..=[`MAX_SLOTS`]; 1 is 003_*'s hardware).
    pub slots: usize,
}

impl HwConfig {
    /// `nodes` nodes with `buffer_size`-byte buffers, bidirectional, no emulated costs, no broken links.
    pub fn new(nodes: usize, buffer_size: usize) -> HwConfig {
        HwConfig {
            nodes,
            buffer_size,
            mode: Mode::Bidirectional,
            signal_cost_ns: 0,
            byte_cost_ps: 0,
            irq_cost_ns: 0,
            topology: Topology::Full,
            hop_cost_ns: 0,
            broken: Vec::new(),
            slots: 1,
        }
    }
}

/// Parse a broken-link list `a-b,c-d`.
pub fn parse_links(s: &str) -> Result<Vec<(usize, usize)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (a, b) = p
                .trim()
                .split_once('-')
                .ok_or_else(|| format!("link '{p}' is not A-B"))?;
            let a = a.parse().map_err(|_| format!("link '{p}': '{a}' is not a node"))?;
            let b = b.parse().map_err(|_| format!("link '{p}': '{b}' is not a node"))?;
            if a == b {
                return Err(format!("link '{p}' joins a node to itself"));
            }
            Ok((a, b))
        })
        .collect()
}

/// A mapped region of emulated message-passing hardware.
pub struct Hw {
    seg: Segment,
    n: usize,
    buf: usize,
    stride: u64,
    slots: usize,
    mode: Mode,
    signal_ns: u64,
    byte_ps: u64,
    irq_ns: u64,
    /// Set once in a VM whose ivshmem device has a doorbell ([`Hw::enable_vm_bell`]).
    vm: std::sync::OnceLock<VmBell>,
    /// Futexes work on the region's words (not in a PCI BAR, where every futex call fails).
    futex_ok: bool,
}

/// A node's use of its VM's ivshmem doorbell: the registers through which it rings nodes in other
/// VMs, and the eventfd its own vector signals (None: it cannot be rung, and sleeps in bounded steps).
struct VmBell {
    regs: Arc<vmf_pal::pci::IvshmemRegs>,
    own: Option<std::os::fd::RawFd>,
}

fn stride_for(buf: usize) -> u64 {
    BUF_HDR + (buf as u64).div_ceil(64) * 64
}

/// Bytes a region of `nodes` nodes with `buf`-byte buffers, `slots` per link, needs.
pub fn region_size(nodes: usize, buf: usize, slots: usize) -> u64 {
    BUFFERS + (nodes * nodes * slots) as u64 * stride_for(buf)
}

fn slots_ok(k: usize) -> bool {
    (1..=MAX_SLOTS).contains(&k) && k.is_power_of_two()
}

/// The sequence number slot `j` of a fresh link holds: that of the packet before the link's first one
/// in that slot (packet q goes to slot q mod K and finds q - K there; the first packet is 1). Status
/// words store sequence numbers relative to it, so a fresh (zeroed, sparse) region needs no writes.
fn initial_seq(j: usize, k: usize) -> u32 {
    let j = if j == 0 { k } else { j };
    (j as u32).wrapping_sub(k as u32) & SEQ_MASK
}

/// Of sequence numbers lying within a window of [`MAX_SLOTS`] (one per slot), the newest: the one from
/// which every other is at most a window behind, counting modulo 2^24.
fn newest(v: &[u32]) -> u32 {
    let behind = |a: u32, b: u32| b.wrapping_sub(a) & SEQ_MASK;
    v.iter().copied().find(|&c| v.iter().all(|&o| behind(o, c) < 1 << 23)).unwrap_or(0)
}

impl Hw {
    /// Create (or re-initialise) the region at `path`.
    pub fn create(path: &Path, cfg: &HwConfig) -> Result<Arc<Hw>, HwError> {
        Self::check_config(path, cfg)?;
        let _ = std::fs::remove_file(path);
        let size = region_size(cfg.nodes, cfg.buffer_size, cfg.slots);
        let (seg, _) = Segment::open_or_create(path, size)?;
        Self::initialise(seg, path, cfg)
    }

    fn check_config(path: &Path, cfg: &HwConfig) -> Result<(), HwError> {
        let bad = |why: String| HwError::BadRegion {
            path: path.display().to_string(),
            why,
        };
        if !(2..=MAX_NODES).contains(&cfg.nodes) {
            return Err(bad(format!("{} nodes is outside 2..={MAX_NODES}", cfg.nodes)));
        }
        if cfg.buffer_size == 0 || cfg.buffer_size > MAX_BUFFER {
            return Err(bad(format!(
                "a buffer of {} bytes is outside 1..={MAX_BUFFER}",
                cfg.buffer_size
            )));
        }
        if !slots_ok(cfg.slots) {
            return Err(bad(format!("{} buffers per link is not a power of two in 1..={MAX_SLOTS}", cfg.slots)));
        }
        for &(a, b) in &cfg.broken {
            if a >= cfg.nodes || b >= cfg.nodes {
                return Err(bad(format!("broken link {a}-{b} names a node outside 0..{}", cfg.nodes)));
            }
        }
        if let Topology::Mesh { width } = cfg.topology {
            if width > cfg.nodes {
                return Err(bad(format!("a mesh {width} wide is wider than {} nodes", cfg.nodes)));
            }
        }
        Ok(())
    }

    /// Create the hardware in `len` bytes at `offset` (page-aligned) of an existing file or device, such
    /// as a window of the region in an ivshmem BAR that VMs share. The window is zeroed first (a device
    /// holds whatever its last user left).
    pub fn create_window(path: &Path, offset: u64, len: u64, cfg: &HwConfig) -> Result<Arc<Hw>, HwError> {
        Self::check_config(path, cfg)?;
        let need = region_size(cfg.nodes, cfg.buffer_size, cfg.slots);
        if len < need {
            return Err(HwError::BadRegion {
                path: path.display().to_string(),
                why: format!("its window of {len} bytes is short of the {need} the hardware needs"),
            });
        }
        let seg = Segment::open_window(path, offset, len)?;
        // SAFETY: our own fresh mapping of `len` bytes; nobody attaches before the header is written.
        unsafe { std::ptr::write_bytes(seg.ptr(0, len)?, 0, len as usize) };
        Self::initialise(seg, path, cfg)
    }

    /// Map the hardware another node created in a window (see [`Hw::create_window`]), validating it.
    pub fn open_window(path: &Path, offset: u64, len: u64) -> Result<Arc<Hw>, HwError> {
        let seg = Segment::open_window(path, offset, len)?;
        Self::from_segment(seg, path)
    }

    fn initialise(seg: Segment, path: &Path, cfg: &HwConfig) -> Result<Arc<Hw>, HwError> {
        let w = |off: u64, v: u64| -> Result<(), HwError> {
            seg.at::<AtomicU64>(off)?.store(v, Ordering::Relaxed);
            Ok(())
        };
        w(H_VERSION, VERSION)?;
        w(H_NODES, cfg.nodes as u64)?;
        w(H_BUF, cfg.buffer_size as u64)?;
        w(H_MODE, (cfg.mode == Mode::Unidirectional) as u64)?;
        w(H_SIGNAL_NS, cfg.signal_cost_ns)?;
        w(H_BYTE_PS, cfg.byte_cost_ps)?;
        w(H_IRQ_NS, cfg.irq_cost_ns)?;
        w(H_SLOTS, cfg.slots as u64)?;
        for t in 0..cfg.nodes {
            for s in 0..cfg.nodes {
                // At most a second per transfer (and never BROKEN by overflow).
                let cost = (cfg.topology.hops(s, t, cfg.nodes).saturating_sub(1))
                    .saturating_mul(cfg.hop_cost_ns)
                    .min(MAX_COST_NS);
                w(LINKS + ((t * MAX_NODES + s) * 8) as u64, cost)?;
            }
        }
        for &(a, b) in &cfg.broken {
            w(LINKS + ((a * MAX_NODES + b) * 8) as u64, BROKEN)?;
            w(LINKS + ((b * MAX_NODES + a) * 8) as u64, BROKEN)?;
        }
        seg.at::<AtomicU64>(H_MAGIC)?.store(MAGIC, Ordering::Release);
        w(H_READY, 1)?;
        Self::from_segment(seg, path)
    }

    /// Map an existing region, validating its header.
    pub fn open(path: &Path) -> Result<Arc<Hw>, HwError> {
        let seg = Segment::open_existing(path)?;
        Self::from_segment(seg, path)
    }

    fn from_segment(seg: Segment, path: &Path) -> Result<Arc<Hw>, HwError> {
        let bad = |why: String| HwError::BadRegion {
            path: path.display().to_string(),
            why,
        };
        let r = |off: u64| -> Result<u64, HwError> { Ok(seg.at::<AtomicU64>(off)?.load(Ordering::Acquire)) };
        if seg.len() < BUFFERS || r(H_MAGIC)? != MAGIC {
            return Err(bad("it has no mphw header".into()));
        }
        if r(H_VERSION)? != VERSION {
            return Err(bad(format!("its version {} is not {VERSION}", r(H_VERSION)?)));
        }
        let n = r(H_NODES)? as usize;
        let buf = r(H_BUF)? as usize;
        let slots = r(H_SLOTS)? as usize;
        if !(2..=MAX_NODES).contains(&n) || buf == 0 || buf > MAX_BUFFER || !slots_ok(slots) {
            return Err(bad(format!(
                "its geometry ({n} nodes, {buf}-byte buffers, {slots} per link) is impossible"
            )));
        }
        if seg.len() < region_size(n, buf, slots) {
            return Err(bad(format!(
                "it is {} bytes, short of the {} its geometry needs",
                seg.len(),
                region_size(n, buf, slots)
            )));
        }
        let mode = match r(H_MODE)? {
            0 => Mode::Bidirectional,
            1 => Mode::Unidirectional,
            m => return Err(bad(format!("its mode word {m} is unknown"))),
        };
        Ok(Arc::new(Hw {
            n,
            buf,
            stride: stride_for(buf),
            slots,
            mode,
            signal_ns: r(H_SIGNAL_NS)?.min(MAX_COST_NS),
            byte_ps: r(H_BYTE_PS)?.min(MAX_COST_NS),
            irq_ns: r(H_IRQ_NS)?.min(MAX_COST_NS),
            futex_ok: vmf_pal::futex::usable(seg.at::<AtomicU32>(NODE_BLOCKS)?),
            seg,
            vm: std::sync::OnceLock::new(),
        }))
    }

    /// Nodes in the region.
    pub fn nodes(&self) -> usize {
        self.n
    }

    /// Data bytes per buffer.
    pub fn buffer_size(&self) -> usize {
        self.buf
    }

    /// Acknowledgement scheme.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Buffers per link.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Spin for the emulated cost of servicing one signal.
    pub fn pay_irq(&self) {
        spin_for(self.irq_ns);
    }

    fn word<T: vmf_bb::segment::ShmSafe>(&self, off: u64) -> &T {
        // Every offset used below is computed from validated geometry inside region_size(): in bounds.
        self.seg.at::<T>(off).expect("offset inside the validated region")
    }

    fn node_block(&self, i: usize) -> u64 {
        NODE_BLOCKS + i as u64 * NODE_BLOCK
    }

    fn bell(&self, i: usize) -> &AtomicU32 {
        self.word(self.node_block(i))
    }

    fn sleepers(&self, i: usize) -> &AtomicU32 {
        self.word(self.node_block(i) + 4)
    }

    /// The forwarding doorbell: rung for packets a node is to pass on (its forwarding agent sleeps on it
    /// while the node's owner may not be polling).
    fn fwd_bell(&self, i: usize) -> &AtomicU32 {
        self.word(self.node_block(i) + 16)
    }

    fn fwd_sleepers(&self, i: usize) -> &AtomicU32 {
        self.word(self.node_block(i) + 20)
    }

    /// Current value of node `i`'s forwarding doorbell.
    pub fn forward_bell(&self, i: usize) -> u32 {
        self.fwd_bell(i).load(Ordering::SeqCst)
    }

    /// Sleep until node `i`'s forwarding doorbell moves past `seen` or `timeout` passes.
    pub fn wait_forward(&self, i: usize, seen: u32, timeout: Duration) -> bool {
        wait_bell(self.fwd_bell(i), self.fwd_sleepers(i), seen, timeout)
    }

    /// Ring node `target`'s forwarding doorbell.
    pub fn ring_forward(&self, target: usize) {
        let bell = self.fwd_bell(target);
        ring_bell(bell, self.fwd_sleepers(target), || {
            vmf_pal::futex::wake(bell, u32::MAX);
        });
    }

    fn owner(&self, i: usize) -> &AtomicU64 {
        self.word(self.node_block(i) + 8)
    }

    /// The process driving node `i` (0: none).
    pub fn owner_pid(&self, i: usize) -> u64 {
        self.owner(i).load(Ordering::Acquire)
    }

    /// Counter word `slot` of node `i` (live; one writer, the node).
    pub fn counter(&self, i: usize, slot: usize) -> &AtomicU64 {
        assert!(slot < COUNTER_SLOTS && i < self.n);
        self.word(self.node_block(i) + COUNTERS_AT + slot as u64 * 8)
    }

    /// Emulated cost of a transfer `source -> target` in ns, or [`BROKEN`].
    pub fn link_cost(&self, source: usize, target: usize) -> u64 {
        self.word::<AtomicU64>(LINKS + ((target * MAX_NODES + source) * 8) as u64)
            .load(Ordering::Relaxed)
    }

    /// Declare the link between `a` and `b` broken (or mend it with its cost) at run time.
    pub fn set_link_cost(&self, a: usize, b: usize, cost: u64) {
        self.word::<AtomicU64>(LINKS + ((b * MAX_NODES + a) * 8) as u64)
            .store(cost, Ordering::Relaxed);
        self.word::<AtomicU64>(LINKS + ((a * MAX_NODES + b) * 8) as u64)
            .store(cost, Ordering::Relaxed);
    }

    fn buffer(&self, target: usize, source: usize, slot: usize) -> u64 {
        BUFFERS + ((target * self.n + source) * self.slots + slot) as u64 * self.stride
    }

    /// The slot packet `seq` of a link uses.
    fn slot_of(&self, seq: u32) -> usize {
        seq as usize & (self.slots - 1)
    }

    /// The sequence number in status word `st` of buffer `slot` (stored relative to the slot's initial
    /// one: see [`initial_seq`]).
    fn seq_in(&self, st: u64, slot: usize) -> u32 {
        ((st >> 8) as u32).wrapping_add(initial_seq(slot, self.slots)) & SEQ_MASK
    }

    /// Sequence number `seq` as buffer `slot`'s status word stores it (bits 8-31).
    fn seq_bits(&self, seq: u32, slot: usize) -> u64 {
        ((seq.wrapping_sub(initial_seq(slot, self.slots)) & SEQ_MASK) as u64) << 8
    }

    fn status(&self, target: usize, source: usize, slot: usize) -> &AtomicU64 {
        self.word(self.buffer(target, source, slot))
    }

    /// The acknowledgement word for packets `source -> target` (the last one consumed): in the first
    /// buffer of source/target (the source's memory), written by the target.
    fn ack(&self, target: usize, source: usize) -> &AtomicU64 {
        self.word(self.buffer(source, target, 0) + 8)
    }

    fn data(&self, target: usize, source: usize, slot: usize) -> *mut u8 {
        self.seg
            .ptr(self.buffer(target, source, slot) + BUF_HDR, self.buf as u64)
            .expect("buffer inside the validated region")
    }

    /// Whether buffer `target`/`source` is free now, as any node may read it (003_* §6.2.3: a sender
    /// choosing an evade node looks at the evade node's buffer at the destination).
    pub fn peer_buffer_free(&self, target: usize, source: usize) -> bool {
        if target == source || target >= self.n || source >= self.n {
            return false;
        }
        let mut seqs = [0u32; MAX_SLOTS];
        for (j, q) in seqs.iter_mut().enumerate().take(self.slots) {
            *q = self.seq_in(self.status(target, source, j).load(Ordering::Acquire), j);
        }
        let seqs = &seqs[..self.slots];
        match self.mode {
            Mode::Bidirectional => {
                (0..self.slots).any(|j| self.status(target, source, j).load(Ordering::Acquire) & FULL == 0)
            }
            Mode::Unidirectional => {
                let a = (self.ack(target, source).load(Ordering::Acquire) >> 8) as u32 & SEQ_MASK;
                (newest(seqs).wrapping_sub(a) & SEQ_MASK) < self.slots as u32
            }
        }
    }

    /// Attach as node `me` (one process at a time; a dead owner's claim is taken over).
    pub fn port(self: &Arc<Self>, me: usize) -> Result<Port, HwError> {
        if me >= self.n {
            return Err(HwError::NoSuchNode { node: me, nodes: self.n });
        }
        let pid = std::process::id() as u64;
        let owner = self.owner(me);
        let kernel = self.word::<AtomicU64>(self.node_block(me) + NB_KERNEL);
        loop {
            let cur = owner.load(Ordering::Acquire);
            // An owner under another kernel (another VM) cannot be seen to be dead: it holds the node.
            let k = kernel.load(Ordering::Acquire);
            let foreign = k != 0 && k != vmf_pal::process::kernel_id();
            if cur != 0 && cur != pid && (foreign || (vmf_pal::process::ProcessId { pid: cur as i32, start_time: 0 }).is_alive()) {
                return Err(HwError::NodeBusy { node: me, pid: cur });
            }
            if owner
                .compare_exchange(cur, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break;
            }
        }
        kernel.store(vmf_pal::process::kernel_id(), Ordering::Release);
        // Resume the link sequence numbers from the region (a restarted node continues where the last one
        // stopped; a fresh region starts at zero everywhere).
        let mut sent = vec![0u32; self.n];
        let mut seen = vec![0u32; self.n];
        let seq_of = |st: u64| ((st >> 8) as u32) & SEQ_MASK;
        for p in 0..self.n {
            if p == me {
                continue;
            }
            let out: Vec<u32> = (0..self.slots).map(|j| self.seq_in(self.status(p, me, j).load(Ordering::Acquire), j)).collect();
            sent[p] = newest(&out);
            seen[p] = match self.mode {
                Mode::Unidirectional => seq_of(self.ack(me, p).load(Ordering::Acquire)),
                Mode::Bidirectional => {
                    // The newest packet consumed: just before the oldest still full, else the newest.
                    let st: Vec<u64> = (0..self.slots).map(|j| self.status(me, p, j).load(Ordering::Acquire)).collect();
                    let full: Vec<u32> =
                        st.iter().enumerate().filter(|(_, &w)| w & FULL != 0).map(|(j, &w)| self.seq_in(w, j)).collect();
                    let all: Vec<u32> = st.iter().enumerate().map(|(j, &w)| self.seq_in(w, j)).collect();
                    match full.iter().copied().find(|&c| full.iter().all(|&o| o.wrapping_sub(c) & SEQ_MASK < 1 << 23)) {
                        Some(oldest) => oldest.wrapping_sub(1) & SEQ_MASK,
                        None => newest(&all),
                    }
                }
            };
        }
        Ok(Port {
            hw: self.clone(),
            me,
            held: vec![false; self.n],
            foreign_off: vec![false; self.n],
            sent,
            seen,
            remote_reads: 0,
        })
    }

    /// Current value of node `i`'s doorbell.
    pub fn doorbell(&self, i: usize) -> u32 {
        self.bell(i).load(Ordering::SeqCst)
    }

    /// Sleep until node `i`'s doorbell moves past `seen` or `timeout` passes. Returns whether it moved.
    /// Node `i` sleeps on its ivshmem doorbell vector instead of the futex when nodes under other
    /// kernels (VMs) may ring it ([`Hw::enable_vm_bell`]).
    pub fn wait_doorbell(&self, i: usize, seen: u32, timeout: Duration) -> bool {
        match self.vm.get().and_then(|v| v.own) {
            Some(fd) if !self.futex_ok || self.has_remote_nodes() => {
                let (bell, sleepers) = (self.bell(i), self.sleepers(i));
                sleepers.fetch_add(1, Ordering::SeqCst);
                if bell.load(Ordering::SeqCst) == seen {
                    vmf_pal::wait_readable(fd, timeout);
                }
                sleepers.fetch_sub(1, Ordering::SeqCst);
                // Consume the interrupt's count (a ring that came while we were not asleep only cuts
                // the next sleep short).
                vmf_pal::drain_eventfd(fd);
                bell.load(Ordering::SeqCst) != seen
            }
            None if !self.futex_ok => {
                // Nobody can wake us (a BAR without a doorbell): the caller keeps `timeout` short.
                std::thread::sleep(timeout);
                self.bell(i).load(Ordering::SeqCst) != seen
            }
            _ => wait_bell(self.bell(i), self.sleepers(i), seen, timeout),
        }
    }

    /// Ring node `target`'s doorbell (no emulated cost).
    pub fn ring(&self, target: usize) {
        let bell = self.bell(target);
        ring_bell(bell, self.sleepers(target), || self.wake(target, bell));
    }

    /// Wake node `target`, asleep on `bell`: by futex under our kernel, else (another VM, or a region in a
    /// PCI BAR, where futexes fail) through the ivshmem doorbell.
    #[cold]
    fn wake(&self, target: usize, bell: &AtomicU32) {
        if self.futex_ok && self.kernel_of(target) == vmf_pal::process::kernel_id() {
            vmf_pal::futex::wake(bell, u32::MAX);
            return;
        }
        // A value from shared memory: only a well-formed one is used; a bad one at worst rings a wrong
        // vector, which wakes nobody harmfully.
        let v = self.word::<AtomicU64>(self.node_block(target) + NB_VM_BELL).load(Ordering::Acquire);
        if let (Some(b), true) = (self.vm.get(), v & !0xffff_ffff == BELL_VALID) {
            b.regs.ring((v >> 16) as u16, v as u16);
        }
    }

    /// The kernel node `i`'s owner runs under (0: not attached yet).
    fn kernel_of(&self, i: usize) -> u64 {
        self.word::<AtomicU64>(self.node_block(i) + NB_KERNEL).load(Ordering::Acquire)
    }

    /// Whether node `i`'s owner runs under this process's kernel (false until it has attached).
    pub fn same_kernel(&self, i: usize) -> bool {
        self.kernel_of(i) == vmf_pal::process::kernel_id()
    }

    /// Whether some attached node runs under another kernel (a VM sharing the region).
    pub fn has_remote_nodes(&self) -> bool {
        let me = vmf_pal::process::kernel_id();
        (0..self.n).any(|i| matches!(self.kernel_of(i), k if k != 0 && k != me))
    }

    /// Whether futexes wake nodes of this kernel here (false in a PCI BAR).
    pub fn futex_ok(&self) -> bool {
        self.futex_ok
    }

    /// Whether every attached node that cannot wake us by futex (one under another kernel; any, in a
    /// PCI BAR) rings through its doorbell (then a sleep on ours may be long; otherwise nodes wait in
    /// bounded steps, polling).
    pub fn remote_nodes_ring(&self) -> bool {
        let me = vmf_pal::process::kernel_id();
        (0..self.n).all(|i| {
            let k = self.kernel_of(i);
            k == 0
                || (k == me && self.futex_ok)
                || self.word::<AtomicU64>(self.node_block(i) + NB_VM_BELL).load(Ordering::Acquire) & BELL_VALID != 0
        })
    }

    /// The eventfd this process sleeps on for its ivshmem doorbell vector, if [`Hw::enable_vm_bell`] gave one.
    pub fn vm_bell_fd(&self) -> Option<std::os::fd::RawFd> {
        self.vm.get().and_then(|v| v.own)
    }

    /// In a VM whose ivshmem device has a doorbell: node `me` rings nodes in other VMs through `regs`, and
    /// with `own` (its vector and the eventfd the guest's agent routes that MSI-X vector to) sleeps on it
    /// and publishes `BELL_VALID | IVPosition << 16 | vector` in its node block so they can ring it. Once
    /// per region; later calls change nothing.
    pub fn enable_vm_bell(&self, me: usize, regs: Arc<vmf_pal::pci::IvshmemRegs>, own: Option<(u16, std::os::fd::RawFd)>) {
        if me >= self.n {
            return;
        }
        let pos = regs.position();
        let own = own.filter(|_| pos <= 0xffff);
        if self.vm.set(VmBell { regs, own: own.map(|(_, fd)| fd) }).is_ok() {
            if let Some((v, _)) = own {
                self.word::<AtomicU64>(self.node_block(me) + NB_VM_BELL)
                    .store(BELL_VALID | u64::from(pos) << 16 | u64::from(v), Ordering::Release);
            }
        }
    }
}

/// Sleep while `bell` holds `seen` (at most `timeout`), announced in `sleepers`; whether it moved. The
/// SeqCst increment of `sleepers` before the last look pairs with [`Hw::ring`]'s SeqCst load after its
/// increment: either the ringer sees the sleeper or the sleeper sees the new value.
fn wait_bell(bell: &AtomicU32, sleepers: &AtomicU32, seen: u32, timeout: Duration) -> bool {
    sleepers.fetch_add(1, Ordering::SeqCst);
    if bell.load(Ordering::SeqCst) == seen {
        vmf_pal::futex::wait(bell, seen, Some(timeout));
    }
    sleepers.fetch_sub(1, Ordering::SeqCst);
    bell.load(Ordering::SeqCst) != seen
}

/// Move `bell` on and, if someone sleeps on it, `wake` them.
fn ring_bell(bell: &AtomicU32, sleepers: &AtomicU32, wake: impl FnOnce()) {
    bell.fetch_add(1, Ordering::SeqCst);
    if sleepers.load(Ordering::SeqCst) != 0 {
        wake();
    }
}

/// State of the way to one target, as a sender sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The buffer is free; `foreign_ok` says whether the target accepts forwarded packets from us.
    Free {
        /// The target accepts indirect traffic over this link.
        foreign_ok: bool,
    },
    /// The buffer still holds our last packet.
    Busy,
    /// The link is broken.
    Broken,
}

/// One node's attachment: sends into other nodes' buffers, receives from its own.
pub struct Port {
    hw: Arc<Hw>,
    me: usize,
    /// Sequence number of the last packet sent to each target.
    sent: Vec<u32>,
    /// Sequence number of the last packet consumed from each source.
    seen: Vec<u32>,
    remote_reads: u64,
    /// Our buffer at each target held for a packet being written in place by a caller that does not
    /// hold the engine meanwhile ([`Port::hold`]): busy to every other send until committed or let go.
    held: Vec<bool>,
    /// Whether we last told each source to pass us no forwarded packets.
    foreign_off: Vec<bool>,
}

fn spin_for(ns: u64) {
    if ns == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

impl Port {
    /// This node's index.
    pub fn me(&self) -> usize {
        self.me
    }

    /// The region.
    pub fn hw(&self) -> &Arc<Hw> {
        &self.hw
    }

    /// Status words read in another node's memory so far (what unidirectional buffers avoid).
    pub fn remote_reads(&self) -> u64 {
        self.remote_reads
    }

    fn check_peer(&self, p: usize) -> Result<(), HwError> {
        if p >= self.hw.n || p == self.me {
            return Err(HwError::NoSuchNode { node: p, nodes: self.hw.n });
        }
        Ok(())
    }

    /// Whether our buffer at `target` is free, without sending.
    pub fn link(&mut self, target: usize) -> Result<Link, HwError> {
        self.check_peer(target)?;
        if self.hw.link_cost(self.me, target) == BROKEN {
            return Ok(Link::Broken);
        }
        let sent = self.sent[target];
        let k = self.hw.slots as u32;
        let corrupt = |what, value| HwError::Corrupt {
            op: "check a buffer",
            source_node: self.me,
            target,
            what,
            value,
        };
        match self.hw.mode {
            Mode::Bidirectional => {
                // The next packet's slot holds the packet K before it, consumed (free) or not (busy).
                self.remote_reads += 1;
                let next = (sent + 1) & SEQ_MASK;
                let slot = self.hw.slot_of(next);
                let st = self.hw.status(target, self.me, slot).load(Ordering::Acquire);
                let prev = next.wrapping_sub(k) & SEQ_MASK;
                if st & FLAGS & !(FULL | NO_FOREIGN) != 0 || self.hw.seq_in(st, slot) != prev {
                    return Err(corrupt("status word", st));
                }
                if st & FULL != 0 {
                    Ok(Link::Busy)
                } else {
                    Ok(Link::Free { foreign_ok: st & NO_FOREIGN == 0 })
                }
            }
            Mode::Unidirectional => {
                // Free while fewer than K packets are unacknowledged.
                let a = self.hw.ack(target, self.me).load(Ordering::Acquire);
                let acked = (a >> 8) as u32 & SEQ_MASK;
                if a & FLAGS & !NO_FOREIGN != 0 || a >> 32 != 0 {
                    return Err(corrupt("acknowledgement word", a));
                }
                let in_flight = sent.wrapping_sub(acked) & SEQ_MASK;
                if in_flight < k {
                    Ok(Link::Free { foreign_ok: a & NO_FOREIGN == 0 })
                } else if in_flight == k {
                    Ok(Link::Busy)
                } else {
                    Err(corrupt("acknowledgement word", a))
                }
            }
        }
    }

    /// Copy `parts` (concatenated) into our buffer at `target` if it is free, then mark it full. Returns
    /// `Ok(false)` when the buffer is busy; [`HwError::Broken`] on a broken link. Does not signal.
    pub fn try_send(&mut self, target: usize, parts: &[&[u8]]) -> Result<bool, HwError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.hw.buf {
            return Err(HwError::TooLarge { len, cap: self.hw.buf });
        }
        match self.link(target)? {
            Link::Busy => return Ok(false),
            Link::Broken => {
                return Err(HwError::Broken {
                    source_node: self.me,
                    target,
                })
            }
            Link::Free { .. } if self.held[target] => return Ok(false),
            Link::Free { .. } => {}
        }
        let dst = self.hw.data(target, self.me, self.next_slot(target));
        let mut at = 0;
        for p in parts {
            // SAFETY: `dst` is our own buffer at `target` (len <= buffer size, checked above); only we write
            // it, and the target reads it only after the Release store of the status word in commit().
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst.add(at), p.len()) };
            at += p.len();
        }
        self.commit(target, len)?;
        Ok(true)
    }

    /// Our buffer at `target` to write a packet in place, if it is free: its data area (buffer size
    /// bytes). Nothing changes until [`Port::commit`]; dropping the reservation costs nothing.
    pub fn reserve(&mut self, target: usize) -> Result<Option<*mut u8>, HwError> {
        match self.link(target)? {
            Link::Free { .. } if !self.held[target] => Ok(Some(self.hw.data(target, self.me, self.next_slot(target)))),
            _ => Ok(None),
        }
    }

    /// [`Port::reserve`], and the buffer stays ours until [`Port::commit`] or [`Port::let_go`] even for
    /// sends made meanwhile through this port (they find it busy): for a caller that fills it without
    /// holding the engine, which another thread may use meanwhile (the vnic reads a frame from its TAP
    /// straight into the buffer while its receive thread forwards packets).
    pub fn hold(&mut self, target: usize) -> Result<Option<*mut u8>, HwError> {
        let r = self.reserve(target)?;
        if r.is_some() {
            self.held[target] = true;
        }
        Ok(r)
    }

    /// Give up a [`Port::hold`] without sending.
    pub fn let_go(&mut self, target: usize) {
        if let Some(h) = self.held.get_mut(target) {
            *h = false;
        }
    }

    /// Our held buffer at `target` (see [`Port::hold`]), if it is held.
    pub fn held(&self, target: usize) -> Option<*mut u8> {
        self.held
            .get(target)
            .copied()
            .unwrap_or(false)
            .then(|| self.hw.data(target, self.me, self.next_slot(target)))
    }

    /// The slot our next packet to `target` goes to.
    fn next_slot(&self, target: usize) -> usize {
        self.hw.slot_of((self.sent[target] + 1) & SEQ_MASK)
    }

    /// Mark our buffer at `target`, reserved and filled with `len` bytes, full (as [`Port::try_send`]
    /// does after its copy). Does not signal.
    pub fn commit(&mut self, target: usize, len: usize) -> Result<(), HwError> {
        self.check_peer(target)?;
        if len > self.hw.buf {
            return Err(HwError::TooLarge { len, cap: self.hw.buf });
        }
        let slot = self.next_slot(target);
        let link = self.hw.link_cost(self.me, target).min(MAX_COST_NS);
        spin_for(link.saturating_add((len as u64).saturating_mul(self.hw.byte_ps) / 1000).min(MAX_COST_NS));
        // Read after the emulated transfer: a no-foreign flag the target set meanwhile is kept.
        let old = self.hw.status(target, self.me, slot).load(Ordering::Acquire);
        let seq = (self.sent[target] + 1) & SEQ_MASK;
        self.sent[target] = seq;
        self.held[target] = false;
        let keep = match self.hw.mode {
            Mode::Bidirectional => old & NO_FOREIGN,
            Mode::Unidirectional => 0,
        };
        self.hw
            .status(target, self.me, slot)
            .store(FULL | keep | self.hw.seq_bits(seq, slot) | (len as u64) << 32, Ordering::Release);
        Ok(())
    }

    /// Signal `target` (with the emulated signal cost).
    pub fn signal(&self, target: usize) {
        spin_for(self.hw.signal_ns);
        self.hw.ring(target);
    }

    /// The packet waiting in our buffer from `source`, if any. Call [`Port::release`] when done with it.
    pub fn peek(&self, source: usize) -> Result<Option<&[u8]>, HwError> {
        self.check_peer(source)?;
        let seen = self.seen[source];
        let next = (seen + 1) & SEQ_MASK;
        let slot = self.hw.slot_of(next);
        let st = self.hw.status(self.me, source, slot).load(Ordering::Acquire);
        let seq = self.hw.seq_in(st, slot);
        // An empty slot holds the packet K before the next one, consumed.
        let prev = next.wrapping_sub(self.hw.slots as u32) & SEQ_MASK;
        let full = match self.hw.mode {
            Mode::Bidirectional => st & FULL != 0,
            Mode::Unidirectional => seq != prev,
        };
        let corrupt = |what, value| HwError::Corrupt {
            op: "receive",
            source_node: source,
            target: self.me,
            what,
            value,
        };
        if !full {
            if self.hw.mode == Mode::Bidirectional && seq != prev {
                return Err(corrupt("status word", st));
            }
            return Ok(None);
        }
        let len = (st >> 32) as usize;
        if st & FLAGS & !(FULL | NO_FOREIGN) != 0 || seq != next || len > self.hw.buf {
            return Err(corrupt("status word", st));
        }
        // SAFETY: our own buffer from `source`, len <= buffer size (checked); the source does not write it
        // again until we release it (a misbehaving source can only change bytes, not bounds).
        Ok(Some(unsafe { std::slice::from_raw_parts(self.hw.data(self.me, source, slot), len) }))
    }

    /// Free our buffer from `source` after [`Port::peek`] returned a packet; `no_foreign` forbids the
    /// source to pass us forwarded traffic (003_*'s vlb_max_foreigners state) until a later release or
    /// [`Port::allow_foreign`] lifts it.
    pub fn release(&mut self, source: usize, no_foreign: bool) {
        let seq = (self.seen[source] + 1) & SEQ_MASK;
        self.seen[source] = seq;
        let nf = if no_foreign { NO_FOREIGN } else { 0 };
        match self.hw.mode {
            Mode::Bidirectional => {
                let slot = self.hw.slot_of(seq);
                self.hw
                    .status(self.me, source, slot)
                    .store(nf | self.hw.seq_bits(seq, slot), Ordering::Release);
                // The source looks for the flag in the buffer it fills next, which with K > 1 is another
                // one: a change goes to every free buffer of the link.
                if self.hw.slots > 1 && self.foreign_off[source] != no_foreign {
                    self.set_foreign_flag(source, nf);
                }
                self.foreign_off[source] = no_foreign;
            }
            Mode::Unidirectional => self
                .hw
                .ack(self.me, source)
                .store(nf | (seq as u64) << 8, Ordering::Release),
        }
    }

    /// Set or lift the no-foreign state of our buffer from `source` while it is free.
    pub fn allow_foreign(&mut self, source: usize, allow: bool) {
        let seq = self.seen[source] as u64;
        let nf = if allow { 0 } else { NO_FOREIGN };
        self.foreign_off[source] = !allow;
        match self.hw.mode {
            Mode::Bidirectional => self.set_foreign_flag(source, nf),
            Mode::Unidirectional => self.hw.ack(self.me, source).store(nf | seq << 8, Ordering::Release),
        }
    }

    /// Put flag `nf` (NO_FOREIGN or 0) on every free buffer of the link from `source` (the source looks
    /// at the one it fills next). Only while free: a source that filled one meanwhile keeps the old flag
    /// there until our release.
    fn set_foreign_flag(&self, source: usize, nf: u64) {
        for j in 0..self.hw.slots {
            let st = self.hw.status(self.me, source, j);
            let cur = st.load(Ordering::Acquire);
            if cur & FULL == 0 {
                let _ = st.compare_exchange(cur, nf | (cur & !FLAGS), Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Current value of our doorbell (pass it to [`Port::wait`]).
    pub fn bell(&self) -> u32 {
        self.hw.doorbell(self.me)
    }

    /// Sleep until our doorbell moves past `seen` or `timeout` passes. Returns whether it moved.
    pub fn wait(&self, seen: u32, timeout: Duration) -> bool {
        self.hw.wait_doorbell(self.me, seen, timeout)
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        let pid = std::process::id() as u64;
        let _ = self
            .hw
            .owner(self.me)
            .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("vmf-mphw-{}-{name}", std::process::id()))
    }

    fn pair(mode: Mode, name: &str) -> (Arc<Hw>, std::path::PathBuf) {
        slotted(mode, name, 1)
    }

    fn slotted(mode: Mode, name: &str, slots: usize) -> (Arc<Hw>, std::path::PathBuf) {
        let p = tmp(name);
        let mut c = HwConfig::new(3, 256);
        c.mode = mode;
        c.slots = slots;
        (Hw::create(&p, &c).unwrap(), p)
    }

    #[test]
    fn sequence_helpers() {
        assert_eq!(initial_seq(0, 1), 0);
        assert_eq!(initial_seq(0, 4), 0);
        assert_eq!(initial_seq(1, 4), SEQ_MASK - 2);
        assert_eq!(initial_seq(3, 4), SEQ_MASK);
        assert_eq!(newest(&[5, 6, 7, 8]), 8);
        assert_eq!(newest(&[SEQ_MASK - 1, SEQ_MASK, 0, 1]), 1, "across the wrap");
        assert_eq!(newest(&[0, SEQ_MASK - 2, SEQ_MASK - 1, SEQ_MASK]), 0);
        assert!(!slots_ok(0) && !slots_ok(3) && !slots_ok(32) && slots_ok(16));
        assert!(Hw::create(&tmp("badslots"), &HwConfig { slots: 3, ..HwConfig::new(2, 64) }).is_err());
        // A fresh region is written only in its header and tables: 64 nodes with 16 buffers per link of
        // 64 KiB each is 4 GiB of which nothing but those pages is touched.
        let p = tmp("sparse");
        let hw = Hw::create(&p, &HwConfig { slots: 16, ..HwConfig::new(64, 65536) }).unwrap();
        use std::os::unix::fs::MetadataExt;
        let used = std::fs::metadata(&p).unwrap().blocks() * 512;
        assert!(used < 1 << 20, "a fresh region occupies {used} bytes");
        drop(hw);
        std::fs::remove_file(p).unwrap();
    }

    /// With K buffers per link a sender has up to K packets in flight; the target takes them in order,
    /// and a node that re-attaches mid-stream continues its sequence numbers (both modes).
    #[test]
    fn k_packets_in_flight_in_order_and_resumed() {
        for (mode, name) in [(Mode::Bidirectional, "kbi"), (Mode::Unidirectional, "kuni")] {
            let (hw, p) = slotted(mode, name, 4);
            let mut a = hw.port(0).unwrap();
            let mut b = hw.port(1).unwrap();
            for i in 0..4u8 {
                assert!(a.try_send(1, &[&[i; 10]]).unwrap(), "packet {i} fits");
            }
            assert_eq!(a.link(1).unwrap(), Link::Busy, "K in flight: busy");
            assert!(!a.try_send(1, &[b"x"]).unwrap());
            assert_eq!(b.peek(0).unwrap().unwrap()[0], 0);
            b.release(0, false);
            assert!(a.try_send(1, &[&[4u8; 10]]).unwrap(), "a released slot takes the next");
            // Re-attach both ends (a restarted node): the sequence carries on.
            drop(a);
            drop(b);
            let mut a = hw.port(0).unwrap();
            let mut b = hw.port(1).unwrap();
            for want in 1..=4u8 {
                let got = b.peek(0).unwrap().expect("still queued")[0];
                assert_eq!(got, want);
                b.release(0, false);
            }
            assert_eq!(b.peek(0).unwrap(), None);
            for i in 5..12u8 {
                assert!(a.try_send(1, &[&[i; 3]]).unwrap());
                assert_eq!(b.peek(0).unwrap().unwrap()[0], i);
                b.release(0, i % 2 == 0);
            }
            // "No forwarded packets" reaches the buffer the sender fills next, whichever was released.
            if mode == Mode::Bidirectional {
                assert!(a.try_send(1, &[b"f"]).unwrap());
                b.peek(0).unwrap().unwrap();
                b.release(0, true);
                assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: false });
                b.allow_foreign(0, true);
                assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: true });
            }
            // A corrupt slot is an error, not a misread.
            let next = (a.sent[1] + 1) & SEQ_MASK;
            hw.status(1, 0, hw.slot_of(next)).store(FULL | (next.wrapping_add(8) as u64) << 8 | 4 << 32, Ordering::Release);
            assert!(matches!(b.peek(0), Err(HwError::Corrupt { .. })));
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn send_receive_release_both_modes() {
        for (mode, name) in [(Mode::Bidirectional, "bi"), (Mode::Unidirectional, "uni")] {
            let (hw, p) = pair(mode, name);
            // Two ports of one process stand for two nodes: ownership is by pid, so take node 1 from a
            // second Hw mapping.
            let mut a = hw.port(0).unwrap();
            let mut b = hw.port(1).unwrap();
            assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: true });
            assert!(a.try_send(1, &[b"hel", b"lo"]).unwrap());
            assert_eq!(a.link(1).unwrap(), Link::Busy);
            assert!(!a.try_send(1, &[b"x"]).unwrap(), "busy buffer refuses");
            assert_eq!(b.peek(1 - 1).unwrap(), Some(&b"hello"[..]));
            assert_eq!(b.peek(2).unwrap(), None);
            b.release(0, true);
            assert_eq!(b.peek(0).unwrap(), None);
            assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: false });
            b.allow_foreign(0, true);
            assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: true });
            assert!(a.try_send(1, &[&[7u8; 256]]).unwrap());
            assert_eq!(b.peek(0).unwrap().unwrap().len(), 256);
            assert!(matches!(a.try_send(2, &[&[0u8; 257]]), Err(HwError::TooLarge { .. })));
            if mode == Mode::Bidirectional {
                assert!(a.remote_reads() > 0);
            } else {
                assert_eq!(a.remote_reads(), 0, "unidirectional senders read only their own memory");
            }
            std::fs::remove_file(p).unwrap();
        }
    }

    /// The hardware in a window of a larger file (as in an ivshmem BAR's region): zeroed over whatever
    /// the file held, seen by a second mapping, bounded to its window; a window without the hardware,
    /// or too short for the geometry its header claims, is refused.
    #[test]
    fn hardware_in_a_window_of_a_device_works() {
        let p = tmp("window");
        let len = region_size(3, 256, 2).div_ceil(4096) * 4096;
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(3 * 4096 + len).unwrap();
        // Leftovers of an earlier user.
        std::fs::write(&p, vec![0xa5u8; (3 * 4096 + len) as usize]).unwrap();
        let c = HwConfig { slots: 2, ..HwConfig::new(3, 256) };
        assert!(Hw::create_window(&p, 3 * 4096, len - 8192, &c).is_err(), "too short for the geometry");
        let hw = Hw::create_window(&p, 3 * 4096, len, &c).unwrap();
        let other = Hw::open_window(&p, 3 * 4096, len).unwrap();
        assert_eq!((other.nodes(), other.slots()), (3, 2));
        let mut a = hw.port(0).unwrap();
        let mut b = other.port(2).unwrap();
        assert!(hw.same_kernel(a.me()) && !hw.has_remote_nodes() && hw.remote_nodes_ring());
        for i in 0..5u8 {
            assert!(a.try_send(2, &[&[i; 100]]).unwrap());
            assert_eq!(b.peek(0).unwrap().unwrap(), &[i; 100][..]);
            b.release(0, false);
        }
        // The bytes before the window are untouched.
        let raw = std::fs::read(&p).unwrap();
        assert!(raw[..3 * 4096].iter().all(|&x| x == 0xa5));
        assert!(matches!(Hw::open_window(&p, 0, 4096 * 20), Err(HwError::BadRegion { .. })));
        assert!(matches!(Hw::open_window(&p, 3 * 4096, len - 8192), Err(HwError::BadRegion { .. })));
        assert!(Hw::open_window(&p, 3 * 4096, len + 4096).is_err(), "past the end of the file");
        // A node under another kernel (a VM) cannot be woken by futex: it counts as remote, and without
        // a doorbell address it cannot be rung.
        hw.word::<AtomicU64>(hw.node_block(1) + NB_KERNEL).store(12345, Ordering::Release);
        assert!(hw.has_remote_nodes() && !hw.remote_nodes_ring() && !hw.same_kernel(1));
        hw.word::<AtomicU64>(hw.node_block(1) + NB_VM_BELL).store(BELL_VALID | 3 << 16 | 1, Ordering::Release);
        assert!(hw.remote_nodes_ring());
        hw.word::<AtomicU64>(hw.node_block(1) + 8).store(1, Ordering::Release);
        assert!(matches!(hw.port(1), Err(HwError::NodeBusy { .. })), "an owner in another VM holds its node");
        drop((a, b));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn corrupt_words_are_errors() {
        for (mode, name) in [(Mode::Bidirectional, "cbi"), (Mode::Unidirectional, "cuni")] {
            let (hw, p) = pair(mode, name);
            let mut a = hw.port(0).unwrap();
            let b = hw.port(1).unwrap();
            // A length beyond the buffer.
            hw.status(1, 0, 0).store(FULL | 1 << 8 | 4096 << 32, Ordering::Release);
            assert!(matches!(b.peek(0), Err(HwError::Corrupt { .. })));
            // A sequence number that skips.
            hw.status(1, 0, 0).store(FULL | 5 << 8 | 8 << 32, Ordering::Release);
            assert!(matches!(b.peek(0), Err(HwError::Corrupt { .. })));
            // Unknown flag bits.
            hw.status(1, 0, 0).store(FULL | 0x80 | 1 << 8, Ordering::Release);
            assert!(matches!(b.peek(0), Err(HwError::Corrupt { .. })));
            // The sender's view: an acknowledgement / status it cannot have produced.
            match mode {
                Mode::Bidirectional => hw.status(1, 0, 0).store(9 << 8, Ordering::Release),
                Mode::Unidirectional => hw.ack(1, 0).store(9 << 8, Ordering::Release),
            }
            assert!(matches!(a.link(1), Err(HwError::Corrupt { .. })));
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn broken_links_and_costs() {
        let p = tmp("broken");
        let mut c = HwConfig::new(4, 64);
        c.broken = parse_links("0-1").unwrap();
        c.topology = Topology::parse("mesh:2").unwrap();
        c.hop_cost_ns = 1000;
        let hw = Hw::create(&p, &c).unwrap();
        let mut a = hw.port(0).unwrap();
        assert_eq!(a.link(1).unwrap(), Link::Broken);
        assert!(matches!(a.try_send(1, &[b"x"]), Err(HwError::Broken { .. })));
        assert_eq!(hw.link_cost(1, 0), BROKEN);
        // mesh 2 wide: 0 and 3 are two hops apart, one hop beyond the first costs 1000 ns.
        assert_eq!(hw.link_cost(0, 3), 1000);
        assert_eq!(hw.link_cost(0, 2), 0);
        let t = Instant::now();
        assert!(a.try_send(3, &[b"x"]).unwrap());
        assert!(t.elapsed() >= Duration::from_nanos(1000));
        hw.set_link_cost(0, 1, 0);
        assert_eq!(a.link(1).unwrap(), Link::Free { foreign_ok: true });
        assert!(parse_links("1-1").is_err() && parse_links("a-2").is_err());
        assert!(Topology::parse("mesh:0").is_err());
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn bad_regions_are_refused() {
        let p = tmp("bad");
        std::fs::write(&p, vec![0u8; 100_000]).unwrap();
        assert!(matches!(Hw::open(&p), Err(HwError::BadRegion { .. })));
        assert!(Hw::create(&p, &HwConfig::new(1, 64)).is_err());
        assert!(Hw::create(&p, &HwConfig::new(65, 64)).is_err());
        let hw = Hw::create(&p, &HwConfig::new(2, 64)).unwrap();
        hw.word::<AtomicU64>(H_NODES).store(1000, Ordering::Relaxed);
        assert!(matches!(Hw::open(&p), Err(HwError::BadRegion { .. })));
        std::fs::remove_file(p).unwrap();
    }

    /// Stress: 3 threads each send to both others and receive, with checksummed numbered packets, in
    /// both modes; every packet arrives once and in order per link.
    #[test]
    fn stress_all_to_all() {
        for (mode, name, k) in [
            (Mode::Bidirectional, "sbi", 1),
            (Mode::Unidirectional, "suni", 1),
            (Mode::Bidirectional, "sbi4", 4),
            (Mode::Unidirectional, "suni4", 4),
        ] {
            let (hw, p) = slotted(mode, name, k);
            const PER_LINK: u32 = 20_000;
            let hs: Vec<_> = (0..3)
                .map(|me| {
                    let hw = hw.clone();
                    std::thread::spawn(move || {
                        let mut port = hw.port(me).unwrap();
                        let mut next_out = [0u32; 3];
                        let mut next_in = [0u32; 3];
                        let peers: Vec<usize> = (0..3).filter(|&x| x != me).collect();
                        let mut done_in = 0;
                        while done_in < 2 * PER_LINK || peers.iter().any(|&t| next_out[t] < PER_LINK) {
                            for &t in &peers {
                                if next_out[t] < PER_LINK {
                                    let v = next_out[t];
                                    let body = [v.to_le_bytes(), (v ^ 0xdead_beef).to_le_bytes()].concat();
                                    if port.try_send(t, &[&body[..(4 + (v as usize % 5))]]).unwrap() {
                                        next_out[t] += 1;
                                        port.signal(t);
                                    }
                                }
                                if let Some(d) = port.peek(t).unwrap() {
                                    let v = u32::from_le_bytes(d[..4].try_into().unwrap());
                                    assert_eq!(v, next_in[t], "link {t}->{me} in order");
                                    assert_eq!(d.len(), 4 + (v as usize % 5));
                                    next_in[t] += 1;
                                    done_in += 1;
                                    port.release(t, false);
                                }
                            }
                        }
                        next_in
                    })
                })
                .collect();
            for (me, h) in hs.into_iter().enumerate() {
                let got = h.join().unwrap();
                for (src, &n) in got.iter().enumerate() {
                    if src != me {
                        assert_eq!(n, PER_LINK);
                    }
                }
            }
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn doorbell_wakes_a_sleeper() {
        let (hw, p) = pair(Mode::Bidirectional, "bell");
        let b = hw.port(1).unwrap();
        let seen = b.bell();
        let hw2 = hw.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            hw2.ring(1);
        });
        let start = Instant::now();
        assert!(b.wait(seen, Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5));
        t.join().unwrap();
        assert!(!b.wait(b.bell(), Duration::from_millis(5)), "no ring: times out");
        std::fs::remove_file(p).unwrap();
    }
}
