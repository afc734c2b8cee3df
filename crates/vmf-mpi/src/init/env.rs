//! Environment management: init/finalize, threads, time, names, versions, memory, error handlers, error
//! classes and strings, communicator queries and attributes, and the exported data symbols.
use crate::*;
use std::ffi::{c_char, c_double, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

// ------------------------------------------------------------------------------------------------ data

/// A pointer-valued exported variable (MPICH exports these as `int * const`).
#[repr(transparent)]
pub struct CPtr(pub *const c_int);
// SAFETY: points to immutable statics.
unsafe impl Sync for CPtr {}

static UNWEIGHTED_OBJ: c_int = 0;
static WEIGHTS_EMPTY_OBJ: c_int = 0;
static F_STATUS_IGNORE_OBJ: [c_int; 5] = [0; 5];
static F_STATUSES_IGNORE_OBJ: [c_int; 5] = [0; 5];

/// `MPI_UNWEIGHTED` (a distinct non-NULL pointer, as in MPICH).
#[no_mangle]
pub static MPI_UNWEIGHTED: CPtr = CPtr(&UNWEIGHTED_OBJ);
/// `MPI_WEIGHTS_EMPTY`.
#[no_mangle]
pub static MPI_WEIGHTS_EMPTY: CPtr = CPtr(&WEIGHTS_EMPTY_OBJ);
/// `MPI_F_STATUS_IGNORE` (for the Fortran interface of the next issue).
#[no_mangle]
pub static MPI_F_STATUS_IGNORE: CPtr =
    CPtr(&F_STATUS_IGNORE_OBJ as *const [c_int; 5] as *const c_int);
/// `MPI_F_STATUSES_IGNORE`.
#[no_mangle]
pub static MPI_F_STATUSES_IGNORE: CPtr =
    CPtr(&F_STATUSES_IGNORE_OBJ as *const [c_int; 5] as *const c_int);

/// The objects `MPI_F08_STATUS_IGNORE` and `MPI_F08_STATUSES_IGNORE` point to (an `MPI_F08_status` and an
/// array of one), exported under MPICH's names.
#[no_mangle]
pub static MPIR_F08_MPI_STATUS_IGNORE_OBJ: [c_int; 5] = [0; 5];
#[no_mangle]
pub static MPIR_F08_MPI_STATUSES_IGNORE_OBJ: [c_int; 5] = [0; 5];
/// `MPI_F08_STATUS_IGNORE`: the sentinel the C side of an mpi_f08 binding passes (a distinct non-NULL
/// pointer, as in MPICH; this library has no mpi_f08 module of its own, but a program or binding built
/// against MPICH's header links).
#[no_mangle]
pub static MPI_F08_STATUS_IGNORE: CPtr =
    CPtr(&MPIR_F08_MPI_STATUS_IGNORE_OBJ as *const [c_int; 5] as *const c_int);
/// `MPI_F08_STATUSES_IGNORE`.
#[no_mangle]
pub static MPI_F08_STATUSES_IGNORE: CPtr =
    CPtr(&MPIR_F08_MPI_STATUSES_IGNORE_OBJ as *const [c_int; 5] as *const c_int);

/// `MPI_DUP_FN` (MPICH names it `MPIR_Dup_fn`): copy the attribute value and set the flag.
///
/// # Safety
/// `attr_out` and `flag` must be valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPIR_Dup_fn(
    _comm: c_int,
    _keyval: c_int,
    _extra: *mut c_void,
    attr_in: *mut c_void,
    attr_out: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    *(attr_out as *mut *mut c_void) = attr_in;
    *flag = 1;
    MPI_SUCCESS
}

// ------------------------------------------------------------------------------------------------ attributes

static mut ATTR_TAG_UB: c_int = TAG_UB;
static mut ATTR_HOST: c_int = MPI_PROC_NULL;
static mut ATTR_IO: c_int = MPI_ANY_SOURCE;
static mut ATTR_WTIME_IS_GLOBAL: c_int = 0;
static mut ATTR_UNIVERSE_SIZE: c_int = 1;
static mut ATTR_APPNUM: c_int = 0;
static mut ATTR_LASTUSEDCODE: c_int = MPI_ERR_LASTCODE;

// ------------------------------------------------------------------------------------------------ errors

