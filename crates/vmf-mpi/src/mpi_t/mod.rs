//! The tool interface (MPI 4.0 chapter 15), as MPICH keeps it in src/mpi_t: control variables, performance
//! variables, categories, and the event interface.
//!
//! - **Control variables** are the fabric's tunables, every `VMF_*` of `vmf_core::config::PARAMS` (name,
//!   default and description come from there, so a tunable added to the fabric appears here with no list to
//!   maintain). Numbers are `MPI_UNSIGNED_LONG_LONG` (sizes with their suffix applied), the others strings
//!   (`MPI_CHAR`). Their value is what the fabric uses: the environment variable when set, else the
//!   default. The fabric reads them once when it starts, so their scope is `MPI_T_SCOPE_READONLY`: set
//!   them in the environment (`VMF_SHM_EAGER_LIMIT=16K vmfabric run ...`).
//! - **Performance variables** are the engine's counters (`vmf_core::engine::Counters`): messages and bytes
//!   sent per transport, received, the unexpected queue's depth and high-water mark, rendezvous sends,
//!   migrations, and how blocking waits ended (spinning, after yielding, after sleeping). Counters and the
//!   wait tallies start at 0 when a handle is allocated and can be reset or written (the handle keeps an
//!   offset); the queue level and high-water mark are read-only. They are continuous (always counting).
//!   Before `MPI_Init` they read 0; after `MPI_Finalize`, the values at finalize. They are read through
//!   the engine's `Tally` (single-writer atomics), never through the library's state, so a tool thread
//!   may read them while the program's thread is inside MPI whatever its thread level.
//! - **Categories** group both by layer: transport counters, matching, waiting, migration, and the tunables
//!   of shared memory, TCP, waiting and binding, one-sided, general.
//! - **Events**: none are defined (`MPI_T_event_get_num` is 0); one event source, the monotonic clock
//!   in nanoseconds, is reported for timestamps.
//!
//! The interface works before `MPI_Init` and after `MPI_Finalize`, from any thread: its state has its own
//! lock. Handles are pointers to objects this module allocated; a pointer it did not hand out (or already
//! freed) is `MPI_T_ERR_INVALID_HANDLE`, never dereferenced.
use crate::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;
use vmf_core::config::{parse_size, PARAMS};
use std::sync::Arc;
use vmf_core::engine::{Counters, Tally};

pub const MPI_T_ERR_NOT_INITIALIZED: c_int = 60;
pub const MPI_T_ERR_INVALID_INDEX: c_int = 62;
pub const MPI_T_ERR_INVALID_HANDLE: c_int = 64;
pub const MPI_T_ERR_INVALID_SESSION: c_int = 67;
pub const MPI_T_ERR_CVAR_SET_NEVER: c_int = 69;
pub const MPI_T_ERR_PVAR_NO_STARTSTOP: c_int = 70;
pub const MPI_T_ERR_PVAR_NO_WRITE: c_int = 71;
pub const MPI_T_ERR_INVALID_NAME: c_int = 73;
pub const MPI_T_ERR_INVALID: c_int = 74;

const VERBOSITY_USER_BASIC: c_int = 221;
const VERBOSITY_TUNER_BASIC: c_int = 224;
const VERBOSITY_TUNER_DETAIL: c_int = 225;
const BIND_NO_OBJECT: c_int = 9700;
const SCOPE_READONLY: c_int = 60439;
const CLASS_LEVEL: c_int = 241;
const CLASS_HIGHWATERMARK: c_int = 244;
const CLASS_COUNTER: c_int = 246;
const SOURCE_ORDERED: c_int = 0;

const MPI_CHAR: MPI_Datatype = 0x4c00_0101;
const MPI_UNSIGNED_LONG_LONG: MPI_Datatype = 0x4c00_0819;
/// Bytes a string control variable's buffer needs (count of its MPI_CHAR elements).
const STR_CVAR_LEN: usize = 256;

/// `MPI_T_PVAR_ALL_HANDLES`: an exported constant pointer, as in MPICH (a distinct address no handle has).
#[no_mangle]
pub static MPI_T_PVAR_ALL_HANDLES: env::CPtr = env::CPtr(&ALL_HANDLES_OBJ as *const c_int);
static ALL_HANDLES_OBJ: c_int = 0;

/// A performance variable: name, class, description, how to read it from a counter snapshot.
struct Pvar {
    name: &'static str,
    class: c_int,
    desc: &'static str,
    get: fn(&Counters) -> u64,
}

