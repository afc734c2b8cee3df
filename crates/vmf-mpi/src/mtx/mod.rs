//! vmfabric's minitransactions and barriers for MPI programs: the C API of `vmfabric/mtx.h` (issue 25),
//! over `vmf_mtx` (the store, commits, crash recovery, barriers).
//!
//! `vmf_store_create(comm, bytes, &store)` makes one store whose memory node `r` belongs to rank `r` of
//! `comm`: rank 0 creates the file in the region directory, every rank attaches, and rank 0 unlinks it once
//! all have (the mapping lives on; a job that dies leaves no file). `vmf_store_open(path, &store)` attaches
//! to a persistent store made by `vmfabric mtx create`. When ranks of `comm` are on several hosts, each
//! host's ranks share a store holding their nodes (made the same way by the host's lowest rank, which
//! also serves it to the other hosts through its one-sided agent), and commits that touch other hosts'
//! nodes run the two-phase commit of `vmf_mtx::dist`.
//!
//! `vmf_barrier_create(comm, kind, &b)`: a shared barrier file when every rank of `comm` shares this
//! host's memory; otherwise the barrier is an `MPI_Barrier` on a duplicate of `comm` (over the
//! transports).
//!
//! Handles are pointers the library registers; every call checks the handle is live, so a NULL, freed or
//! foreign handle is `VMF_ERR_HANDLE`, never a crash. Errors are negative codes; `vmf_strerror(code)`
//! returns the message of this thread's last error when it had that code, else the code's description.
use crate::*;
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::Mutex;
use vmf_core::Route;
use vmf_mtx::{Barrier, Cond, DistMtx, DistStore, GroupInfo, Mode, Mtx, Outcome, Store, StoreService, WaitKind};

/// MPI_INT (MPICH's handle).
const MPI_INT: MPI_Datatype = 0x4c00_0405;
/// MPI_BYTE (MPICH's handle).
const MPI_BYTE: MPI_Datatype = 0x4c00_010d;

pub const VMF_MTX_COMMITTED: c_int = 0;
pub const VMF_MTX_COMPARE_FAILED: c_int = 1;
pub const VMF_MTX_LOCK_FAILED: c_int = 2;
pub const VMF_MTX_TRY: c_int = 0;
pub const VMF_MTX_BLOCKING: c_int = 1;
pub const VMF_BARRIER_SPIN: c_int = 0;
pub const VMF_BARRIER_BLOCK: c_int = 1;
pub const VMF_BARRIER_ADAPTIVE: c_int = 2;
pub const VMF_COND_SPIN: c_int = 0;
pub const VMF_COND_BLOCK: c_int = 1;
pub const VMF_COND_ADAPTIVE: c_int = 2;

pub const VMF_ERR_ARG: c_int = -1;
pub const VMF_ERR_HANDLE: c_int = -2;
pub const VMF_ERR_CORRUPT: c_int = -3;
pub const VMF_ERR_IO: c_int = -4;
pub const VMF_ERR_NOSLOT: c_int = -5;
pub const VMF_ERR_TOOLARGE: c_int = -6;
pub const VMF_ERR_REMOTE: c_int = -7;
pub const VMF_ERR_MPI: c_int = -8;
pub const VMF_ERR_PEER: c_int = -9;

fn describe(code: c_int) -> &'static str {
    match code {
        VMF_MTX_COMMITTED => "committed",
        VMF_MTX_COMPARE_FAILED => "a compare item did not hold",
        VMF_MTX_LOCK_FAILED => "a lock was held by another minitransaction",
        VMF_ERR_ARG => "invalid argument",
        VMF_ERR_HANDLE => "invalid handle (NULL, freed, or not one of this library's)",
        VMF_ERR_CORRUPT => "the store is corrupt",
        VMF_ERR_IO => "the store or barrier file could not be created or opened",
        VMF_ERR_NOSLOT => "no free participant slot in the store",
        VMF_ERR_TOOLARGE => "the minitransaction is too large",
        VMF_ERR_REMOTE => "a memory node on another host failed, or the object needs every rank on one host",
        VMF_ERR_MPI => "an MPI call failed",
        VMF_ERR_PEER => "a barrier or condition-variable participant (or the mutex holder) died",
        _ => "unknown vmfabric code",
    }
}

thread_local! {
    static LAST: RefCell<(c_int, CString)> = RefCell::new((0, CString::default()));
}

fn fail(code: c_int, msg: impl Into<String>) -> c_int {
    let m = CString::new(msg.into().replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = (code, m));
    code
}

fn from_mtx(e: vmf_mtx::Error) -> c_int {
    use vmf_mtx::Error as E;
    let code = match &e {
        E::InvalidArgument(m) if m.contains("died") => VMF_ERR_PEER,
        E::InvalidArgument(_) => VMF_ERR_ARG,
        E::Io { .. } => VMF_ERR_IO,
        E::Corrupt(_) => VMF_ERR_CORRUPT,
        E::NoSlot(_) => VMF_ERR_NOSLOT,
        E::TooLarge(_) => VMF_ERR_TOOLARGE,
        E::Remote(_) => VMF_ERR_REMOTE,
    };
    fail(code, e.to_string())
}

