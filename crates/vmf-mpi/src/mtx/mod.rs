//! vmfabric's minitransactions and barriers for MPI programs: the C API of `vmfabric/mtx.h` (issue 25),
//! over `vmf_mtx` (the store, commits, crash recovery, barriers).
//!
//! `vmf_store_create(comm, bytes, &store)` makes one store whose memory node `r` belongs to rank `r` of
//! `comm`: rank 0 creates the file in the region directory, every rank attaches, and rank 0 unlinks it once
//! all have (the mapping lives on; a job that dies leaves no file). `vmf_store_open(path, &store)` attaches
//! to a persistent store made by `vmfabric mtx create`. Memory nodes reached over TCP (ranks of `comm` on
//! other hosts) need the two-phase commit, not built yet: `vmf_store_create` then fails with
//! `VMF_ERR_REMOTE`.
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
use vmf_mtx::{Barrier, Cond, Mode, Mtx, Outcome, Store, WaitKind};

/// MPI_INT (MPICH's handle).
const MPI_INT: MPI_Datatype = 0x4c00_0405;

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
        VMF_ERR_REMOTE => "memory nodes on other hosts are not supported yet (two-phase commit over TCP)",
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
    };
    fail(code, e.to_string())
}

// ---------------------------------------------------------------- handles

pub struct StoreH {
    store: Store,
    /// Ranks of the communicator (none for a store opened by path): collective free.
    comm: Option<MPI_Comm>,
}
pub struct TxH {
    store: *mut StoreH,
    tx: Mtx,
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
    Ok(dir.join(format!("vmf-{what}-{hex}")))
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
    if !tri!(co_resident(&m)) {
        // Collective agreement first, so every rank fails alike.
        let _ = all_ok(comm, false);
        return fail(VMF_ERR_REMOTE, format!("ranks of the communicator are on other hosts; {}", describe(VMF_ERR_REMOTE)));
    }
    if !tri!(all_ok(comm, true)) {
        return fail(VMF_ERR_REMOTE, describe(VMF_ERR_REMOTE));
    }
    let path = tri!(shared_name(comm, me, &dir, "mtx"));
    let opts = vmf_mtx::StoreOptions { slots: m.len().max(1) * 2 + 8, ..Default::default() };
    let made = if me == 0 { Store::create(&path, m.len(), bytes, &opts).map(Some) } else { Ok(None) };
    let made_ok = made.is_ok();
    if !tri!(all_ok(comm, made_ok)) {
        return match made {
            Err(e) => from_mtx(e),
            Ok(_) => fail(VMF_ERR_IO, "rank 0 could not create the store"),
        };
    }
    let attached = match made {
        Ok(Some(s)) => Ok(s),
        _ => Store::open(&path),
    };
    let ok = attached.is_ok();
    let everyone = all_ok(comm, ok);
    if me == 0 {
        let _ = std::fs::remove_file(&path);
    }
    match (attached, everyone) {
        (Ok(s), Ok(true)) => {
            let h = Box::into_raw(Box::new(StoreH { store: s, comm: Some(comm) }));
            register(K_STORE, h as usize);
            *store = h;
            VMF_MTX_COMMITTED
        }
        (Err(e), _) => from_mtx(e),
        (Ok(_), Ok(false)) => fail(VMF_ERR_IO, "another rank could not attach to the store"),
        (Ok(_), Err(c)) => c,
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
            let h = Box::into_raw(Box::new(StoreH { store: s, comm: None }));
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
    unregister(K_STORE, h as usize);
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
    let r = t.tx.commit(&(*t.store).store, mode);
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
    let made = if me == 0 { create(&path) } else { Ok(()) };
    if !all_ok(comm, made.is_ok())? {
        return Err(match made {
            Err(e) => from_mtx(e),
            Ok(()) => fail(VMF_ERR_IO, format!("rank 0 could not create the {what} file")),
        });
    }
    let opened = open(&path);
    let everyone = all_ok(comm, opened.is_ok());
    if me == 0 {
        let _ = std::fs::remove_file(&path);
    }
    match (opened, everyone) {
        (Ok(x), Ok(true)) => Ok(x),
        (Err(e), _) => Err(from_mtx(e)),
        (Ok(_), Ok(false)) => Err(fail(VMF_ERR_IO, format!("another rank could not open the {what} file"))),
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