const PVARS: &[Pvar] = &[
    Pvar { name: "shm_msgs_sent", class: CLASS_COUNTER, desc: "messages sent through shared memory", get: |c| c.shm_msgs_sent },
    Pvar { name: "shm_bytes_sent", class: CLASS_COUNTER, desc: "payload bytes sent through shared memory", get: |c| c.shm_bytes_sent },
    Pvar { name: "tcp_msgs_sent", class: CLASS_COUNTER, desc: "messages sent over TCP", get: |c| c.tcp_msgs_sent },
    Pvar { name: "mphw_msgs_sent", class: CLASS_COUNTER, desc: "messages sent over the emulated message-passing hardware (VMF_TRANSPORT=mphw)", get: |c| c.mphw_msgs_sent },
    Pvar { name: "tcp_bytes_sent", class: CLASS_COUNTER, desc: "payload bytes sent over TCP", get: |c| c.tcp_bytes_sent },
    Pvar { name: "self_msgs_sent", class: CLASS_COUNTER, desc: "messages a rank sent to itself", get: |c| c.self_msgs_sent },
    Pvar { name: "self_bytes_sent", class: CLASS_COUNTER, desc: "payload bytes a rank sent to itself", get: |c| c.self_bytes_sent },
    Pvar { name: "msgs_recvd", class: CLASS_COUNTER, desc: "messages received (any transport)", get: |c| c.msgs_recvd },
    Pvar { name: "bytes_recvd", class: CLASS_COUNTER, desc: "payload bytes received (any transport)", get: |c| c.bytes_recvd },
    Pvar { name: "unexpected_queue_length", class: CLASS_LEVEL, desc: "messages that arrived before their receive was posted, waiting now", get: |c| c.unexpected_now },
    Pvar { name: "unexpected_queue_max", class: CLASS_HIGHWATERMARK, desc: "the most messages the unexpected queue ever held", get: |c| c.unexpected_max },
    Pvar { name: "rendezvous_sent", class: CLASS_COUNTER, desc: "messages sent with the rendezvous protocol (above the eager limit)", get: |c| c.rendezvous_sent },
    Pvar { name: "migrations", class: CLASS_COUNTER, desc: "times this rank's traffic moved to another transport because a rank migrated", get: |c| c.migrations },
    Pvar { name: "waits_spin", class: CLASS_COUNTER, desc: "blocking waits that completed while spinning", get: |c| c.waits_spin },
    Pvar { name: "waits_yield", class: CLASS_COUNTER, desc: "blocking waits that completed after yielding the CPU", get: |c| c.waits_yield },
    Pvar { name: "waits_sleep", class: CLASS_COUNTER, desc: "blocking waits that completed after sleeping", get: |c| c.waits_sleep },
];

/// A category: name, description, which control variables (by name prefix) and performance variables
/// (by name prefix) it holds.
struct Category {
    name: &'static str,
    desc: &'static str,
    cvars: &'static [&'static str],
    pvars: &'static [&'static str],
}

const CATEGORIES: &[Category] = &[
    Category { name: "vmfabric_transport", desc: "messages and bytes per transport", cvars: &[], pvars: &["shm_", "tcp_", "self_", "msgs_", "bytes_", "rendezvous"] },
    Category { name: "vmfabric_matching", desc: "the unexpected-message queue", cvars: &[], pvars: &["unexpected_"] },
    Category { name: "vmfabric_waiting", desc: "how blocking waits end; the waiting and binding tunables", cvars: &["WAIT", "SPIN_COUNT", "BIND", "HOST_CPUS", "MACHINE_RANKS", "LIVENESS_MS", "INIT_TIMEOUT"], pvars: &["waits_"] },
    Category { name: "vmfabric_migration", desc: "ranks moving between hosts", cvars: &[], pvars: &["migrations"] },
    Category { name: "vmfabric_shm", desc: "the shared-memory transport's tunables", cvars: &["SHM", "REGION_"], pvars: &[] },
    Category { name: "vmfabric_tcp", desc: "the TCP transport's tunables", cvars: &["TCP"], pvars: &[] },
    Category { name: "vmfabric_rma", desc: "one-sided communication's tunables", cvars: &["RMA_"], pvars: &[] },
    Category { name: "vmfabric_general", desc: "other tunables", cvars: &["VERBOSE"], pvars: &[] },
];

fn cvar_in(cat: &Category, name: &str) -> bool {
    cat.cvars.iter().any(|p| name.starts_with(p))
}

fn cat_cvars(i: usize) -> Vec<c_int> {
    PARAMS.iter().enumerate().filter(|(_, p)| cvar_in(&CATEGORIES[i], p.name)).map(|(k, _)| k as c_int).collect()
}

fn cat_pvars(i: usize) -> Vec<c_int> {
    PVARS.iter().enumerate().filter(|(_, p)| CATEGORIES[i].pvars.iter().any(|x| p.name.starts_with(x))).map(|(k, _)| k as c_int).collect()
}

/// A control variable's handle.
struct CvarHandle {
    index: usize,
}