/// Text of an error class or code.
pub fn error_string(code: c_int) -> String {
    if code >= USER_CLASS_BASE {
        return match user_string(code) {
            Some(s) => s.as_deref().unwrap_or("").to_string(),
            None => format!("unknown error code {code}"),
        };
    }
    let s = match code {
        0 => "no error",
        1 => "invalid buffer pointer",
        2 => "invalid count argument",
        3 => "invalid datatype",
        4 => "invalid tag",
        5 => "invalid communicator",
        6 => "invalid rank",
        7 => "invalid root",
        8 => "invalid group",
        9 => "invalid operation",
        10 => "invalid topology",
        11 => "invalid dimension argument",
        12 => "invalid argument",
        13 => "unknown error",
        14 => "message truncated",
        15 => "other MPI error",
        16 => "internal MPI error",
        17 => "error code is in status",
        18 => "pending request",
        19 => "invalid request",
        20 => "permission denied",
        21 => "invalid access mode",
        22 => "invalid file name",
        23 => "error in data conversion",
        24 => "data representation identifier already registered",
        25 => "file exists",
        26 => "file in use",
        27 => "invalid file handle",
        28 => "invalid info object",
        29 => "invalid info key",
        30 => "invalid info value",
        31 => "key not defined in info object",
        32 => "I/O error",
        33 => "invalid service name",
        34 => "out of memory",
        35 => "collective argument not identical on all processes",
        36 => "no space left",
        37 => "no such file",
        38 => "invalid port",
        39 => "quota exceeded",
        40 => "read-only file or file system",
        41 => "service error",
        42 => "spawn error",
        43 => "unsupported data representation",
        44 => "operation not supported",
        45 => "invalid window",
        46 => "invalid base address",
        47 => "invalid lock type",
        48 => "invalid attribute key",
        49 => "conflicting accesses to window",
        50 => "wrong RMA synchronization",
        51 => "invalid size",
        52 => "invalid displacement",
        53 => "invalid assert argument",
        55 => "target memory not in window",
        56 => "memory cannot be attached",
        57 => "memory cannot be shared",
        58 => "wrong window flavor",
        59..=74 | 78 => "MPI tool interface error",
        75 => "invalid session",
        76 => "communication with an aborted process",
        77 => "value too large to store",
        101 => "process failure",
        102 => "process failure pending",
        103 => "communication object revoked",
        104 => "operation could not be issued",
        105 => "cannot allocate request",
        _ => return format!("unknown error code {code}"),
    };
    s.to_string()
}

/// An added class or code: its slot.
enum UserSlot {
    Class(usize),
    Code(usize),
}

/// The slot of an added class or code that currently exists.
fn user_slot(code: c_int) -> Option<UserSlot> {
    let u = user_errs();
    if code >= USER_CODE_BASE {
        let i = (code - USER_CODE_BASE) as usize;
        matches!(u.codes.get(i), Some(Some(_))).then_some(UserSlot::Code(i))
    } else if code >= USER_CLASS_BASE {
        let i = (code - USER_CLASS_BASE) as usize;
        matches!(u.classes.get(i), Some(Some(_))).then_some(UserSlot::Class(i))
    } else {
        None
    }
}

/// The string of an added class or code that exists (`Some(None)`: none set yet).
fn user_string(code: c_int) -> Option<&'static mut Option<String>> {
    let u = user_errs();
    match user_slot(code)? {
        UserSlot::Class(i) => u.classes[i].as_mut(),
        UserSlot::Code(i) => u.codes[i].as_mut().map(|(_, s)| s),
    }
}

fn valid_code(code: c_int) -> bool {
    (0..=MPICH_ERR_LAST_CLASS).contains(&code)
        || (101..=MPICH_ERR_LAST_MPIX).contains(&code)
        || user_slot(code).is_some()
}

/// The class of an error code.
pub fn error_class(code: c_int) -> Option<c_int> {
    match user_slot(code) {
        Some(UserSlot::Code(i)) => user_errs().codes[i].as_ref().map(|(c, _)| *c),
        Some(UserSlot::Class(_)) => Some(code),
        None => valid_code(code).then_some(code),
    }
}

/// Puts `v` in the lowest free slot of `t` (at most `USER_SLOTS`) and returns the slot.
fn take_slot<T>(t: &mut Vec<Option<T>>, v: T) -> R<usize> {
    if t.len() >= USER_SLOTS && t.iter().all(Option::is_some) {
        return err(MPI_ERR_OTHER, "too many added error classes or codes");
    }
    Ok(put_in_free_slot(t, 0, v))
}