// ---------------------------------------------------------------- handles

pub struct StoreH {
    store: AnyStore,
    /// Ranks of the communicator (none for a store opened by path): collective free.
    comm: Option<MPI_Comm>,
    /// The id of the service this rank registered with its agent (the home of its host's store).
    service: Option<u64>,
    /// The thread that made or opened the store: it commits through the store's own participant slot;
    /// other threads through attachments of their own ([`thread_attachment`]).
    owner: std::thread::ThreadId,
}

/// Attachments of this host's store for threads other than a store's owner, by (store handle, thread): a
/// participant slot tags its locks, so two threads committing at once through one slot would take each
/// other's locks for their own.
type Attachments = std::collections::HashMap<(usize, std::thread::ThreadId), Box<Store>>;
static EXTRA: Mutex<Option<Attachments>> = Mutex::new(None);

/// The calling thread's attachment of store `h`'s local part (`None`: the owner's slot serves, or the
/// store holds no local part).
fn thread_attachment(h: &StoreH) -> vmf_mtx::Result<Option<*const Store>> {
    let me = std::thread::current().id();
    if me == h.owner {
        return Ok(None);
    }
    let base = match &h.store {
        AnyStore::Local(s) => s,
        AnyStore::Dist(d) => match d.local() {
            Some(s) => s,
            None => return Ok(None),
        },
    };
    let mut g = EXTRA.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(Default::default);
    let key = (h as *const StoreH as usize, me);
    if let Some(s) = m.get(&key) {
        return Ok(Some(&**s as *const Store));
    }
    let s = Box::new(base.another()?);
    let p = &*s as *const Store;
    m.insert(key, s);
    Ok(Some(p))
}

/// Forget every thread's attachment of store `h` (it is being freed).
fn drop_attachments(h: usize) {
    if let Some(m) = EXTRA.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.retain(|k, _| k.0 != h);
    }
}

/// A store on one host, or spread over hosts.
pub enum AnyStore {
    Local(Store),
    Dist(DistStore),
}

/// A minitransaction of either kind of store.
pub enum AnyTx {
    Local(Mtx),
    Dist(DistMtx),
}

fn mixed<T>() -> vmf_mtx::Result<T> {
    Err(vmf_mtx::Error::InvalidArgument("a minitransaction used with another store".into()))
}

impl AnyStore {
    fn nodes(&self) -> usize {
        match self {
            AnyStore::Local(s) => s.nodes(),
            AnyStore::Dist(s) => s.nodes(),
        }
    }
    fn node_bytes(&self) -> usize {
        match self {
            AnyStore::Local(s) => s.node_bytes(),
            AnyStore::Dist(s) => s.node_bytes(),
        }
    }
    fn begin(&self) -> AnyTx {
        match self {
            AnyStore::Local(s) => AnyTx::Local(s.begin()),
            AnyStore::Dist(s) => AnyTx::Dist(s.begin()),
        }
    }
}

impl AnyTx {
    fn compare(&mut self, s: &AnyStore, node: usize, off: usize, d: &[u8]) -> vmf_mtx::Result<()> {
        match (self, s) {
            (AnyTx::Local(t), AnyStore::Local(s)) => t.compare(s, node, off, d),
            (AnyTx::Dist(t), AnyStore::Dist(s)) => t.compare(s, node, off, d),
            _ => mixed(),
        }
    }
    fn read(&mut self, s: &AnyStore, node: usize, off: usize, len: usize) -> vmf_mtx::Result<usize> {
        match (self, s) {
            (AnyTx::Local(t), AnyStore::Local(s)) => t.read(s, node, off, len),
            (AnyTx::Dist(t), AnyStore::Dist(s)) => t.read(s, node, off, len),
            _ => mixed(),
        }
    }
    fn write(&mut self, s: &AnyStore, node: usize, off: usize, d: &[u8]) -> vmf_mtx::Result<()> {
        match (self, s) {
            (AnyTx::Local(t), AnyStore::Local(s)) => t.write(s, node, off, d),
            (AnyTx::Dist(t), AnyStore::Dist(s)) => t.write(s, node, off, d),
            _ => mixed(),
        }
    }
    fn set_compare(&mut self, i: usize, d: &[u8]) -> vmf_mtx::Result<()> {
        match self {
            AnyTx::Local(t) => t.set_compare(i, d),
            AnyTx::Dist(t) => t.set_compare(i, d),
        }
    }
    fn set_write(&mut self, i: usize, d: &[u8]) -> vmf_mtx::Result<()> {
        match self {
            AnyTx::Local(t) => t.set_write(i, d),
            AnyTx::Dist(t) => t.set_write(i, d),
        }
    }
    fn commit(&mut self, s: &AnyStore, local: Option<&Store>, mode: Mode) -> vmf_mtx::Result<Outcome> {
        match (self, s) {
            (AnyTx::Local(t), AnyStore::Local(s)) => t.commit(local.unwrap_or(s), mode),
            (AnyTx::Dist(t), AnyStore::Dist(s)) => t.commit_on(s, local, mode),
            _ => mixed(),
        }
    }
    fn read_result(&self, i: usize) -> Option<&[u8]> {
        match self {
            AnyTx::Local(t) => t.read_result(i),
            AnyTx::Dist(t) => t.read_result(i),
        }
    }
    fn failed_item(&self) -> Option<usize> {
        match self {
            AnyTx::Local(t) => t.failed_item(),
            AnyTx::Dist(t) => t.failed_item(),
        }
    }
    fn reset(&mut self) {
        match self {
            AnyTx::Local(t) => t.reset(),
            AnyTx::Dist(t) => t.reset(),
        }
    }
}

