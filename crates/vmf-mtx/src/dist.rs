//! Memory nodes on other hosts: Sinfonia's two-phase commit over vmfabric's one-sided agents.
//!
//! A [`DistStore`] spreads memory nodes over host groups: the nodes of the group this process belongs to
//! live in a [`Store`] on this host (committed with atomics, as everywhere else), those of other groups
//! in their hosts' stores, reached through the agent of one rank there (the group's *home*), which runs
//! a [`StoreService`]. A [`DistMtx`] addresses nodes by their global index and [`DistMtx::commit`] runs:
//!
//! - items on this host only: the ordinary commit, no message;
//! - items on one other host only: one message, prepared and committed there in one step (one round
//!   trip);
//! - otherwise the two-phase commit: the local part is prepared first (locks, compares, redo log; in
//!   `Blocking` mode it may wait for local locks, holding nothing remote yet), then every remote part is
//!   prepared in parallel, with try-locks only — a participant never waits, so two coordinators can never
//!   wait for each other; every vote yes commits (the local part first: that is the commit point, then a
//!   COMMIT message to each participant, not waited for: the participant's locks keep everyone else off
//!   the items until it has applied the writes), any other vote aborts everywhere.
//!
//! A `Blocking` commit whose participants refused a lock retries with randomised exponential backoff;
//! past [`crate::STARVE_AFTER`] its prepares are *urgent*: they raise the participants' turnstiles, so new
//! commits there let it through first (no commit starves).
//!
//! **Failures.** A participant whose coordinator's connection closes with a prepared transaction aborts
//! it (the coordinator died before its decision reached that participant). A coordinator that loses a
//! participant before the decision aborts everywhere and returns an error. The one case left open: a
//! coordinator killed between its commit point and the sending of its COMMIT messages (one store and one
//! `sendmsg` per participant) leaves its own host's part committed and those participants aborted;
//! closing it needs a decision record the other hosts can read (Sinfonia's recovery coordinator).
//!
//! **Wire format** (service operations [`OP_PREPARE`], [`OP_COMMIT`], [`OP_ABORT`]; little-endian,
//! validated by the participant): PREPARE = `txid u64, flags u32, items u32`, then per item `kind u8,
//! 3 zero bytes, node u32, offset u64, len u64` and, for compare and write items, its `len` bytes. The
//! answer: `vote u32, failed u32`, then the read items' bytes in order (when the vote is yes or a compare
//! failed). COMMIT and ABORT carry `txid u64` and are answered with no bytes.
use crate::{Error, Mode, Mtx, Outcome, Result, Store, STARVE_AFTER};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vmf_rma::agent::{Creds, Service};
use vmf_rma::exec::Status;
use vmf_rma::service::ServiceClient;

/// Service operation: prepare (or, with [`F_ONE_PHASE`], commit at once).
pub const OP_PREPARE: u8 = 1;
/// Service operation: commit a prepared transaction.
pub const OP_COMMIT: u8 = 2;
/// Service operation: abort a prepared transaction.
pub const OP_ABORT: u8 = 3;
/// Prepare flag: commit in the same step when the vote is yes (the only participant).
pub const F_ONE_PHASE: u32 = 1;
/// Prepare flag: raise the store's turnstile (a starving coordinator).
pub const F_URGENT: u32 = 2;

const K_COMPARE: u8 = 1;
const K_READ: u8 = 2;
const K_WRITE: u8 = 3;
const ITEM_HDR: usize = 24;
const PREP_HDR: usize = 16;
/// Votes.
const V_YES: u32 = 0;
const V_COMPARE: u32 = 1;
const V_LOCK: u32 = 2;
/// How long a participant retries an urgent prepare whose locks are held.
const URGENT_TRIES: Duration = Duration::from_micros(200);
/// Most items of one remote part (bounded so that a bad peer cannot make the participant allocate much).
const MAX_ITEMS: usize = 1 << 16;

// ------------------------------------------------------------------------------------------ participant

/// The participant: serves prepare, commit and abort for one store on behalf of remote coordinators
/// (registered with this process's one-sided agent by the store's home rank).
pub struct StoreService {
    /// An attachment to the store that the prepared transactions' own attachments are made from.
    base: Store,
    spare: Mutex<Vec<Store>>,
    prepared: Mutex<HashMap<(u64, u64), (Store, Mtx)>>,
    /// Most transactions prepared at once (bounded by the store's slots).
    limit: usize,
}