/// MPI_LASTUSEDCODE: the largest added class or code that exists, and never below MPI_ERR_LASTCODE.
fn update_lastused() {
    let u = user_errs();
    while matches!(u.classes.last(), Some(None)) {
        u.classes.pop();
    }
    while matches!(u.codes.last(), Some(None)) {
        u.codes.pop();
    }
    let last = if !u.codes.is_empty() {
        USER_CODE_BASE + u.codes.len() as c_int - 1
    } else if !u.classes.is_empty() {
        USER_CLASS_BASE + u.classes.len() as c_int - 1
    } else {
        MPI_ERR_LASTCODE
    };
    // SAFETY: serialised calls.
    unsafe { ATTR_LASTUSEDCODE = last };
}

pub(crate) fn errhandler_ok(st: &State, eh: MPI_Errhandler) -> bool {
    eh == MPI_ERRORS_ARE_FATAL
        || eh == MPI_ERRORS_RETURN
        || eh == MPI_ERRORS_ABORT
        || ((eh as u32) & 0xfc00_0000 == EH_BASE
            && st
                .errhandlers
                .get(((eh as u32) & 0x03ff_ffff) as usize)
                .is_some_and(|f| f.is_some()))
}

// ------------------------------------------------------------------------------------------------ init

/// Start the library (the fabric, WORLD, SELF and the bridge communicator) unless it runs: by MPI_Init or
/// the first MPI_Session_init. It cannot start again once stopped (the fabric has left its job).
pub(crate) fn start(required: c_int) -> R {
    match phase() {
        PHASE_INIT => return Ok(()),
        PHASE_DONE => {
            return err(
                MPI_ERR_OTHER,
                "the library was finalized (MPI_Finalize and every session): it cannot start again in this process",
            )
        }
        _ => {}
    }
    let fab = Fabric::init().map_err(|e| MpiErr {
        code: MPI_ERR_OTHER,
        msg: e.to_string(),
    })?;
    let (rank, size) = (fab.rank(), fab.size());
    let mut world = Comm::new(16, rank as i32, None, size as i32, MPI_ERRORS_ARE_FATAL);
    world.name = "MPI_COMM_WORLD".into();
    let mut selfc = Comm::new(18, 0, Some(vec![rank]), 1, MPI_ERRORS_ARE_FATAL);
    selfc.name = "MPI_COMM_SELF".into();
    // Every process, on contexts of its own: where communicators made from groups agree (`session.rs`).
    let mut bridge = Comm::new(20, rank as i32, None, size as i32, MPI_ERRORS_RETURN);
    bridge.name = "(vmfabric bridge)".into();
    let level = required.clamp(MPI_THREAD_SINGLE, MPI_THREAD_MULTIPLE);
    // The tool interface reads the engine's counters from here on, from any thread.
    crate::mpi_t::attach(fab.engine().tally());
    let st = State {
        fab,
        comms: vec![Some(world), Some(selfc), Some(bridge)],
        reqs: Vec::with_capacity(64),
        free_reqs: Vec::new(),
        msgs: Vec::new(),
        orphans: Vec::new(),
        bsends: Vec::new(),
        bsend_buf: None,
        bsend_used: 0,
        errhandlers: Vec::new(),
        thread_level: level,
        main_thread: std::thread::current().id(),
        groups: Vec::new(),
        keyvals: Vec::new(),
        ops: Vec::new(),
        types: Vec::new(),
        type_holds: Vec::new(),
        predef_names: Default::default(),
        predef_attrs: Default::default(),
        f90_types: Default::default(),
        big_types: Default::default(),
        next_ctx: 32,
        mt_ctx_seq: 0,
        mt_ictx_seq: 0,
        next_ictx: IDUP_CTX_BASE,
        spare: None,
        nbc_active: 0,
        pcolls: Vec::new(),
        wins: Vec::new(),
        files: Vec::new(),
        file_eh: MPI_ERRORS_RETURN,
        datareps: Vec::new(),
        ports: Vec::new(),
        names: Vec::new(),
        dyn_links: Vec::new(),
        parent: MPI_COMM_NULL,
    };
    // What the launcher says (vmfabric run --universe-size, mpiexec -usize); without a launcher the job
    // itself; unknown (the attribute is not set, as under MPICH) when a launcher does not say.
    let universe = match st.fab.universe_size() {
        Some(u) if u > 0 => u.max(size),
        Some(_) => 0,
        None if std::env::var_os("PMI_FD").is_none() && std::env::var_os("PMI_PORT").is_none() => size,
        None => 0,
    };
    let appnum = st.fab.appnum().unwrap_or(0);
    // SAFETY: serialised calls (crate contract).
    unsafe {
        ATTR_UNIVERSE_SIZE = universe.min(c_int::MAX as usize) as c_int;
        ATTR_APPNUM = appnum as c_int;
        if let Ok(a) = std::env::var("PMI_APPNUM")
            .unwrap_or_default()
            .parse::<c_int>()
        {
            ATTR_APPNUM = a;
        }
        *G.st.get() = Some(st);
        *G.phase.get() = PHASE_INIT;
    }
    if level == MPI_THREAD_MULTIPLE {
        // Every call takes the library lock from now on, and a thread waiting in the engine hands it over
        // between its polls (`mt.rs`). The guard covers the rest of this MPI_Init_thread.
        let _g = crate::mt::enable();
        let st = state()?;
        // SAFETY: from now on every call holds the library lock, which the hook hands over and retakes.
        unsafe {
            st.fab.set_shared();
            st.fab.engine().set_yield_hook(Some(crate::mt::hook));
        }
    }
    Ok(())
}