pub struct TxH {
    store: *mut StoreH,
    tx: AnyTx,
    /// Read items' destinations, filled at commit.
    outs: Vec<(usize, *mut c_void)>,
}
pub enum BarH {
    Shared(Barrier),
    Mpi(MPI_Comm),
}

/// Live handles (addresses), per kind.
static LIVE: Mutex<Option<[HashSet<usize>; 4]>> = Mutex::new(None);
const K_STORE: usize = 0;
const K_TX: usize = 1;
const K_BAR: usize = 2;
const K_COND: usize = 3;

fn live(kind: usize, p: usize) -> bool {
    p != 0 && LIVE.lock().unwrap().as_ref().is_some_and(|l| l[kind].contains(&p))
}
fn register(kind: usize, p: usize) {
    LIVE.lock().unwrap().get_or_insert_with(Default::default)[kind].insert(p);
}
fn unregister(kind: usize, p: usize) -> bool {
    LIVE.lock().unwrap().as_mut().is_some_and(|l| l[kind].remove(&p))
}

/// The store behind `h`, or VMF_ERR_HANDLE.
unsafe fn store_ref<'a>(h: *mut StoreH) -> Result<&'a mut StoreH, c_int> {
    if live(K_STORE, h as usize) {
        Ok(&mut *h)
    } else {
        Err(fail(VMF_ERR_HANDLE, "the store handle is NULL, freed, or not a store"))
    }
}
unsafe fn tx_ref<'a>(h: *mut TxH) -> Result<&'a mut TxH, c_int> {
    if !live(K_TX, h as usize) {
        return Err(fail(VMF_ERR_HANDLE, "the minitransaction handle is NULL, freed, or not one"));
    }
    let t = &mut *h;
    if !live(K_STORE, t.store as usize) {
        return Err(fail(VMF_ERR_HANDLE, "the minitransaction's store has been freed"));
    }
    Ok(t)
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(c) => return c,
        }
    };
}

// ---------------------------------------------------------------- collective set-up helpers

/// World ranks of communicator `comm` and this process's rank in it; fails for an intercommunicator.
fn members(comm: MPI_Comm) -> Result<(Vec<usize>, usize, PathBuf), c_int> {
    let st = state().map_err(|e| fail(VMF_ERR_MPI, e.msg))?;
    let c = st.comm(comm).map_err(|e| fail(VMF_ERR_ARG, e.msg))?.1;
    if c.remote.is_some() {
        return Err(fail(VMF_ERR_ARG, "an intercommunicator (use an intracommunicator)"));
    }
    let m: Vec<usize> = (0..c.size).map(|r| c.to_world(r)).collect();
    let me = c.rank as usize;
    let dir = PathBuf::from(&st.fab.engine().config().region_dir);
    Ok((m, me, dir))
}

/// Do all members share this process's memory (shared-memory or self route to each)?
fn co_resident(m: &[usize]) -> Result<bool, c_int> {
    let st = state().map_err(|e| fail(VMF_ERR_MPI, e.msg))?;
    let e = st.fab.engine();
    Ok(m.iter().all(|&w| matches!(e.route(w), Route::Shm | Route::SelfLoop)))
}

/// Rank 0 makes a fresh name in `dir`; every rank learns it (collective). Returns the path.
fn shared_name(comm: MPI_Comm, me: usize, dir: &std::path::Path, what: &str) -> Result<PathBuf, c_int> {
    shared_name_id(comm, me, dir, what).map(|(p, _)| p)
}

/// [`shared_name`], and a 64-bit id drawn with it (the same at every rank).
fn shared_name_id(comm: MPI_Comm, me: usize, dir: &std::path::Path, what: &str) -> Result<(PathBuf, u64), c_int> {
    let mut id = [0i32; 4];
    if me == 0 {
        let mut b = [0u8; 16];
        let _ = getrandom::fill(&mut b);
        for (i, c) in b.chunks(4).enumerate() {
            id[i] = i32::from_le_bytes(c.try_into().unwrap());
        }
    }
    // SAFETY: 4 ints at `id`, MPI_INT, root 0.
    let rc = unsafe { crate::coll::PMPI_Bcast(id.as_mut_ptr() as *mut c_void, 4, MPI_INT, 0, comm) };
    if rc != MPI_SUCCESS {
        return Err(fail(VMF_ERR_MPI, format!("MPI_Bcast of the {what} name failed ({rc})")));
    }
    let hex: String = id.iter().map(|v| format!("{:08x}", *v as u32)).collect();
    let num = (id[0] as u32 as u64) << 32 | id[1] as u32 as u64;
    Ok((dir.join(format!("vmf-{what}-{hex}")), num))
}

