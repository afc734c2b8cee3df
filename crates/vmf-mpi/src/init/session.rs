//! The MPI 4.0 Sessions model: `MPI_Session_init`/`_finalize`, process sets, groups from process sets and
//! communicators from groups (`MPI_Comm_create_from_group`, `MPI_Intercomm_create_from_groups`).
//!
//! A session needs the library running: the first `MPI_Session_init` (or `MPI_Init`) starts it, and it
//! stops when the world model and every session are finalized. MPI 4.0 lets a process start sessions
//! again after that; the vmfabric fabric cannot rejoin its job once it has left, so such a call fails
//! with `MPI_ERR_OTHER` and says so.
//!
//! Process sets: `mpi://WORLD` (every process of the job) and `mpi://SELF` (this process); their info
//! holds `mpi_size`. Communicators made from groups agree on their context over a hidden *bridge*
//! communicator (all processes, a context of its own), so they never meet traffic of `MPI_COMM_WORLD`; the
//! string tag is hashed into the tag of that agreement, so concurrent calls with different string tags do
//! not match each other's messages.
//!
//! Handles: sessions 0xb8000000 | index (`MPI_SESSION_NULL` = 0x38000000); session error handlers
//! 0x94000000 | 0x02000000 | index, in a table of their own that works before initialization.
use crate::comm::MPI_Group;
use crate::*;
use std::ffi::{c_char, c_int, CStr};

pub(crate) const SESSION_NULL: MPI_Session = 0x3800_0000;
const SESSION_BASE: u32 = 0xb800_0000;
const SESSION_EH: u32 = 0x0200_0000;
/// Index of the bridge communicator in the communicator table (after WORLD and SELF).
pub(crate) const BRIDGE: usize = 2;
const PSETS: [&str; 2] = ["mpi://WORLD", "mpi://SELF"];

pub type MPI_Session = c_int;

struct Session {
    eh: MPI_Errhandler,
    hints: Vec<(String, String)>,
}

struct Globals {
    sessions: Vec<Option<Session>>,
    handlers: Vec<CommErrFn>,
}
struct Cell(UnsafeCell<Globals>);
// SAFETY: the library's MPI_THREAD_SERIALIZED contract: calls never overlap.
unsafe impl Sync for Cell {}
static S: Cell = Cell(UnsafeCell::new(Globals {
    sessions: Vec::new(),
    handlers: Vec::new(),
}));

fn g() -> &'static mut Globals {
    // SAFETY: serialised calls (crate contract).
    unsafe { &mut *S.0.get() }
}

/// Sessions alive.
pub(crate) fn live() -> usize {
    g().sessions.iter().flatten().count()
}

fn index(h: MPI_Session) -> R<usize> {
    let u = h as u32;
    if u & 0xfc00_0000 == SESSION_BASE {
        let i = (u & 0x03ff_ffff) as usize;
        if g().sessions.get(i).is_some_and(|s| s.is_some()) {
            return Ok(i);
        }
    }
    err(MPI_ERR_SESSION, format!("invalid session handle {h:#x}"))
}

/// A handler made by MPI_Session_create_errhandler.
pub(crate) fn is_session_eh(eh: MPI_Errhandler) -> bool {
    (eh as u32) & 0xfe00_0000 == EH_BASE | SESSION_EH
        && g().handlers.len() > ((eh as u32) & 0x01ff_ffff) as usize
}

/// Call session error handler `eh` (made by MPI_Session_create_errhandler) for `session` and `code`.
fn call_handler(eh: MPI_Errhandler, session: MPI_Session, code: c_int) {
    let f = g().handlers[((eh as u32) & 0x01ff_ffff) as usize];
    let (mut s, mut code) = (session, code);
    // SAFETY: a handler registered by the program through MPI_Session_create_errhandler.
    unsafe { f(&mut s, &mut code) };
}

fn session_eh_ok(eh: MPI_Errhandler) -> bool {
    eh == MPI_ERRORS_ARE_FATAL
        || eh == MPI_ERRORS_RETURN
        || eh == MPI_ERRORS_ABORT
        || is_session_eh(eh)
}

