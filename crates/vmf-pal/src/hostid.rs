//! The identity of an emulated host as its processes see it: a host name of its own (a UTS namespace)
//! and an `/etc/hosts` that resolves every emulated host's name to its address (a private mount
//! namespace with the file bound over `/etc/hosts`), as on a cluster whose nodes know each other by name.
//! `vmfabric run --hosts` gives each rank one; a rank that migrates renames itself after its new host.
use std::ffi::CStr;
use std::io;
use std::os::unix::fs::MetadataExt;

/// Give the calling process the identity of an emulated host: its own UTS and mount namespaces, mount
/// propagation made private (nothing it mounts reaches the machine's namespace), `hosts_file` bound over
/// `/etc/hosts`, and `name` as its host name. All or nothing for the host name: it is set only once the
/// file is in place.
///
/// # Safety
/// Meant for a child between `fork` and `exec` (`Command::pre_exec`): it makes system calls only and
/// allocates nothing. It changes the namespaces of the calling thread; a multi-threaded process must not
/// call it.
pub unsafe fn enter(name: &CStr, hosts_file: &CStr) -> io::Result<()> {
    if libc::unshare(libc::CLONE_NEWUTS | libc::CLONE_NEWNS) != 0 {
        return Err(io::Error::last_os_error());
    }
    if libc::mount(
        c"none".as_ptr(),
        c"/".as_ptr(),
        std::ptr::null(),
        libc::MS_REC | libc::MS_PRIVATE,
        std::ptr::null(),
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    if libc::mount(
        hosts_file.as_ptr(),
        c"/etc/hosts".as_ptr(),
        std::ptr::null(),
        libc::MS_BIND,
        std::ptr::null(),
    ) != 0
    {
        return Err(io::Error::last_os_error());
    }
    if libc::sethostname(name.as_ptr(), name.to_bytes().len()) != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process's UTS namespace (its host name) is not the one of process `other` (its
/// launcher): only then may it rename its host without renaming the machine.
pub fn own_uts_namespace(other: i32) -> bool {
    let id = |p: &str| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    match (id("/proc/self/ns/uts"), id(&format!("/proc/{other}/ns/uts"))) {
        (Some(a), Some(b)) => a != b,
        _ => false,
    }
}

/// This process's host name (`gethostname`).
pub fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most b.len() bytes.
    if unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) } != 0 {
        return String::new();
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// Set the host name of this process's UTS namespace. Check [`own_uts_namespace`] first: in the
/// machine's namespace this renames the machine.
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: a live buffer of name.len() bytes.
    if unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_shares_its_own_uts_namespace_and_a_dead_one_is_not_other() {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        assert!(!own_uts_namespace(me));
        assert!(!own_uts_namespace(i32::MAX));
        assert!(!hostname().is_empty());
    }

    /// A child that enters an identity sees its name and its hosts file; the machine keeps both.
    #[test]
    fn a_child_gets_its_own_host_name_and_hosts_file() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("note: not root; skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("vmf-hostid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hosts");
        std::fs::write(&file, "198.18.0.9\tvmf-test-h9\n").unwrap();
        let before = (hostname(), std::fs::read_to_string("/etc/hosts").unwrap());
        let name = c"vmf-test-h9";
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "hostname; cat /etc/hosts"]);
        // SAFETY: enter's contract: between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || enter(name, &path));
        }
        match cmd.output() {
            Ok(o) if o.status.success() => {
                let out = String::from_utf8_lossy(&o.stdout);
                assert_eq!(out, "vmf-test-h9\n198.18.0.9\tvmf-test-h9\n");
            }
            Ok(o) => panic!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr)),
            // Namespaces not permitted here (a container without CAP_SYS_ADMIN): nothing to check.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => eprintln!("note: {e}; skipped"),
            Err(e) => panic!("cannot enter an identity: {e}"),
        }
        assert_eq!((hostname(), std::fs::read_to_string("/etc/hosts").unwrap()), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