/// A performance variable's handle: its variable and the offset its value is read with.
struct PvarHandle {
    session: usize,
    index: usize,
    offset: u64,
}

struct TState {
    refs: u32,
    cvar_handles: Vec<usize>,
    sessions: Vec<usize>,
    pvar_handles: Vec<usize>,
    /// The engine's counters (set when the library starts; they outlive the engine, so after
    /// MPI_Finalize they hold the final counts). Read with relaxed loads: never the library's state,
    /// which another thread may be using.
    tally: Option<Arc<Tally>>,
}

static T: Mutex<TState> = Mutex::new(TState {
    refs: 0,
    cvar_handles: Vec::new(),
    sessions: Vec::new(),
    pvar_handles: Vec::new(),
    tally: None,
});

/// Run `f` on the interface's state, once it is initialized.
fn with<T2>(f: impl FnOnce(&mut TState) -> Result<T2, c_int>) -> Result<T2, c_int> {
    let mut t = T.lock().unwrap_or_else(|p| p.into_inner());
    if t.refs == 0 {
        return Err(MPI_T_ERR_NOT_INITIALIZED);
    }
    f(&mut t)
}

fn rc(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => e,
    }
}

/// Read performance variables from the engine's counters `t` (called when the library starts).
pub(crate) fn attach(t: Arc<Tally>) {
    T.lock().unwrap_or_else(|p| p.into_inner()).tally = Some(t);
}

/// The counters now (zeros before the library started).
fn counters(t: &TState) -> Counters {
    t.tally.as_ref().map_or_else(Counters::default, |c| c.snapshot())
}

/// Store a string the MPI_T way: `len` in is the buffer's size, out the length stored with its NUL (as
/// MPICH); with a NULL buffer or a size of 0 nothing is copied and `len` says what the string needs.
unsafe fn tstr(s: &str, buf: *mut c_char, len: *mut c_int) {
    if len.is_null() {
        return;
    }
    if !buf.is_null() && *len > 0 {
        let n = s.len().min(*len as usize - 1);
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
        *len = n as c_int + 1; // what was stored (MPICH's convention)
    } else {
        *len = s.len() as c_int + 1; // a query: what the string needs
    }
}

unsafe fn set<T2>(p: *mut T2, v: T2) {
    if !p.is_null() {
        *p = v;
    }
}

unsafe fn name_of<'a>(p: *const c_char) -> Result<std::borrow::Cow<'a, str>, c_int> {
    if p.is_null() {
        return Err(MPI_T_ERR_INVALID);
    }
    Ok(CStr::from_ptr(p).to_string_lossy())
}

/// Sizes whose default `auto` means this host's calibration (docs/transports/shm.md): MPI_T shows them as
/// the number in use, as it did when their defaults were constants.
const CALIBRATED_SIZES: &[&str] = &["SHM_EAGER_LIMIT", "SHM_CHUNK"];

/// A control variable's value as the fabric sees it.
fn cvar_value(i: usize) -> String {
    let p = &PARAMS[i];
    let v = std::env::var(format!("VMF_{}", p.name)).unwrap_or_else(|_| p.default.to_string());
    if v == "auto" && CALIBRATED_SIZES.contains(&p.name) {
        let l = vmf_core::Config::from_env().ok().and_then(|c| c.large).unwrap_or_default();
        return (if p.name == "SHM_CHUNK" { l.chunk } else { l.eager_limit }).to_string();
    }
    v
}

fn cvar_numeric(i: usize) -> bool {
    parse_size(PARAMS[i].default).is_some() || CALIBRATED_SIZES.contains(&PARAMS[i].name)
}

fn pvar_readonly(i: usize) -> bool {
    PVARS[i].class != CLASS_COUNTER
}

/// The live handle `h` of registry `list`, as a reference.
unsafe fn live<'a, H>(list: &[usize], h: *mut c_void) -> Result<&'a mut H, c_int> {
    if h.is_null() || !list.contains(&(h as usize)) {
        return Err(MPI_T_ERR_INVALID_HANDLE);
    }
    Ok(&mut *(h as *mut H))
}

/// Whether `h` is MPI_T_PVAR_ALL_HANDLES.
fn is_all(h: *mut c_void) -> bool {
    std::ptr::eq(h as *const c_int, &ALL_HANDLES_OBJ)
}

fn check_session(t: &TState, s: *mut c_void) -> Result<(), c_int> {
    if s.is_null() || !t.sessions.contains(&(s as usize)) {
        return Err(MPI_T_ERR_INVALID_SESSION);
    }
    Ok(())
}