impl StoreService {
    /// Serve `base` (an attachment of its own: it holds a slot). `limit`: most prepared transactions at
    /// once, beyond which prepares vote "lock failed" (the coordinator retries).
    pub fn new(base: Store, limit: usize) -> StoreService {
        StoreService {
            base,
            spare: Mutex::new(Vec::new()),
            prepared: Mutex::new(HashMap::new()),
            limit: limit.max(1),
        }
    }

    /// Transactions prepared and waiting for their coordinator's decision.
    pub fn in_doubt(&self) -> usize {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn attachment(&self) -> Result<Store> {
        if let Some(s) = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(s);
        }
        self.base.another()
    }

    fn give_back(&self, s: Store) {
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }

    /// Parse a PREPARE payload into a minitransaction on `st` (items checked against it).
    fn parse(st: &Store, data: &[u8]) -> std::result::Result<(u64, u32, Mtx), Status> {
        if data.len() < PREP_HDR {
            return Err(Status::Bad);
        }
        let txid = u64::from_le_bytes(data[..8].try_into().unwrap());
        let flags = u32::from_le_bytes(data[8..12].try_into().unwrap());
        let n = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
        if n == 0 || n > MAX_ITEMS || flags & !(F_ONE_PHASE | F_URGENT) != 0 {
            return Err(Status::Bad);
        }
        let mut tx = st.begin();
        let mut p = PREP_HDR;
        for _ in 0..n {
            let h = data.get(p..p + ITEM_HDR).ok_or(Status::Bad)?;
            let kind = h[0];
            let node = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
            let off = u64::from_le_bytes(h[8..16].try_into().unwrap());
            let len = u64::from_le_bytes(h[16..24].try_into().unwrap());
            p += ITEM_HDR;
            let (off, len) = (usize::try_from(off).map_err(|_| Status::Range)?, usize::try_from(len).map_err(|_| Status::Range)?);
            let r = match kind {
                K_READ => tx.read(st, node, off, len).map(|_| ()),
                K_COMPARE | K_WRITE => {
                    let d = data.get(p..p.checked_add(len).ok_or(Status::Bad)?).ok_or(Status::Bad)?;
                    p += len;
                    if kind == K_COMPARE {
                        tx.compare(st, node, off, d)
                    } else {
                        tx.write(st, node, off, d)
                    }
                }
                _ => return Err(Status::Bad),
            };
            r.map_err(|_| Status::Range)?;
        }
        if p != data.len() {
            return Err(Status::Bad);
        }
        Ok((txid, flags, tx))
    }

    fn answer(out: &mut Vec<u8>, vote: u32, failed: usize, tx: Option<&Mtx>) {
        out.extend_from_slice(&vote.to_le_bytes());
        out.extend_from_slice(&(failed as u32).to_le_bytes());
        if let Some(tx) = tx {
            let mut i = 0;
            while let Some(r) = tx.read_result(i) {
                out.extend_from_slice(r);
                i += 1;
            }
        }
    }