/// MPI_Allreduce(MIN) of `ok`: did every rank succeed? (collective)
fn all_ok(comm: MPI_Comm, ok: bool) -> Result<bool, c_int> {
    let mut v: c_int = ok as c_int;
    // SAFETY: one int in place.
    let rc = unsafe {
        crate::coll::PMPI_Allreduce(crate::coll::IN_PLACE, &mut v as *mut c_int as *mut c_void, 1, MPI_INT, crate::op::MPI_MIN, comm)
    };
    if rc != MPI_SUCCESS {
        return Err(fail(VMF_ERR_MPI, format!("MPI_Allreduce failed ({rc})")));
    }
    Ok(v != 0)
}

// ---------------------------------------------------------------- stores and minitransactions

/// # Safety
/// `store` must be writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_store_create(comm: MPI_Comm, bytes: usize, store: *mut *mut StoreH) -> c_int {
    if store.is_null() {
        return fail(VMF_ERR_ARG, "store is NULL");
    }
    *store = std::ptr::null_mut();
    let (m, me, dir) = {
        let _mt = crate::mt::enter();
        tri!(members(comm))
    };
    if bytes == 0 {
        return fail(VMF_ERR_ARG, "a store of 0 bytes per node");
    }
    if !tri!(all_ok(comm, tri!(co_resident(&m)))) {
        return match create_dist(comm, &m, me, &dir, bytes) {
            Ok(h) => {
                let h = Box::into_raw(Box::new(h));
                register(K_STORE, h as usize);
                *store = h;
                VMF_MTX_COMMITTED
            }
            Err(c) => c,
        };
    }
    let path = tri!(shared_name(comm, me, &dir, "mtx"));
    let opts = vmf_mtx::StoreOptions { slots: m.len().max(1) * 2 + 8, ..Default::default() };
    let s = tri!(create_and_attach(
        comm,
        me == 0,
        &path,
        "rank 0 could not create the store",
        "another rank could not attach to the store",
        |p| Store::create(p, m.len(), bytes, &opts).map(Some),
        Store::open,
    ));
    let h = Box::into_raw(Box::new(StoreH { store: AnyStore::Local(s), comm: Some(comm), service: None, owner: std::thread::current().id() }));
    register(K_STORE, h as usize);
    *store = h;
    VMF_MTX_COMMITTED
}

/// Bytes of an agent address in the exchange: IPv6 (IPv4 mapped) and port.
const ADDR_WIRE: usize = 18;

