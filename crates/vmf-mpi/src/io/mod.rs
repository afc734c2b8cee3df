//! MPI-IO (MPI 4.0 chapter 14), as MPICH keeps it in src/mpi/romio: file objects and their management
//! (this file), views and data representations (`view.rs`), and data access (`access.rs`: explicit
//! offsets, individual and shared file pointers, collective two-phase I/O, split collectives, nonblocking
//! forms).
//!
//! A file is an open POSIX file descriptor on every rank of the communicator, a private communicator for
//! the library's own collective traffic, and an 8-byte counter in an internal one-sided window (rank 0
//! holds it) that is the shared file pointer: `MPI_File_write_shared` is one fetch-and-add, served by
//! loads and CPU atomics between co-resident ranks and by the target's agent over TCP. That works on any
//! POSIX file system the ranks share, also when they run on different emulated hosts. Atomic mode takes
//! fcntl byte-range locks around each access.
use crate::comm::{add_comm, new_ctx};
use crate::*;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::io::AsRawFd;
use std::rc::Rc;

pub(crate) mod access;
pub(crate) mod view;

use view::{ConvFn, Datarep, Rep, View, MPI_ERR_IO};

/// `MPI_File` is a pointer in MPICH's ABI; ours are integers below 2^31 that are never dereferenced, so
/// the Fortran handle (MPI_File_c2f) is the same number, also as the low half of an `MPI_File` (a Fortran
/// error handler reads an INTEGER where C passes an `MPI_File *`).
pub type MPI_File = usize;
pub type MPI_Offset = i64;
pub const MPI_FILE_NULL: MPI_File = 0;
const FILE_BASE: usize = 0x3f1e_0000;

pub const MPI_MODE_CREATE: c_int = 1;
pub const MPI_MODE_RDONLY: c_int = 2;
pub const MPI_MODE_WRONLY: c_int = 4;
pub const MPI_MODE_RDWR: c_int = 8;
pub const MPI_MODE_DELETE_ON_CLOSE: c_int = 16;
pub const MPI_MODE_UNIQUE_OPEN: c_int = 32;
pub const MPI_MODE_EXCL: c_int = 64;
pub const MPI_MODE_APPEND: c_int = 128;
pub const MPI_MODE_SEQUENTIAL: c_int = 256;
const ALL_MODES: c_int = MPI_MODE_CREATE
    | MPI_MODE_RDONLY
    | MPI_MODE_WRONLY
    | MPI_MODE_RDWR
    | MPI_MODE_DELETE_ON_CLOSE
    | MPI_MODE_UNIQUE_OPEN
    | MPI_MODE_EXCL
    | MPI_MODE_APPEND
    | MPI_MODE_SEQUENTIAL;
pub const MPI_DISPLACEMENT_CURRENT: MPI_Offset = -54278278;
pub const MPI_SEEK_SET: c_int = 600;
pub const MPI_SEEK_CUR: c_int = 602;
pub const MPI_SEEK_END: c_int = 604;
pub const MPI_MAX_DATAREP_STRING: usize = 128;

pub const MPI_ERR_ACCESS: c_int = 20;
pub const MPI_ERR_AMODE: c_int = 21;
pub const MPI_ERR_BAD_FILE: c_int = 22;
pub const MPI_ERR_DUP_DATAREP: c_int = 24;
pub const MPI_ERR_FILE_EXISTS: c_int = 25;
pub const MPI_ERR_FILE: c_int = 27;
pub const MPI_ERR_NOT_SAME: c_int = 35;
pub const MPI_ERR_NO_SPACE: c_int = 36;
pub const MPI_ERR_NO_SUCH_FILE: c_int = 37;
pub const MPI_ERR_QUOTA: c_int = 39;
pub const MPI_ERR_READ_ONLY: c_int = 40;
pub const MPI_ERR_UNSUPPORTED_OPERATION: c_int = 44;

/// Collective buffering defaults (ROMIO's hint names): bytes each aggregator handles per round.
pub(crate) const CB_BUFFER_SIZE: usize = 16 << 20;

/// An open file.
pub(crate) struct MFile {
    pub file: std::fs::File,
    pub path: std::path::PathBuf,
    /// Private communicator (errors return; the program's traffic never meets ours).
    pub comm: MPI_Comm,
    pub rank: i32,
    pub size: i32,
    pub amode: c_int,
    /// Hints given at open, set_view and set_info (all kept; those the library uses are listed by
    /// MPI_File_get_info with their values).
    pub hints: crate::info::Pairs,
    pub view: Rc<View>,
    /// Individual file pointer, in etypes of the view.
    pub pos: i64,
    /// The shared file pointer: an 8-byte counter (etypes of the view) at rank 0 of this window.
    pub shwin: c_int,
    pub atomic: bool,
    pub eh: MPI_Errhandler,
    /// A split collective begun and not yet ended: (is a read, status bytes).
    pub split: Option<(bool, usize)>,
    /// The collective-buffering hints in force, the same on every rank (rank 0's: `settle_hints`):
    /// bytes per aggregator and round, aggregators, two-phase reads / writes forced on or off.
    pub cb: usize,
    pub naggr: usize,
    pub cb_read: Option<bool>,
    pub cb_write: Option<bool>,
}

