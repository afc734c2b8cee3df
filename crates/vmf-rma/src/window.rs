//! Windows: memory of every member of a group exposed for one-sided access, and the operations on it.
//!
//! # Where the memory is and how each origin reaches it
//!
//! Members that share a region with each other (co-resident: processes, containers, VMs on one host)
//! form a *node group*. At creation the group's lowest member (the leader) makes one *node segment*
//! holding a control block per group member ([`crate::ctl`]) and, for `Allocate`/`Shared` windows, every
//! member's memory: a memfd when all members run on one kernel (mapped by the others through
//! `pidfd_getfd`, so nothing is left in any file system), else a block of the leader's partition of the
//! region's pool (which VMs sharing an ivshmem region map too). Then, per target, an origin:
//!
//! | target memory | put / get | accumulate, atomics, locks |
//! |---|---|---|
//! | mapped here (node segment, pool, or `MPI_Alloc_mem` memfd) | loads and stores | CPU atomics; the accumulate lock for other elements |
//! | private, co-resident | `process_vm_writev`/`readv` | under the target's accumulate lock, read and written by single copy |
//! | on another host (or unreachable otherwise) | the target's agent over TCP | the agent, with CPU atomics on its own mapping |
//!
//! No path needs the target to call the library: the target is passive on all three.
//!
//! # Creation protocol
//! Three exchanges among the members (the caller provides an allgather): (1) each member's description
//! (process, kernel, sizes, memory, agent address), (2) the node segments made by the leaders,
//! (3) whether each member mapped its node segment; a group where anyone failed falls back to private
//! memory, so every member decides the same way.
use crate::agent::{Agent, Creds};
use crate::conn::Conn;
use crate::attach::{AttachList, AttachTable, Entry, TABLE_BYTES};
use std::collections::HashMap;
use crate::ctl::{Ctl, HeapCtl, CTL_SIZE};
use crate::exec::{Mem, Status, Target};
use crate::layout::{Layout, Run};
use crate::reduce::{Elem, ROp};
use crate::wire::{Kind, ReqHeader, FLAG_EXCL};
use crate::RmaError;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use vmf_pal::inplace::InPlace;
use vmf_pal::shmem::SharedMem;
use vmf_transport::shm::region::Region;

/// How a window's memory came to be (MPI's flavors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Flavor {
    /// Memory the program gives (`MPI_Win_create`).
    Create = 0,
    /// Memory the library allocates (`MPI_Win_allocate`).
    Allocate = 1,
    /// Memory the library allocates, mapped by every member (`MPI_Win_allocate_shared`).
    Shared = 2,
    /// Memory attached later (`MPI_Win_create_dynamic`): displacements are addresses.
    Dynamic = 3,
}

impl Flavor {
    fn from_u8(v: u8) -> Option<Flavor> {
        Some(match v {
            0 => Flavor::Create,
            1 => Flavor::Allocate,
            2 => Flavor::Shared,
            3 => Flavor::Dynamic,
            _ => return None,
        })
    }
}

/// What a process contributes to every window it joins.
#[derive(Clone)]
pub struct RmaCtx {
    /// This rank (world).
    pub rank: usize,
    /// The shared region, if this rank maps one.
    pub region: Option<Arc<Region>>,
    /// This rank's slot in it.
    pub slot: u32,
    /// Where the agent listens and how connections authenticate; `None` without TCP.
    pub tcp: Option<(IpAddr, Creds)>,
    /// How long the agent polls after serving before it sleeps.
    pub agent_spin: Duration,
    /// How long an origin polls its connection before it sleeps in `poll`.
    pub client_spin: Duration,
    /// Peers may read and write this process's memory by single copy.
    pub cma_ok: bool,
    /// Node segments may be memfds (else pool blocks).
    pub memfd: bool,
    /// `Create` windows up to this many bytes share their whole pages in place (0: never).
    pub share_create_max: u64,
}

impl RmaCtx {
    /// The context of the rank driving `eng`.
    pub fn from_engine(eng: &vmf_core::engine::Engine) -> RmaCtx {
        let cfg = eng.config();
        let (region, slot) = match eng.shm() {
            Some(s) => (Some(s.region().clone()), s.local_index()),
            None => (None, 0),
        };
        let tcp = eng.tcp().map(|t| {
            let c = t.config();
            (
                t.local_addr().ip(),
                Creds {
                    secret: c.secret,
                    job: c.job,
                    rank: eng.rank() as u32,
                },
            )
        });
        RmaCtx {
            rank: eng.rank(),
            region,
            slot,
            tcp,
            agent_spin: Duration::from_micros(cfg.rma_agent_spin_us),
            client_spin: Duration::from_micros(cfg.rma_agent_spin_us.max(50)),
            cma_ok: vmf_pal::cma::allow_any_ptracer().is_ok(),
            memfd: cfg.rma_memfd,
            share_create_max: cfg.rma_share_create_max,
        }
    }
}

/// What a member asks for.
pub struct WinSpec<'a> {
    /// The flavor.
    pub flavor: Flavor,
    /// Bytes of this member's memory.
    pub size: usize,
    /// This member's displacement unit.
    pub disp_unit: u32,
    /// `Create`: the program's memory (`size` bytes).
    pub base: *mut u8,
    /// `Shared`: each member's part starts on its own page (MPI's `alloc_shared_noncontig`).
    pub noncontig: bool,
    /// This member's index.
    pub me: usize,
    /// Per member: reached through shared memory (or this member itself).
    pub near: &'a [bool],
    /// Per member: its world rank.
    pub world: &'a [usize],
}

/// An allgather among the members: each gives its bytes, gets everyone's in member order.
pub type Exchange<'a> = dyn FnMut(Vec<u8>) -> Result<Vec<Vec<u8>>, String> + 'a;

/// An allocation from the caller's partition of the region's pool.
pub type PoolAlloc<'a> = dyn FnMut(usize) -> Option<*mut u8> + 'a;

/// A member whose memory is mapped here: what the fast paths need.
#[derive(Clone, Copy, Debug)]
pub struct Direct {
    /// Where the member's window offset 0 is here (mapped from `lo` on).
    pub base: *mut u8,
    /// First byte mapped here: 0, or the first whole page of memory the member shared in place
    /// (`MPI_Win_create` on its own memory, whose partial edge pages are reached by single copy).
    pub lo: u64,
    /// One past the last byte mapped here (the member's size, or the end of its whole pages).
    pub size: u64,
    /// Its control block (accumulate lock).
    pub ctl: *const Ctl,
    /// Its displacement unit.
    pub disp_unit: u32,
}

/// When an operation completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// Already (locally and remotely).
    Now,
    /// When response `seq` from `target`'s agent is in.
    Later {
        /// The target.
        target: usize,
        /// Sequence number on its connection.
        seq: u64,
    },
}