/// `vmf_store_create` over ranks on several hosts (collective): each host's ranks share a store of their
/// own nodes, made by the host's lowest rank (its *home*), which serves it to the other hosts through
/// its one-sided agent; every rank learns every home's agent address.
unsafe fn create_dist(comm: MPI_Comm, m: &[usize], me: usize, dir: &std::path::Path, bytes: usize) -> Result<StoreH, c_int> {
    let (near, tcp, agent_spin, client_spin) = {
        let _mt = crate::mt::enter();
        let st = state().map_err(|e| fail(VMF_ERR_MPI, e.msg))?;
        let e = st.fab.engine();
        let near: Vec<bool> = m.iter().map(|&w| matches!(e.route(w), Route::Shm | Route::SelfLoop)).collect();
        let ctx = vmf_rma::RmaCtx::from_engine(&e);
        (near, ctx.tcp, ctx.agent_spin, ctx.client_spin)
    };
    // A host group is named by its lowest member; every rank learns every member's group.
    let key = near.iter().position(|&x| x).unwrap_or(me) as c_int;
    let mut keys = vec![0 as c_int; m.len()];
    // SAFETY: one int out, m.len() ints in.
    let rc = crate::coll::PMPI_Allgather(&key as *const c_int as *const c_void, 1, MPI_INT, keys.as_mut_ptr() as *mut c_void, 1, MPI_INT, comm);
    if rc != MPI_SUCCESS {
        return Err(fail(VMF_ERR_MPI, format!("MPI_Allgather of the host groups failed ({rc})")));
    }
    let mut heads: Vec<c_int> = keys.clone();
    heads.sort_unstable();
    heads.dedup();
    let node_group: Vec<usize> = keys.iter().map(|k| heads.binary_search(k).unwrap()).collect();
    let mine = node_group[me];
    let home = key as usize == me;
    let gsize = node_group.iter().filter(|&&g| g == mine).count();
    let (base, id) = shared_name_id(comm, me, dir, "mtx")?;
    let path = PathBuf::from(format!("{}-g{key}", base.display()));
    // Each home makes its host's store: its own ranks' nodes, and slots for the transactions other
    // hosts' ranks prepare there.
    let opts = vmf_mtx::StoreOptions { slots: gsize * 2 + m.len() * 2 + 8, ..Default::default() };
    let local = create_and_attach(
        comm,
        home,
        &path,
        "a host's lowest rank could not create its store",
        "another rank could not attach to its host's store",
        |p| Store::create(p, gsize, bytes, &opts).map(Some),
        Store::open,
    )?;
    // The agents: every rank may coordinate, homes serve.
    let started = match tcp {
        Some((ip, creds)) => vmf_rma::agent::Agent::get_or_start(ip, creds, agent_spin)
            .map_err(|e| format!("unable to start the one-sided agent: {e}"))
            .and_then(|a| {
                if home {
                    let svc = StoreService::new(local.another().map_err(|e| e.to_string())?, m.len() * 2 + 4);
                    a.add_service(id, std::sync::Arc::new(svc));
                }
                Ok((a.addr(), creds))
            }),
        None => Err("this rank has no TCP transport (VMF_TCP=0?) to reach the other hosts".into()),
    };
    let mut mine_wire = [0u8; ADDR_WIRE];
    if let Ok((addr, _)) = &started {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(v) => v.to_ipv6_mapped(),
            std::net::IpAddr::V6(v) => v,
        };
        mine_wire[..16].copy_from_slice(&ip.octets());
        mine_wire[16..].copy_from_slice(&addr.port().to_le_bytes());
    }
    let all_started = all_ok(comm, started.is_ok())?;
    let undo = |a: &Result<_, String>| {
        if home && a.is_ok() {
            if let Some(ag) = vmf_rma::agent::Agent::running() {
                ag.remove_service(id);
            }
        }
    };
    if !all_started {
        undo(&started);
        return Err(match started {
            Err(e) => fail(VMF_ERR_REMOTE, e),
            Ok(_) => fail(VMF_ERR_REMOTE, "another rank could not start its one-sided agent"),
        });
    }
    let mut wires = vec![0u8; ADDR_WIRE * m.len()];
    let rc = crate::coll::PMPI_Allgather(mine_wire.as_ptr() as *const c_void, ADDR_WIRE as c_int, MPI_BYTE, wires.as_mut_ptr() as *mut c_void, ADDR_WIRE as c_int, MPI_BYTE, comm);
    if rc != MPI_SUCCESS {
        undo(&started);
        return Err(fail(VMF_ERR_MPI, format!("MPI_Allgather of the agents' addresses failed ({rc})")));
    }
    let groups: Vec<GroupInfo> = heads
        .iter()
        .enumerate()
        .map(|(g, &h)| {
            let w = &wires[h as usize * ADDR_WIRE..(h as usize + 1) * ADDR_WIRE];
            let ip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&w[..16]).unwrap());
            let ip = ip.to_ipv4_mapped().map_or(std::net::IpAddr::V6(ip), std::net::IpAddr::V4);
            let port = u16::from_le_bytes([w[16], w[17]]);
            GroupInfo { home: m[h as usize] as u32, addr: (g != mine).then_some(std::net::SocketAddr::new(ip, port)), service: id }
        })
        .collect();
    let (_, creds) = started.as_ref().map_err(|e| fail(VMF_ERR_REMOTE, e.clone()))?;
    let dist = DistStore::new(Some(local), &node_group, bytes, mine, groups, *creds, client_spin);
    {
        // While this rank waits in the library, its own thread serves its agent's requests.
        let _mt = crate::mt::enter();
        if let Ok(st) = state() {
            vmf_rma::agent::Agent::hook_into(&mut st.fab.engine());
        }
    }
    let ok = all_ok(comm, dist.is_ok())?;
    match (dist, ok) {
        (Ok(d), true) => Ok(StoreH { store: AnyStore::Dist(d), comm: Some(comm), service: home.then_some(id), owner: std::thread::current().id() }),
        (Err(e), _) => {
            undo(&started);
            Err(from_mtx(e))
        }
        (Ok(_), false) => {
            undo(&started);
            Err(fail(VMF_ERR_REMOTE, "another rank could not set up the store"))
        }
    }
}

/// Attach to a persistent store (made by `vmfabric mtx create PATH`); not collective.
///
/// # Safety
/// `path` must be a C string or NULL; `store` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_store_open(path: *const c_char, store: *mut *mut StoreH) -> c_int {
    if path.is_null() || store.is_null() {
        return fail(VMF_ERR_ARG, "path or store is NULL");
    }
    *store = std::ptr::null_mut();
    let p = std::ffi::CStr::from_ptr(path).to_string_lossy().into_owned();
    match Store::open(std::path::Path::new(&p)) {
        Ok(s) => {
            let h = Box::into_raw(Box::new(StoreH { store: AnyStore::Local(s), comm: None, service: None, owner: std::thread::current().id() }));
            register(K_STORE, h as usize);
            *store = h;
            0
        }
        Err(e) => from_mtx(e),
    }
}

/// Number of memory nodes and bytes per node of a store.
///
/// # Safety
/// Outputs writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn vmf_store_size(store: *mut StoreH, nodes: *mut c_int, bytes: *mut usize) -> c_int {
    let s = tri!(store_ref(store));
    if !nodes.is_null() {
        *nodes = s.store.nodes() as c_int;
    }
    if !bytes.is_null() {
        *bytes = s.store.node_bytes();
    }
    0
}

/// Collective over the creating communicator (a store opened by path: local).
///
/// # Safety
/// `store` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_store_free(store: *mut *mut StoreH) -> c_int {
    if store.is_null() {
        return fail(VMF_ERR_ARG, "store is NULL");
    }
    let h = *store;
    let s = tri!(store_ref(h));
    if let Some(c) = s.comm {
        // Nobody may still be committing on this rank's node.
        let rc = crate::coll::PMPI_Barrier(c);
        if rc != MPI_SUCCESS {
            return fail(VMF_ERR_MPI, format!("MPI_Barrier in vmf_store_free failed ({rc})"));
        }
    }
    if let Some(id) = s.service {
        if let Some(a) = vmf_rma::agent::Agent::running() {
            a.remove_service(id);
        }
    }
    unregister(K_STORE, h as usize);
    drop_attachments(h as usize);
    drop(Box::from_raw(h));
    *store = std::ptr::null_mut();
    0
}

