//! Info objects (MPI 4.0 chapter 10): ordered (key, value) string pairs, and the hints of communicators.
//!
//! Handles are MPICH's: `MPI_INFO_NULL` = 0x1c000000, the predefined `MPI_INFO_ENV` = 0x5c000001, and
//! objects made by the program 0x9c000000 | index. The table lives outside the library state, so the Info
//! calls work before `MPI_Init` and after `MPI_Finalize`, as MPI 4.0 allows. Keys keep the order in which
//! they were first set (what `MPI_Info_get_nthkey` enumerates); setting a key again replaces its value.
//!
//! `MPI_INFO_ENV` holds what MPI 4.0 section 11.2.4 lists and this process knows: `command` and `argv`
//! (from `/proc/self/cmdline`), `maxprocs` (the job size the launcher gave), `wdir` and `host`, the same
//! before and after `MPI_Init` (no `thread_level`: that is a level requested at launch).
use crate::*;
use std::ffi::{c_char, c_int, CStr};

/// `MPI_INFO_NULL`.
pub(crate) const INFO_NULL: MPI_Info = 0x1c00_0000;
/// `MPI_INFO_ENV`.
pub(crate) const INFO_ENV: MPI_Info = 0x5c00_0001;
const INFO_BASE: u32 = 0x9c00_0000;
const MAX_KEY: usize = 255;
const MAX_VAL: usize = 1024;

pub(crate) type Pairs = Vec<(String, String)>;

struct Infos(UnsafeCell<Vec<Option<Pairs>>>);
// SAFETY: the library's MPI_THREAD_SERIALIZED contract: calls never overlap.
unsafe impl Sync for Infos {}
static INFOS: Infos = Infos(UnsafeCell::new(Vec::new()));

fn table() -> &'static mut Vec<Option<Pairs>> {
    // SAFETY: serialised calls (crate contract); the reference does not outlive the MPI call.
    unsafe { &mut *INFOS.0.get() }
}

fn env_pairs() -> Pairs {
    let mut v = Vec::new();
    if let Ok(cmd) = std::fs::read("/proc/self/cmdline") {
        let mut args = cmd
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned());
        if let Some(c) = args.next() {
            v.push(("command".to_string(), c));
        }
        let rest: Vec<String> = args.collect();
        if !rest.is_empty() {
            v.push(("argv".to_string(), rest.join(" ")));
        }
    }
    let size = state_opt()
        .map(|s| s.fab.size().to_string())
        .or_else(|| std::env::var("PMI_SIZE").ok());
    if let Some(n) = size {
        v.push(("maxprocs".to_string(), n));
    }
    if let Ok(d) = std::env::current_dir() {
        v.push(("wdir".to_string(), d.display().to_string()));
    }
    let h = vmf_pal::hostid::hostname();
    if !h.is_empty() {
        v.push(("host".to_string(), h));
    }
    // No "thread_level": the standard means a level requested at launch (which `vmfabric run` has no flag
    // for), not the one MPI_Init_thread provided, and the keys must not change when MPI_Init runs.
    v
}

/// The pairs of a valid info handle (`MPI_INFO_ENV` is computed on each use: it is small and rare).
fn pairs(h: MPI_Info) -> R<std::borrow::Cow<'static, Pairs>> {
    if h == INFO_ENV {
        return Ok(std::borrow::Cow::Owned(env_pairs()));
    }
    match index(h) {
        Some(i) => Ok(std::borrow::Cow::Borrowed(table()[i].as_ref().unwrap())),
        None => bad(h),
    }
}

/// The error for a handle that names no info object (MPI_INFO_NULL: MPI_ERR_ARG, as MPICH).
fn bad<T>(h: MPI_Info) -> R<T> {
    if h == INFO_NULL {
        err(
            MPI_ERR_ARG,
            "MPI_INFO_NULL where an info object is required",
        )
    } else {
        err(MPI_ERR_INFO, format!("invalid info handle {h:#x}"))
    }
}

fn index(h: MPI_Info) -> Option<usize> {
    let u = h as u32;
    if u & 0xfc00_0000 != INFO_BASE {
        return None;
    }
    let i = (u & 0x03ff_ffff) as usize;
    table().get(i).is_some_and(|x| x.is_some()).then_some(i)
}

/// Check an info argument of another call: MPI_INFO_NULL, MPI_INFO_ENV or a live object.
pub(crate) fn check(h: MPI_Info) -> R {
    if h == INFO_NULL || h == INFO_ENV || index(h).is_some() {
        Ok(())
    } else {
        err(MPI_ERR_INFO, format!("invalid info handle {h:#x}"))
    }
}