/// What an origin knows of a member.
#[derive(Clone, Debug)]
struct Member {
    size: u64,
    disp_unit: u32,
    agent: Option<SocketAddr>,
    agent_win: u64,
    /// The member's memory mapped here (for `shared_query`).
    mapped: Option<*mut u8>,
}

/// Page-aligned zeroed heap memory.
struct HeapBuf {
    p: *mut u8,
    layout: std::alloc::Layout,
}

impl HeapBuf {
    fn new(len: usize) -> Option<HeapBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        (!p.is_null()).then_some(HeapBuf { p, layout })
    }
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.p, self.layout) };
    }
}

/// A window.
pub struct Window {
    me: usize,
    flavor: Flavor,
    world: Vec<usize>,
    members: Vec<Member>,
    paths: Vec<Option<Target>>,
    /// Per member whose memory is mapped here: (base, size, control block), for the fast paths.
    direct: Vec<Option<Direct>>,
    /// Per member: operations are outstanding at its agent (the fast paths must not overtake them).
    agent_busy: Vec<bool>,
    conns: Vec<Option<Conn>>,
    base: *mut u8,
    size: usize,
    disp_unit: u32,
    _seg: Option<SharedMem>,
    pool_block: Option<*mut u8>,
    _heap: Option<HeapBuf>,
    _heap_ctl: Option<HeapCtl>,
    _peer_maps: Vec<SharedMem>,
    attach: Option<AttachList>,
    /// Dynamic windows: the table peers read (a memfd of this member's), when there are peers.
    attach_table: Option<(SharedMem, AttachTable)>,
    agent: Option<Arc<Agent>>,
    agent_id: u64,
    creds: Option<Creds>,
    client_spin: Duration,
    /// Encoded runs of the last layout sent (reused).
    runs_buf: Vec<u8>,
    /// This member's memory shared in place (`Create`), private again when the window is dropped (last,
    /// after the peers' mappings and the agent registration are gone).
    in_place: Option<InPlace>,
    /// `Create` and attached memory up to this many bytes is shared in place.
    share_max: u64,
    /// Dynamic windows: ranges attached here and shared in place, by address.
    dyn_in_place: HashMap<u64, (InPlace, Entry)>,
    /// Dynamic windows: views of peers' ranges shared in place, by (member, id).
    dyn_maps: HashMap<(usize, u64), SharedMem>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("me", &self.me)
            .field("flavor", &self.flavor)
            .field("size", &self.size)
            .field("routes", &self.routes())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------- encoding

struct Wr(Vec<u8>);
impl Wr {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
}

struct Rd<'a>(&'a [u8], usize);
impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let b = self
            .0
            .get(self.1..self.1 + n)
            .ok_or_else(|| "a window description is truncated".to_string())?;
        self.1 += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        if n > 256 {
            return Err("a window description has a bad address".into());
        }
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "bad address text".into())
    }
}

const DESC_VERSION: u32 = 1;

/// Where a `Create` member's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MemDesc {
    Private,
    Pool { slot: u32, off: u64 },
    Memfd { fd: i32, len: u64, off: u64 },
}

/// Phase 1: what a member publishes.
#[derive(Clone, Debug)]
struct Desc {
    pid: i32,
    kernel: u64,
    flavor: Flavor,
    cma_ok: bool,
    size: u64,
    disp_unit: u32,
    base: u64,
    mem: MemDesc,
    agent: Option<SocketAddr>,
    agent_win: u64,
}

impl Desc {
    fn encode(&self) -> Vec<u8> {
        let mut w = Wr(Vec::with_capacity(96));
        w.u32(DESC_VERSION)
            .u32(self.pid as u32)
            .u64(self.kernel)
            .u8(self.flavor as u8)
            .u8(self.cma_ok as u8)
            .u64(self.size)
            .u32(self.disp_unit)
            .u64(self.base);
        match self.mem {
            MemDesc::Private => {
                w.u8(0);
            }
            MemDesc::Pool { slot, off } => {
                w.u8(1).u32(slot).u64(off);
            }
            MemDesc::Memfd { fd, len, off } => {
                w.u8(2).u32(fd as u32).u64(len).u64(off);
            }
        }
        w.str(&self.agent.map_or(String::new(), |a| a.to_string()))
            .u64(self.agent_win);
        w.0
    }

    fn decode(b: &[u8]) -> Result<Desc, String> {
        let mut r = Rd(b, 0);
        if r.u32()? != DESC_VERSION {
            return Err("members run different versions of vmfabric".into());
        }
        let pid = r.u32()? as i32;
        let kernel = r.u64()?;
        let flavor = Flavor::from_u8(r.u8()?).ok_or("bad window flavor")?;
        let cma_ok = r.u8()? != 0;
        let size = r.u64()?;
        let disp_unit = r.u32()?;
        let base = r.u64()?;
        let mem = match r.u8()? {
            0 => MemDesc::Private,
            1 => MemDesc::Pool {
                slot: r.u32()?,
                off: r.u64()?,
            },
            2 => MemDesc::Memfd {
                fd: r.u32()? as i32,
                len: r.u64()?,
                off: r.u64()?,
            },
            _ => return Err("bad window memory kind".into()),
        };
        let a = r.str()?;
        let agent = if a.is_empty() {
            None
        } else {
            Some(a.parse().map_err(|_| format!("bad agent address {a:?}"))?)
        };
        let agent_win = r.u64()?;
        Ok(Desc {
            pid,
            kernel,
            flavor,
            cma_ok,
            size,
            disp_unit,
            base,
            mem,
            agent,
            agent_win,
        })
    }
}

/// Phase 2: the node segment a leader made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seg {
    None,
    Memfd { pid: i32, fd: i32, len: u64 },
    Pool { slot: u32, off: u64, len: u64 },
}

impl Seg {
    fn encode(&self) -> Vec<u8> {
        let mut w = Wr(Vec::new());
        match *self {
            Seg::None => {
                w.u8(0);
            }
            Seg::Memfd { pid, fd, len } => {
                w.u8(1).u32(pid as u32).u32(fd as u32).u64(len);
            }
            Seg::Pool { slot, off, len } => {
                w.u8(2).u32(slot).u64(off).u64(len);
            }
        }
        w.0
    }

    fn read(r: &mut Rd) -> Result<Seg, String> {
        Ok(match r.u8()? {
            0 => Seg::None,
            1 => Seg::Memfd {
                pid: r.u32()? as i32,
                fd: r.u32()? as i32,
                len: r.u64()?,
            },
            2 => Seg::Pool {
                slot: r.u32()?,
                off: r.u64()?,
                len: r.u64()?,
            },
            _ => return Err("bad node segment kind".into()),
        })
    }
}

/// The node segment's layout: control blocks of the group's members, then (for allocated flavors) their
/// memory. Every group member computes it alike from the phase-1 sizes.
struct SegLayout {
    ctl: Vec<u64>,
    data: Vec<u64>,
    total: u64,
}

