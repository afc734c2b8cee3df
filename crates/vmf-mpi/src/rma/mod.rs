//! One-sided communication (MPI-3 RMA, MPI 4.0 chapter 12), as MPICH keeps it in src/mpi/rma: window
//! objects (this file), the communication calls (`ops.rs`) and the synchronisation calls (`sync.rs`).
//!
//! A window is a `vmf_rma::Window` (which decides, per target, whether memory is reached by loads and
//! stores, by single copy or through the target's agent over TCP) plus what MPI adds: a private
//! communicator for the window's own traffic (fence barriers, post/complete messages), the epoch state
//! that decides which calls are legal (MPI_ERR_RMA_SYNC otherwise), attributes, info, a name and an error
//! handler. The memory model is MPI_WIN_UNIFIED: public and private copies are the same memory.
use crate::comm::{add_comm, new_ctx};
use crate::*;
use std::ffi::{c_char, c_int, c_void};
use vmf_core::Route;
use vmf_rma::{Flavor, RmaCtx, RmaError, WinSpec, Window};

pub(crate) mod ops;
pub(crate) mod sync;

pub type MPI_Win = c_int;
pub type MPI_Group = c_int;
pub const MPI_WIN_NULL: MPI_Win = 0x2000_0000;
const WIN_BASE: u32 = 0xa000_0000;

pub const MPI_WIN_BASE: c_int = 0x6600_0001;
pub const MPI_WIN_SIZE: c_int = 0x6600_0003;
pub const MPI_WIN_DISP_UNIT: c_int = 0x6600_0005;
pub const MPI_WIN_CREATE_FLAVOR: c_int = 0x6600_0007;
pub const MPI_WIN_MODEL: c_int = 0x6600_0009;
pub const MPI_WIN_FLAVOR_CREATE: c_int = 1;
pub const MPI_WIN_FLAVOR_ALLOCATE: c_int = 2;
pub const MPI_WIN_FLAVOR_DYNAMIC: c_int = 3;
pub const MPI_WIN_FLAVOR_SHARED: c_int = 4;
pub const MPI_WIN_UNIFIED: c_int = 2;
pub const MPI_LOCK_EXCLUSIVE: c_int = 234;
pub const MPI_LOCK_SHARED: c_int = 235;
pub const MPI_MODE_NOCHECK: c_int = 1024;
pub const MPI_MODE_NOSTORE: c_int = 2048;
pub const MPI_MODE_NOPUT: c_int = 4096;
pub const MPI_MODE_NOPRECEDE: c_int = 8192;
pub const MPI_MODE_NOSUCCEED: c_int = 16384;
pub(crate) const MODES: c_int =
    MPI_MODE_NOCHECK | MPI_MODE_NOSTORE | MPI_MODE_NOPUT | MPI_MODE_NOPRECEDE | MPI_MODE_NOSUCCEED;

pub const MPI_ERR_WIN: c_int = 45;
pub const MPI_ERR_BASE: c_int = 46;
pub const MPI_ERR_LOCKTYPE: c_int = 47;
pub const MPI_ERR_RMA_SYNC: c_int = 50;
pub const MPI_ERR_SIZE: c_int = 51;
pub const MPI_ERR_DISP: c_int = 52;
pub const MPI_ERR_ASSERT: c_int = 53;
pub const MPI_ERR_RMA_RANGE: c_int = 55;
pub const MPI_ERR_RMA_ATTACH: c_int = 56;
pub const MPI_ERR_RMA_SHARED: c_int = 57;
pub const MPI_ERR_RMA_FLAVOR: c_int = 58;

/// Storage of the predefined attributes' values (MPI_Win_get_attr hands out pointers into it).
pub(crate) struct PreAttrs {
    pub base: *mut c_void,
    pub size: MPI_Aint,
    pub disp_unit: c_int,
    pub flavor: c_int,
    pub model: c_int,
}