    fn prepare(&self, session: u64, data: &[u8], out: &mut Vec<u8>) -> Status {
        if self.in_doubt() >= self.limit {
            Self::answer(out, V_LOCK, 0, None);
            return Status::Ok;
        }
        let att = match self.attachment() {
            Ok(a) => a,
            Err(_) => {
                // No slot free: as a held lock, the coordinator retries.
                Self::answer(out, V_LOCK, 0, None);
                return Status::Ok;
            }
        };
        let (txid, flags, mut tx) = match Self::parse(&att, data) {
            Ok(v) => v,
            Err(s) => {
                self.give_back(att);
                return s;
            }
        };
        if self.prepared.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&(session, txid)) {
            self.give_back(att);
            return Status::Bad;
        }
        // A participant never waits for a lock (two coordinators must never wait for each other through
        // their participants); an urgent prepare retries for a short, bounded while, its turnstile keeping
        // new local commits off meanwhile.
        let urgent = flags & F_URGENT != 0;
        let until = Instant::now() + URGENT_TRIES;
        let r = loop {
            let r = tx.prepare(&att, Mode::Try, urgent);
            if !urgent || !matches!(r, Ok(Outcome::LockFailed)) || Instant::now() > until {
                break r;
            }
            std::hint::spin_loop();
        };
        match r {
            Ok(Outcome::Committed) => {
                Self::answer(out, V_YES, 0, Some(&tx));
                if flags & F_ONE_PHASE != 0 {
                    let fin = tx.finish(&att, true);
                    self.give_back(att);
                    if fin.is_err() {
                        out.clear();
                        return Status::Io;
                    }
                } else {
                    self.prepared.lock().unwrap_or_else(|e| e.into_inner()).insert((session, txid), (att, tx));
                }
                Status::Ok
            }
            Ok(Outcome::CompareFailed(i)) => {
                Self::answer(out, V_COMPARE, i, Some(&tx));
                self.give_back(att);
                Status::Ok
            }
            Ok(Outcome::LockFailed) => {
                Self::answer(out, V_LOCK, 0, None);
                self.give_back(att);
                Status::Ok
            }
            Err(_) => {
                self.give_back(att);
                Status::Io
            }
        }
    }

    fn decide(&self, session: u64, data: &[u8], commit: bool) -> Status {
        let Ok(b) = <[u8; 8]>::try_from(data) else {
            return Status::Bad;
        };
        let txid = u64::from_le_bytes(b);
        let Some((att, mut tx)) = self.prepared.lock().unwrap_or_else(|e| e.into_inner()).remove(&(session, txid)) else {
            return Status::NoWin;
        };
        let r = tx.finish(&att, commit);
        self.give_back(att);
        if r.is_ok() {
            Status::Ok
        } else {
            Status::Io
        }
    }
}

impl Service for StoreService {
    fn call(&self, session: u64, op: u8, data: &[u8], out: &mut Vec<u8>) -> Status {
        match op {
            OP_PREPARE => self.prepare(session, data, out),
            OP_COMMIT => self.decide(session, data, true),
            OP_ABORT => self.decide(session, data, false),
            _ => Status::Bad,
        }
    }

    /// The coordinator has gone without deciding: its prepared transactions abort.
    fn closed(&self, session: u64) {
        let gone: Vec<(Store, Mtx)> = {
            let mut p = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<(u64, u64)> = p.keys().filter(|k| k.0 == session).copied().collect();
            keys.iter().filter_map(|k| p.remove(k)).collect()
        };
        for (att, mut tx) in gone {
            let _ = tx.finish(&att, false);
            self.give_back(att);
        }
    }
}

// ------------------------------------------------------------------------------------------ coordinator

/// Where a host group's nodes are served.
#[derive(Debug, Clone, Copy)]
pub struct GroupInfo {
    /// World rank of the group's home (whose agent serves the group's store).
    pub home: u32,
    /// Its agent's address (`None` for this process's own group).
    pub addr: Option<SocketAddr>,
    /// The id its [`StoreService`] is registered under there.
    pub service: u64,
}

/// A store whose memory nodes are spread over host groups (see the module documentation).
pub struct DistStore {
    local: Option<Store>,
    /// Per global node: (group, index in that group's store).
    nodes: Vec<(usize, usize)>,
    node_bytes: usize,
    mine: usize,
    groups: Vec<GroupInfo>,
    conns: Vec<Mutex<Option<ServiceClient>>>,
    creds: Creds,
    spin: Duration,
    next_tx: AtomicU64,
}

impl std::fmt::Debug for DistStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistStore({} nodes over {} groups, this group {})", self.nodes.len(), self.groups.len(), self.mine)
    }
}