/// The pairs of an info argument of another call (MPI_INFO_NULL: none).
pub(crate) fn hints(h: MPI_Info) -> R<Pairs> {
    if h == INFO_NULL {
        return Ok(Vec::new());
    }
    pairs(h).map(|p| p.into_owned())
}

/// The hints of `h` a communicator keeps: the standard's (keys starting `mpi_`, the prefix MPI reserves,
/// e.g. `mpi_assert_no_any_tag`). Others are ignored, as MPICH ignores keys it does not know, so
/// MPI_Comm_get_info does not return them.
pub(crate) fn comm_hints(h: MPI_Info) -> R<Pairs> {
    let mut p = hints(h)?;
    p.retain(|(k, _)| k.starts_with("mpi_"));
    Ok(p)
}

/// Set `key` to `value` in the program's info object `h` (MPI_Comm_split_type reports a resource
/// type this way).
pub(crate) fn set(h: MPI_Info, key: &str, value: &str) -> R {
    let i = mutable(h)?;
    let p = table()[i].as_mut().unwrap();
    match p.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = value.to_string(),
        None => p.push((key.to_string(), value.to_string())),
    }
    Ok(())
}

/// The value of `key` in `h` (None for MPI_INFO_NULL or a missing key).
pub(crate) fn get(h: MPI_Info, key: &str) -> R<Option<String>> {
    if h == INFO_NULL {
        return Ok(None);
    }
    let p = pairs(h)?;
    Ok(lookup(&p, key).map(str::to_string))
}

/// A new info object holding `p`.
pub(crate) fn create(p: Pairs) -> MPI_Info {
    let t = table();
    let i = put_in_free_slot(t, 0, p);
    (INFO_BASE | i as u32) as MPI_Info
}

unsafe fn key_arg(key: *const c_char) -> R<String> {
    if key.is_null() {
        return err(MPI_ERR_ARG, "key is NULL");
    }
    let b = CStr::from_ptr(key).to_bytes();
    if b.is_empty() || b.len() > MAX_KEY {
        return err(
            MPI_ERR_INFO_KEY,
            format!("info key of {} characters (1..={MAX_KEY} allowed)", b.len()),
        );
    }
    Ok(String::from_utf8_lossy(b).into_owned())
}

fn mutable(h: MPI_Info) -> R<usize> {
    if h == INFO_ENV {
        return err(
            MPI_ERR_INFO,
            "MPI_INFO_ENV is predefined and cannot be changed or freed",
        );
    }
    index(h).map_or_else(|| bad(h), Ok)
}

/// Copy `v` into `out` (room for `room` characters plus the terminating NUL), truncating.
unsafe fn put_str(v: &str, out: *mut c_char, room: usize) {
    let n = v.len().min(room);
    std::ptr::copy_nonoverlapping(v.as_ptr() as *const c_char, out, n);
    *out.add(n) = 0;
}

fn lookup<'a>(p: &'a Pairs, k: &str) -> Option<&'a str> {
    p.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
}