/// Which epochs are open on a window (MPI 4.0 §12.5), from this process's side.
#[derive(Default)]
pub(crate) struct Epochs {
    /// A fence opened an epoch (the last fence had no MPI_MODE_NOSUCCEED).
    pub fence: bool,
    /// Operations were issued since that fence (only then is it an epoch other calls conflict with).
    pub fence_ops: bool,
    /// MPI_Win_start's access group (window ranks).
    pub start: Option<Vec<usize>>,
    /// MPI_Win_post's exposure group (window ranks) and the completions still expected.
    pub post: Option<Vec<usize>>,
    /// Per target: 0 none, 1 shared, 2 exclusive (MPI_Win_lock); +4 when taken with MPI_MODE_NOCHECK.
    pub locks: Vec<u8>,
    pub nlocks: usize,
    /// MPI_Win_lock_all is in force; with `lock_all_nocheck` no lock is taken at all.
    pub lock_all: bool,
    pub lock_all_nocheck: bool,
    /// Targets whose shared lock MPI_Win_lock_all took (on first use).
    pub held: Vec<bool>,
}

/// A window.
pub(crate) struct MWin {
    pub w: Window,
    /// The window's private communicator.
    pub comm: MPI_Comm,
    pub ci: usize,
    pub world: Vec<usize>,
    pub eh: MPI_Errhandler,
    pub name: String,
    pub attrs: Vec<(c_int, *mut c_void)>,
    pub hints: crate::info::Pairs,
    pub pre: Box<PreAttrs>,
    pub ep: Epochs,
}

impl MWin {
    pub fn flavor(&self) -> c_int {
        self.pre.flavor
    }
}

#[inline]
pub(crate) fn win_index(h: MPI_Win) -> Option<usize> {
    let u = h as u32;
    (u & 0xfc00_0000 == WIN_BASE).then_some((u & 0x03ff_ffff) as usize)
}

/// The window of handle `h`.
#[inline]
pub(crate) fn win(st: &mut State, h: MPI_Win) -> R<(usize, &mut MWin)> {
    if let Some(i) = win_index(h) {
        if let Some(Some(w)) = st.wins.get_mut(i) {
            return Ok((i, w));
        }
    }
    if h == MPI_WIN_NULL {
        err(MPI_ERR_WIN, "MPI_WIN_NULL is not a valid window here")
    } else {
        err(MPI_ERR_WIN, format!("invalid window handle {h:#x}"))
    }
}

/// An MPI error for a one-sided failure.
pub(crate) fn rma_err(e: RmaError) -> MpiErr {
    let code = match &e {
        RmaError::Range { .. } | RmaError::NotAttached { .. } => MPI_ERR_RMA_RANGE,
        RmaError::Remote {
            status: vmf_rma::Status::Range,
            ..
        } => MPI_ERR_RMA_RANGE,
        RmaError::Bad { .. } => MPI_ERR_ARG,
        RmaError::Shared(_) => MPI_ERR_RMA_SHARED,
        RmaError::NoMem(_) => MPI_ERR_NO_MEM,
        RmaError::Flavor(_) => MPI_ERR_RMA_FLAVOR,
        RmaError::Attach(_) => MPI_ERR_RMA_ATTACH,
        RmaError::Core(c) => return from_core(c.clone()),
        _ => MPI_ERR_OTHER,
    };
    MpiErr {
        code,
        msg: e.to_string(),
    }
}

/// Finish an MPI call on window `win`: success, or hand the error to the window's error handler.
#[inline]
pub(crate) fn fin_win(win: MPI_Win, name: &str, r: R) -> c_int {
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => raise_win(win, name, e),
    }
}