/// Report an error of a call on `session` through its error handler (an invalid session: MPI_COMM_WORLD's
/// rules, i.e. fatal unless changed).
fn fin_s(session: MPI_Session, name: &str, r: R) -> c_int {
    let Err(e) = r else { return MPI_SUCCESS };
    let Ok(i) = index(session) else {
        return raise(MPI_COMM_WORLD, name, e);
    };
    match g().sessions[i].as_ref().unwrap().eh {
        MPI_ERRORS_RETURN => e.code,
        x if x == MPI_ERRORS_ARE_FATAL || x == MPI_ERRORS_ABORT => fatal(name, &e),
        user => {
            call_handler(user, session, e.code);
            e.code
        }
    }
}

unsafe fn cstr(p: *const c_char, what: &str) -> R<String> {
    if p.is_null() {
        return err(MPI_ERR_ARG, format!("{what} is NULL"));
    }
    Ok(CStr::from_ptr(p).to_string_lossy().into_owned())
}

/// The world ranks of process set `name`.
fn pset(st: &State, name: &str) -> R<Vec<usize>> {
    if name.eq_ignore_ascii_case(PSETS[0]) {
        Ok((0..st.fab.size()).collect())
    } else if name.eq_ignore_ascii_case(PSETS[1]) {
        Ok(vec![st.fab.rank()])
    } else {
        err(
            MPI_ERR_ARG,
            format!("unknown process set '{name}' (this library has mpi://WORLD and mpi://SELF)"),
        )
    }
}

/// A tag in 0..2^30 from a string tag (FNV-1a), the same in every process.
fn tag_of(s: &str) -> c_int {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    (h & 0x3fff_ffff) as c_int
}

/// MPI_Comm_create_from_group: collective over the members of `g` (world ranks); Ok(None) if this
/// process is not one of them.
fn from_group(st: &mut State, g: &[usize], tag: c_int, eh: MPI_Errhandler) -> R<Option<MPI_Comm>> {
    let Some(r) = g.iter().position(|&w| w == st.fab.rank()) else {
        return Ok(None);
    };
    let bctx = st.comms[BRIDGE].as_ref().unwrap().coll;
    let mut v = [crate::comm::ctx_propose(st)? as i32];
    crate::coll::allreduce_max_group(st, bctx, 0x4000_0000 | tag, g, r, &mut v)?;
    crate::comm::ctx_agreed(st, v[0] as u32);
    let c = Comm::new(v[0] as u32, r as i32, Some(g.to_vec()), g.len() as i32, eh);
    Ok(Some(crate::comm::add_comm(st, c)))
}

fn comm_eh(st: &State, eh: MPI_Errhandler) -> R<MPI_Errhandler> {
    if crate::env::errhandler_ok(st, eh) {
        Ok(eh)
    } else {
        err(
            MPI_ERR_ARG,
            format!("{eh:#x} is not a communicator error handler"),
        )
    }
}