fn seg_layout(group: &[usize], descs: &[Desc], flavor: Flavor, noncontig: bool) -> SegLayout {
    let ctl: Vec<u64> = (0..group.len()).map(|i| (i * CTL_SIZE) as u64).collect();
    let mut off = (group.len() * CTL_SIZE) as u64;
    let mut data = Vec::with_capacity(group.len());
    let allocated = matches!(flavor, Flavor::Allocate | Flavor::Shared);
    for &m in group {
        if allocated {
            // Win_allocate: every part on its own page; Win_allocate_shared: contiguous in member order
            // (each part starts where the previous one ends, MPI 4.0 §12.2.3), unless the program asked
            // for noncontiguous parts.
            let align = if flavor == Flavor::Allocate || noncontig {
                4096
            } else {
                1
            };
            off = off.div_ceil(align) * align;
            data.push(off);
            off += descs[m].size;
        } else {
            data.push(0);
        }
    }
    SegLayout {
        ctl,
        data,
        total: off.max(1),
    }
}

/// Share the window's memory `[base, base + size)` in place (see [`vmf_pal::inplace`]) and say where the
/// shared range starts relative to `base`. When no thread of the process but this one (and the agent,
/// held still meanwhile) can write memory, the pages holding the window move whole, edges included, even
/// if other data share them (a window smaller than a page, as benchmarks make); otherwise only the pages
/// that lie entirely inside the window do, and the edges stay private (reached by single copy).
fn share_in_place(base: *mut u8, size: usize, agent: Option<&Agent>) -> Option<(InPlace, i64)> {
    let b = base as usize;
    let e = b.checked_add(size)?;
    let _quiet = agent.map(|a| a.quiesce());
    let whole = (b.div_ceil(4096) * 4096, e / 4096 * 4096);
    let mut tries = vec![whole];
    if alone(agent.is_some()) {
        // Rounded out first; the whole pages only if that fails (an edge page shared already, by the
        // window memory of a neighbouring range).
        tries.insert(0, (b / 4096 * 4096, e.div_ceil(4096) * 4096));
    }
    for (lo, hi) in tries {
        if hi <= lo {
            continue;
        }
        // SAFETY: nobody writes the pages meanwhile: the window's memory is not written while it is
        // being exposed, and other data on the edge pages only when another thread runs (then they
        // stay).
        if let Ok(r) = unsafe { InPlace::share(lo as *mut u8, hi - lo) } {
            return Some((r, lo as i64 - b as i64));
        }
    }
    None
}

fn setup(e: impl Into<String>) -> RmaError {
    RmaError::Setup(e.into())
}