/// The handles `h` names in `session` (all of them for MPI_T_PVAR_ALL_HANDLES).
fn handles_of(t: &TState, session: *mut c_void, h: *mut c_void) -> Result<Vec<usize>, c_int> {
    check_session(t, session)?;
    if is_all(h) {
        // SAFETY: live handles of the registry.
        return Ok(t.pvar_handles.iter().copied().filter(|&p| unsafe { (*(p as *const PvarHandle)).session } == session as usize).collect());
    }
    if h.is_null() || !t.pvar_handles.contains(&(h as usize)) {
        return Err(MPI_T_ERR_INVALID_HANDLE);
    }
    // SAFETY: a live handle.
    if unsafe { (*(h as *const PvarHandle)).session } != session as usize {
        return Err(MPI_T_ERR_INVALID_HANDLE);
    }
    Ok(vec![h as usize])
}

fn index_ok(i: c_int, n: usize) -> Result<usize, c_int> {
    usize::try_from(i).ok().filter(|&k| k < n).ok_or(MPI_T_ERR_INVALID_INDEX)
}

unsafe fn fill_indices(v: &[c_int], len: c_int, out: *mut c_int) {
    if out.is_null() {
        return;
    }
    for (k, x) in v.iter().take(len.max(0) as usize).enumerate() {
        *out.add(k) = *x;
    }
}

fn now_ns() -> MPI_Count {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime into a local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as MPI_Count * 1_000_000_000 + ts.tv_nsec as MPI_Count
}