impl MFile {
    /// A hint as a positive integer, if given and valid.
    pub fn hint_usize(&self, key: &str) -> Option<usize> {
        self.hints
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.trim().parse().ok())
            .filter(|&n| n > 0)
    }
    pub fn hint(&self, key: &str) -> Option<&str> {
        self.hints
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn handle(i: usize) -> MPI_File {
    FILE_BASE + i
}

fn index(st: &State, fh: MPI_File) -> Option<usize> {
    let i = fh.checked_sub(FILE_BASE)?;
    st.files.get(i).and_then(|f| f.as_ref()).map(|_| i)
}

/// The open file `fh`.
pub(crate) fn file(st: &mut State, fh: MPI_File) -> R<&mut MFile> {
    match index(st, fh) {
        Some(i) => Ok(st.files[i].as_mut().unwrap()),
        None if fh == MPI_FILE_NULL => err(MPI_ERR_FILE, "the file handle is MPI_FILE_NULL"),
        None => err(MPI_ERR_FILE, format!("invalid file handle {fh:#x}")),
    }
}

/// A return code of an MPI call the library makes on its own behalf, as a result.
pub(crate) fn ck(rc: c_int, what: &str) -> R {
    if rc == MPI_SUCCESS {
        Ok(())
    } else {
        err(rc, format!("{what} failed: {}", env::error_string(rc)))
    }
}

/// Make every rank of `comm` fail when one does (collective calls must agree, or the others hang in
/// the next exchange): the largest error class wins; a rank that was fine reports that another failed.
pub(crate) unsafe fn agree(comm: MPI_Comm, local: R) -> R {
    let mine: i64 = match &local {
        Ok(()) => 0,
        Err(e) => e.code.max(1) as i64,
    };
    let mut worst = [0i64];
    ck(
        crate::coll::PMPI_Allreduce(
            &mine as *const i64 as *const c_void,
            worst.as_mut_ptr() as *mut c_void,
            1,
            MPI_INT64,
            crate::op::MPI_MAX,
            comm,
        ),
        "agreement",
    )?;
    local?;
    if worst[0] != 0 {
        return err(
            worst[0] as c_int,
            "the call failed on another rank of the file's communicator",
        );
    }
    Ok(())
}

/// Allreduce of i64 values with `op` over `comm`.
pub(crate) unsafe fn allreduce(comm: MPI_Comm, v: &mut [i64], op: crate::op::MPI_Op) -> R {
    let send = v.to_vec();
    ck(
        crate::coll::PMPI_Allreduce(
            send.as_ptr() as *const c_void,
            v.as_mut_ptr() as *mut c_void,
            v.len() as c_int,
            MPI_INT64,
            op,
            comm,
        ),
        "allreduce",
    )
}

/// Check that every rank passed the same values (MPI_ERR_NOT_SAME otherwise).
pub(crate) unsafe fn same(comm: MPI_Comm, vals: &[i64], what: &str) -> R {
    let mut v: Vec<i64> = vals.iter().flat_map(|&x| [x, x.wrapping_neg()]).collect();
    allreduce(comm, &mut v, crate::op::MPI_MAX)?;
    for (k, x) in vals.iter().enumerate() {
        if v[2 * k] != *x || v[2 * k + 1] != x.wrapping_neg() {
            return err(
                MPI_ERR_NOT_SAME,
                format!("{what} differs between the ranks"),
            );
        }
    }
    Ok(())
}

pub(crate) const MPI_INT64: MPI_Datatype = 0x4c00_0809; // MPI_LONG_LONG_INT

/// Map an operating-system error to an MPI-IO error class.
pub(crate) fn os_err(e: &std::io::Error, what: &str) -> MpiErr {
    let code = match e.raw_os_error() {
        Some(libc::ENOENT) => MPI_ERR_NO_SUCH_FILE,
        Some(libc::EACCES) | Some(libc::EPERM) => MPI_ERR_ACCESS,
        Some(libc::EEXIST) => MPI_ERR_FILE_EXISTS,
        Some(libc::EROFS) => MPI_ERR_READ_ONLY,
        Some(libc::ENOSPC) | Some(libc::EFBIG) => MPI_ERR_NO_SPACE,
        Some(libc::EDQUOT) => MPI_ERR_QUOTA,
        Some(libc::EISDIR) | Some(libc::ENAMETOOLONG) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => {
            MPI_ERR_BAD_FILE
        }
        _ => MPI_ERR_IO,
    };
    MpiErr {
        code,
        msg: format!("{what}: {e}"),
    }
}

/// The path of a file name, without a ROMIO file-system prefix ("ufs:", "nfs:", "lustre:"...).
fn path_of(name: &str) -> std::path::PathBuf {
    const PREFIXES: &[&str] = &[
        "ufs", "nfs", "lustre", "gpfs", "pvfs2", "panfs", "daos", "testfs", "xfs", "pfs", "piofs", "hfs",
        "sfs", "bgl", "bglockless", "zoidfs", "ime", "quobytefs",
    ];
    match name.split_once(':') {
        Some((p, rest)) if PREFIXES.contains(&p.to_ascii_lowercase().as_str()) => rest.into(),
        _ => name.into(),
    }
}

/// Check an access mode (MPI 4.0 §14.2.1 and ROMIO's rules).
fn check_amode(amode: c_int) -> R {
    let rw = [MPI_MODE_RDONLY, MPI_MODE_WRONLY, MPI_MODE_RDWR]
        .iter()
        .filter(|&&m| amode & m != 0)
        .count();
    let bad = if amode & !ALL_MODES != 0 {
        Some("unknown mode bits")
    } else if rw != 1 {
        Some("exactly one of MPI_MODE_RDONLY, MPI_MODE_WRONLY and MPI_MODE_RDWR is required")
    } else if amode & MPI_MODE_RDONLY != 0 && amode & (MPI_MODE_CREATE | MPI_MODE_EXCL) != 0 {
        Some("MPI_MODE_RDONLY cannot be combined with MPI_MODE_CREATE or MPI_MODE_EXCL")
    } else if amode & MPI_MODE_RDWR != 0 && amode & MPI_MODE_SEQUENTIAL != 0 {
        Some("MPI_MODE_SEQUENTIAL cannot be combined with MPI_MODE_RDWR")
    } else {
        None
    };
    match bad {
        Some(m) => err(MPI_ERR_AMODE, format!("access mode {amode:#x}: {m}")),
        None => Ok(()),
    }
}

/// Open the file on private communicator `pc` (collective over it).
unsafe fn open_on(
    pc: MPI_Comm,
    rank: i32,
    size: i32,
    name: *const c_char,
    amode: c_int,
    hints: crate::info::Pairs,
) -> R<MFile> {
    let local = (|| -> R<std::path::PathBuf> {
        if name.is_null() {
            return err(MPI_ERR_BAD_FILE, "the file name is NULL");
        }
        check_amode(amode)?;
        Ok(path_of(&CStr::from_ptr(name).to_string_lossy()))
    })();
    agree(pc, local.as_ref().map(|_| ()).map_err(|e| e.clone()))?;
    let path = local?;
    same(pc, &[amode as i64], "the access mode")?;
    // Rank 0 creates the file (exclusively if asked); then every rank opens it.
    let created = if rank == 0 && amode & MPI_MODE_CREATE != 0 {
        let mut o = std::fs::OpenOptions::new();
        o.write(true);
        if amode & MPI_MODE_EXCL != 0 {
            o.create_new(true)
        } else {
            o.create(true)
        };
        o.open(&path)
            .map(drop)
            .map_err(|e| os_err(&e, &format!("creating {}", path.display())))
    } else {
        Ok(())
    };
    agree(pc, created)?;
    let mut o = std::fs::OpenOptions::new();
    o.read(amode & (MPI_MODE_RDONLY | MPI_MODE_RDWR) != 0)
        .write(amode & (MPI_MODE_WRONLY | MPI_MODE_RDWR) != 0);
    let opened = o
        .open(&path)
        .map_err(|e| os_err(&e, &format!("opening {}", path.display())));
    agree(pc, opened.as_ref().map(|_| ()).map_err(|e| e.clone()))?;
    let file = opened?;
    // The shared file pointer.
    let mut base: *mut i64 = std::ptr::null_mut();
    let mut win: c_int = 0;
    let bytes = if rank == 0 { 8 } else { 0 };
    ck(
        crate::rma::PMPI_Win_allocate(
            bytes,
            8,
            crate::info::INFO_NULL,
            pc,
            &mut base as *mut *mut i64 as *mut c_void,
            &mut win,
        ),
        "MPI_Win_allocate (shared file pointer)",
    )?;
    let mut pos = 0;
    if amode & MPI_MODE_APPEND != 0 {
        pos = file.metadata().map_err(|e| os_err(&e, "fstat"))?.len() as i64;
        if rank == 0 {
            *base = pos;
        }
    } else if rank == 0 {
        *base = 0;
    }
    ck(
        crate::rma::sync::PMPI_Win_lock_all(crate::rma::MPI_MODE_NOCHECK, win),
        "MPI_Win_lock_all",
    )?;
    ck(crate::coll::PMPI_Barrier(pc), "barrier")?;
    let eh = state()?.file_eh;
    Ok(MFile {
        file,
        path,
        comm: pc,
        rank,
        size,
        amode,
        hints,
        view: Rc::new(View::bytes()),
        pos,
        shwin: win,
        atomic: false,
        eh,
        split: None,
        cb: CB_BUFFER_SIZE,
        naggr: size as usize,
        cb_read: None,
        cb_write: None,
    })
}

/// Make every rank use rank 0's collective-buffering hints (collective): ranks that disagreed would cut
/// the file into different domains and drop each other's pieces.
pub(crate) unsafe fn settle_hints(fh: MPI_File) -> R {
    let st = state()?;
    let f = file(st, fh)?;
    let flag = |k: &str| match f.hint(k) {
        Some("enable") => 1i64,
        Some("disable") => 0,
        _ => -1,
    };
    let mut v = [
        f.hint_usize("cb_buffer_size").unwrap_or(CB_BUFFER_SIZE) as i64,
        f.hint_usize("cb_nodes").unwrap_or(f.size as usize).min(f.size as usize).max(1) as i64,
        flag("romio_cb_read"),
        flag("romio_cb_write"),
    ];
    let pc = f.comm;
    ck(crate::coll::PMPI_Bcast(v.as_mut_ptr() as *mut c_void, 4, MPI_INT64, 0, pc), "bcast")?;
    let f = file(state()?, fh)?;
    let on = |x: i64| (x >= 0).then_some(x == 1);
    (f.cb, f.naggr, f.cb_read, f.cb_write) = (v[0].max(1) as usize, v[1].max(1) as usize, on(v[2]), on(v[3]));
    Ok(())
}

/// Free the view's own duplicates of its types.
unsafe fn drop_view_types(v: &View) {
    for t in [v.etype, v.filetype] {
        if crate::datatype::is_derived(t) {
            let mut t = t;
            crate::datatype::PMPI_Type_free(&mut t);
        }
    }
}

/// Finish an MPI call on file `fh`: success, or hand the error to the file's error handler.
#[inline]
pub(crate) fn fin_file(fh: MPI_File, name: &str, r: R) -> c_int {
    match r {
        Ok(()) => MPI_SUCCESS,
        Err(e) => raise_file(fh, name, e),
    }
}

/// Invoke the error handler of `fh` (that of MPI_FILE_NULL when `fh` is not an open file; MPI_ERRORS_RETURN
/// unless the program changed it, as the standard says).
#[cold]
pub(crate) fn raise_file(fh: MPI_File, name: &str, e: MpiErr) -> c_int {
    let Some(s) = state_opt().filter(|_| phase() == PHASE_INIT) else {
        return raise(MPI_COMM_WORLD, name, e);
    };
    let (eh, mut h) = match index(s, fh) {
        Some(i) => (s.files[i].as_ref().unwrap().eh, fh),
        None => (s.file_eh, MPI_FILE_NULL),
    };
    match eh {
        MPI_ERRORS_RETURN => e.code,
        x if x == MPI_ERRORS_ARE_FATAL || x == MPI_ERRORS_ABORT => fatal(name, &e),
        user => match s
            .errhandlers
            .get(((user as u32) & 0x03ff_ffff) as usize)
            .copied()
            .flatten()
        {
            Some(f) => {
                let mut code = e.code;
                // SAFETY: a handler the program registered with MPI_File_create_errhandler, whose first
                // argument is an MPI_File*.
                unsafe {
                    let f: FileErrFn = std::mem::transmute(f);
                    f(&mut h, &mut code);
                }
                // What the handler left in the code (ROMIO's MPIO_Err_return_file: a handler may clear it).
                code
            }
            None => fatal(name, &e),
        },
    }
}

pub(crate) type FileErrFn = unsafe extern "C" fn(*mut MPI_File, *mut c_int, ...);

/// Close file `i` of the table (collective).
unsafe fn close(fh: *mut MPI_File) -> R {
    if fh.is_null() {
        return err(MPI_ERR_ARG, "fh is NULL");
    }
    let st = state()?;
    let f = file(st, *fh)?;
    let (pc, mut win, rank, delete) = (
        f.comm,
        f.shwin,
        f.rank,
        f.amode & MPI_MODE_DELETE_ON_CLOSE != 0,
    );
    let i = index(st, *fh).unwrap();
    ck(crate::coll::PMPI_Barrier(pc), "barrier")?;
    let f = st.files[i].take().unwrap();
    let path = f.path.clone();
    drop_view_types(&f.view);
    drop(f);
    ck(
        crate::rma::sync::PMPI_Win_unlock_all(win),
        "MPI_Win_unlock_all",
    )?;
    ck(crate::rma::PMPI_Win_free(&mut win), "MPI_Win_free")?;
    let mut r = Ok(());
    if delete {
        ck(crate::coll::PMPI_Barrier(pc), "barrier")?;
        if rank == 0 {
            r = std::fs::remove_file(&path)
                .map_err(|e| os_err(&e, &format!("deleting {}", path.display())));
        }
        // Every rank returns once the file is gone (and with rank 0's error, if it could not go).
        r = agree(pc, r);
    }
    let mut pc = pc;
    ck(crate::comm::PMPI_Comm_free(&mut pc), "MPI_Comm_free")?;
    *fh = MPI_FILE_NULL;
    r
}

/// The data representation named `name`.
unsafe fn rep_of(st: &State, name: *const c_char) -> R<(String, Rep)> {
    if name.is_null() {
        return err(MPI_ERR_ARG, "datarep is NULL");
    }
    let n = CStr::from_ptr(name).to_string_lossy().into_owned();
    let rep = match n.as_str() {
        "native" | "NATIVE" | "internal" => Rep::Native,
        "external32" | "EXTERNAL32" => Rep::External32,
        _ => match st.datareps.iter().position(|d| d.name == n) {
            Some(i) => Rep::User(i),
            None => {
                return err(
                    view::MPI_ERR_UNSUPPORTED_DATAREP,
                    format!("unknown data representation \"{n}\""),
                )
            }
        },
    };
    Ok((n, rep))
}

/// A duplicate of a derived type (the view keeps its own); predefined types as they are.
unsafe fn own(t: MPI_Datatype) -> R<MPI_Datatype> {
    if !crate::datatype::is_derived(t) {
        return Ok(t);
    }
    let mut d = 0;
    ck(crate::datatype::PMPI_Type_dup(t, &mut d), "MPI_Type_dup")?;
    Ok(d)
}

unsafe fn set_view(
    fh: MPI_File,
    disp: MPI_Offset,
    etype: MPI_Datatype,
    filetype: MPI_Datatype,
    datarep: *const c_char,
    info: MPI_Info,
) -> R {
    let st = state()?;
    let f = file(st, fh)?;
    let (pc, amode, split) = (f.comm, f.amode, f.split.is_some());
    let local = (|| -> R<(View, crate::info::Pairs)> {
        if split {
            return err(MPI_ERR_IO, "a split collective is in progress on this file");
        }
        let (name, rep) = rep_of(state()?, datarep)?;
        let hints = crate::info::hints(info)?;
        let mut disp = disp;
        if disp == MPI_DISPLACEMENT_CURRENT {
            if amode & MPI_MODE_SEQUENTIAL == 0 {
                return err(
                    MPI_ERR_ARG,
                    "MPI_DISPLACEMENT_CURRENT needs a file opened with MPI_MODE_SEQUENTIAL",
                );
            }
            disp = access::shared_byte_offset(fh)?;
        }
        let v = View::new(
            disp,
            etype,
            filetype,
            &name,
            rep,
            amode & MPI_MODE_RDONLY == 0,
        )?;
        Ok((v, hints))
    })();
    agree(pc, local.as_ref().map(|_| ()).map_err(|e| e.clone()))?;
    let (mut v, hints) = local?;
    v.etype = own(etype)?;
    v.filetype = own(filetype)?;
    let st = state()?;
    let f = file(st, fh)?;
    let old = std::mem::replace(&mut f.view, Rc::new(v));
    f.hints.extend(hints);
    f.pos = 0;
    let (rank, win) = (f.rank, f.shwin);
    drop_view_types(&old);
    ck(crate::coll::PMPI_Barrier(pc), "barrier")?;
    let reset = if rank == 0 { access::shared_set(win, 0) } else { Ok(()) };
    agree(pc, reset)?;
    settle_hints(fh)
}

unsafe fn get_view(
    fh: MPI_File,
    disp: *mut MPI_Offset,
    etype: *mut MPI_Datatype,
    filetype: *mut MPI_Datatype,
    datarep: *mut c_char,
) -> R {
    let st = state()?;
    let v = file(st, fh)?.view.clone();
    if disp.is_null() || etype.is_null() || filetype.is_null() {
        return err(MPI_ERR_ARG, "NULL argument");
    }
    *disp = v.disp;
    *etype = own(v.etype)?;
    *filetype = own(v.filetype)?;
    put_str(
        &v.datarep,
        datarep,
        std::ptr::null_mut(),
        MPI_MAX_DATAREP_STRING,
    );
    Ok(())
}

/// The hints MPI_File_get_info reports: those the library uses, with their values, then the others given.
fn info_pairs(f: &MFile) -> crate::info::Pairs {
    let mut p: crate::info::Pairs = vec![
        (
            "cb_buffer_size".into(),
            f.hint_usize("cb_buffer_size")
                .unwrap_or(CB_BUFFER_SIZE)
                .to_string(),
        ),
        (
            "cb_nodes".into(),
            f.hint_usize("cb_nodes")
                .map_or(f.size as usize, |n| n.min(f.size as usize))
                .to_string(),
        ),
        (
            "romio_cb_read".into(),
            f.hint("romio_cb_read").unwrap_or("automatic").into(),
        ),
        (
            "romio_cb_write".into(),
            f.hint("romio_cb_write").unwrap_or("automatic").into(),
        ),
    ];
    for (k, v) in &f.hints {
        match p.iter_mut().find(|(pk, _)| pk == k) {
            Some(_) => {}
            None => p.push((k.clone(), v.clone())),
        }
    }
    p
}

/// Run `f` on file `fh` as a collective call: the ranks agree on the outcome, then synchronise.
unsafe fn collective(fh: MPI_File, f: impl FnOnce(&mut MFile) -> R) -> R {
    let st = state()?;
    let fl = file(st, fh)?;
    let pc = fl.comm;
    let r = f(fl);
    agree(pc, r)?;
    ck(crate::coll::PMPI_Barrier(pc), "barrier")
}

mpi_api! {
    fn MPI_File_open / PMPI_File_open(comm: MPI_Comm, filename: *const c_char, amode: c_int, info: MPI_Info, fh: *mut MPI_File) -> c_int {
        let r = (|| -> R {
            if !fh.is_null() {
                *fh = MPI_FILE_NULL;
            }
            let st = state()?;
            let (ci, c) = st.comm(comm)?;
            if c.remote.is_some() {
                return err(MPI_ERR_COMM, "MPI_File_open needs an intracommunicator");
            }
            let (rank, size, world) = (c.rank, c.size, c.world.clone());
            // Errors of this rank's own arguments are agreed on below, once the ranks share a context.
            let args = if fh.is_null() { err(MPI_ERR_ARG, "fh is NULL") } else { crate::info::hints(info) };
            let ctx = new_ctx(st, ci)?;
            let mut pc = Comm::new(ctx, rank, world, size, MPI_ERRORS_RETURN);
            pc.name = "(file)".into();
            let mut pch = add_comm(st, pc);
            let opened = agree(pch, args.as_ref().map(drop).map_err(|e| e.clone()))
                .and_then(|()| open_on(pch, rank, size, filename, amode, args.unwrap_or_default()));
            match opened {
                Ok(f) => {
                    let st = state()?;
                    let i = put_in_free_slot(&mut st.files, 0, f);
                    *fh = handle(i);
                    settle_hints(*fh)
                }
                Err(e) => {
                    crate::comm::PMPI_Comm_free(&mut pch);
                    Err(e)
                }
            }
        })();
        fin_file(MPI_FILE_NULL, "MPI_File_open", r)
    }
    fn MPI_File_close / PMPI_File_close(fh: *mut MPI_File) -> c_int {
        let h = if fh.is_null() { MPI_FILE_NULL } else { *fh };
        fin_file(h, "MPI_File_close", close(fh))
    }
    fn MPI_File_delete / PMPI_File_delete(filename: *const c_char, info: MPI_Info) -> c_int {
        let r = (|| -> R {
            crate::info::hints(info)?;
            if filename.is_null() {
                return err(MPI_ERR_BAD_FILE, "the file name is NULL");
            }
            let p = path_of(&CStr::from_ptr(filename).to_string_lossy());
            std::fs::remove_file(&p).map_err(|e| os_err(&e, &format!("deleting {}", p.display())))
        })();
        fin_file(MPI_FILE_NULL, "MPI_File_delete", r)
    }
    fn MPI_File_set_size / PMPI_File_set_size(fh: MPI_File, size: MPI_Offset) -> c_int {
        let r = (|| -> R {
            let pc = file(state()?, fh)?.comm;
            same(pc, &[size], "the size")?;
            collective(fh, |f| {
                if size < 0 {
                    return err(MPI_ERR_ARG, format!("size {size} is negative"));
                }
                if f.amode & MPI_MODE_RDONLY != 0 {
                    return err(MPI_ERR_READ_ONLY, "the file is open read-only");
                }
                if f.amode & MPI_MODE_SEQUENTIAL != 0 {
                    return err(MPI_ERR_UNSUPPORTED_OPERATION, "MPI_File_set_size on a file opened with MPI_MODE_SEQUENTIAL");
                }
                if f.rank == 0 {
                    f.file.set_len(size as u64).map_err(|e| os_err(&e, "ftruncate"))?;
                }
                Ok(())
            })
        })();
        fin_file(fh, "MPI_File_set_size", r)
    }
    fn MPI_File_preallocate / PMPI_File_preallocate(fh: MPI_File, size: MPI_Offset) -> c_int {
        let r = (|| -> R {
            let pc = file(state()?, fh)?.comm;
            same(pc, &[size], "the size")?;
            collective(fh, |f| {
                if size < 0 {
                    return err(MPI_ERR_ARG, format!("size {size} is negative"));
                }
                if f.amode & MPI_MODE_RDONLY != 0 {
                    return err(MPI_ERR_READ_ONLY, "the file is open read-only");
                }
                if f.amode & MPI_MODE_SEQUENTIAL != 0 {
                    return err(MPI_ERR_UNSUPPORTED_OPERATION, "MPI_File_preallocate on a file opened with MPI_MODE_SEQUENTIAL");
                }
                if f.rank == 0 && size > 0 {
                    let rc = libc::posix_fallocate(f.file.as_raw_fd(), 0, size);
                    if rc != 0 {
                        return Err(os_err(&std::io::Error::from_raw_os_error(rc), "posix_fallocate"));
                    }
                }
                Ok(())
            })
        })();
        fin_file(fh, "MPI_File_preallocate", r)
    }
    fn MPI_File_get_size / PMPI_File_get_size(fh: MPI_File, size: *mut MPI_Offset) -> c_int {
        let r = (|| -> R {
            let f = file(state()?, fh)?;
            let n = f.file.metadata().map_err(|e| os_err(&e, "fstat"))?.len();
            out(size, n as MPI_Offset, "size")
        })();
        fin_file(fh, "MPI_File_get_size", r)
    }
    fn MPI_File_get_group / PMPI_File_get_group(fh: MPI_File, group: *mut crate::comm::MPI_Group) -> c_int {
        let r = (|| -> R {
            let pc = file(state()?, fh)?.comm;
            ck(crate::comm::PMPI_Comm_group(pc, group), "MPI_Comm_group")
        })();
        fin_file(fh, "MPI_File_get_group", r)
    }
    fn MPI_File_get_amode / PMPI_File_get_amode(fh: MPI_File, amode: *mut c_int) -> c_int {
        let r = (|| -> R {
            let a = file(state()?, fh)?.amode;
            out(amode, a, "amode")
        })();
        fin_file(fh, "MPI_File_get_amode", r)
    }
    fn MPI_File_set_info / PMPI_File_set_info(fh: MPI_File, info: MPI_Info) -> c_int {
        let r = (|| -> R {
            let hints = crate::info::hints(info);
            collective(fh, |f| {
                f.hints.extend(hints?);
                Ok(())
            })?;
            settle_hints(fh)
        })();
        fin_file(fh, "MPI_File_set_info", r)
    }
    fn MPI_File_get_info / PMPI_File_get_info(fh: MPI_File, info_used: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            let p = info_pairs(file(state()?, fh)?);
            out(info_used, crate::info::create(p), "info_used")
        })();
        fin_file(fh, "MPI_File_get_info", r)
    }
    fn MPI_File_set_view / PMPI_File_set_view(fh: MPI_File, disp: MPI_Offset, etype: MPI_Datatype, filetype: MPI_Datatype, datarep: *const c_char, info: MPI_Info) -> c_int {
        fin_file(fh, "MPI_File_set_view", set_view(fh, disp, etype, filetype, datarep, info))
    }
    fn MPI_File_get_view / PMPI_File_get_view(fh: MPI_File, disp: *mut MPI_Offset, etype: *mut MPI_Datatype, filetype: *mut MPI_Datatype, datarep: *mut c_char) -> c_int {
        fin_file(fh, "MPI_File_get_view", get_view(fh, disp, etype, filetype, datarep))
    }
    fn MPI_File_set_atomicity / PMPI_File_set_atomicity(fh: MPI_File, flag: c_int) -> c_int {
        let r = (|| -> R {
            let pc = file(state()?, fh)?.comm;
            same(pc, &[(flag != 0) as i64], "the atomicity flag")?;
            collective(fh, |f| {
                f.atomic = flag != 0;
                Ok(())
            })
        })();
        fin_file(fh, "MPI_File_set_atomicity", r)
    }
    fn MPI_File_get_atomicity / PMPI_File_get_atomicity(fh: MPI_File, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let a = file(state()?, fh)?.atomic;
            out(flag, a as c_int, "flag")
        })();
        fin_file(fh, "MPI_File_get_atomicity", r)
    }
    fn MPI_File_sync / PMPI_File_sync(fh: MPI_File) -> c_int {
        let r = collective(fh, |f| {
            if f.split.is_some() {
                return err(MPI_ERR_IO, "a split collective is in progress on this file");
            }
            if f.amode & MPI_MODE_RDONLY != 0 {
                return Ok(());
            }
            f.file.sync_all().map_err(|e| os_err(&e, "fsync"))
        });
        fin_file(fh, "MPI_File_sync", r)
    }
    fn MPI_File_get_type_extent / PMPI_File_get_type_extent(fh: MPI_File, datatype: MPI_Datatype, extent: *mut MPI_Aint) -> c_int {
        let r = (|| -> R {
            let v = file(state()?, fh)?.view.clone();
            let e = match v.rep {
                Rep::Native => crate::datatype::ext_size(datatype)?.0,
                _ => v.stream_len(1, datatype)? as isize,
            };
            out(extent, e as MPI_Aint, "extent")
        })();
        fin_file(fh, "MPI_File_get_type_extent", r)
    }
    fn MPI_File_get_type_extent_c / PMPI_File_get_type_extent_c(fh: MPI_File, datatype: MPI_Datatype, extent: *mut MPI_Count) -> c_int {
        let mut e: MPI_Aint = 0;
        let rc = PMPI_File_get_type_extent(fh, datatype, &mut e);
        if rc == MPI_SUCCESS && !extent.is_null() {
            *extent = e as MPI_Count;
        }
        rc
    }
    fn MPI_File_create_errhandler / PMPI_File_create_errhandler(function: Option<FileErrFn>, errhandler: *mut MPI_Errhandler) -> c_int {
        // SAFETY: both are C variadic handler functions taking a handle pointer and an int pointer.
        crate::env::PMPI_Comm_create_errhandler(function.map(|f| std::mem::transmute::<FileErrFn, CommErrFn>(f)), errhandler)
    }
    fn MPI_File_set_errhandler / PMPI_File_set_errhandler(file: MPI_File, errhandler: MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            if !crate::env::errhandler_ok(st, errhandler) {
                return err(MPI_ERR_ARG, format!("invalid error handler {errhandler:#x}"));
            }
            if file == MPI_FILE_NULL {
                st.file_eh = errhandler;
            } else {
                self::file(st, file)?.eh = errhandler;
            }
            Ok(())
        })();
        fin_file(file, "MPI_File_set_errhandler", r)
    }
    fn MPI_File_get_errhandler / PMPI_File_get_errhandler(file: MPI_File, errhandler: *mut MPI_Errhandler) -> c_int {
        let r = (|| -> R {
            let st = state()?;
            let eh = if file == MPI_FILE_NULL { st.file_eh } else { self::file(st, file)?.eh };
            out(errhandler, eh, "errhandler")
        })();
        fin_file(file, "MPI_File_get_errhandler", r)
    }
    fn MPI_File_call_errhandler / PMPI_File_call_errhandler(fh: MPI_File, errorcode: c_int) -> c_int {
        if fh != MPI_FILE_NULL {
            if let Err(e) = state().and_then(|st| file(st, fh).map(drop)) {
                return raise_file(fh, "MPI_File_call_errhandler", e);
            }
        }
        let msg = format!("MPI_File_call_errhandler with error code {errorcode}");
        raise_file(fh, "MPI_File_call_errhandler", MpiErr { code: errorcode, msg });
        MPI_SUCCESS
    }
    fn MPI_File_c2f / PMPI_File_c2f(fh: MPI_File) -> MPI_Fint {
        if fh >= FILE_BASE && fh < i32::MAX as usize { fh as MPI_Fint } else { 0 }
    }
    fn MPI_File_f2c / PMPI_File_f2c(fh: MPI_Fint) -> MPI_File {
        if fh as usize >= FILE_BASE && fh > 0 { fh as MPI_File } else { MPI_FILE_NULL }
    }
    fn MPI_Register_datarep / PMPI_Register_datarep(datarep: *const c_char, read_conversion_fn: Option<view::DatarepConv>, write_conversion_fn: Option<view::DatarepConv>, dtype_file_extent_fn: Option<view::ExtentFn>, extra_state: *mut c_void) -> c_int {
        let r = register(datarep, read_conversion_fn.map(ConvFn::Int), write_conversion_fn.map(ConvFn::Int), dtype_file_extent_fn, extra_state);
        fin_file(MPI_FILE_NULL, "MPI_Register_datarep", r)
    }
    fn MPI_Register_datarep_c / PMPI_Register_datarep_c(datarep: *const c_char, read_conversion_fn: Option<view::DatarepConvC>, write_conversion_fn: Option<view::DatarepConvC>, dtype_file_extent_fn: Option<view::ExtentFn>, extra_state: *mut c_void) -> c_int {
        let r = register(datarep, read_conversion_fn.map(ConvFn::Big), write_conversion_fn.map(ConvFn::Big), dtype_file_extent_fn, extra_state);
        fin_file(MPI_FILE_NULL, "MPI_Register_datarep_c", r)
    }
}

unsafe fn register(
    name: *const c_char,
    read: Option<ConvFn>,
    write: Option<ConvFn>,
    extent: Option<view::ExtentFn>,
    extra: *mut c_void,
) -> R {
    let st = state()?;
    if name.is_null() {
        return err(MPI_ERR_ARG, "datarep is NULL");
    }
    let n = CStr::from_ptr(name).to_string_lossy().into_owned();
    if n.is_empty() || n.len() >= MPI_MAX_DATAREP_STRING {
        return err(
            MPI_ERR_ARG,
            format!("data representation name of {} characters", n.len()),
        );
    }
    if rep_of(st, name).is_ok() {
        return err(
            MPI_ERR_DUP_DATAREP,
            format!("data representation \"{n}\" exists already"),
        );
    }
    if extent.is_none() {
        return err(MPI_ERR_ARG, "dtype_file_extent_fn is NULL");
    }
    st.datareps.push(Datarep {
        name: n,
        read,
        write,
        extent,
        extra,
    });
    Ok(())
}