impl DistStore {
    /// `local`: this group's store (`None` when this process serves no node and holds none, e.g. a
    /// coordinator alone); `node_group[n]` = the group of global node `n` (nodes of one group are
    /// numbered in their store in global order); `mine`: this process's group; `groups[g]`: where group
    /// `g` is served; `creds`: this process's credentials in the job (its agent connections
    /// authenticate with them); `spin`: how long a wait for an answer polls before it sleeps.
    pub fn new(
        local: Option<Store>,
        node_group: &[usize],
        node_bytes: usize,
        mine: usize,
        groups: Vec<GroupInfo>,
        creds: Creds,
        spin: Duration,
    ) -> Result<DistStore> {
        let mut count = vec![0usize; groups.len()];
        let mut nodes = Vec::with_capacity(node_group.len());
        for &g in node_group {
            let c = count.get_mut(g).ok_or_else(|| Error::InvalidArgument(format!("group {g} of {}", groups.len())))?;
            nodes.push((g, *c));
            *c += 1;
        }
        if let Some(s) = &local {
            if s.nodes() != count[mine] || s.node_bytes() != node_bytes {
                return Err(Error::InvalidArgument(format!(
                    "this host's store has {} nodes of {} bytes; the layout says {} of {node_bytes}",
                    s.nodes(),
                    s.node_bytes(),
                    count[mine]
                )));
            }
        }
        let conns = groups.iter().map(|_| Mutex::new(None)).collect();
        Ok(DistStore {
            local,
            nodes,
            node_bytes,
            mine,
            groups,
            conns,
            creds,
            spin,
            next_tx: AtomicU64::new(1),
        })
    }

    /// Number of memory nodes (over all hosts).
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Bytes of each memory node.
    pub fn node_bytes(&self) -> usize {
        self.node_bytes
    }

    /// This host's store, if this process holds one.
    pub fn local(&self) -> Option<&Store> {
        self.local.as_ref()
    }

    /// The group and in-group index of global node `node`, with its bounds checked for `len` bytes at
    /// `offset`.
    fn place(&self, node: usize, offset: usize, len: usize) -> Result<(usize, usize)> {
        let &(g, i) = self
            .nodes
            .get(node)
            .ok_or_else(|| Error::InvalidArgument(format!("memory node {node} (the store has {})", self.nodes.len())))?;
        if len == 0 {
            return Err(Error::InvalidArgument("an item of 0 bytes".into()));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.node_bytes) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{} of node {node} (a node has {})",
                offset.saturating_add(len),
                self.node_bytes
            )));
        }
        Ok((g, i))
    }

    fn client<'a>(&self, g: usize, slot: &'a mut Option<ServiceClient>) -> Result<&'a mut ServiceClient> {
        if slot.as_ref().is_some_and(|c| c.broken().is_some()) {
            *slot = None;
        }
        if slot.is_none() {
            let gi = self.groups[g];
            let addr = gi.addr.ok_or_else(|| Error::Remote(format!("group {g} has no address")))?;
            let c = ServiceClient::connect(addr, &self.creds, gi.home, self.spin).map_err(|e| {
                Error::Remote(format!("unable to reach rank {}'s agent at {addr} (memory nodes of group {g}): {e}", gi.home))
            })?;
            *slot = Some(c);
        }
        Ok(slot.as_mut().unwrap())
    }

    /// A new, empty minitransaction on this store.
    pub fn begin(&self) -> DistMtx {
        DistMtx {
            remote: (0..self.groups.len()).map(|_| Part::default()).collect(),
            ..Default::default()
        }
    }
}

/// One remote group's items, encoded as the PREPARE payload wants them.
#[derive(Debug, Default, Clone)]
struct Part {
    /// Items (without the PREPARE header).
    items: Vec<u8>,
    count: u32,
    /// Bytes of reads the answer brings.
    read_bytes: usize,
    /// Global compare index of this part's compare items, in order.
    compares: Vec<usize>,
    /// Global read index of this part's reads, in order.
    reads: Vec<usize>,
}

/// Where a global item lives: the local part (index in its kind) or a remote group (offset of its bytes
/// in the group's payload).
#[derive(Debug, Clone, Copy)]
enum At {
    Local(usize),
    Remote(usize, usize),
}

/// A minitransaction over a [`DistStore`] (mirrors [`Mtx`]).
#[derive(Debug, Default, Clone)]
pub struct DistMtx {
    local: Mtx,
    remote: Vec<Part>,
    local_compares: Vec<usize>,
    compares: Vec<(At, usize)>,
    reads: Vec<(At, usize)>,
    writes: Vec<(At, usize)>,
    /// Read results of remote reads: (offset in `rbuf`, len) per global read (unused for local ones).
    rres: Vec<(usize, usize)>,
    rbuf: Vec<u8>,
    failed: Option<usize>,
}