mpi_api! {
    fn MPI_T_init_thread / PMPI_T_init_thread(required: c_int, provided: *mut c_int) -> c_int {
        let mut t = T.lock().unwrap_or_else(|p| p.into_inner());
        t.refs += 1;
        set(provided, required.clamp(MPI_THREAD_SINGLE, MPI_THREAD_MULTIPLE));
        MPI_SUCCESS
    }
    fn MPI_T_finalize / PMPI_T_finalize() -> c_int {
        let mut t = T.lock().unwrap_or_else(|p| p.into_inner());
        if t.refs == 0 {
            return MPI_T_ERR_NOT_INITIALIZED;
        }
        t.refs -= 1;
        if t.refs == 0 {
            // The handles go with the interface.
            for h in std::mem::take(&mut t.cvar_handles) {
                drop(Box::from_raw(h as *mut CvarHandle));
            }
            for h in std::mem::take(&mut t.pvar_handles) {
                drop(Box::from_raw(h as *mut PvarHandle));
            }
            for s in std::mem::take(&mut t.sessions) {
                drop(Box::from_raw(s as *mut u8));
            }
        }
        MPI_SUCCESS
    }

    // -------------------------------------------------------------------------------------------- cvars
    fn MPI_T_cvar_get_num / PMPI_T_cvar_get_num(num_cvar: *mut c_int) -> c_int {
        rc(with(|_| { set(num_cvar, PARAMS.len() as c_int); Ok(()) }))
    }
    fn MPI_T_cvar_get_info / PMPI_T_cvar_get_info(cvar_index: c_int, name: *mut c_char, name_len: *mut c_int, verbosity: *mut c_int, datatype: *mut MPI_Datatype, enumtype: *mut *mut c_void, desc: *mut c_char, desc_len: *mut c_int, bind: *mut c_int, scope: *mut c_int) -> c_int {
        rc(with(|_| {
            let i = index_ok(cvar_index, PARAMS.len())?;
            let p = &PARAMS[i];
            tstr(&format!("VMF_{}", p.name), name, name_len);
            let v = if matches!(p.name, "WAIT" | "BIND" | "VERBOSE" | "SHM" | "TCP") { VERBOSITY_USER_BASIC } else { VERBOSITY_TUNER_BASIC };
            set(verbosity, v);
            set(datatype, if cvar_numeric(i) { MPI_UNSIGNED_LONG_LONG } else { MPI_CHAR });
            set(enumtype, std::ptr::null_mut());
            tstr(p.doc, desc, desc_len);
            set(bind, BIND_NO_OBJECT);
            set(scope, SCOPE_READONLY);
            Ok(())
        }))
    }
    fn MPI_T_cvar_get_index / PMPI_T_cvar_get_index(name: *const c_char, cvar_index: *mut c_int) -> c_int {
        rc(with(|_| {
            let n = name_of(name)?;
            let k = PARAMS.iter().position(|p| n.strip_prefix("VMF_") == Some(p.name)).ok_or(MPI_T_ERR_INVALID_NAME)?;
            set(cvar_index, k as c_int);
            Ok(())
        }))
    }
    fn MPI_T_cvar_handle_alloc / PMPI_T_cvar_handle_alloc(cvar_index: c_int, obj_handle: *mut c_void, handle: *mut *mut c_void, count: *mut c_int) -> c_int {
        let _ = obj_handle;
        rc(with(|t| {
            let i = index_ok(cvar_index, PARAMS.len())?;
            if handle.is_null() {
                return Err(MPI_T_ERR_INVALID);
            }
            let h = Box::into_raw(Box::new(CvarHandle { index: i }));
            t.cvar_handles.push(h as usize);
            *handle = h as *mut c_void;
            set(count, if cvar_numeric(i) { 1 } else { STR_CVAR_LEN as c_int });
            Ok(())
        }))
    }
    fn MPI_T_cvar_handle_free / PMPI_T_cvar_handle_free(handle: *mut *mut c_void) -> c_int {
        rc(with(|t| {
            if handle.is_null() {
                return Err(MPI_T_ERR_INVALID_HANDLE);
            }
            live::<CvarHandle>(&t.cvar_handles, *handle)?;
            t.cvar_handles.retain(|&h| h != *handle as usize);
            drop(Box::from_raw(*handle as *mut CvarHandle));
            *handle = std::ptr::null_mut();
            Ok(())
        }))
    }
    fn MPI_T_cvar_read / PMPI_T_cvar_read(handle: *mut c_void, buf: *mut c_void) -> c_int {
        rc(with(|t| {
            let h = live::<CvarHandle>(&t.cvar_handles, handle)?;
            if buf.is_null() {
                return Err(MPI_T_ERR_INVALID);
            }
            let v = cvar_value(h.index);
            if cvar_numeric(h.index) {
                *(buf as *mut u64) = parse_size(&v).unwrap_or(0);
            } else {
                let n = v.len().min(STR_CVAR_LEN - 1);
                std::ptr::copy_nonoverlapping(v.as_ptr(), buf as *mut u8, n);
                *(buf as *mut u8).add(n) = 0;
            }
            Ok(())
        }))
    }
    fn MPI_T_cvar_write / PMPI_T_cvar_write(handle: *mut c_void, buf: *const c_void) -> c_int {
        let _ = buf;
        rc(with(|t| {
            live::<CvarHandle>(&t.cvar_handles, handle)?;
            // The fabric reads its tunables once, when it starts (scope MPI_T_SCOPE_READONLY).
            Err(MPI_T_ERR_CVAR_SET_NEVER)
        }))
    }
    fn MPI_T_enum_get_info / PMPI_T_enum_get_info(enumtype: *mut c_void, num: *mut c_int, name: *mut c_char, name_len: *mut c_int) -> c_int {
        let _ = (enumtype, num, name, name_len);
        // No variable has an enumeration type, so no enumeration handle exists.
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_enum_get_item / PMPI_T_enum_get_item(enumtype: *mut c_void, indx: c_int, value: *mut c_int, name: *mut c_char, name_len: *mut c_int) -> c_int {
        let _ = (enumtype, indx, value, name, name_len);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }

    // -------------------------------------------------------------------------------------------- pvars
    fn MPI_T_pvar_get_num / PMPI_T_pvar_get_num(num_pvar: *mut c_int) -> c_int {
        rc(with(|_| { set(num_pvar, PVARS.len() as c_int); Ok(()) }))
    }
    fn MPI_T_pvar_get_info / PMPI_T_pvar_get_info(pvar_index: c_int, name: *mut c_char, name_len: *mut c_int, verbosity: *mut c_int, var_class: *mut c_int, datatype: *mut MPI_Datatype, enumtype: *mut *mut c_void, desc: *mut c_char, desc_len: *mut c_int, bind: *mut c_int, readonly: *mut c_int, continuous: *mut c_int, atomic: *mut c_int) -> c_int {
        rc(with(|_| {
            let i = index_ok(pvar_index, PVARS.len())?;
            let p = &PVARS[i];
            tstr(p.name, name, name_len);
            set(verbosity, VERBOSITY_TUNER_DETAIL);
            set(var_class, p.class);
            set(datatype, MPI_UNSIGNED_LONG_LONG);
            set(enumtype, std::ptr::null_mut());
            tstr(p.desc, desc, desc_len);
            set(bind, BIND_NO_OBJECT);
            set(readonly, pvar_readonly(i) as c_int);
            set(continuous, 1);
            set(atomic, 0);
            Ok(())
        }))
    }
    fn MPI_T_pvar_get_index / PMPI_T_pvar_get_index(name: *const c_char, var_class: c_int, pvar_index: *mut c_int) -> c_int {
        rc(with(|_| {
            let n = name_of(name)?;
            let k = PVARS.iter().position(|p| p.name == n && p.class == var_class).ok_or(MPI_T_ERR_INVALID_NAME)?;
            set(pvar_index, k as c_int);
            Ok(())
        }))
    }
    fn MPI_T_pvar_session_create / PMPI_T_pvar_session_create(session: *mut *mut c_void) -> c_int {
        rc(with(|t| {
            if session.is_null() {
                return Err(MPI_T_ERR_INVALID);
            }
            let s = Box::into_raw(Box::new(0u8));
            t.sessions.push(s as usize);
            *session = s as *mut c_void;
            Ok(())
        }))
    }
    fn MPI_T_pvar_session_free / PMPI_T_pvar_session_free(session: *mut *mut c_void) -> c_int {
        rc(with(|t| {
            if session.is_null() {
                return Err(MPI_T_ERR_INVALID_SESSION);
            }
            let s = *session;
            check_session(t, s)?;
            // Its handles go with it.
            let mine: Vec<usize> = t.pvar_handles.iter().copied().filter(|&h| (*(h as *const PvarHandle)).session == s as usize).collect();
            t.pvar_handles.retain(|h| !mine.contains(h));
            for h in mine {
                drop(Box::from_raw(h as *mut PvarHandle));
            }
            t.sessions.retain(|&x| x != s as usize);
            drop(Box::from_raw(s as *mut u8));
            *session = std::ptr::null_mut();
            Ok(())
        }))
    }
    fn MPI_T_pvar_handle_alloc / PMPI_T_pvar_handle_alloc(session: *mut c_void, pvar_index: c_int, obj_handle: *mut c_void, handle: *mut *mut c_void, count: *mut c_int) -> c_int {
        let _ = obj_handle;
        rc(with(|t| {
            check_session(t, session)?;
            let i = index_ok(pvar_index, PVARS.len())?;
            if handle.is_null() {
                return Err(MPI_T_ERR_INVALID);
            }
            let offset = if pvar_readonly(i) { 0 } else { (PVARS[i].get)(&counters(t)) };
            let h = Box::into_raw(Box::new(PvarHandle { session: session as usize, index: i, offset }));
            t.pvar_handles.push(h as usize);
            *handle = h as *mut c_void;
            set(count, 1);
            Ok(())
        }))
    }
    fn MPI_T_pvar_handle_free / PMPI_T_pvar_handle_free(session: *mut c_void, handle: *mut *mut c_void) -> c_int {
        rc(with(|t| {
            if handle.is_null() {
                return Err(MPI_T_ERR_INVALID_HANDLE);
            }
            let h = *handle;
            handles_of(t, session, h)?;
            if is_all(h) {
                return Err(MPI_T_ERR_INVALID_HANDLE);
            }
            t.pvar_handles.retain(|&x| x != h as usize);
            drop(Box::from_raw(h as *mut PvarHandle));
            *handle = std::ptr::null_mut();
            Ok(())
        }))
    }
    fn MPI_T_pvar_start / PMPI_T_pvar_start(session: *mut c_void, handle: *mut c_void) -> c_int {
        // Every variable is continuous: nothing to start (MPI_T_PVAR_ALL_HANDLES: fine, as the standard says).
        rc(with(|t| {
            let all = is_all(handle);
            handles_of(t, session, handle)?;
            if all { Ok(()) } else { Err(MPI_T_ERR_PVAR_NO_STARTSTOP) }
        }))
    }
    fn MPI_T_pvar_stop / PMPI_T_pvar_stop(session: *mut c_void, handle: *mut c_void) -> c_int {
        rc(with(|t| {
            let all = is_all(handle);
            handles_of(t, session, handle)?;
            if all { Ok(()) } else { Err(MPI_T_ERR_PVAR_NO_STARTSTOP) }
        }))
    }
    fn MPI_T_pvar_read / PMPI_T_pvar_read(session: *mut c_void, handle: *mut c_void, buf: *mut c_void) -> c_int {
        rc(with(|t| pvar_read(t, session, handle, buf, false)))
    }
    fn MPI_T_pvar_readreset / PMPI_T_pvar_readreset(session: *mut c_void, handle: *mut c_void, buf: *mut c_void) -> c_int {
        rc(with(|t| pvar_read(t, session, handle, buf, true)))
    }
    fn MPI_T_pvar_reset / PMPI_T_pvar_reset(session: *mut c_void, handle: *mut c_void) -> c_int {
        rc(with(|t| {
            let now = counters(t);
            let all = is_all(handle);
            for h in handles_of(t, session, handle)? {
                let h = &mut *(h as *mut PvarHandle);
                if pvar_readonly(h.index) {
                    if all {
                        continue; // ALL_HANDLES resets those that can be
                    }
                    return Err(MPI_T_ERR_PVAR_NO_WRITE);
                }
                h.offset = (PVARS[h.index].get)(&now);
            }
            Ok(())
        }))
    }
    fn MPI_T_pvar_write / PMPI_T_pvar_write(session: *mut c_void, handle: *mut c_void, buf: *const c_void) -> c_int {
        rc(with(|t| {
            if is_all(handle) {
                return Err(MPI_T_ERR_INVALID_HANDLE);
            }
            let hs = handles_of(t, session, handle)?;
            let h = &mut *(hs[0] as *mut PvarHandle);
            if pvar_readonly(h.index) {
                return Err(MPI_T_ERR_PVAR_NO_WRITE);
            }
            if buf.is_null() {
                return Err(MPI_T_ERR_INVALID);
            }
            let v = *(buf as *const u64);
            h.offset = (PVARS[h.index].get)(&counters(t)).wrapping_sub(v);
            Ok(())
        }))
    }

    // -------------------------------------------------------------------------------------------- categories
    fn MPI_T_category_get_num / PMPI_T_category_get_num(num_cat: *mut c_int) -> c_int {
        rc(with(|_| { set(num_cat, CATEGORIES.len() as c_int); Ok(()) }))
    }
    fn MPI_T_category_get_info / PMPI_T_category_get_info(cat_index: c_int, name: *mut c_char, name_len: *mut c_int, desc: *mut c_char, desc_len: *mut c_int, num_cvars: *mut c_int, num_pvars: *mut c_int, num_categories: *mut c_int) -> c_int {
        rc(with(|_| {
            let i = index_ok(cat_index, CATEGORIES.len())?;
            tstr(CATEGORIES[i].name, name, name_len);
            tstr(CATEGORIES[i].desc, desc, desc_len);
            set(num_cvars, cat_cvars(i).len() as c_int);
            set(num_pvars, cat_pvars(i).len() as c_int);
            set(num_categories, 0);
            Ok(())
        }))
    }
    fn MPI_T_category_get_index / PMPI_T_category_get_index(name: *const c_char, cat_index: *mut c_int) -> c_int {
        rc(with(|_| {
            let n = name_of(name)?;
            let k = CATEGORIES.iter().position(|c| c.name == n).ok_or(MPI_T_ERR_INVALID_NAME)?;
            set(cat_index, k as c_int);
            Ok(())
        }))
    }
    fn MPI_T_category_get_cvars / PMPI_T_category_get_cvars(cat_index: c_int, len: c_int, indices: *mut c_int) -> c_int {
        rc(with(|_| { fill_indices(&cat_cvars(index_ok(cat_index, CATEGORIES.len())?), len, indices); Ok(()) }))
    }
    fn MPI_T_category_get_pvars / PMPI_T_category_get_pvars(cat_index: c_int, len: c_int, indices: *mut c_int) -> c_int {
        rc(with(|_| { fill_indices(&cat_pvars(index_ok(cat_index, CATEGORIES.len())?), len, indices); Ok(()) }))
    }
    fn MPI_T_category_get_categories / PMPI_T_category_get_categories(cat_index: c_int, len: c_int, indices: *mut c_int) -> c_int {
        let _ = (len, indices);
        rc(with(|_| { index_ok(cat_index, CATEGORIES.len())?; Ok(()) }))
    }
    fn MPI_T_category_get_events / PMPI_T_category_get_events(cat_index: c_int, len: c_int, indices: *mut c_int) -> c_int {
        let _ = (len, indices);
        rc(with(|_| { index_ok(cat_index, CATEGORIES.len())?; Ok(()) }))
    }
    fn MPI_T_category_get_num_events / PMPI_T_category_get_num_events(cat_index: c_int, num_events: *mut c_int) -> c_int {
        rc(with(|_| { index_ok(cat_index, CATEGORIES.len())?; set(num_events, 0); Ok(()) }))
    }
    fn MPI_T_category_changed / PMPI_T_category_changed(update_number: *mut c_int) -> c_int {
        // The categories are fixed for the life of the process.
        rc(with(|_| { set(update_number, 0); Ok(()) }))
    }

    // -------------------------------------------------------------------------------------------- events
    fn MPI_T_event_get_num / PMPI_T_event_get_num(num_events: *mut c_int) -> c_int {
        rc(with(|_| { set(num_events, 0); Ok(()) }))
    }
    fn MPI_T_event_get_info / PMPI_T_event_get_info(event_index: c_int, name: *mut c_char, name_len: *mut c_int, verbosity: *mut c_int, array_of_datatypes: *mut MPI_Datatype, array_of_displacements: *mut MPI_Aint, num_elements: *mut c_int, enumtype: *mut *mut c_void, info: *mut MPI_Info, desc: *mut c_char, desc_len: *mut c_int, bind: *mut c_int) -> c_int {
        let _ = (name, name_len, verbosity, array_of_datatypes, array_of_displacements, num_elements, enumtype, info, desc, desc_len, bind);
        rc(with(|_| index_ok(event_index, 0).map(drop)))
    }
    fn MPI_T_event_get_index / PMPI_T_event_get_index(name: *const c_char, event_index: *mut c_int) -> c_int {
        let _ = event_index;
        rc(with(|_| { name_of(name)?; Err(MPI_T_ERR_INVALID_NAME) }))
    }
    fn MPI_T_event_handle_alloc / PMPI_T_event_handle_alloc(event_index: c_int, obj_handle: *mut c_void, info: MPI_Info, event_registration: *mut *mut c_void) -> c_int {
        let _ = (obj_handle, info, event_registration);
        rc(with(|_| index_ok(event_index, 0).map(drop)))
    }
    fn MPI_T_event_handle_free / PMPI_T_event_handle_free(event_registration: *mut c_void, user_data: *mut c_void, free_cb_function: *mut c_void) -> c_int {
        let _ = (event_registration, user_data, free_cb_function);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_handle_get_info / PMPI_T_event_handle_get_info(event_registration: *mut c_void, info_used: *mut MPI_Info) -> c_int {
        let _ = (event_registration, info_used);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_handle_set_info / PMPI_T_event_handle_set_info(event_registration: *mut c_void, info: MPI_Info) -> c_int {
        let _ = (event_registration, info);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_register_callback / PMPI_T_event_register_callback(event_registration: *mut c_void, cb_safety: c_int, info: MPI_Info, user_data: *mut c_void, event_cb_function: *mut c_void) -> c_int {
        let _ = (event_registration, cb_safety, info, user_data, event_cb_function);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_callback_get_info / PMPI_T_event_callback_get_info(event_registration: *mut c_void, cb_safety: c_int, info_used: *mut MPI_Info) -> c_int {
        let _ = (event_registration, cb_safety, info_used);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_callback_set_info / PMPI_T_event_callback_set_info(event_registration: *mut c_void, cb_safety: c_int, info: MPI_Info) -> c_int {
        let _ = (event_registration, cb_safety, info);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_set_dropped_handler / PMPI_T_event_set_dropped_handler(event_registration: *mut c_void, dropped_cb_function: *mut c_void) -> c_int {
        let _ = (event_registration, dropped_cb_function);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_read / PMPI_T_event_read(event_instance: *mut c_void, element_index: c_int, buffer: *mut c_void) -> c_int {
        let _ = (event_instance, element_index, buffer);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_copy / PMPI_T_event_copy(event_instance: *mut c_void, buffer: *mut c_void) -> c_int {
        let _ = (event_instance, buffer);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_get_timestamp / PMPI_T_event_get_timestamp(event_instance: *mut c_void, event_timestamp: *mut MPI_Count) -> c_int {
        let _ = (event_instance, event_timestamp);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_event_get_source / PMPI_T_event_get_source(event_instance: *mut c_void, source_index: *mut c_int) -> c_int {
        let _ = (event_instance, source_index);
        rc(with(|_| Err(MPI_T_ERR_INVALID_HANDLE)))
    }
    fn MPI_T_source_get_num / PMPI_T_source_get_num(num_sources: *mut c_int) -> c_int {
        rc(with(|_| { set(num_sources, 1); Ok(()) }))
    }
    fn MPI_T_source_get_info / PMPI_T_source_get_info(source_index: c_int, name: *mut c_char, name_len: *mut c_int, desc: *mut c_char, desc_len: *mut c_int, ordering: *mut c_int, ticks_per_second: *mut MPI_Count, max_ticks: *mut MPI_Count, info: *mut MPI_Info) -> c_int {
        rc(with(|_| {
            index_ok(source_index, 1)?;
            tstr("vmfabric_clock", name, name_len);
            tstr("the process's monotonic clock (CLOCK_MONOTONIC), in nanoseconds", desc, desc_len);
            set(ordering, SOURCE_ORDERED);
            set(ticks_per_second, 1_000_000_000);
            set(max_ticks, MPI_Count::MAX);
            set(info, crate::info::INFO_NULL);
            Ok(())
        }))
    }
    fn MPI_T_source_get_timestamp / PMPI_T_source_get_timestamp(source_index: c_int, timestamp: *mut MPI_Count) -> c_int {
        rc(with(|_| { index_ok(source_index, 1)?; set(timestamp, now_ns()); Ok(()) }))
    }
}

unsafe fn pvar_read(t: &mut TState, session: *mut c_void, handle: *mut c_void, buf: *mut c_void, reset: bool) -> Result<(), c_int> {
    if is_all(handle) {
        return Err(MPI_T_ERR_INVALID_HANDLE);
    }
    let hs = handles_of(t, session, handle)?;
    let h = &mut *(hs[0] as *mut PvarHandle);
    if buf.is_null() {
        return Err(MPI_T_ERR_INVALID);
    }
    if reset && pvar_readonly(h.index) {
        return Err(MPI_T_ERR_PVAR_NO_WRITE);
    }
    let now = (PVARS[h.index].get)(&counters(t));
    *(buf as *mut u64) = now.wrapping_sub(h.offset);
    if reset {
        h.offset = now;
    }
    Ok(())
}