mpi_api! {
    fn MPI_Info_create / PMPI_Info_create(info: *mut MPI_Info) -> c_int {
        if info.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Info_create", MpiErr { code: MPI_ERR_ARG, msg: "info is NULL".into() });
        }
        *info = create(Vec::new());
        MPI_SUCCESS
    }
    fn MPI_Info_create_env / PMPI_Info_create_env(_argc: c_int, _argv: *mut *mut c_char, info: *mut MPI_Info) -> c_int {
        if info.is_null() {
            return raise(MPI_COMM_WORLD, "MPI_Info_create_env", MpiErr { code: MPI_ERR_ARG, msg: "info is NULL".into() });
        }
        *info = create(env_pairs());
        MPI_SUCCESS
    }
    fn MPI_Info_set / PMPI_Info_set(info: MPI_Info, key: *const c_char, value: *const c_char) -> c_int {
        let r = (|| -> R {
            let i = mutable(info)?;
            let k = key_arg(key)?;
            if value.is_null() {
                return err(MPI_ERR_ARG, "value is NULL");
            }
            let b = CStr::from_ptr(value).to_bytes();
            if b.len() > MAX_VAL {
                return err(MPI_ERR_INFO_VALUE, format!("info value of {} characters (at most {MAX_VAL} allowed)", b.len()));
            }
            let v = String::from_utf8_lossy(b).into_owned();
            let p = table()[i].as_mut().unwrap();
            match p.iter_mut().find(|(key, _)| *key == k) {
                Some(e) => e.1 = v,
                None => p.push((k, v)),
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_set", r)
    }
    fn MPI_Info_delete / PMPI_Info_delete(info: MPI_Info, key: *const c_char) -> c_int {
        let r = (|| -> R {
            let i = mutable(info)?;
            let k = key_arg(key)?;
            let p = table()[i].as_mut().unwrap();
            match p.iter().position(|(key, _)| *key == k) {
                Some(at) => {
                    p.remove(at);
                    Ok(())
                }
                None => err(MPI_ERR_INFO_NOKEY, format!("key '{k}' is not set")),
            }
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_delete", r)
    }
    fn MPI_Info_get / PMPI_Info_get(info: MPI_Info, key: *const c_char, valuelen: c_int, value: *mut c_char, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?;
            let k = key_arg(key)?;
            if flag.is_null() || valuelen < 0 || (value.is_null() && valuelen > 0) {
                return err(MPI_ERR_ARG, "flag or value is NULL, or valuelen is negative");
            }
            match lookup(&p, &k) {
                Some(v) => {
                    *flag = 1;
                    if !value.is_null() {
                        put_str(v, value, valuelen as usize);
                    }
                    if v.len() > valuelen as usize {
                        // As MPICH: the value is truncated and the call reports it.
                        return err(MPI_ERR_INFO_VALUE, format!("value of '{k}' has {} characters, valuelen is {valuelen} (truncated)", v.len()));
                    }
                }
                None => *flag = 0,
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_get", r)
    }
    fn MPI_Info_get_string / PMPI_Info_get_string(info: MPI_Info, key: *const c_char, buflen: *mut c_int, value: *mut c_char, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?;
            let k = key_arg(key)?;
            if flag.is_null() || buflen.is_null() || *buflen < 0 || (value.is_null() && *buflen > 0) {
                return err(MPI_ERR_ARG, "flag, buflen or value is NULL, or *buflen is negative");
            }
            match lookup(&p, &k) {
                Some(v) => {
                    *flag = 1;
                    if *buflen > 0 {
                        put_str(v, value, *buflen as usize - 1);
                    }
                    *buflen = v.len() as c_int + 1;
                }
                None => *flag = 0,
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_get_string", r)
    }
    fn MPI_Info_get_valuelen / PMPI_Info_get_valuelen(info: MPI_Info, key: *const c_char, valuelen: *mut c_int, flag: *mut c_int) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?;
            let k = key_arg(key)?;
            if flag.is_null() || valuelen.is_null() {
                return err(MPI_ERR_ARG, "flag or valuelen is NULL");
            }
            match lookup(&p, &k) {
                Some(v) => {
                    *flag = 1;
                    *valuelen = v.len() as c_int;
                }
                None => *flag = 0,
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_get_valuelen", r)
    }
    fn MPI_Info_get_nkeys / PMPI_Info_get_nkeys(info: MPI_Info, nkeys: *mut c_int) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?;
            if nkeys.is_null() {
                return err(MPI_ERR_ARG, "nkeys is NULL");
            }
            *nkeys = p.len() as c_int;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_get_nkeys", r)
    }
    fn MPI_Info_get_nthkey / PMPI_Info_get_nthkey(info: MPI_Info, n: c_int, key: *mut c_char) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?;
            if key.is_null() {
                return err(MPI_ERR_ARG, "key is NULL");
            }
            match usize::try_from(n).ok().and_then(|n| p.get(n)) {
                Some((k, _)) => put_str(k, key, MAX_KEY),
                None => return err(MPI_ERR_ARG, format!("key number {n} of an info object with {} keys", p.len())),
            }
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_get_nthkey", r)
    }
    fn MPI_Info_dup / PMPI_Info_dup(info: MPI_Info, newinfo: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            let p = pairs(info)?.into_owned();
            if newinfo.is_null() {
                return err(MPI_ERR_ARG, "newinfo is NULL");
            }
            *newinfo = create(p);
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_dup", r)
    }
    fn MPI_Info_free / PMPI_Info_free(info: *mut MPI_Info) -> c_int {
        let r = (|| -> R {
            if info.is_null() {
                return err(MPI_ERR_ARG, "info is NULL");
            }
            // Freeing the predefined MPI_INFO_ENV only clears the caller's handle, as in MPICH.
            if *info != INFO_ENV {
                let i = mutable(*info)?;
                table()[i] = None;
            }
            *info = INFO_NULL;
            Ok(())
        })();
        fin(MPI_COMM_WORLD, "MPI_Info_free", r)
    }
}