/// Stop the library if, once `dropping` sessions end, neither the world model nor a session uses it.
pub(crate) fn stop_if_unused(dropping: usize) -> R {
    let st = state()?;
    crate::p2p::reap(st, true)?;
    // SAFETY: serialised calls.
    let world_on = unsafe { *G.world.get() } == WORLD_ON;
    if !world_on && crate::session::live() <= dropping {
        crate::spawn::finalize(st);
        st.fab.finalize().map_err(from_core)?;
        // SAFETY: serialised calls.
        unsafe { *G.phase.get() = PHASE_DONE };
    }
    Ok(())
}

fn do_init(required: c_int, provided: *mut c_int) -> R {
    // SAFETY: serialised calls.
    match unsafe { *G.world.get() } {
        WORLD_ON => return err(MPI_ERR_OTHER, "MPI_Init called twice"),
        WORLD_DONE => return err(MPI_ERR_OTHER, "MPI_Init called after MPI_Finalize"),
        _ => {}
    }
    start(required)?;
    // SAFETY: serialised calls.
    unsafe {
        *G.world.get() = WORLD_ON;
        if !provided.is_null() {
            *provided = state()?.thread_level;
        }
    }
    let st = state()?;
    set_world_fast(Some((st.fab.rank(), st.fab.size())));
    // A process started by MPI_Comm_spawn connects to its parents now (collective over the children).
    let _g = crate::mt::enter();
    crate::spawn::connect_parent(state()?)
}

/// Address range ever handed out from the shared pool by MPI_Alloc_mem.
static POOL_LO: AtomicUsize = AtomicUsize::new(usize::MAX);
static POOL_HI: AtomicUsize = AtomicUsize::new(0);