impl Window {
    /// Create a window (collective over the members: every member calls it with the same flavor and an
    /// `exchange` over the same members). `pool` allocates from this member's partition of the region's
    /// pool (used when members of a node group run on different kernels); a block it returns is handed
    /// back by [`Window::take_pool_block`] for the caller to free after the window is gone.
    pub fn create(
        ctx: &RmaCtx,
        spec: &WinSpec,
        exchange: &mut Exchange,
        pool: &mut PoolAlloc,
    ) -> Result<Window, RmaError> {
        let n = spec.near.len();
        if spec.world.len() != n || spec.me >= n || !spec.near[spec.me] {
            return Err(setup("inconsistent window members"));
        }
        let agent = match ctx.tcp {
            Some((ip, creds)) if n > 1 => Some(
                Agent::get_or_start(ip, creds, ctx.agent_spin)
                    .map_err(|e| setup(format!("Unable to start the one-sided agent since {e}")))?,
            ),
            _ => None,
        };
        let agent_id = agent.as_ref().map_or(0, |a| a.new_id());
        // Dynamic windows: the attach table co-resident peers check their single copies against.
        let attach_table = if spec.flavor == Flavor::Dynamic && spec.near.iter().filter(|&&x| x).count() > 1 {
            SharedMem::create("vmf-attach", TABLE_BYTES).ok().map(|m| {
                // SAFETY: a fresh zeroed mapping of TABLE_BYTES: an empty table.
                let t = unsafe { AttachTable::at(m.as_ptr()) };
                (m, t)
            })
        } else {
            None
        };
        let mem = match spec.flavor {
            Flavor::Dynamic => match &attach_table {
                Some((m, _)) => MemDesc::Memfd {
                    fd: m.raw_fd(),
                    len: m.len() as u64,
                    off: 0,
                },
                None => MemDesc::Private,
            },
            Flavor::Create if spec.size > 0 => {
                let pool_at = ctx
                    .region
                    .as_ref()
                    .and_then(|r| r.pool_offset(spec.base, spec.size))
                    .filter(|&(slot, _)| slot == ctx.slot);
                if let Some((slot, off)) = pool_at {
                    MemDesc::Pool { slot, off }
                } else if let Some((fd, len, off)) = crate::alloc::lookup(spec.base, spec.size) {
                    MemDesc::Memfd {
                        fd,
                        len: len as u64,
                        off: off as u64,
                    }
                } else {
                    MemDesc::Private
                }
            }
            _ => MemDesc::Private,
        };
        let mine = Desc {
            pid: std::process::id() as i32,
            kernel: vmf_pal::process::kernel_id(),
            flavor: spec.flavor,
            cma_ok: ctx.cma_ok,
            size: spec.size as u64,
            disp_unit: spec.disp_unit,
            base: spec.base as u64,
            mem,
            agent: agent.as_ref().map(|a| a.addr()),
            agent_win: agent_id,
        };
        // Phase 1.
        let all = exchange(mine.encode()).map_err(setup)?;
        if all.len() != n {
            return Err(setup("the exchange returned the wrong number of members"));
        }
        let descs: Vec<Desc> = all
            .iter()
            .map(|b| Desc::decode(b))
            .collect::<Result<_, _>>()
            .map_err(setup)?;
        if descs.iter().any(|d| d.flavor != spec.flavor) {
            return Err(setup("members created the window with different flavors"));
        }
        let group: Vec<usize> = (0..n).filter(|&m| spec.near[m]).collect();
        let gi = group.iter().position(|&m| m == spec.me).unwrap();
        let lay = seg_layout(&group, &descs, spec.flavor, spec.noncontig);
        // Phase 2: the leader makes the node segment (only when there is someone to share with).
        let mut own_seg: Option<SharedMem> = None;
        let mut pool_block = None;
        let mut seg_out = Seg::None;
        if gi == 0 && group.len() > 1 {
            let same_kernel = group.iter().all(|&m| descs[m].kernel == mine.kernel);
            if same_kernel && ctx.memfd {
                if let Ok(m) = SharedMem::create("vmf-win", lay.total as usize) {
                    seg_out = Seg::Memfd {
                        pid: mine.pid,
                        fd: m.raw_fd(),
                        len: lay.total,
                    };
                    own_seg = Some(m);
                }
            }
            if seg_out == Seg::None {
                if let (Some(r), Some(p)) = (ctx.region.as_ref(), pool(lay.total as usize)) {
                    if let Some((slot, off)) = r.pool_offset(p, lay.total as usize) {
                        // SAFETY: a fresh pool block of `total` bytes: the control blocks start free.
                        unsafe { std::ptr::write_bytes(p, 0, (group.len() * CTL_SIZE).min(lay.total as usize)) };
                        seg_out = Seg::Pool {
                            slot,
                            off,
                            len: lay.total,
                        };
                        pool_block = Some(p);
                    }
                }
            }
        }
        // Also in phase 2: `Create` memory shared in place, when a peer on this kernel could map it.
        let in_place = if spec.flavor == Flavor::Create
            && mine.mem == MemDesc::Private
            && ctx.memfd
            && spec.size > 0
            && spec.size as u64 <= ctx.share_create_max
            && group.iter().any(|&m| m != spec.me && descs[m].kernel == mine.kernel)
        {
            share_in_place(spec.base, spec.size, agent.as_deref())
        } else {
            None
        };
        let mut msg = Wr(seg_out.encode());
        match &in_place {
            Some((ip, rel)) => {
                msg.u8(1).u32(ip.raw_fd() as u32).u64(*rel as u64).u64(ip.len() as u64);
            }
            None => {
                msg.u8(0);
            }
        }
        let in_place = in_place.map(|x| x.0);
        let segs = exchange(msg.0).map_err(setup)?;
        if segs.len() != n {
            return Err(setup("the exchange returned the wrong number of members"));
        }
        // Per member: (memfd, where its mapping starts relative to the window's base, length).
        let mut shared_in_place: Vec<Option<(i32, i64, u64)>> = vec![None; n];
        let mut seg = Seg::None;
        for &m in &group {
            let mut r = Rd(&segs[m], 0);
            let sg = Seg::read(&mut r).map_err(setup)?;
            if m == group[0] && group.len() > 1 {
                seg = sg;
            }
            if r.u8().map_err(setup)? == 1 {
                let fd = r.u32().map_err(setup)? as i32;
                let rel = r.u64().map_err(setup)? as i64;
                let len = r.u64().map_err(setup)?;
                // Whole pages overlapping the member's window (starting at most a page before it).
                let ok = len % 4096 == 0
                    && len > 0
                    && len <= (1 << 46)
                    && rel > -4096
                    && rel < descs[m].size as i64;
                if ok && m != spec.me {
                    shared_in_place[m] = Some((fd, rel, len));
                }
            }
        }
        // Phase 3: map it.
        let mut mapped_seg: Option<SharedMem> = None;
        let seg_ptr: Option<*mut u8> = match seg {
            Seg::None => None,
            Seg::Memfd { pid, fd, len } => {
                if len != lay.total {
                    None
                } else if let Some(m) = own_seg.take() {
                    let p = m.as_ptr();
                    mapped_seg = Some(m);
                    Some(p)
                } else {
                    match SharedMem::open_peer(pid, fd, len as usize) {
                        Ok(m) => {
                            let p = m.as_ptr();
                            mapped_seg = Some(m);
                            Some(p)
                        }
                        Err(_) => None,
                    }
                }
            }
            Seg::Pool { slot, off, len } => {
                if len != lay.total {
                    None
                } else {
                    ctx.region
                        .as_ref()
                        .and_then(|r| r.pool_ptr(slot, off, len).ok())
                }
            }
        };
        let oks = exchange(vec![seg_ptr.is_some() as u8]).map_err(setup)?;
        let group_ok = seg != Seg::None
            && group
                .iter()
                .all(|&m| oks.get(m).is_some_and(|b| b.first() == Some(&1)));
        let seg_ptr = if group_ok { seg_ptr } else { None };
        if !group_ok {
            mapped_seg = None;
        }
        if spec.flavor == Flavor::Shared && group.len() != n {
            return Err(RmaError::Shared(
                "MPI_Win_allocate_shared needs every member to share memory with the others, and some run on other hosts".into(),
            ));
        }
        if spec.flavor == Flavor::Shared && n > 1 && seg_ptr.is_none() {
            return Err(RmaError::Shared(
                "no shared segment could be made or mapped by every member (memfd refused and the pool too small: raise VMF_SHM_POOL)".into(),
            ));
        }
        // This member's memory and control block.
        let mut heap = None;
        let mut heap_ctl = None;
        let (base, my_ctl) = match seg_ptr {
            Some(sp) => {
                // SAFETY: offsets inside the segment of lay.total bytes.
                let ctl = unsafe { sp.add(lay.ctl[gi] as usize) };
                let b = match spec.flavor {
                    Flavor::Allocate | Flavor::Shared => unsafe { sp.add(lay.data[gi] as usize) },
                    Flavor::Create => spec.base,
                    Flavor::Dynamic => std::ptr::null_mut(),
                };
                (b, ctl as *const Ctl)
            }
            None => {
                let c = HeapCtl::new();
                let cp = c.ptr() as *const Ctl;
                heap_ctl = Some(c);
                let b = match spec.flavor {
                    Flavor::Allocate | Flavor::Shared => {
                        let h = HeapBuf::new(spec.size).ok_or(RmaError::NoMem(spec.size))?;
                        let p = h.p;
                        heap = Some(h);
                        p
                    }
                    Flavor::Create => spec.base,
                    Flavor::Dynamic => std::ptr::null_mut(),
                };
                (b, cp)
            }
        };
        // Every member's memory kind, decided alike by all.
        let shared_mem = |m: usize| -> bool {
            match spec.flavor {
                Flavor::Allocate | Flavor::Shared => group_ok && spec.near[m],
                Flavor::Create => !matches!(descs[m].mem, MemDesc::Private),
                Flavor::Dynamic => false,
            }
        };
        let attach = (spec.flavor == Flavor::Dynamic).then(AttachList::new);
        // Routes.
        let mut peer_maps = Vec::new();
        let mut members = Vec::with_capacity(n);
        let mut paths: Vec<Option<Target>> = Vec::with_capacity(n);
        for m in 0..n {
            let d = &descs[m];
            let mut mapped: Option<*mut u8> = None;
            let ctl_here: Option<*const Ctl> = if m == spec.me {
                Some(my_ctl)
            } else if let (Some(sp), Some(k)) = (seg_ptr, group.iter().position(|&g| g == m)) {
                // SAFETY: inside the segment.
                Some(unsafe { sp.add(lay.ctl[k] as usize) } as *const Ctl)
            } else {
                None
            };
            let path = if m == spec.me {
                mapped = Some(base);
                Some(Target {
                    mem: match &attach {
                        Some(l) => Mem::DynDirect(l.clone()),
                        None => Mem::Direct {
                            base,
                            size: spec.size as u64,
                        },
                    },
                    ctl: ctl_here,
                })
            } else if spec.near[m] {
                // Map the member's memory when it is shared.
                let k = group.iter().position(|&g| g == m).unwrap();
                if shared_mem(m) {
                    mapped = match (spec.flavor, d.mem) {
                        (Flavor::Allocate | Flavor::Shared, _) => {
                            // SAFETY: inside the segment.
                            seg_ptr.map(|sp| unsafe { sp.add(lay.data[k] as usize) })
                        }
                        (_, MemDesc::Pool { slot, off }) => ctx
                            .region
                            .as_ref()
                            .and_then(|r| r.pool_ptr(slot, off, d.size).ok()),
                        (_, MemDesc::Memfd { fd, len, off }) => {
                            match SharedMem::open_peer(d.pid, fd, len as usize) {
                                Ok(sm) if off.checked_add(d.size).is_some_and(|e| e <= sm.len() as u64) => {
                                    // SAFETY: inside the mapping (checked).
                                    let p = unsafe { sm.as_ptr().add(off as usize) };
                                    peer_maps.push(sm);
                                    Some(p)
                                }
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                }
                let cma = ctx.cma_ok && d.cma_ok;
                match (mapped, spec.flavor) {
                    (Some(p), _) => Some(Target {
                        mem: Mem::Direct { base: p, size: d.size },
                        ctl: ctl_here,
                    }),
                    (None, Flavor::Dynamic) if cma && d.kernel == mine.kernel => match d.mem {
                        // Single copies checked against the member's published attach table.
                        MemDesc::Memfd { fd, len, .. } if len as usize >= TABLE_BYTES => {
                            match SharedMem::open_peer(d.pid, fd, TABLE_BYTES) {
                                Ok(sm) => {
                                    // SAFETY: a mapping of TABLE_BYTES (checked by open_peer).
                                    let table = unsafe { AttachTable::at(sm.as_ptr()) };
                                    peer_maps.push(sm);
                                    Some(Target {
                                        mem: Mem::DynCma { pid: d.pid, table },
                                        ctl: ctl_here,
                                    })
                                }
                                Err(_) => None,
                            }
                        }
                        _ => None,
                    },
                    (None, Flavor::Create) if cma && d.kernel == mine.kernel && shared_in_place[m].is_some() => {
                        let (fd, rel, len) = shared_in_place[m].unwrap();
                        let (pid, base, size) = (d.pid, d.base, d.size);
                        // The window's bytes [lo, hi) lie in the mapping (rel: its start, relative to
                        // the window; checked above to overlap the window).
                        let lo = rel.max(0) as u64;
                        let hi = (rel + len as i64).clamp(0, size as i64) as u64;
                        let mem = match SharedMem::open_peer(pid, fd, len as usize) {
                            Ok(sm) if lo < hi => {
                                let here = sm.as_ptr().wrapping_offset(-rel as isize);
                                peer_maps.push(sm);
                                Mem::Split {
                                    here,
                                    lo,
                                    hi,
                                    pid,
                                    base,
                                    size,
                                }
                            }
                            _ => Mem::Cma { pid, base, size },
                        };
                        Some(Target { mem, ctl: ctl_here })
                    }
                    (None, _) if cma && d.kernel == mine.kernel => Some(Target {
                        mem: Mem::Cma {
                            pid: d.pid,
                            base: match spec.flavor {
                                Flavor::Create => d.base,
                                // Allocated but private (no segment): the member's heap address, which
                                // only it knows; reach it through its agent.
                                _ => 0,
                            },
                            size: d.size,
                        },
                        ctl: ctl_here,
                    })
                    .filter(|_| spec.flavor == Flavor::Create),
                    _ => None,
                }
            } else {
                None
            };
            // Anything a local path cannot do goes to the member's agent: there must be one.
            let needs_agent = m != spec.me
                && path
                    .as_ref()
                    .is_none_or(|t| !t.can_rmw() || t.ctl.is_none());
            if needs_agent && d.agent.is_none() {
                return Err(RmaError::Unreachable {
                    target: m,
                    why: "it shares no memory with this rank that both can map, and no TCP agent serves it (VMF_TCP=0?)".into(),
                });
            }
            members.push(Member {
                size: d.size,
                disp_unit: d.disp_unit,
                agent: d.agent,
                agent_win: d.agent_win,
                mapped,
            });
            paths.push(path);
        }
        let direct = paths
            .iter()
            .zip(&members)
            .map(|(p, m)| match p {
                Some(Target {
                    mem: Mem::Direct { base, size },
                    ctl: Some(c),
                }) => Some(Direct {
                    base: *base,
                    lo: 0,
                    size: *size,
                    ctl: *c,
                    disp_unit: m.disp_unit,
                }),
                Some(Target {
                    mem: Mem::Split { here, lo, hi, .. },
                    ctl: Some(c),
                }) => Some(Direct {
                    base: *here,
                    lo: *lo,
                    size: *hi,
                    ctl: *c,
                    disp_unit: m.disp_unit,
                }),
                _ => None,
            })
            .collect();
        let win = Window {
            direct,
            agent_busy: vec![false; n],
            me: spec.me,
            flavor: spec.flavor,
            world: spec.world.to_vec(),
            members,
            conns: (0..n).map(|_| None).collect(),
            base,
            size: spec.size,
            disp_unit: spec.disp_unit,
            _seg: mapped_seg,
            pool_block,
            _heap: heap,
            _heap_ctl: heap_ctl,
            _peer_maps: peer_maps,
            attach,
            attach_table,
            agent: agent.clone(),
            agent_id,
            creds: ctx.tcp.map(|t| t.1),
            client_spin: ctx.client_spin,
            runs_buf: Vec::new(),
            paths,
            in_place,
            share_max: if ctx.memfd && group.iter().any(|&m| m != spec.me && descs[m].kernel == mine.kernel) {
                ctx.share_create_max
            } else {
                0
            },
            dyn_in_place: HashMap::new(),
            dyn_maps: HashMap::new(),
        };
        if let Some(a) = &agent {
            a.register(agent_id, win.paths[spec.me].clone().expect("own path"));
        }
        Ok(win)
    }

    // ------------------------------------------------------------------------------------------ queries

    /// This member's index.
    pub fn rank(&self) -> usize {
        self.me
    }
    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }
    /// The flavor.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }
    /// This member's memory (null for dynamic windows).
    pub fn base(&self) -> *mut u8 {
        self.base
    }
    /// Bytes of this member's memory.
    pub fn local_size(&self) -> usize {
        self.size
    }
    /// This member's displacement unit.
    pub fn disp_unit(&self) -> u32 {
        self.disp_unit
    }
    /// Bytes and displacement unit of member `m`.
    pub fn member(&self, m: usize) -> Option<(u64, u32)> {
        self.members.get(m).map(|x| (x.size, x.disp_unit))
    }
    /// The fast path to member `m`: its memory and control block when they are mapped here and no
    /// operation to it is outstanding at its agent (so a load or store now cannot overtake one).
    #[inline]
    pub fn direct(&self, m: usize) -> Option<&Direct> {
        match self.direct.get(m) {
            Some(Some(d)) if !self.agent_busy[m] => Some(d),
            _ => None,
        }
    }

    /// Member `m`'s memory mapped in this process (shared memory), if it is.
    pub fn mapped(&self, m: usize) -> Option<*mut u8> {
        self.members.get(m).and_then(|x| x.mapped)
    }
    /// How each member is reached: "self", "load/store", "single-copy" or "agent".
    pub fn routes(&self) -> Vec<&'static str> {
        (0..self.members.len()).map(|m| self.route_name(m)).collect()
    }
    fn route_name(&self, m: usize) -> &'static str {
        match &self.paths[m] {
            _ if m == self.me => "self",
            Some(Target {
                mem: Mem::Direct { .. },
                ..
            }) => "load/store",
            Some(Target {
                mem: Mem::Split { .. },
                ..
            }) => "in place",
            Some(_) => "single-copy",
            None => "agent",
        }
    }
    /// The pool block this window's node segment lives in (to be freed by the caller once the window is
    /// dropped), taken once.
    pub fn take_pool_block(&mut self) -> Option<*mut u8> {
        self.pool_block.take()
    }