/// # Safety
/// `tx` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_begin(store: *mut StoreH, tx: *mut *mut TxH) -> c_int {
    if tx.is_null() {
        return fail(VMF_ERR_ARG, "tx is NULL");
    }
    *tx = std::ptr::null_mut();
    let s = tri!(store_ref(store));
    let h = Box::into_raw(Box::new(TxH { store, tx: s.store.begin(), outs: Vec::new() }));
    register(K_TX, h as usize);
    *tx = h;
    0
}

unsafe fn bytes<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8], c_int> {
    if p.is_null() {
        return Err(fail(VMF_ERR_ARG, format!("{what} is NULL")));
    }
    Ok(std::slice::from_raw_parts(p as *const u8, len))
}

/// The checks every call that hands a transaction bytes makes (a live handle, non-NULL bytes, a
/// non-negative node or item index `k`), then `f` on them.
unsafe fn with_bytes(
    tx: *mut TxH,
    k: c_int,
    k_what: &str,
    p: *const c_void,
    len: usize,
    what: &str,
    f: impl FnOnce(&mut TxH, usize, &[u8]) -> vmf_mtx::Result<()>,
) -> c_int {
    let t = tri!(tx_ref(tx));
    let d = tri!(bytes(p, len, what));
    if k < 0 {
        return fail(VMF_ERR_ARG, format!("{k_what} {k}"));
    }
    match f(t, k as usize, d) {
        Ok(()) => 0,
        Err(e) => from_mtx(e),
    }
}

/// # Safety
/// `expected` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_compare(tx: *mut TxH, node: c_int, offset: usize, expected: *const c_void, len: usize) -> c_int {
    with_bytes(tx, node, "memory node", expected, len, "expected", |t, n, d| t.tx.compare(&(*t.store).store, n, offset, d))
}

/// # Safety
/// `out` valid for `len` bytes until the commit.
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_read(tx: *mut TxH, node: c_int, offset: usize, out: *mut c_void, len: usize) -> c_int {
    let t = tri!(tx_ref(tx));
    if out.is_null() {
        return fail(VMF_ERR_ARG, "out is NULL");
    }
    if node < 0 {
        return fail(VMF_ERR_ARG, format!("memory node {node}"));
    }
    match t.tx.read(&(*t.store).store, node as usize, offset, len) {
        Ok(i) => {
            t.outs.push((i, out));
            0
        }
        Err(e) => from_mtx(e),
    }
}

/// # Safety
/// `data` valid for `len` bytes (copied).
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_write(tx: *mut TxH, node: c_int, offset: usize, data: *const c_void, len: usize) -> c_int {
    with_bytes(tx, node, "memory node", data, len, "data", |t, n, d| t.tx.write(&(*t.store).store, n, offset, d))
}

/// # Safety
/// `expected` valid for `len` bytes (copied).
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_set_compare(tx: *mut TxH, item: c_int, expected: *const c_void, len: usize) -> c_int {
    with_bytes(tx, item, "compare item", expected, len, "expected", |t, i, d| t.tx.set_compare(i, d))
}

/// # Safety
/// `data` valid for `len` bytes (copied).
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_set_write(tx: *mut TxH, item: c_int, data: *const c_void, len: usize) -> c_int {
    with_bytes(tx, item, "write item", data, len, "data", |t, i, d| t.tx.set_write(i, d))
}

/// # Safety
/// The read items' `out` buffers still valid.
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_commit(tx: *mut TxH, flags: c_int) -> c_int {
    let t = tri!(tx_ref(tx));
    let mode = match flags {
        VMF_MTX_TRY => Mode::Try,
        VMF_MTX_BLOCKING => Mode::Blocking,
        _ => return fail(VMF_ERR_ARG, format!("flags {flags} (VMF_MTX_TRY or VMF_MTX_BLOCKING)")),
    };
    let sh = &*t.store;
    let local = match thread_attachment(sh) {
        // SAFETY: the attachment lives in EXTRA until the store is freed (collective: not during a commit).
        Ok(p) => p.map(|p| &*p),
        Err(e) => return from_mtx(e),
    };
    let r = t.tx.commit(&sh.store, local, mode);
    let copy_out = |t: &TxH| {
        for &(i, out) in &t.outs {
            let d = t.tx.read_result(i).unwrap();
            std::ptr::copy_nonoverlapping(d.as_ptr(), out as *mut u8, d.len());
        }
    };
    match r {
        Ok(Outcome::Committed) => {
            copy_out(t);
            VMF_MTX_COMMITTED
        }
        Ok(Outcome::CompareFailed(_)) => {
            copy_out(t);
            VMF_MTX_COMPARE_FAILED
        }
        Ok(Outcome::LockFailed) => VMF_MTX_LOCK_FAILED,
        Err(e) => from_mtx(e),
    }
}