mpi_api! {
    fn MPI_Session_init / PMPI_Session_init(info: MPI_Info, errhandler: MPI_Errhandler, session: *mut MPI_Session) -> c_int {
        let r = (|| -> R {
            if session.is_null() {
                return err(MPI_ERR_ARG, "session is NULL");
            }
            crate::info::check(info)?;
            if !session_eh_ok(errhandler) {
                return err(MPI_ERR_ARG, format!("{errhandler:#x} is not a session error handler"));
            }
            let hints = crate::info::hints(info)?;
            let level = match hints.iter().find(|(k, _)| k == "thread_level").map(|(_, v)| v.as_str()) {
                Some("MPI_THREAD_SINGLE") => MPI_THREAD_SINGLE,
                Some("MPI_THREAD_FUNNELED") => 1,
                Some("MPI_THREAD_MULTIPLE") => MPI_THREAD_MULTIPLE,
                _ => MPI_THREAD_SERIALIZED,
            };
            crate::env::start(level)?;
            let s = Session { eh: errhandler, hints };
            let t = &mut g().sessions;
            let i = put_in_free_slot(t, 0, s);
            *session = (SESSION_BASE | i as u32) as c_int;
            Ok(())
        })();
        match r {
            Ok(()) => MPI_SUCCESS,
            // No session yet: the error handler argument decides (a handler of the program gets
            // MPI_SESSION_NULL).
            Err(e) if errhandler == MPI_ERRORS_RETURN => e.code,
            Err(e) if is_session_eh(errhandler) => {
                call_handler(errhandler, SESSION_NULL, e.code);
                e.code
            }
            Err(e) => fatal("MPI_Session_init", &e),
        }
    }
    fn MPI_Session_finalize / PMPI_Session_finalize(session: *mut MPI_Session) -> c_int {
        let h = if session.is_null() { SESSION_NULL } else { *session };
        let r = (|| -> R {
            let i = index(h)?;
            // Like MPI_Finalize for the world model: operations the session started must be complete; what
            // is still in flight in the background (freed requests, buffered sends) is finished here.
            crate::env::stop_if_unused(1)?;
            g().sessions[i] = None;
            *session = SESSION_NULL;
            Ok(())
        })();
        fin_s(h, "MPI_Session_finalize", r)
    }
    fn MPI_Session_get_num_psets / PMPI_Session_get_num_psets(session: MPI_Session, info: MPI_Info, npset_names: *mut c_int) -> c_int {
        let r = (|| -> R {
            index(session)?;
            crate::info::check(info)?;
            if npset_names.is_null() {
                return err(MPI_ERR_ARG, "npset_names is NULL");
            }
            *npset_names = PSETS.len() as c_int;
            Ok(())
        })();
        fin_s(session, "MPI_Session_get_num_psets", r)
    }
    fn MPI_Session_get_nth_pset / PMPI_Session_get_nth_pset(session: MPI_Session, info: MPI_Info, n: c_int, pset_len: *mut c_int, pset_name: *mut c_char) -> c_int {
        let r = (|| -> R {
            index(session)?;
            crate::info::check(info)?;
            if pset_len.is_null() || *pset_len < 0 || (*pset_len > 0 && pset_name.is_null()) {
                return err(MPI_ERR_ARG, "pset_len or pset_name is NULL, or *pset_len is negative");
            }
            let Some(name) = usize::try_from(n).ok().and_then(|n| PSETS.get(n)) else {
                return err(MPI_ERR_ARG, format!("process set number {n} (there are {})", PSETS.len()));
            };
            // *pset_len 0: only report the room needed (with the terminator); otherwise copy, truncating.
            if *pset_len > 0 {
                let k = name.len().min(*pset_len as usize - 1);
                std::ptr::copy_nonoverlapping(name.as_ptr() as *const c_char, pset_name, k);
                *pset_name.add(k) = 0;
            }
            *pset_len = name.len() as c_int + 1;
            Ok(())
        })();
        fin_s(session, "MPI_Session_get_nth_pset", r)
    }
    fn MPI_Session_get_pset_info / PMPI_Session_get_pset_info(session: MPI_Session, pset_name: *const c_char, info: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            index(session)?;
            let name = cstr(pset_name, "pset_name")?;
            if info.is_null() {
                return err(MPI_ERR_ARG, "info is NULL");
            }
            let n = pset(state()?, &name)?.len();
            *info = crate::info::create(vec![("mpi_size".to_string(), n.to_string())]);
            Ok(())
        })();
        fin_s(session, "MPI_Session_get_pset_info", r)
    }
    fn MPI_Session_get_info / PMPI_Session_get_info(session: MPI_Session, info_used: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            let i = index(session)?;
            if info_used.is_null() {
                return err(MPI_ERR_ARG, "info_used is NULL");
            }
            let mut h = g().sessions[i].as_ref().unwrap().hints.clone();
            h.retain(|(k, _)| k != "thread_level");
            let level = ["MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE"];
            h.push(("thread_level".to_string(), level[state()?.thread_level.clamp(0, 3) as usize].to_string()));
            *info_used = crate::info::create(h);
            Ok(())
        })();
        fin_s(session, "MPI_Session_get_info", r)
    }
    fn MPI_Group_from_session_pset / PMPI_Group_from_session_pset(session: MPI_Session, pset_name: *const c_char, newgroup: *mut MPI_Group) -> c_int {
        let r = (|| -> R {
            index(session)?;
            let name = cstr(pset_name, "pset_name")?;
            if newgroup.is_null() {
                return err(MPI_ERR_ARG, "newgroup is NULL");
            }
            let st = state()?;
            let members = pset(st, &name)?;
            *newgroup = crate::comm::group_handle(st, members);
            Ok(())
        })();
        fin_s(session, "MPI_Group_from_session_pset", r)
    }
    fn MPI_Comm_create_from_group / PMPI_Comm_create_from_group(group: MPI_Group, stringtag: *const c_char, info: MPI_Info, errhandler: MPI_Errhandler, newcomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let tag = tag_of(&cstr(stringtag, "stringtag")?);
            crate::info::check(info)?;
            if newcomm.is_null() {
                return err(MPI_ERR_ARG, "newcomm is NULL");
            }
            let eh = comm_eh(st, errhandler)?;
            let members = crate::comm::group(st, group)?;
            let Some(c) = from_group(st, &members, tag, eh)? else {
                return err(MPI_ERR_GROUP, "this process is not a member of the group");
            };
            let ci = comm_index(c).unwrap();
            st.comms[ci].as_mut().unwrap().hints = crate::info::comm_hints(info)?;
            *newcomm = c;
            Ok(())
        })();
        fin(MPI_COMM_SELF, "MPI_Comm_create_from_group", r)
    }
    fn MPI_Intercomm_create_from_groups / PMPI_Intercomm_create_from_groups(local_group: MPI_Group, local_leader: c_int, remote_group: MPI_Group,
        remote_leader: c_int, stringtag: *const c_char, info: MPI_Info, errhandler: MPI_Errhandler, newintercomm: *mut MPI_Comm) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let name = cstr(stringtag, "stringtag")?;
            crate::info::check(info)?;
            if newintercomm.is_null() {
                return err(MPI_ERR_ARG, "newintercomm is NULL");
            }
            let eh = comm_eh(st, errhandler)?;
            let local = crate::comm::group(st, local_group)?;
            let remote = crate::comm::group(st, remote_group)?;
            let Some(&rl) = usize::try_from(remote_leader).ok().and_then(|r| remote.get(r)) else {
                return err(MPI_ERR_RANK, format!("remote_leader {remote_leader} is not in the remote group (size {})", remote.len()));
            };
            // The local group as a communicator (its own tag), then the leaders meet on the bridge.
            let Some(lc) = from_group(st, &local, tag_of(&format!("{name}\0local")), eh)? else {
                return err(MPI_ERR_GROUP, "this process is not a member of the local group");
            };
            let r = crate::intercomm::create(lc, local_leader, crate::p2p::comm_handle(BRIDGE), rl as c_int, tag_of(&name), newintercomm);
            let mut tmp = lc;
            let freed = crate::comm::free_comm(state()?, &mut tmp);
            r?;
            freed?;
            let st = state()?;
            let ci = comm_index(*newintercomm).unwrap();
            let c = st.comms[ci].as_mut().unwrap();
            c.eh = eh;
            c.hints = crate::info::comm_hints(info)?;
            Ok(())
        })();
        fin(MPI_COMM_SELF, "MPI_Intercomm_create_from_groups", r)
    }
    fn MPI_Session_create_errhandler / PMPI_Session_create_errhandler(session_errhandler_fn: Option<CommErrFn>, errhandler: *mut MPI_Errhandler) -> c_int {
        let Some(f) = session_errhandler_fn else {
            return raise(MPI_COMM_WORLD, "MPI_Session_create_errhandler", MpiErr { code: MPI_ERR_ARG, msg: "function is NULL".into() });
        };
        if errhandler.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Session_create_errhandler", MpiErr { code: MPI_ERR_ARG, msg: "errhandler is NULL".into() });
        }
        g().handlers.push(f);
        *errhandler = (EH_BASE | SESSION_EH | (g().handlers.len() - 1) as u32) as c_int;
        MPI_SUCCESS
    }
    fn MPI_Session_set_errhandler / PMPI_Session_set_errhandler(session: MPI_Session, errhandler: MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let i = index(session)?;
            if !session_eh_ok(errhandler) {
                return err(MPI_ERR_ARG, format!("{errhandler:#x} is not a session error handler"));
            }
            g().sessions[i].as_mut().unwrap().eh = errhandler;
            Ok(())
        })();
        fin_s(session, "MPI_Session_set_errhandler", r)
    }
    fn MPI_Session_get_errhandler / PMPI_Session_get_errhandler(session: MPI_Session, errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let i = index(session)?;
            if errhandler.is_null() {
                return err(MPI_ERR_ARG, "errhandler is NULL");
            }
            *errhandler = g().sessions[i].as_ref().unwrap().eh;
            Ok(())
        })();
        fin_s(session, "MPI_Session_get_errhandler", r)
    }
    fn MPI_Session_call_errhandler / PMPI_Session_call_errhandler(session: MPI_Session, errorcode: c_int) -> c_int {
        if index(session).is_err() {
            return fin_s(session, "MPI_Session_call_errhandler", index(session).map(|_| ()));
        }
        let r: R = Err(MpiErr { code: errorcode, msg: "raised by MPI_Session_call_errhandler".into() });
        fin_s(session, "MPI_Session_call_errhandler", r);
        MPI_SUCCESS
    }
}