    // ------------------------------------------------------------------------------------------ helpers

    fn check_target(&self, t: usize) -> Result<(), RmaError> {
        if t < self.members.len() {
            Ok(())
        } else {
            Err(RmaError::Bad {
                target: t,
                what: format!("no member {t} in a window of {}", self.members.len()),
            })
        }
    }

    /// Range check at the origin (all flavors but dynamic, whose ranges only the target knows).
    fn check_range(&self, t: usize, disp: u64, layout: &Layout) -> Result<(), RmaError> {
        if self.flavor == Flavor::Dynamic {
            return Ok(());
        }
        if let Some((lo, hi)) = layout.span() {
            let size = self.members[t].size as i128;
            let (a, b) = (disp as i128 + lo, disp as i128 + hi);
            if a < 0 || b > size {
                return Err(RmaError::Range {
                    target: t,
                    lo: a,
                    hi: b,
                    size: size as u64,
                });
            }
        }
        Ok(())
    }

    fn status(&self, t: usize, st: Status) -> Result<(), RmaError> {
        match st {
            Status::Ok => Ok(()),
            Status::Range if self.flavor == Flavor::Dynamic => Err(RmaError::NotAttached { target: t }),
            Status::Range => Err(RmaError::Range {
                target: t,
                lo: 0,
                hi: 0,
                size: self.members[t].size,
            }),
            s => Err(RmaError::Remote { target: t, status: s }),
        }
    }