fn item_hdr(out: &mut Vec<u8>, kind: u8, node: usize, offset: usize, len: usize) {
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&(node as u32).to_le_bytes());
    out.extend_from_slice(&(offset as u64).to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

impl DistMtx {
    fn add(&mut self, st: &DistStore, kind: u8, node: usize, offset: usize, len: usize, bytes: Option<&[u8]>) -> Result<At> {
        let (g, i) = st.place(node, offset, len)?;
        if g == st.mine {
            let ls = st.local.as_ref().ok_or_else(|| Error::InvalidArgument(format!("memory node {node} is on this host, which holds no store")))?;
            return Ok(At::Local(match kind {
                K_COMPARE => {
                    self.local.compare(ls, i, offset, bytes.unwrap())?;
                    self.local_compares.push(self.compares.len());
                    self.local_compares.len() - 1
                }
                K_READ => self.local.read(ls, i, offset, len)?,
                _ => {
                    let j = self.writes.iter().filter(|(a, _)| matches!(a, At::Local(_))).count();
                    self.local.write(ls, i, offset, bytes.unwrap())?;
                    j
                }
            }));
        }
        if self.remote.len() != st.groups.len() {
            self.remote.resize(st.groups.len(), Part::default());
        }
        let p = &mut self.remote[g];
        if p.count as usize >= MAX_ITEMS {
            return Err(Error::TooLarge(format!("more than {MAX_ITEMS} items on one host")));
        }
        item_hdr(&mut p.items, kind, i, offset, len);
        let at = p.items.len();
        if let Some(b) = bytes {
            p.items.extend_from_slice(b);
        }
        p.count += 1;
        match kind {
            K_COMPARE => p.compares.push(self.compares.len()),
            K_READ => {
                p.reads.push(self.reads.len());
                p.read_bytes += len;
            }
            _ => {}
        }
        Ok(At::Remote(g, at))
    }

    /// Add a compare item (see [`Mtx::compare`]); `node` is a global memory node.
    pub fn compare(&mut self, st: &DistStore, node: usize, offset: usize, expected: &[u8]) -> Result<()> {
        let at = self.add(st, K_COMPARE, node, offset, expected.len(), Some(expected))?;
        self.compares.push((at, expected.len()));
        Ok(())
    }

    /// Add a read item; returns its index for [`DistMtx::read_result`].
    pub fn read(&mut self, st: &DistStore, node: usize, offset: usize, len: usize) -> Result<usize> {
        let at = self.add(st, K_READ, node, offset, len, None)?;
        self.reads.push((at, len));
        self.rres.push((0, 0));
        Ok(self.reads.len() - 1)
    }

    /// Add a write item.
    pub fn write(&mut self, st: &DistStore, node: usize, offset: usize, data: &[u8]) -> Result<()> {
        let at = self.add(st, K_WRITE, node, offset, data.len(), Some(data))?;
        self.writes.push((at, data.len()));
        Ok(())
    }

    fn set(&mut self, which: (At, usize), bytes: &[u8], local: impl FnOnce(&mut Mtx, usize, &[u8]) -> Result<()>) -> Result<()> {
        let (at, len) = which;
        if bytes.len() != len {
            return Err(Error::InvalidArgument(format!("{} bytes for an item of {len}", bytes.len())));
        }
        match at {
            At::Local(i) => local(&mut self.local, i, bytes),
            At::Remote(g, off) => {
                self.remote[g].items[off..off + len].copy_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// Replace the expected bytes of compare item `i` (see [`Mtx::set_compare`]).
    pub fn set_compare(&mut self, i: usize, expected: &[u8]) -> Result<()> {
        let w = *self.compares.get(i).ok_or_else(|| Error::InvalidArgument(format!("compare item {i} of {}", self.compares.len())))?;
        self.set(w, expected, |m, j, b| m.set_compare(j, b))
    }

    /// Replace the data of write item `i` (see [`Mtx::set_write`]).
    pub fn set_write(&mut self, i: usize, data: &[u8]) -> Result<()> {
        let w = *self.writes.get(i).ok_or_else(|| Error::InvalidArgument(format!("write item {i} of {}", self.writes.len())))?;
        self.set(w, data, |m, j, b| m.set_write(j, b))
    }

    /// What read item `i` returned at the last commit.
    pub fn read_result(&self, i: usize) -> Option<&[u8]> {
        match self.reads.get(i)? {
            (At::Local(j), _) => self.local.read_result(*j),
            (At::Remote(..), _) => {
                let (o, l) = self.rres[i];
                self.rbuf.get(o..o + l)
            }
        }
    }

    /// Index of the compare item that failed at the last commit.
    pub fn failed_item(&self) -> Option<usize> {
        self.failed
    }

    /// Forget every item.
    pub fn reset(&mut self) {
        self.local.reset();
        for p in &mut self.remote {
            *p = Part::default();
        }
        self.local_compares.clear();
        self.compares.clear();
        self.reads.clear();
        self.writes.clear();
        self.rres.clear();
        self.rbuf.clear();
        self.failed = None;
    }

    fn has_local(&self) -> bool {
        self.compares.iter().chain(&self.reads).chain(&self.writes).any(|(a, _)| matches!(a, At::Local(_)))
    }

    /// Commit all-or-nothing over every host (see the module documentation).
    pub fn commit(&mut self, st: &DistStore, mode: Mode) -> Result<Outcome> {
        self.commit_on(st, None, mode)
    }

    /// [`DistMtx::commit`] with this host's part committed through `local` (another attachment of the
    /// store's local part, [`Store::another`]: a thread of its own committing at the same time as others
    /// of this process needs a participant slot of its own).
    pub fn commit_on(&mut self, st: &DistStore, local: Option<&Store>, mode: Mode) -> Result<Outcome> {
        let ls = local.or(st.local.as_ref());
        let t0 = Instant::now();
        let mut backoff_ns: u64 = 1_000;
        let mut urgent = false;
        loop {
            let o = self.attempt(st, ls, mode, urgent)?;
            if o != Outcome::LockFailed || mode == Mode::Try {
                return Ok(o);
            }
            if !urgent && t0.elapsed() > STARVE_AFTER {
                urgent = true;
            }
            // Randomised exponential backoff: two retrying coordinators soon stop meeting.
            let mut r = [0u8; 8];
            let _ = getrandom::fill(&mut r);
            let jitter = u64::from_le_bytes(r) % backoff_ns.max(1);
            let pause = Duration::from_nanos(backoff_ns / 2 + jitter);
            let until = Instant::now() + pause;
            if pause < Duration::from_micros(50) {
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::sleep(pause);
            }
            backoff_ns = (backoff_ns * 2).min(1_000_000);
        }
    }

    fn attempt(&mut self, st: &DistStore, ls: Option<&Store>, mode: Mode, urgent: bool) -> Result<Outcome> {
        self.failed = None;
        let remote: Vec<usize> = (0..self.remote.len()).filter(|&g| self.remote[g].count > 0).collect();
        let has_local = self.has_local();
        if remote.is_empty() {
            let ls = ls.ok_or_else(|| Error::InvalidArgument("an empty minitransaction".into()))?;
            if !has_local {
                return Ok(Outcome::Committed);
            }
            let o = self.local.commit(ls, mode)?;
            return Ok(self.map_local(o));
        }
        // The connections of every remote part, locked in group order (threads sharing the store).
        let mut guards: Vec<_> = remote.iter().map(|&g| st.conns[g].lock().unwrap_or_else(|e| e.into_inner())).collect();
        let one_phase = remote.len() == 1 && !has_local;
        let mut local_prepared = false;
        let mut first_failed: Option<usize> = None;
        if has_local {
            let ls = ls.unwrap();
            match self.local.prepare(ls, mode, urgent)? {
                Outcome::Committed => local_prepared = true,
                Outcome::LockFailed => return Ok(Outcome::LockFailed),
                o => {
                    // The transaction fails; the other hosts are still asked, for their reads.
                    if let Outcome::CompareFailed(i) = self.map_local(o) {
                        first_failed = Some(i);
                    }
                    if remote.iter().all(|&g| self.remote[g].reads.is_empty()) {
                        return Ok(Outcome::CompareFailed(first_failed.unwrap()));
                    }
                }
            }
        }
        let txid = st.next_tx.fetch_add(1, Ordering::Relaxed);
        let mut flags = if urgent { F_URGENT } else { 0 };
        if one_phase {
            flags |= F_ONE_PHASE;
        }
        // Prepare every remote part, in parallel.
        let mut posted = Vec::with_capacity(remote.len());
        let mut err = None;
        for (k, &g) in remote.iter().enumerate() {
            let p = &self.remote[g];
            let mut hdr = [0u8; PREP_HDR];
            hdr[..8].copy_from_slice(&txid.to_le_bytes());
            hdr[8..12].copy_from_slice(&flags.to_le_bytes());
            hdr[12..16].copy_from_slice(&p.count.to_le_bytes());
            match st.client(g, &mut guards[k]) {
                Ok(c) => posted.push(Some(c.post(st.groups[g].service, OP_PREPARE, &[&hdr, &p.items], 8 + p.read_bytes))),
                Err(e) => {
                    posted.push(None);
                    err.get_or_insert(e);
                }
            }
        }
        // Votes.
        self.rbuf.clear();
        let mut yes = vec![false; remote.len()];
        let mut lock_failed = false;
        for (k, &g) in remote.iter().enumerate() {
            let Some(seq) = posted[k] else { continue };
            let c = guards[k].as_mut().unwrap();
            let ans = match c.wait(seq) {
                Ok(a) => a,
                Err(e) => {
                    err.get_or_insert(Error::Remote(format!("rank {}'s agent (memory nodes of group {g}): {e}", st.groups[g].home)));
                    continue;
                }
            };
            let vote = u32::from_le_bytes(ans[..4].try_into().unwrap());
            let failed = u32::from_le_bytes(ans[4..8].try_into().unwrap()) as usize;
            match vote {
                V_YES | V_COMPARE => {
                    let p = &self.remote[g];
                    let mut o = 8;
                    for &ri in &p.reads {
                        let l = self.reads[ri].1;
                        self.rres[ri] = (self.rbuf.len(), l);
                        self.rbuf.extend_from_slice(&ans[o..o + l]);
                        o += l;
                    }
                    if vote == V_YES {
                        yes[k] = true;
                    } else {
                        let gi = *p.compares.get(failed).ok_or_else(|| Error::Remote(format!("group {g} named compare item {failed} of {}", p.compares.len())))?;
                        first_failed = Some(first_failed.map_or(gi, |f| f.min(gi)));
                    }
                }
                V_LOCK => lock_failed = true,
                v => {
                    err.get_or_insert(Error::Remote(format!("group {g} voted {v}")));
                }
            }
        }
        let decided = err.is_none() && !lock_failed && first_failed.is_none();
        if one_phase {
            if let Some(e) = err {
                return Err(e);
            }
            return Ok(if lock_failed {
                Outcome::LockFailed
            } else if let Some(i) = first_failed {
                self.failed = Some(i);
                Outcome::CompareFailed(i)
            } else {
                Outcome::Committed
            });
        }
        // The decision: the local part first (the commit point), then the participants.
        if local_prepared {
            self.local.finish(ls.unwrap(), decided)?;
        }
        let txb = txid.to_le_bytes();
        for (k, &g) in remote.iter().enumerate() {
            if yes[k] {
                if let Some(c) = guards[k].as_mut() {
                    c.post_nowait(st.groups[g].service, if decided { OP_COMMIT } else { OP_ABORT }, &[&txb]);
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        if lock_failed {
            return Ok(Outcome::LockFailed);
        }
        if let Some(i) = first_failed {
            self.failed = Some(i);
            return Ok(Outcome::CompareFailed(i));
        }
        Ok(Outcome::Committed)
    }

    /// The outcome of the local part in global compare numbering.
    fn map_local(&mut self, o: Outcome) -> Outcome {
        match o {
            Outcome::CompareFailed(i) => {
                let g = self.local_compares[i];
                self.failed = Some(g);
                Outcome::CompareFailed(g)
            }
            o => o,
        }
    }
}

#[cfg(test)]
#[path = "dist_tests.rs"]
mod tests;