/// Invoke the error handler of `win` (that of MPI_COMM_WORLD when `win` is not a valid window).
#[cold]
pub(crate) fn raise_win(win: MPI_Win, name: &str, e: MpiErr) -> c_int {
    let eh = state_opt()
        .filter(|_| phase() == PHASE_INIT)
        .and_then(|s| win_index(win).and_then(|i| s.wins.get(i)).and_then(|w| w.as_ref()).map(|w| w.eh));
    let Some(eh) = eh else {
        return raise(MPI_COMM_WORLD, name, e);
    };
    match eh {
        MPI_ERRORS_RETURN => e.code,
        x if x == MPI_ERRORS_ARE_FATAL || x == MPI_ERRORS_ABORT => fatal(name, &e),
        user => {
            let f = state_opt().and_then(|s| {
                s.errhandlers
                    .get(((user as u32) & 0x03ff_ffff) as usize)
                    .copied()
                    .flatten()
            });
            match f {
                Some(f) => {
                    let mut w = win;
                    let mut code = e.code;
                    // SAFETY: a handler registered by the program through MPI_Win_create_errhandler.
                    unsafe { f(&mut w, &mut code) };
                    e.code
                }
                None => fatal(name, &e),
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------ creation

/// Create a window of `flavor` over communicator `comm` (collective); returns its handle.
unsafe fn create(
    flavor: Flavor,
    size: MPI_Aint,
    disp_unit: c_int,
    info: MPI_Info,
    comm: MPI_Comm,
    base: *mut c_void,
) -> R<MPI_Win> {
    let st = state()?;
    crate::info::check(info)?;
    if size < 0 {
        return err(MPI_ERR_SIZE, format!("window size {size} is negative"));
    }
    if disp_unit <= 0 {
        return err(MPI_ERR_DISP, format!("displacement unit {disp_unit} is not positive"));
    }
    if flavor == Flavor::Create && base.is_null() && size > 0 {
        return err(MPI_ERR_BASE, "base is NULL for a window of nonzero size");
    }
    let (ci, c) = st.comm(comm)?;
    crate::intercomm::intra_only(c, "creating a window")?;
    let hints = if info == crate::info::INFO_NULL {
        Vec::new()
    } else {
        crate::info::hints(info)?
    };
    let noncontig = hints
        .iter()
        .any(|(k, v)| k == "alloc_shared_noncontig" && v == "true");
    let (me, n) = (c.rank as usize, c.size as usize);
    let world: Vec<usize> = (0..n as i32).map(|r| c.to_world(r)).collect();
    let eh = c.eh;
    if world.iter().any(|&w| w >= st.fab.size()) {
        // Every member sees a process of another job among them, so all fail alike.
        return err(
            crate::io::MPI_ERR_UNSUPPORTED_OPERATION,
            "one-sided windows over processes of several jobs (MPI_Comm_spawn, connect/accept, join) are not supported",
        );
    }
    // The window's own communicator: fences and post/complete messages never meet the program's.
    let ctx = new_ctx(st, ci)?;
    let mut wc = Comm::new(ctx, me as i32, Some(world.clone()), n as i32, MPI_ERRORS_RETURN);
    wc.name = "(window)".into();
    let wch = add_comm(st, wc);
    let wci = comm_index(wch).expect("new communicator");
    let (near, rctx) = {
        let e = st.fab.engine();
        let near: Vec<bool> = world
            .iter()
            .map(|&w| matches!(e.route(w), Route::Shm | Route::SelfLoop))
            .collect();
        (near, RmaCtx::from_engine(&e))
    };
    let spec = WinSpec {
        flavor,
        size: size as usize,
        disp_unit: disp_unit as u32,
        base: base as *mut u8,
        noncontig,
        me,
        near: &near,
        world: &world,
    };
    // The exchanges are allgathers over the window's communicator; the pool is this rank's partition.
    // Both need the library state, used by one closure at a time.
    let stp: *mut State = st;
    let mut exchange = |b: Vec<u8>| -> Result<Vec<Vec<u8>>, String> {
        // SAFETY: the closures run one at a time inside Window::create, which holds no other reference.
        let st = unsafe { &mut *stp };
        crate::coll::allgather_bytes(st, wci, &b).map_err(|e| e.msg)
    };
    let mut pool = |len: usize| -> Option<*mut u8> {
        // SAFETY: as above.
        let st = unsafe { &mut *stp };
        st.fab.engine().pool_alloc(len, 4096)
    };
    let made = Window::create(&rctx, &spec, &mut exchange, &mut pool);
    let st = state()?;
    let w = match made {
        Ok(w) => w,
        Err(e) => {
            let mut h = wch;
            let _ = crate::comm::free_comm(st, &mut h);
            return Err(rma_err(e));
        }
    };
    // While this rank waits in the library, its own thread serves the agent's requests.
    if vmf_rma::agent::Agent::running().is_some() {
        vmf_rma::agent::Agent::hook_into(&mut st.fab.engine());
    }
    // Nobody uses the window before every member has set it up.
    crate::coll::barrier(st, wch)?;
    let fl = match flavor {
        Flavor::Create => MPI_WIN_FLAVOR_CREATE,
        Flavor::Allocate => MPI_WIN_FLAVOR_ALLOCATE,
        Flavor::Shared => MPI_WIN_FLAVOR_SHARED,
        Flavor::Dynamic => MPI_WIN_FLAVOR_DYNAMIC,
    };
    let pre = Box::new(PreAttrs {
        base: if flavor == Flavor::Dynamic {
            std::ptr::null_mut() // MPI_BOTTOM
        } else {
            w.base() as *mut c_void
        },
        size: size as MPI_Aint,
        disp_unit,
        flavor: fl,
        model: MPI_WIN_UNIFIED,
    });
    if st.config_verbose() {
        eprintln!(
            "vmfabric: rank {}: window of {} ranks ({:?}), routes {:?}",
            st.fab.rank(),
            n,
            flavor,
            w.routes()
        );
    }
    let mw = MWin {
        w,
        comm: wch,
        ci: wci,
        world,
        eh,
        name: String::new(),
        attrs: Vec::new(),
        hints,
        pre,
        ep: Epochs {
            locks: vec![0; n],
            held: vec![false; n],
            ..Default::default()
        },
    };
    let i = put_in_free_slot(&mut st.wins, 0, mw);
    Ok((WIN_BASE | i as u32) as c_int)
}

impl State {
    fn config_verbose(&self) -> bool {
        self.fab.engine().config().verbose
    }
}

/// MPI_Win_free: collective; every epoch must be closed.
unsafe fn free(win: *mut MPI_Win) -> R {
    let st = state()?;
    if win.is_null() {
        return err(MPI_ERR_ARG, "win is NULL");
    }
    let h = *win;
    let (wi, w) = self::win(st, h)?;
    if w.ep.nlocks > 0 || w.ep.lock_all || w.ep.start.is_some() || w.ep.post.is_some() {
        return err(
            MPI_ERR_RMA_SYNC,
            "MPI_Win_free with a lock, lock_all, start or post epoch still open",
        );
    }
    w.w.flush_all().map_err(rma_err)?;
    let wch = w.comm;
    crate::coll::barrier(st, wch)?;
    let attrs = std::mem::take(&mut st.wins[wi].as_mut().unwrap().attrs);
    for (k, v) in attrs.iter().rev() {
        crate::comm::delete_obj_attr(st, h, *k, *v)?;
    }
    let mut mw = st.wins[wi].take().unwrap();
    let block = mw.w.take_pool_block();
    drop(mw.w);
    if let Some(p) = block {
        st.fab.engine().pool_free(p);
    }
    let mut c = mw.comm;
    crate::comm::free_comm(st, &mut c)?;
    *win = MPI_WIN_NULL;
    Ok(())
}

/// The window ranks of the members of group `g` (MPI_ERR_GROUP if one is not in the window).
pub(crate) fn group_ranks(st: &State, w: &MWin, g: MPI_Group) -> R<Vec<usize>> {
    let members = crate::comm::group(st, g)?;
    members
        .iter()
        .map(|m| {
            w.world.iter().position(|x| x == m).ok_or_else(|| MpiErr {
                code: MPI_ERR_GROUP,
                msg: format!("process {m} of the group is not a member of the window"),
            })
        })
        .collect()
}

/// The defaults MPI_Win_get_info reports (MPI 4.0 §12.2.1), with the program's own hints over them.
fn info_used(w: &MWin) -> crate::info::Pairs {
    let mut p: crate::info::Pairs = vec![
        ("no_locks".into(), "false".into()),
        ("accumulate_ordering".into(), "rar,raw,war,waw".into()),
        ("accumulate_ops".into(), "same_op_no_op".into()),
        ("same_size".into(), "false".into()),
        ("same_disp_unit".into(), "false".into()),
    ];
    if w.flavor() == MPI_WIN_FLAVOR_SHARED {
        p.push(("alloc_shared_noncontig".into(), "false".into()));
    }
    // The program's values of the keys the library knows; other keys are ignored (MPI 4.0 §10: an
    // implementation returns the hints it uses).
    for (k, v) in &w.hints {
        if let Some(e) = p.iter_mut().find(|(key, _)| key == k) {
            e.1 = v.clone();
        }
    }
    p
}

mpi_api! {
    fn MPI_Win_create / PMPI_Win_create(base: *mut c_void, size: MPI_Aint, disp_unit: c_int, info: MPI_Info, comm: MPI_Comm, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() { return err(MPI_ERR_ARG, "win is NULL"); }
            *win = create(Flavor::Create, size, disp_unit, info, comm, base)?;
            Ok(())
        })();
        fin(comm, "MPI_Win_create", r)
    }
    fn MPI_Win_create_c / PMPI_Win_create_c(base: *mut c_void, size: MPI_Aint, disp_unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() { return err(MPI_ERR_ARG, "win is NULL"); }
            let du = c_int::try_from(disp_unit).map_err(|_| MpiErr { code: MPI_ERR_DISP, msg: format!("displacement unit {disp_unit} is out of range") })?;
            *win = create(Flavor::Create, size, du, info, comm, base)?;
            Ok(())
        })();
        fin(comm, "MPI_Win_create_c", r)
    }
    fn MPI_Win_allocate / PMPI_Win_allocate(size: MPI_Aint, disp_unit: c_int, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() || baseptr.is_null() { return err(MPI_ERR_ARG, "win or baseptr is NULL"); }
            let h = create(Flavor::Allocate, size, disp_unit, info, comm, std::ptr::null_mut())?;
            *win = h;
            *(baseptr as *mut *mut c_void) = self::win(state()?, h)?.1.w.base() as *mut c_void;
            Ok(())
        })();
        fin(comm, "MPI_Win_allocate", r)
    }
    fn MPI_Win_allocate_c / PMPI_Win_allocate_c(size: MPI_Aint, disp_unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() || baseptr.is_null() { return err(MPI_ERR_ARG, "win or baseptr is NULL"); }
            let du = c_int::try_from(disp_unit).map_err(|_| MpiErr { code: MPI_ERR_DISP, msg: format!("displacement unit {disp_unit} is out of range") })?;
            let h = create(Flavor::Allocate, size, du, info, comm, std::ptr::null_mut())?;
            *win = h;
            *(baseptr as *mut *mut c_void) = self::win(state()?, h)?.1.w.base() as *mut c_void;
            Ok(())
        })();
        fin(comm, "MPI_Win_allocate_c", r)
    }
    fn MPI_Win_allocate_shared / PMPI_Win_allocate_shared(size: MPI_Aint, disp_unit: c_int, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() || baseptr.is_null() { return err(MPI_ERR_ARG, "win or baseptr is NULL"); }
            let h = create(Flavor::Shared, size, disp_unit, info, comm, std::ptr::null_mut())?;
            *win = h;
            *(baseptr as *mut *mut c_void) = self::win(state()?, h)?.1.w.base() as *mut c_void;
            Ok(())
        })();
        fin(comm, "MPI_Win_allocate_shared", r)
    }
    fn MPI_Win_allocate_shared_c / PMPI_Win_allocate_shared_c(size: MPI_Aint, disp_unit: MPI_Aint, info: MPI_Info, comm: MPI_Comm, baseptr: *mut c_void, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() || baseptr.is_null() { return err(MPI_ERR_ARG, "win or baseptr is NULL"); }
            let du = c_int::try_from(disp_unit).map_err(|_| MpiErr { code: MPI_ERR_DISP, msg: format!("displacement unit {disp_unit} is out of range") })?;
            let h = create(Flavor::Shared, size, du, info, comm, std::ptr::null_mut())?;
            *win = h;
            *(baseptr as *mut *mut c_void) = self::win(state()?, h)?.1.w.base() as *mut c_void;
            Ok(())
        })();
        fin(comm, "MPI_Win_allocate_shared_c", r)
    }
    fn MPI_Win_create_dynamic / PMPI_Win_create_dynamic(info: MPI_Info, comm: MPI_Comm, win: *mut MPI_Win) -> c_int {
        let r = (|| -> R {
            if win.is_null() { return err(MPI_ERR_ARG, "win is NULL"); }
            *win = create(Flavor::Dynamic, 0, 1, info, comm, std::ptr::null_mut())?;
            Ok(())
        })();
        fin(comm, "MPI_Win_create_dynamic", r)
    }
    fn MPI_Win_free / PMPI_Win_free(win: *mut MPI_Win) -> c_int {
        let h = if win.is_null() { MPI_WIN_NULL } else { *win };
        fin_win(h, "MPI_Win_free", free(win))
    }
    fn MPI_Win_attach / PMPI_Win_attach(win: MPI_Win, base: *mut c_void, size: MPI_Aint) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let w = self::win(st, win)?.1;
            if size < 0 { return err(MPI_ERR_SIZE, format!("size {size} is negative")); }
            if w.flavor() != MPI_WIN_FLAVOR_DYNAMIC {
                return err(MPI_ERR_RMA_FLAVOR, "MPI_Win_attach needs a window made by MPI_Win_create_dynamic");
            }
            if size == 0 { return Ok(()); }
            if base.is_null() { return err(MPI_ERR_ARG, "base is NULL"); }
            w.w.attach(base as *mut u8, size as usize).map_err(rma_err)
        })();
        fin_win(win, "MPI_Win_attach", r)
    }
    fn MPI_Win_detach / PMPI_Win_detach(win: MPI_Win, base: *const c_void) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let w = self::win(st, win)?.1;
            if w.flavor() != MPI_WIN_FLAVOR_DYNAMIC {
                return err(MPI_ERR_RMA_FLAVOR, "MPI_Win_detach needs a window made by MPI_Win_create_dynamic");
            }
            w.w.detach(base as *const u8).map_err(rma_err)
        })();
        fin_win(win, "MPI_Win_detach", r)
    }
    fn MPI_Win_shared_query / PMPI_Win_shared_query(win: MPI_Win, rank: c_int, size: *mut MPI_Aint, disp_unit: *mut c_int, baseptr: *mut c_void) -> c_int {
        let r = (|| -> R {
            let (s, d, p) = shared_query(win, rank)?;
            out(size, s, "size")?;
            out(disp_unit, d as c_int, "disp_unit")?;
            out(baseptr as *mut *mut c_void, p, "baseptr")
        })();
        fin_win(win, "MPI_Win_shared_query", r)
    }
    fn MPI_Win_shared_query_c / PMPI_Win_shared_query_c(win: MPI_Win, rank: c_int, size: *mut MPI_Aint, disp_unit: *mut MPI_Aint, baseptr: *mut c_void) -> c_int {
        let r = (|| -> R {
            let (s, d, p) = shared_query(win, rank)?;
            out(size, s, "size")?;
            out(disp_unit, d as MPI_Aint, "disp_unit")?;
            out(baseptr as *mut *mut c_void, p, "baseptr")
        })();
        fin_win(win, "MPI_Win_shared_query_c", r)
    }
    fn MPI_Win_get_group / PMPI_Win_get_group(win: MPI_Win, group: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let wl = self::win(st, win)?.1.world.clone();
            let g = crate::comm::group_handle(st, wl);
            out(group, g, "group")
        })();
        fin_win(win, "MPI_Win_get_group", r)
    }
    fn MPI_Win_set_info / PMPI_Win_set_info(win: MPI_Win, info: MPI_Info) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let add = crate::info::hints(info)?;
            let w = self::win(st, win)?.1;
            for (k, v) in add {
                match w.hints.iter_mut().find(|(key, _)| *key == k) {
                    Some(e) => e.1 = v,
                    None => w.hints.push((k, v)),
                }
            }
            Ok(())
        })();
        fin_win(win, "MPI_Win_set_info", r)
    }
    fn MPI_Win_get_info / PMPI_Win_get_info(win: MPI_Win, info_used: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let p = self::info_used(self::win(st, win)?.1);
            out(info_used, crate::info::create(p), "info_used")
        })();
        fin_win(win, "MPI_Win_get_info", r)
    }
    fn MPI_Win_set_name / PMPI_Win_set_name(win: MPI_Win, win_name: *const c_char) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let w = self::win(st, win)?.1;
            if win_name.is_null() { return err(MPI_ERR_ARG, "win_name is NULL"); }
            let s = std::ffi::CStr::from_ptr(win_name).to_string_lossy();
            w.name = s.chars().take(127).collect();
            Ok(())
        })();
        fin_win(win, "MPI_Win_set_name", r)
    }
    fn MPI_Win_get_name / PMPI_Win_get_name(win: MPI_Win, win_name: *mut c_char, resultlen: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let w = self::win(st, win)?.1;
            if win_name.is_null() || resultlen.is_null() { return err(MPI_ERR_ARG, "NULL argument"); }
            put_str(&w.name, win_name, resultlen, 128);
            Ok(())
        })();
        fin_win(win, "MPI_Win_get_name", r)
    }
    fn MPI_Win_create_errhandler / PMPI_Win_create_errhandler(function: Option<CommErrFn>, errhandler: *mut MPI_Errhandler) -> c_int {
        crate::env::PMPI_Comm_create_errhandler(function, errhandler)
    }
    fn MPI_Win_set_errhandler / PMPI_Win_set_errhandler(win: MPI_Win, errhandler: MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if !crate::env::errhandler_ok(st, errhandler) {
                return err(MPI_ERR_ARG, format!("invalid error handler {errhandler:#x}"));
            }
            self::win(st, win)?.1.eh = errhandler;
            Ok(())
        })();
        fin_win(win, "MPI_Win_set_errhandler", r)
    }
    fn MPI_Win_get_errhandler / PMPI_Win_get_errhandler(win: MPI_Win, errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let eh = self::win(st, win)?.1.eh;
            out(errhandler, eh, "errhandler")
        })();
        fin_win(win, "MPI_Win_get_errhandler", r)
    }
    fn MPI_Win_call_errhandler / PMPI_Win_call_errhandler(win: MPI_Win, errorcode: c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            self::win(st, win)?;
            Ok(())
        })();
        if let Err(e) = r {
            return raise_win(win, "MPI_Win_call_errhandler", e);
        }
        let msg = format!("MPI_Win_call_errhandler with error code {errorcode}");
        let rc = raise_win(win, "MPI_Win_call_errhandler", MpiErr { code: errorcode, msg });
        // The handler ran (or returned the code): the call itself succeeded.
        let _ = rc;
        MPI_SUCCESS
    }
    fn MPI_Win_create_keyval / PMPI_Win_create_keyval(win_copy_attr_fn: Option<crate::comm::CopyFn>, win_delete_attr_fn: Option<crate::comm::DeleteFn>, win_keyval: *mut c_int, extra_state: *mut c_void) -> c_int {
        fin(MPI_COMM_WORLD, "MPI_Win_create_keyval", crate::comm::keyval_create(win_copy_attr_fn, win_delete_attr_fn, win_keyval, extra_state))
    }
    fn MPI_Win_free_keyval / PMPI_Win_free_keyval(win_keyval: *mut c_int) -> c_int {
        crate::comm::PMPI_Comm_free_keyval(win_keyval)
    }
    fn MPI_Win_set_attr / PMPI_Win_set_attr(win: MPI_Win, win_keyval: c_int, attribute_val: *mut c_void) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (wi, _) = self::win(st, win)?;
            crate::comm::user_key(st, win_keyval)?;
            let old = st.wins[wi].as_ref().unwrap().attrs.iter().find(|a| a.0 == win_keyval).map(|a| a.1);
            if let Some(v) = old {
                crate::comm::delete_obj_attr(st, win, win_keyval, v)?;
            }
            let a = &mut st.wins[wi].as_mut().unwrap().attrs;
            match a.iter_mut().find(|x| x.0 == win_keyval) {
                Some(x) => x.1 = attribute_val,
                None => a.push((win_keyval, attribute_val)),
            }
            Ok(())
        })();
        fin_win(win, "MPI_Win_set_attr", r)
    }
    fn MPI_Win_get_attr / PMPI_Win_get_attr(win: MPI_Win, win_keyval: c_int, attribute_val: *mut c_void, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if attribute_val.is_null() || flag.is_null() {
                return err(MPI_ERR_ARG, "NULL argument");
            }
            let (wi, _) = self::win(st, win)?;
            let outp = attribute_val as *mut *mut c_void;
            let w = st.wins[wi].as_mut().unwrap();
            let pre = &mut *w.pre;
            let v: *mut c_void = match win_keyval {
                MPI_WIN_BASE => pre.base,
                MPI_WIN_SIZE => &mut pre.size as *mut MPI_Aint as *mut c_void,
                MPI_WIN_DISP_UNIT => &mut pre.disp_unit as *mut c_int as *mut c_void,
                MPI_WIN_CREATE_FLAVOR => &mut pre.flavor as *mut c_int as *mut c_void,
                MPI_WIN_MODEL => &mut pre.model as *mut c_int as *mut c_void,
                k => {
                    crate::comm::user_key(st, k)?;
                    match st.wins[wi].as_ref().unwrap().attrs.iter().find(|a| a.0 == k) {
                        Some(a) => {
                            *outp = a.1;
                            *flag = 1;
                        }
                        None => *flag = 0,
                    }
                    return Ok(());
                }
            };
            *outp = v;
            *flag = 1;
            Ok(())
        })();
        fin_win(win, "MPI_Win_get_attr", r)
    }
    fn MPI_Win_delete_attr / PMPI_Win_delete_attr(win: MPI_Win, win_keyval: c_int) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let (wi, _) = self::win(st, win)?;
            crate::comm::user_key(st, win_keyval)?;
            let Some(pos) = st.wins[wi].as_ref().unwrap().attrs.iter().position(|a| a.0 == win_keyval) else {
                return err(MPI_ERR_KEYVAL, "attribute not set on this window");
            };
            let v = st.wins[wi].as_ref().unwrap().attrs[pos].1;
            crate::comm::delete_obj_attr(st, win, win_keyval, v)?;
            st.wins[wi].as_mut().unwrap().attrs.remove(pos);
            Ok(())
        })();
        fin_win(win, "MPI_Win_delete_attr", r)
    }
}