    fn conn(&mut self, t: usize) -> Result<&mut Conn, RmaError> {
        if self.conns[t].is_none() {
            let addr = self.members[t].agent.ok_or_else(|| RmaError::Unreachable {
                target: t,
                why: "no agent serves it".into(),
            })?;
            let creds = self.creds.ok_or_else(|| RmaError::Unreachable {
                target: t,
                why: "this rank has no TCP".into(),
            })?;
            let s = crate::agent::connect(addr, &creds, self.world[t] as u32).map_err(|e| {
                RmaError::Unreachable {
                    target: t,
                    why: format!("connecting to its agent at {addr} failed: {e}"),
                }
            })?;
            self.conns[t] = Some(Conn::new(s, self.client_spin));
        }
        let c = self.conns[t].as_mut().unwrap();
        if let Some(b) = &c.broken {
            return Err(RmaError::Unreachable {
                target: t,
                why: b.clone(),
            });
        }
        Ok(c)
    }

    /// Before a local operation on `t`: agent operations to it must be done first (ordering).
    fn settle(&mut self, t: usize) -> Result<(), RmaError> {
        if self.conns[t].as_ref().is_some_and(|c| c.done < c.issued) {
            self.flush(t)?;
        }
        Ok(())
    }

    unsafe fn agent_op(
        &mut self,
        t: usize,
        mut h: ReqHeader,
        layout: &Layout,
        parts: &[&[u8]],
        dest: *mut u8,
        cap: usize,
    ) -> Result<Done, RmaError> {
        h.win = self.members[t].agent_win;
        h.nruns = layout.runs.len() as u32;
        h.count = layout.count as u64;
        h.extent = layout.extent as i64;
        h.data_len = parts.iter().map(|p| p.len() as u64).sum();
        let mut runs = std::mem::take(&mut self.runs_buf);
        runs.clear();
        layout.encode_runs(&mut runs);
        let r = self.conn(t).map(|c| c.send(&h, &runs, parts, dest, cap, false));
        self.runs_buf = runs;
        let seq = r?;
        self.agent_busy[t] = true;
        Ok(Done::Later { target: t, seq })
    }

    // ------------------------------------------------------------------------------------------ operations

    /// Write `layout.bytes()` packed bytes from `data` into member `t` at byte displacement `disp`. The
    /// data is consumed before returning (local completion); remote completion by [`Window::flush`].
    ///
    /// # Safety
    /// `data` readable for `layout.bytes()` bytes.
    pub unsafe fn put(&mut self, t: usize, disp: u64, layout: &Layout, data: *const u8) -> Result<Done, RmaError> {
        self.check_target(t)?;
        self.check_range(t, disp, layout)?;
        if self.paths[t].is_some() {
            self.settle(t)?;
            let st = match self.dyn_view(t, disp, layout) {
                Some(v) => v.put(disp, layout, data),
                None => self.paths[t].as_ref().unwrap().put(disp, layout, data),
            };
            return self.status(t, st).map(|()| Done::Now);
        }
        let d = std::slice::from_raw_parts(data, layout.bytes());
        let h = ReqHeader {
            kind: Kind::Put as u8,
            disp,
            ..Default::default()
        };
        self.agent_op(t, h, layout, &[d], std::ptr::null_mut(), 0)
    }

    /// Read member `t`'s layout at `disp` into the packed buffer `out`.
    ///
    /// # Safety
    /// `out` writable for `layout.bytes()` bytes until the operation completes.
    pub unsafe fn get(&mut self, t: usize, disp: u64, layout: &Layout, out: *mut u8) -> Result<Done, RmaError> {
        self.check_target(t)?;
        self.check_range(t, disp, layout)?;
        if self.paths[t].is_some() {
            self.settle(t)?;
            let st = match self.dyn_view(t, disp, layout) {
                Some(v) => v.get(disp, layout, out),
                None => self.paths[t].as_ref().unwrap().get(disp, layout, out),
            };
            return self.status(t, st).map(|()| Done::Now);
        }
        let h = ReqHeader {
            kind: Kind::Get as u8,
            disp,
            ..Default::default()
        };
        self.agent_op(t, h, layout, &[], out, layout.bytes())
    }