mpi_api! {
    fn MPI_Init / PMPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Init", do_init(MPI_THREAD_SINGLE, std::ptr::null_mut()))
    }

    fn MPI_Init_thread / PMPI_Init_thread(_argc: *mut c_int, _argv: *mut *mut *mut c_char, required: c_int, provided: *mut c_int) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Init_thread", do_init(required, provided))
    }

    fn MPI_Initialized / PMPI_Initialized(flag: *mut c_int) -> c_int {
        if flag.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Initialized", MpiErr { code: MPI_ERR_ARG, msg: "flag is NULL".into() });
        }
        *flag = (*G.world.get() != WORLD_NONE) as c_int;
        MPI_SUCCESS
    }

    fn MPI_Finalized / PMPI_Finalized(flag: *mut c_int) -> c_int {
        if flag.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Finalized", MpiErr { code: MPI_ERR_ARG, msg: "flag is NULL".into() });
        }
        *flag = (*G.world.get() == WORLD_DONE) as c_int;
        MPI_SUCCESS
    }

    fn MPI_Finalize / PMPI_Finalize() -> c_int {
        let r = (|| -> R {
            if *G.world.get() != WORLD_ON {
                return err(MPI_ERR_OTHER, "MPI_Finalize without MPI_Init");
            }
            crate::comm::free_self_attrs(state()?)?;
            set_world_fast(None);
            *G.world.get() = WORLD_DONE;
            // Sessions still open keep the library running; the last one stops it.
            stop_if_unused(0)
        })();
        fin(MPI_COMM_WORLD, "MPI_Finalize", r)
    }

    fn MPI_Abort / PMPI_Abort(_comm: MPI_Comm, errorcode: c_int) -> c_int {
        let msg = format!("application called MPI_Abort(comm, {errorcode})");
        match state_opt() {
            Some(s) if phase() == PHASE_INIT => {
                eprintln!("vmfabric MPI: rank {}: {msg}", s.fab.rank());
                s.fab.abort(errorcode, &msg)
            }
            _ => {
                eprintln!("vmfabric MPI: {msg}");
                std::process::exit(errorcode)
            }
        }
    }

    fn MPI_Query_thread / PMPI_Query_thread(provided: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if provided.is_null() {
                return err(MPI_ERR_ARG, "provided is NULL");
            }
            *provided = st.thread_level;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Query_thread", r)
    }

    fn MPI_Is_thread_main / PMPI_Is_thread_main(flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if flag.is_null() {
                return err(MPI_ERR_ARG, "flag is NULL");
            }
            *flag = (std::thread::current().id() == st.main_thread) as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Is_thread_main", r)
    }



    fn MPI_Get_processor_name / PMPI_Get_processor_name(name: *mut c_char, resultlen: *mut c_int) -> c_int {
        if name.is_null() || resultlen.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Get_processor_name", MpiErr { code: MPI_ERR_ARG, msg: "NULL argument".into() });
        }
        put_str(&vmf_pal::hostid::hostname(), name, resultlen, MPI_MAX_PROCESSOR_NAME);
        MPI_SUCCESS
    }

    fn MPI_Pcontrol / PMPI_Pcontrol(level: c_int) -> c_int {
        // Defined by the standard to do nothing in the library itself: a profiling layer interposing
        // MPI_Pcontrol gets the call. (C declares it variadic; on x86-64 a callee that reads only the
        // first argument is call-compatible with variadic callers.)
        let _ = level;
        MPI_SUCCESS
    }
    fn MPI_Get_version / PMPI_Get_version(version: *mut c_int, subversion: *mut c_int) -> c_int {
        if version.is_null() || subversion.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Get_version", MpiErr { code: MPI_ERR_ARG, msg: "NULL argument".into() });
        }
        *version = 4;
        *subversion = 0;
        MPI_SUCCESS
    }

    fn MPI_Get_library_version / PMPI_Get_library_version(version: *mut c_char, resultlen: *mut c_int) -> c_int {
        if version.is_null() || resultlen.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Get_library_version", MpiErr { code: MPI_ERR_ARG, msg: "NULL argument".into() });
        }
        let s = format!(
            "vmfabric {} MPI library (libmpich.so.12 ABI, MPI 4.0 constants; shared-memory fabric for co-resident VMs, containers and processes)",
            env!("CARGO_PKG_VERSION")
        );
        put_str(&s, version, resultlen, MPI_MAX_LIBRARY_VERSION_STRING);
        MPI_SUCCESS
    }

    fn MPI_Alloc_mem / PMPI_Alloc_mem(size: MPI_Aint, info: MPI_Info, baseptr: *mut c_void) -> c_int {
        let r = (|| -> R {
            crate::info::check(info)?;
            if size < 0 {
                return err(MPI_ERR_ARG, format!("size {size} is negative"));
            }
            if baseptr.is_null() {
                return err(MPI_ERR_ARG, "baseptr is NULL");
            }
            // From this rank's partition of the shared pool when there is room: a large send from such a
            // buffer is then copied by a co-resident receiver straight out of the region.
            if let Ok(st) = state() {
                if let Some(p) = st.fab.engine().pool_alloc((size as usize).max(1), 4096) {
                    POOL_LO.fetch_min(p as usize, Ordering::Relaxed);
                    POOL_HI.fetch_max(p as usize + size as usize, Ordering::Relaxed);
                    *(baseptr as *mut *mut c_void) = p as *mut c_void;
                    return Ok(());
                }
            }
            // Past the pool: a memfd mapping of whole pages, which co-resident peers map too, so a window
            // created over it (MPI_Win_create on MPI_Alloc_mem memory) is reached by loads and stores.
            if size >= 4096 {
                if let Some(p) = vmf_rma::alloc::alloc_shared(size as usize) {
                    *(baseptr as *mut *mut c_void) = p as *mut c_void;
                    return Ok(());
                }
            }
            let mut p: *mut c_void = std::ptr::null_mut();
            if libc::posix_memalign(&mut p, 4096, (size as usize).max(1)) != 0 {
                return err(MPI_ERR_NO_MEM, format!("cannot allocate {size} bytes"));
            }
            *(baseptr as *mut *mut c_void) = p;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Alloc_mem", r)
    }

    fn MPI_Free_mem / PMPI_Free_mem(base: *mut c_void) -> c_int {
        if base.is_null() {
            return MPI_SUCCESS;
        }
        if let Ok(st) = state() {
            if st.fab.engine().pool_free(base as *mut u8) {
                return MPI_SUCCESS;
            }
        }
        if vmf_rma::alloc::free_shared(base as *mut u8) {
            return MPI_SUCCESS;
        }
        // A pool block freed after MPI_Finalize (erroneous) must not reach free(3): the region is gone.
        let a = base as usize;
        if a >= POOL_LO.load(Ordering::Relaxed) && a < POOL_HI.load(Ordering::Relaxed) {
            return MPI_SUCCESS;
        }
        libc::free(base);
        MPI_SUCCESS
    }

    fn MPI_Error_string / PMPI_Error_string(errorcode: c_int, string: *mut c_char, resultlen: *mut c_int) -> c_int {
        if string.is_null() || resultlen.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Error_string", MpiErr { code: MPI_ERR_ARG, msg: "NULL argument".into() });
        }
        if !valid_code(errorcode) {
            put_str(&format!("unknown error code {errorcode}"), string, resultlen, MPI_MAX_ERROR_STRING);
            return raise(MPI_COMM_WORLD, "MPI_Error_string", MpiErr { code: MPI_ERR_ARG, msg: format!("invalid error code {errorcode}") });
        }
        put_str(&error_string(errorcode), string, resultlen, MPI_MAX_ERROR_STRING);
        MPI_SUCCESS
    }

    fn MPI_Error_class / PMPI_Error_class(errorcode: c_int, errorclass: *mut c_int) -> c_int {
        let r = (|| -> R {
            if errorclass.is_null() {
                return err(MPI_ERR_ARG, "errorclass is NULL");
            }
            *errorclass = error_class(errorcode).ok_or_else(|| MpiErr { code: MPI_ERR_ARG, msg: format!("invalid error code {errorcode}") })?;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Error_class", r)
    }

    fn MPI_Add_error_class / PMPI_Add_error_class(errorclass: *mut c_int) -> c_int {
        let r = (|| -> R {
            if errorclass.is_null() {
                return err(MPI_ERR_ARG, "errorclass is NULL");
            }
            let i = take_slot(&mut user_errs().classes, None)?;
            *errorclass = USER_CLASS_BASE + i as c_int;
            update_lastused();
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Add_error_class", r)
    }

    fn MPI_Add_error_code / PMPI_Add_error_code(errorclass: c_int, errorcode: *mut c_int) -> c_int {
        let r = (|| -> R {
            if errorcode.is_null() {
                return err(MPI_ERR_ARG, "errorcode is NULL");
            }
            let ok = matches!(user_slot(errorclass), Some(UserSlot::Class(_)))
                || (0..=MPICH_ERR_LAST_CLASS).contains(&errorclass);
            if !ok {
                return err(MPI_ERR_ARG, format!("invalid error class {errorclass}"));
            }
            let i = take_slot(&mut user_errs().codes, (errorclass, None))?;
            *errorcode = USER_CODE_BASE + i as c_int;
            update_lastused();
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Add_error_code", r)
    }

    fn MPI_Add_error_string / PMPI_Add_error_string(errorcode: c_int, string: *const c_char) -> c_int {
        let r = (|| -> R {
            if string.is_null() {
                return err(MPI_ERR_ARG, "string is NULL");
            }
            let Some(slot) = user_string(errorcode) else {
                return err(MPI_ERR_ARG, format!("error code {errorcode} was not added by the program"));
            };
            *slot = Some(CStr::from_ptr(string).to_string_lossy().into_owned());
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Add_error_string", r)
    }

    // MPICH 4.0's names for MPI 4.1's MPI_Remove_error_class/code/string.
    fn MPIX_Delete_error_class / PMPIX_Delete_error_class(errorclass: c_int) -> c_int {
        let r = (|| -> R {
            let u = user_errs();
            let Some(UserSlot::Class(i)) = user_slot(errorclass) else {
                return err(MPI_ERR_ARG, format!("error class {errorclass} was not added by the program"));
            };
            if u.codes.iter().flatten().any(|(c, _)| *c == errorclass) {
                return err(MPI_ERR_ARG, format!("error class {errorclass} still has error codes"));
            }
            u.classes[i] = None;
            update_lastused();
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPIX_Delete_error_class", r)
    }

    fn MPIX_Delete_error_code / PMPIX_Delete_error_code(errorcode: c_int) -> c_int {
        let r = (|| -> R {
            let Some(UserSlot::Code(i)) = user_slot(errorcode) else {
                return err(MPI_ERR_ARG, format!("error code {errorcode} was not added by the program"));
            };
            user_errs().codes[i] = None;
            update_lastused();
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPIX_Delete_error_code", r)
    }

    fn MPIX_Delete_error_string / PMPIX_Delete_error_string(errorcode: c_int) -> c_int {
        let r = match user_string(errorcode) {
            Some(s) if s.is_some() => {
                *s = None;
                Ok(())
            }
            _ => err(MPI_ERR_ARG, format!("error code {errorcode} has no added string")),
        };
        fin(MPI_COMM_WORLD, "MPIX_Delete_error_string", r)
    }

    // MPICH's GPU queries: this library moves host memory only, so no GPU kind is supported (a program
    // then stages device buffers itself, as it does under a CPU-only MPICH build).
    fn MPIX_GPU_query_support / PMPIX_GPU_query_support(gpu_type: c_int, is_supported: *mut c_int) -> c_int {
        let r = if is_supported.is_null() {
            err(MPI_ERR_ARG, "is_supported is NULL")
        } else if !(0..=2).contains(&gpu_type) {
            err(MPI_ERR_ARG, format!("invalid gpu_type {gpu_type} (MPIX_GPU_SUPPORT_CUDA, _ZE or _HIP)"))
        } else {
            *is_supported = 0;
            Ok(())
        };
        fin(MPI_COMM_WORLD, "MPIX_GPU_query_support", r)
    }
    fn MPIX_Query_cuda_support / PMPIX_Query_cuda_support() -> c_int {
        0
    }
    fn MPIX_Query_ze_support / PMPIX_Query_ze_support() -> c_int {
        0
    }
    fn MPIX_Query_hip_support / PMPIX_Query_hip_support() -> c_int {
        0
    }

    fn MPI_Comm_create_errhandler / PMPI_Comm_create_errhandler(function: Option<CommErrFn>, errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let f = function.ok_or_else(|| MpiErr { code: MPI_ERR_ARG, msg: "function is NULL".into() })?;
            if errhandler.is_null() {
                return err(MPI_ERR_ARG, "errhandler is NULL");
            }
            st.errhandlers.push(Some(f));
            *errhandler = (EH_BASE | (st.errhandlers.len() - 1) as u32) as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Comm_create_errhandler", r)
    }

    fn MPI_Comm_set_errhandler / PMPI_Comm_set_errhandler(comm: MPI_Comm, errhandler: MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if !errhandler_ok(st, errhandler) {
                return err(MPI_ERR_ARG, format!("invalid error handler {errhandler:#x}"));
            }
            st.comm(comm)?.1.eh = errhandler;
            Ok(())
        })();
        fin(comm, "MPI_Comm_set_errhandler", r)
    }

    fn MPI_Comm_get_errhandler / PMPI_Comm_get_errhandler(comm: MPI_Comm, errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let eh = st.comm(comm)?.1.eh;
            if errhandler.is_null() {
                return err(MPI_ERR_ARG, "errhandler is NULL");
            }
            *errhandler = eh;
            Ok(())
        })();
        fin(comm, "MPI_Comm_get_errhandler", r)
    }

    fn MPI_Errhandler_free / PMPI_Errhandler_free(errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            if errhandler.is_null() {
                return err(MPI_ERR_ARG, "errhandler is NULL");
            }
            if !crate::session::is_session_eh(*errhandler) && !errhandler_ok(state()?, *errhandler) {
                return err(MPI_ERR_ARG, "invalid error handler");
            }
            // Handlers stay valid while communicators use them; predefined ones are never freed.
            *errhandler = MPI_ERRHANDLER_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Errhandler_free", r)
    }

    fn MPI_Comm_call_errhandler / PMPI_Comm_call_errhandler(comm: MPI_Comm, errorcode: c_int) -> c_int {
        let st = match state() {
            Ok(s) => s,
            Err(e) => return raise(comm, "MPI_Comm_call_errhandler", e),
        };
        if let Err(e) = st.comm(comm) {
            return raise(comm, "MPI_Comm_call_errhandler", e);
        }
        let msg = format!("MPI_Comm_call_errhandler with error code {errorcode}");
        let rc = raise(comm, "MPI_Comm_call_errhandler", MpiErr { code: errorcode, msg });
        // The call itself succeeded when the handler returned.
        let _ = rc;
        MPI_SUCCESS
    }



    fn MPI_Comm_get_attr / PMPI_Comm_get_attr(comm: MPI_Comm, keyval: c_int, attribute_val: *mut c_void, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            st.comm(comm)?;
            if attribute_val.is_null() || flag.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            if let Some(v) = crate::comm::get_user_attr(st, comm, keyval)? {
                match v {
                    Some(v) => {
                        *(attribute_val as *mut *mut c_void) = v;
                        *flag = 1;
                    }
                    None => *flag = 0,
                }
                return Ok(());
            }
            let out = attribute_val as *mut *mut c_int;
            let p: *mut c_int = match keyval {
                MPI_TAG_UB => &raw mut ATTR_TAG_UB,
                MPI_HOST => &raw mut ATTR_HOST,
                MPI_IO => &raw mut ATTR_IO,
                MPI_WTIME_IS_GLOBAL => &raw mut ATTR_WTIME_IS_GLOBAL,
                MPI_UNIVERSE_SIZE => &raw mut ATTR_UNIVERSE_SIZE,
                MPI_APPNUM => &raw mut ATTR_APPNUM,
                MPI_LASTUSEDCODE => &raw mut ATTR_LASTUSEDCODE,
                _ => return err(MPI_ERR_KEYVAL, format!("invalid or unsupported attribute key {keyval:#x}")),
            };
            *out = p;
            // MPI_UNIVERSE_SIZE is set only when known (0: the launcher did not say).
            *flag = (keyval != MPI_UNIVERSE_SIZE || *p > 0) as c_int;
            Ok(())
        })();
        fin(comm, "MPI_Comm_get_attr", r)
    }

}

/// (rank, size) in MPI_COMM_WORLD and MPI_COMM_SELF while the world model runs, for the lock-free
/// MPI_Comm_rank/size: both are fixed from MPI_Init to MPI_Finalize. 0 while not running.
static WORLD_RANK_SIZE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Record (or, with None, forget) this process's place in MPI_COMM_WORLD.
pub(crate) fn set_world_fast(v: Option<(usize, usize)>) {
    let x = v.map_or(0, |(r, n)| (1 << 63) | ((r as u64) << 32) | n as u64);
    WORLD_RANK_SIZE.store(x, std::sync::atomic::Ordering::Release);
}

/// (rank, size) of `comm` without the library lock when it is MPI_COMM_WORLD or MPI_COMM_SELF and the
/// world model runs; None otherwise (the caller takes the ordinary path).
#[inline]
fn world_fast(comm: MPI_Comm) -> Option<(c_int, c_int)> {
    let x = WORLD_RANK_SIZE.load(std::sync::atomic::Ordering::Acquire);
    if x == 0 {
        return None;
    }
    match comm {
        MPI_COMM_WORLD => Some((((x >> 32) & 0x7fff_ffff) as c_int, (x & 0xffff_ffff) as c_int)),
        MPI_COMM_SELF => Some((0, 1)),
        _ => None,
    }
}

mpi_api_nolock! {
    fn MPI_Wtime / PMPI_Wtime() -> c_double {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    fn MPI_Wtick / PMPI_Wtick() -> c_double {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        libc::clock_getres(libc::CLOCK_MONOTONIC, &mut ts);
        let t = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        if t > 0.0 { t } else { 1e-9 }
    }
    fn MPI_Comm_rank / PMPI_Comm_rank(comm: MPI_Comm, rank: *mut c_int) -> c_int {
        if let Some((r, _)) = world_fast(comm) {
            if !rank.is_null() {
                *rank = r;
                return MPI_SUCCESS;
            }
        }
        let _mt = crate::mt::enter();
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            if rank.is_null() {
                return err(MPI_ERR_ARG, "rank is NULL");
            }
            *rank = c.rank;
            Ok(())
        })();
        fin(comm, "MPI_Comm_rank", r)
    }
    fn MPI_Comm_size / PMPI_Comm_size(comm: MPI_Comm, size: *mut c_int) -> c_int {
        if let Some((_, n)) = world_fast(comm) {
            if !size.is_null() {
                *size = n;
                return MPI_SUCCESS;
            }
        }
        let _mt = crate::mt::enter();
        let r = (|| -> R {
            let st = state()?;
            let c = st.comm(comm)?.1;
            if size.is_null() {
                return err(MPI_ERR_ARG, "size is NULL");
            }
            *size = c.size;
            Ok(())
        })();
        fin(comm, "MPI_Comm_size", r)
    }
}