/// MPI_Win_shared_query: (size, disp_unit, base) of `rank`'s memory as mapped here.
fn shared_query(win: MPI_Win, rank: c_int) -> R<(MPI_Aint, u32, *mut c_void)> {
    let st = state()?;
    let w = self::win(st, win)?.1;
    let n = w.w.size();
    let r = if rank == MPI_PROC_NULL {
        // The lowest rank with memory (MPI 4.0 §12.2.3); the first rank when none has any.
        (0..n).find(|&m| w.w.member(m).is_some_and(|(s, _)| s > 0)).unwrap_or(0)
    } else if rank < 0 || rank as usize >= n {
        return err(MPI_ERR_RANK, format!("rank {rank} is not in a window of {n}"));
    } else {
        rank as usize
    };
    let (size, du) = w.w.member(r).unwrap();
    match w.w.mapped(r) {
        // A member without memory has no address (MPICH: NULL).
        _ if size == 0 && w.flavor() == MPI_WIN_FLAVOR_SHARED => Ok((0, du, std::ptr::null_mut())),
        Some(p) if w.flavor() != MPI_WIN_FLAVOR_DYNAMIC => Ok((size as MPI_Aint, du, p as *mut c_void)),
        _ if w.flavor() == MPI_WIN_FLAVOR_SHARED => err(MPI_ERR_RMA_SHARED, format!("rank {r}'s memory is not mapped here")),
        _ => err(
            MPI_ERR_RMA_FLAVOR,
            format!("rank {r}'s window memory is not shared with this process"),
        ),
    }
}