    /// Accumulate packed `data` into member `t`'s layout at `disp` with `op` on `elem` elements; with
    /// `result`, the old contents come back there (get-accumulate, fetch-and-op).
    ///
    /// # Safety
    /// `data` readable and `result` writable for `layout.bytes()` bytes until the operation completes.
    #[allow(clippy::too_many_arguments)] // MPI_Get_accumulate's arguments
    pub unsafe fn accumulate(
        &mut self,
        t: usize,
        disp: u64,
        layout: &Layout,
        elem: Elem,
        op: ROp,
        data: *const u8,
        result: Option<*mut u8>,
    ) -> Result<Done, RmaError> {
        self.check_target(t)?;
        self.check_range(t, disp, layout)?;
        if !crate::reduce::allowed(op, elem) {
            return Err(RmaError::Bad {
                target: t,
                what: format!("{op:?} is not defined on {elem:?}"),
            });
        }
        if self.paths[t].as_ref().is_some_and(|p| p.can_rmw()) {
            self.settle(t)?;
            let st = match self.dyn_view(t, disp, layout) {
                Some(v) => v.acc(disp, layout, elem, op, data, result),
                None => self.paths[t].as_ref().unwrap().acc(disp, layout, elem, op, data, result),
            };
            return self.status(t, st).map(|()| Done::Now);
        }
        let bytes = layout.bytes();
        let d = std::slice::from_raw_parts(data, bytes);
        let h = ReqHeader {
            kind: if result.is_some() { Kind::GetAcc } else { Kind::Acc } as u8,
            elem: elem as u8,
            op: op as u8,
            disp,
            ..Default::default()
        };
        let (dest, cap) = result.map_or((std::ptr::null_mut(), 0), |r| (r, bytes));
        self.agent_op(t, h, layout, &[d], dest, cap)
    }

    /// Compare-and-swap one `elem` at `disp` of member `t`; the old value goes to `result`.
    ///
    /// # Safety
    /// `compare`, `new` readable and `result` writable for one element until the operation completes.
    pub unsafe fn compare_and_swap(
        &mut self,
        t: usize,
        disp: u64,
        elem: Elem,
        compare: *const u8,
        new: *const u8,
        result: *mut u8,
    ) -> Result<Done, RmaError> {
        self.check_target(t)?;
        let s = elem.packed_size();
        let run = crate::layout::contig_run(s);
        let layout = Layout::contig(&run);
        self.check_range(t, disp, &layout)?;
        if self.paths[t].as_ref().is_some_and(|p| p.can_rmw()) {
            self.settle(t)?;
            let st = match self.dyn_view(t, disp, &layout) {
                Some(v) => v.cas(disp, elem, compare, new, result),
                None => self.paths[t].as_ref().unwrap().cas(disp, elem, compare, new, result),
            };
            return self.status(t, st).map(|()| Done::Now);
        }
        let c = std::slice::from_raw_parts(compare, s);
        let nw = std::slice::from_raw_parts(new, s);
        let h = ReqHeader {
            kind: Kind::Cas as u8,
            elem: elem as u8,
            disp,
            ..Default::default()
        };
        self.agent_op(t, h, &layout, &[c, nw], result, s)
    }

    /// True once `d` has completed (drives the connection).
    pub fn test(&mut self, d: Done) -> Result<bool, RmaError> {
        match d {
            Done::Now => Ok(true),
            Done::Later { target, seq } => {
                let Some(c) = self.conns[target].as_mut() else {
                    return Ok(true);
                };
                c.pump();
                if let Some(b) = &c.broken {
                    return Err(RmaError::Unreachable {
                        target,
                        why: b.clone(),
                    });
                }
                if c.done >= seq {
                    if c.done >= c.issued {
                        self.agent_busy[target] = false;
                    }
                    if let Some(st) = c.error.take() {
                        return self.status(target, st).map(|()| true);
                    }
                    return Ok(true);
                }
                Ok(false)
            }
        }
    }

    /// True if nothing to member `t` is outstanding at its agent (a flush is then only a fence).
    #[inline]
    pub fn agent_idle(&self, t: usize) -> bool {
        !self.agent_busy.get(t).copied().unwrap_or(true)
    }

    /// Complete every operation to member `t` at the target (remote completion).
    #[inline]
    pub fn flush(&mut self, t: usize) -> Result<(), RmaError> {
        self.check_target(t)?;
        if self.conns[t].is_some() {
            return self.flush_agent(t);
        }
        full_fence();
        Ok(())
    }

    #[cold]
    fn flush_agent(&mut self, t: usize) -> Result<(), RmaError> {
        let c = self.conns[t].as_mut().unwrap();
        if c.done < c.issued {
            let seq = c.issued;
            c.wait(seq).map_err(|why| RmaError::Unreachable { target: t, why })?;
        }
        self.agent_busy[t] = false;
        if let Some(st) = c.error.take() {
            return self.status(t, st);
        }
        full_fence();
        Ok(())
    }

    /// [`Window::flush`] for every member.
    pub fn flush_all(&mut self) -> Result<(), RmaError> {
        let mut first = Ok(());
        for t in 0..self.members.len() {
            if self.conns[t].is_some() {
                let r = self.flush(t);
                if first.is_ok() {
                    first = r;
                }
            }
        }
        full_fence();
        first
    }

    /// True if operations to member `t` are still outstanding at its agent.
    pub fn pending(&self, t: usize) -> bool {
        self.conns
            .get(t)
            .and_then(|c| c.as_ref())
            .is_some_and(|c| c.done < c.issued)
    }

    /// Try once to take member `t`'s passive-target lock (`excl`: exclusive).
    pub fn try_lock(&mut self, t: usize, excl: bool) -> Result<bool, RmaError> {
        self.check_target(t)?;
        if let Some(p) = self.paths[t].as_ref().filter(|p| p.ctl.is_some()) {
            return Ok(p.try_lock(excl) == Status::Ok);
        }
        let st = self.agent_sync(t, Kind::Lock, excl)?;
        match st {
            Status::Ok => Ok(true),
            Status::Busy => Ok(false),
            s => self.status(t, s).map(|()| false),
        }
    }

    /// Release member `t`'s passive-target lock (after [`Window::flush`]).
    pub fn unlock(&mut self, t: usize, excl: bool) -> Result<(), RmaError> {
        self.check_target(t)?;
        if let Some(p) = self.paths[t].as_ref().filter(|p| p.ctl.is_some()) {
            p.unlock(excl);
            return Ok(());
        }
        let st = self.agent_sync(t, Kind::Unlock, excl)?;
        self.status(t, st)
    }