/// Index of the first failing compare item of the last commit, or -1.
///
/// # Safety
/// A handle from vmf_mtx_begin (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_failed_item(tx: *mut TxH) -> c_int {
    let t = tri!(tx_ref(tx));
    t.tx.failed_item().map_or(-1, |i| i as c_int)
}

/// # Safety
/// A handle from vmf_mtx_begin (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_reset(tx: *mut TxH) -> c_int {
    let t = tri!(tx_ref(tx));
    t.tx.reset();
    t.outs.clear();
    0
}

/// # Safety
/// `tx` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_mtx_free(tx: *mut *mut TxH) -> c_int {
    drop(tri!(take_handle(tx, K_TX, "tx", "the minitransaction handle is NULL, freed, or not one")));
    0
}

/// Unregister the handle in `*p` (of registry `kind`), clear `*p` and hand back the box to drop.
unsafe fn take_handle<T>(p: *mut *mut T, kind: usize, name: &str, bad: &str) -> Result<Box<T>, c_int> {
    if p.is_null() {
        return Err(fail(VMF_ERR_ARG, format!("{name} is NULL")));
    }
    let h = *p;
    if !unregister(kind, h as usize) {
        return Err(fail(VMF_ERR_HANDLE, bad));
    }
    *p = std::ptr::null_mut();
    Ok(Box::from_raw(h))
}

// The barrier and condition-variable kinds share their values (one parser below).
const _: () = assert!(
    VMF_BARRIER_SPIN == VMF_COND_SPIN && VMF_BARRIER_BLOCK == VMF_COND_BLOCK && VMF_BARRIER_ADAPTIVE == VMF_COND_ADAPTIVE
);

/// The waiting of a barrier or condition variable kind (`prefix`: the constants' names in errors).
fn wait_kind(kind: c_int, what: &str, prefix: &str) -> Result<WaitKind, c_int> {
    match kind {
        VMF_BARRIER_SPIN => Ok(WaitKind::Spin),
        VMF_BARRIER_BLOCK => Ok(WaitKind::Block),
        VMF_BARRIER_ADAPTIVE => Ok(WaitKind::Adaptive),
        _ => Err(fail(VMF_ERR_ARG, format!("{what} kind {kind} ({prefix}_SPIN, _BLOCK or _ADAPTIVE)"))),
    }
}

// ---------------------------------------------------------------- barriers

/// # Safety
/// `b` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_barrier_create(comm: MPI_Comm, kind: c_int, b: *mut *mut BarH) -> c_int {
    if b.is_null() {
        return fail(VMF_ERR_ARG, "barrier is NULL");
    }
    *b = std::ptr::null_mut();
    let k = tri!(wait_kind(kind, "barrier", "VMF_BARRIER"));
    let (m, me, dir) = {
        let _mt = crate::mt::enter();
        tri!(members(comm))
    };
    let local = tri!(co_resident(&m));
    if !tri!(all_ok(comm, local)) {
        // Over the transports: MPI_Barrier on a private duplicate.
        let mut dup = MPI_COMM_NULL;
        let rc = crate::comm::PMPI_Comm_dup(comm, &mut dup);
        if rc != MPI_SUCCESS {
            return fail(VMF_ERR_MPI, format!("MPI_Comm_dup failed ({rc})"));
        }
        let h = Box::into_raw(Box::new(BarH::Mpi(dup)));
        register(K_BAR, h as usize);
        *b = h;
        return 0;
    }
    let x = tri!(shared_object(comm, me, &dir, "bar", |p| Barrier::create(p, m.len()), |p| Barrier::open(p, me, k)));
    let h = Box::into_raw(Box::new(BarH::Shared(x)));
    register(K_BAR, h as usize);
    *b = h;
    0
}

/// A shared object of the co-resident ranks of `comm`: rank 0 creates its file, every rank opens it, rank 0
/// unlinks the name once all have it open. Collective; every rank learns whether all succeeded.
unsafe fn shared_object<T>(
    comm: MPI_Comm,
    me: usize,
    dir: &std::path::Path,
    what: &str,
    create: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<()>,
    open: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<T>,
) -> Result<T, c_int> {
    let path = shared_name(comm, me, dir, what)?;
    create_and_attach(
        comm,
        me == 0,
        &path,
        &format!("rank 0 could not create the {what} file"),
        &format!("another rank could not open the {what} file"),
        |p| create(p).map(|()| None),
        open,
    )
}

/// Collective: the `creator` makes the object at `path` (`create` may hand back its own attachment),
/// every other rank attaches with `open`, and the creator unlinks the name once every rank has it. Every
/// rank learns whether all succeeded; `no_create` / `no_open` are the messages of the ranks whose own
/// step succeeded when another's failed.
unsafe fn create_and_attach<T>(
    comm: MPI_Comm,
    creator: bool,
    path: &std::path::Path,
    no_create: &str,
    no_open: &str,
    create: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<Option<T>>,
    open: impl FnOnce(&std::path::Path) -> vmf_mtx::Result<T>,
) -> Result<T, c_int> {
    let made = if creator { create(path) } else { Ok(None) };
    if !all_ok(comm, made.is_ok())? {
        return Err(match made {
            Err(e) => from_mtx(e),
            Ok(_) => fail(VMF_ERR_IO, no_create),
        });
    }
    let attached = match made {
        Ok(Some(x)) => Ok(x),
        _ => open(path),
    };
    let everyone = all_ok(comm, attached.is_ok());
    if creator {
        let _ = std::fs::remove_file(path);
    }
    match (attached, everyone) {
        (Ok(x), Ok(true)) => Ok(x),
        (Err(e), _) => Err(from_mtx(e)),
        (Ok(_), Ok(false)) => Err(fail(VMF_ERR_IO, no_open)),
        (Ok(_), Err(c)) => Err(c),
    }
}

/// # Safety
/// A handle from vmf_barrier_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_barrier_wait(b: *mut BarH) -> c_int {
    if !live(K_BAR, b as usize) {
        return fail(VMF_ERR_HANDLE, "the barrier handle is NULL, freed, or not a barrier");
    }
    match &mut *b {
        BarH::Shared(x) => match x.wait() {
            Ok(()) => 0,
            Err(e) => from_mtx(e),
        },
        BarH::Mpi(c) => {
            let rc = crate::coll::PMPI_Barrier(*c);
            if rc == MPI_SUCCESS {
                0
            } else {
                fail(VMF_ERR_MPI, format!("MPI_Barrier failed ({rc})"))
            }
        }
    }
}

/// # Safety
/// `b` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_barrier_free(b: *mut *mut BarH) -> c_int {
    let h = tri!(take_handle(b, K_BAR, "barrier", "the barrier handle is NULL, freed, or not a barrier"));
    if let BarH::Mpi(mut c) = *h {
        crate::comm::PMPI_Comm_free(&mut c);
    }
    0
}

// ---------------------------------------------------------------- condition variables

/// # Safety
/// `c` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_create(comm: MPI_Comm, kind: c_int, c: *mut *mut Cond) -> c_int {
    if c.is_null() {
        return fail(VMF_ERR_ARG, "cond is NULL");
    }
    *c = std::ptr::null_mut();
    let k = tri!(wait_kind(kind, "condition variable", "VMF_COND"));
    let (m, me, dir) = {
        let _mt = crate::mt::enter();
        tri!(members(comm))
    };
    let local = tri!(co_resident(&m));
    if !tri!(all_ok(comm, local)) {
        return fail(VMF_ERR_REMOTE, "condition variables need every rank of the communicator on one host (shared memory)");
    }
    let x = tri!(shared_object(comm, me, &dir, "cnd", |p| Cond::create(p, m.len()), |p| Cond::open(p, me, k)));
    let h = Box::into_raw(Box::new(x));
    register(K_COND, h as usize);
    *c = h;
    0
}

/// The condition variable behind `c`, or VMF_ERR_HANDLE.
unsafe fn cond_ref<'a>(c: *mut Cond) -> Result<&'a Cond, c_int> {
    if live(K_COND, c as usize) {
        Ok(&*c)
    } else {
        Err(fail(VMF_ERR_HANDLE, "the condition variable handle is NULL, freed, or not a condition variable"))
    }
}

fn cond_rc(r: vmf_mtx::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => from_mtx(e),
    }
}

/// # Safety
/// A handle from vmf_cond_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_lock(c: *mut Cond) -> c_int {
    cond_rc(tri!(cond_ref(c)).lock())
}

/// # Safety
/// A handle from vmf_cond_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_unlock(c: *mut Cond) -> c_int {
    cond_rc(tri!(cond_ref(c)).unlock())
}

/// # Safety
/// A handle from vmf_cond_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_wait(c: *mut Cond) -> c_int {
    cond_rc(tri!(cond_ref(c)).wait())
}

/// # Safety
/// A handle from vmf_cond_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_signal(c: *mut Cond) -> c_int {
    tri!(cond_ref(c)).signal();
    0
}

/// # Safety
/// A handle from vmf_cond_create (checked).
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_broadcast(c: *mut Cond) -> c_int {
    tri!(cond_ref(c)).broadcast();
    0
}

/// # Safety
/// `c` writable.
#[no_mangle]
pub unsafe extern "C" fn vmf_cond_free(c: *mut *mut Cond) -> c_int {
    drop(tri!(take_handle(c, K_COND, "cond", "the condition variable handle is NULL, freed, or not a condition variable")));
    0
}

/// The message of this thread's last error if it had `code`, else the code's description.
#[no_mangle]
pub extern "C" fn vmf_strerror(code: c_int) -> *const c_char {
    LAST.with(|l| {
        let l = l.borrow();
        if l.0 == code && code < 0 && !l.1.as_bytes().is_empty() {
            return l.1.as_ptr();
        }
        // Static descriptions, NUL-terminated once per code.
        static DESCS: Mutex<Vec<(c_int, CString)>> = Mutex::new(Vec::new());
        let mut d = DESCS.lock().unwrap();
        if let Some((_, s)) = d.iter().find(|(c, _)| *c == code) {
            return s.as_ptr();
        }
        d.push((code, CString::new(describe(code)).unwrap()));
        d.last().unwrap().1.as_ptr()
    })
}