    fn agent_sync(&mut self, t: usize, kind: Kind, excl: bool) -> Result<Status, RmaError> {
        let h = ReqHeader {
            kind: kind as u8,
            flags: if excl { FLAG_EXCL } else { 0 },
            win: self.members[t].agent_win,
            ..Default::default()
        };
        let c = self.conn(t)?;
        // SAFETY: no response data is expected.
        let seq = unsafe { c.send(&h, &[], &[], std::ptr::null_mut(), 0, true) };
        c.wait(seq).map_err(|why| RmaError::Unreachable { target: t, why })?;
        Ok(c.take_status(seq).unwrap_or(Status::Bad))
    }

    // ------------------------------------------------------------------------------------------ dynamic

    /// Attach `len` bytes at `base` to this member's part of a dynamic window.
    pub fn attach(&mut self, base: *mut u8, len: usize) -> Result<(), RmaError> {
        let Some(list) = &self.attach else {
            return Err(RmaError::Flavor("attach needs a dynamic window".into()));
        };
        list.attach(base as u64, len as u64).map_err(RmaError::Attach)?;
        if self.attach_table.is_some() && self.share_max >= len as u64 && len > 0 {
            if let Some((ip, rel)) = share_in_place(base, len, self.agent.as_deref()) {
                let e = Entry {
                    addr: base as u64,
                    len: len as u64,
                    id: NEXT_SHARE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    fd: ip.raw_fd() as u64,
                    rel,
                    map_len: ip.len() as u64,
                    ino: vmf_pal::shmem::inode(ip.raw_fd()).unwrap_or(0),
                };
                self.dyn_in_place.insert(base as u64, (ip, e));
            }
        }
        self.publish_attached();
        Ok(())
    }

    /// Publish the attached ranges to co-resident peers (those shared in place with their mappings).
    fn publish_attached(&self) {
        let (Some((_, t)), Some(list)) = (&self.attach_table, &self.attach) else {
            return;
        };
        let entries: Vec<Entry> = list
            .ranges()
            .into_iter()
            .map(|(addr, len)| match self.dyn_in_place.get(&addr) {
                Some((_, e)) if e.len == len => *e,
                _ => Entry {
                    addr,
                    len,
                    ..Default::default()
                },
            })
            .collect();
        t.publish(&entries);
    }

    /// A view of dynamic-window member `t` for the operation at `disp` when the memory it reaches is
    /// shared in place (mapped here on first use): loads and stores instead of single copies.
    fn dyn_view(&mut self, t: usize, disp: u64, layout: &Layout) -> Option<Target> {
        let Some(Target {
            mem: Mem::DynCma { pid, table },
            ctl,
        }) = &self.paths[t]
        else {
            return None;
        };
        let (pid, ctl) = (*pid, *ctl);
        let (lo, hi) = layout.span()?;
        let a = u64::try_from(disp as i128 + lo).ok()?;
        let b = u64::try_from(disp as i128 + hi).ok()?;
        let e = table.shared(a, b.checked_sub(a)?)?;
        let key = (t, e.id);
        if !self.dyn_maps.contains_key(&key) {
            // Views of ranges detached since stay mapped until here (or the window's end).
            if self.dyn_maps.len() >= 256 {
                self.dyn_maps.clear();
            }
            let sm = SharedMem::open_peer(pid, e.fd as i32, e.map_len as usize).ok()?;
            if vmf_pal::shmem::inode(sm.raw_fd()).ok()? != e.ino {
                return None;
            }
            self.dyn_maps.insert(key, sm);
        }
        let start = (e.addr as i64).wrapping_add(e.rel) as u64;
        let here = self.dyn_maps[&key].as_ptr().wrapping_sub(start as usize);
        Some(Target {
            mem: Mem::Direct {
                base: here,
                size: start + e.map_len,
            },
            ctl,
        })
    }

    /// Detach the range attached at `base`.
    pub fn detach(&mut self, base: *const u8) -> Result<(), RmaError> {
        let Some(list) = &self.attach else {
            return Err(RmaError::Flavor("detach needs a dynamic window".into()));
        };
        list.detach(base as u64).map_err(RmaError::Attach)?;
        let ip = self.dyn_in_place.remove(&(base as u64));
        self.publish_attached();
        if let Some((ip, _)) = ip {
            self.unshare(ip);
        }
        Ok(())
    }

    /// The attached ranges of this member (dynamic windows).
    pub fn attached(&self) -> Vec<(u64, u64)> {
        self.attach.as_ref().map_or(Vec::new(), |l| l.ranges())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(a) = &self.agent {
            a.unregister(self.agent_id);
        }
        // Memory shared in place becomes private again while nothing else can write to it (see
        // `vmf_pal::inplace`); the peers unmap their views of it in their own MPI_Win_free.
        self.dyn_maps.clear();
        let shared: Vec<InPlace> = self
            .in_place
            .take()
            .into_iter()
            .chain(self.dyn_in_place.drain().map(|(_, (ip, _))| ip))
            .collect();
        for ip in shared {
            self.unshare(ip);
        }
    }
}

impl Window {
    /// Make memory shared in place private again (while nothing else can write to it).
    fn unshare(&self, mut ip: InPlace) {
        let _quiet = self.agent.as_ref().map(|a| a.quiesce());
        ip.set_restore(alone(self.agent.is_some()));
        drop(ip);
    }
}

/// Ids of ranges of dynamic windows shared in place (unique in the process).
static NEXT_SHARE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// True when no thread of this process but the caller (and the agent, if `agent`) can write memory. The
/// copier's helper thread (`vmf_bb::copier`) does not count once its last copy is settled: between copies
/// it touches only its own statics and stack.
fn alone(agent: bool) -> bool {
    vmf_bb::copier::settle();
    let threads = std::fs::read_dir("/proc/self/task").map_or(usize::MAX, |d| d.count());
    threads <= 1 + usize::from(agent) + usize::from(vmf_bb::copier::helper_exists())
}

/// A full memory barrier: stores before it are visible to every processor before loads after it
/// (remote completion on shared memory). A locked no-op on a stack word, which x86 orders like `mfence`
/// at a fraction of its cost.
///
/// Copies of puts and gets that the copier's helper thread may still be finishing
/// (`vmf_bb::copier::copy_deferred`) are completed first: every flush, unlock, fence and complete ends
/// with this barrier.
#[inline(always)]
pub fn full_fence() {
    vmf_bb::copier::settle();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a locked OR of zero into our own stack slot: no effect but the ordering.
    unsafe {
        std::arch::asm!("lock or dword ptr [rsp], 0", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// A whole-window run for byte ranges.
pub fn bytes_run(len: usize) -> [Run; 1] {
    crate::layout::contig_run(len)
}
