//! The guest agent: `vmfabric vm agent`, PID 1 of a guest (started by the initramfs' `/init`). It listens
//! on TCP port [`AGENT_PORT`](crate::proto::AGENT_PORT) and, per request of the host, starts ranks (with
//! the host's working directory bound into the guest), forwards their output and exit status, kills them
//! when asked or when the host goes away, reports what it sees (`info`) and powers the guest off.
//! As PID 1 it reaps every process of the guest.
use crate::proto::{Frame, RankSpec};
use crate::VmError;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the initramfs mounted the host's files read-write (in a migratable guest: where the agent
/// mounts them while it copies a job's files in).
pub const HOST_RW: &str = "/run/host";

/// This guest mounts none of the host's files but for moments (`vmfabric vm up --migratable`).
static MIGRATABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn migratable() -> bool {
    MIGRATABLE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Serialises the moments a migratable guest has the host's files mounted.
static HOST_FILES: Mutex<()> = Mutex::new(());

/// Run `f` with the host's files mounted (9p, writable) at [`HOST_RW`], then unmount them: a migratable
/// guest keeps no 9p file system mounted, since QEMU refuses to migrate a guest while one is.
fn with_host_files<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let _g = HOST_FILES.lock().unwrap_or_else(|p| p.into_inner());
    let _ = std::fs::create_dir_all(HOST_RW);
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (src, dst, fs, opts) = (c("hostrw"), c(HOST_RW), c("9p"), c("trans=virtio,version=9p2000.L,msize=512000"));
    // SAFETY: valid C strings; a mount of the host's export.
    if unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, opts.as_ptr().cast()) } != 0 {
        return Err(format!("cannot mount the host's files over 9p ({})", std::io::Error::last_os_error()));
    }
    let r = f();
    // SAFETY: unmounting what we mounted above.
    if unsafe { libc::umount(dst.as_ptr()) } != 0 {
        return Err(format!(
            "cannot unmount the host's files ({}): the guest cannot migrate while they are mounted",
            std::io::Error::last_os_error()
        ));
    }
    Ok(r)
}

/// An absolute path naming a file by its plain components (no `..`), as staging wants them.
fn stage_path_ok(p: &str) -> bool {
    use std::path::Component;
    let p = std::path::Path::new(p);
    p.is_absolute() && p.components().skip(1).all(|c| matches!(c, Component::Normal(_))) && p.components().count() > 1
}

/// Copy `files` (pairs of absolute paths: the host's file, where it goes in this guest) in from the
/// host's files; one already there with the host's size and modification time is kept.
fn stage(files: &[(String, String)]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let copy = || -> Result<(), String> {
        for (from, f) in files {
            let src = format!("{HOST_RW}{from}");
            let m = std::fs::metadata(&src).map_err(|e| format!("the host's {from} ({e})"))?;
            if let Ok(have) = std::fs::metadata(f) {
                if have.len() == m.len() && have.modified().ok() == m.modified().ok() {
                    continue;
                }
            }
            let p = std::path::Path::new(f);
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d).map_err(|e| format!("cannot create {} ({e})", d.display()))?;
            }
            // Through a new file: the old one may be a running program's (ETXTBSY if written in place).
            let tmp = format!("{f}.vmf-stage");
            std::fs::copy(&src, &tmp).map_err(|e| format!("cannot copy the host's {from} ({e})"))?;
            let t = std::fs::File::options().write(true).open(&tmp).map_err(|e| format!("{tmp} ({e})"))?;
            if let Ok(mt) = m.modified() {
                let _ = t.set_modified(mt);
            }
            let _ = t.set_permissions(std::fs::Permissions::from_mode(m.permissions().mode()));
            std::fs::rename(&tmp, f).map_err(|e| format!("cannot put {f} in place ({e})"))?;
        }
        Ok(())
    };
    with_host_files(copy)?
}

type Reaped = Arc<Mutex<HashMap<i32, mpsc::Sender<(i32, i32)>>>>;

/// A running rank's control socket (the launcher's protocol: it writes `ready`, is asked
/// `migrate <host>` after SIGUSR2 and answers `ok <ms> ms` or `error ...`).
struct RankCtl {
    rank: u32,
    pid: i32,
    sock: std::os::unix::net::UnixStream,
    ready: bool,
}

/// Every running rank's control socket, for `leave-region` / `join-region`.
static CTLS: Mutex<Vec<RankCtl>> = Mutex::new(Vec::new());

/// The hosts a rank in this guest can be on: 0 = the ivshmem region, 1 = this guest's own memory
/// (a region file in [`LOCAL_DIR`]); the same address on both.
pub const LOCAL_DIR: &str = "/dev/shm/vmfabric-local";

fn hosts_table(ip: &str) -> String {
    format!("0=-,ivshmem,{ip};1=-,{LOCAL_DIR},{ip}")
}

/// This guest's address (eth0's IPv4), from the kernel command line the host gave it.
fn my_ip() -> Option<String> {
    let c = std::fs::read_to_string("/proc/cmdline").ok()?;
    c.split_whitespace()
        .find_map(|w| w.strip_prefix("vmf_ip="))
        .map(|v| v.split('/').next().unwrap_or(v).to_owned())
}

/// Move every running rank of this guest to `host` (0: onto the ivshmem region, 1: off it), one at a
/// time; per rank its answer. Ok only when every rank moved.
fn move_ranks(host: usize) -> Result<Vec<(u32, String)>, String> {
    use std::io::Read as _;
    // Work on clones of the sockets: the table's lock is not held while ranks move (their exits and a
    // new job's starts take it).
    let mut snap: Vec<(u32, i32, std::os::unix::net::UnixStream, bool)> = {
        let g = CTLS.lock().unwrap_or_else(|p| p.into_inner());
        g.iter()
            .filter_map(|c| Some((c.rank, c.pid, c.sock.try_clone().ok()?, c.ready)))
            .collect()
    };
    snap.sort_by_key(|c| c.0);
    let still = |pid: i32| CTLS.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|c| c.pid == pid);
    let mut out = Vec::new();
    let mut bad = None;
    let read_line = |sock: &mut std::os::unix::net::UnixStream, secs: u64| -> String {
        let _ = sock.set_read_timeout(Some(Duration::from_secs(secs)));
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while sock.read_exact(&mut b).is_ok() && b[0] != b'\n' {
            line.push(b[0]);
        }
        String::from_utf8_lossy(&line).trim().to_owned()
    };
    // 1. Every rank opens its new region on a helper thread while it goes on working (`prepare`).
    let mut asked = Vec::new();
    for (rank, pid, sock, ready) in snap.iter_mut() {
        let (rank, pid) = (*rank, *pid);
        if !*ready {
            // The rank writes `ready` once its SIGUSR2 handler is in place.
            let _ = sock.set_read_timeout(Some(Duration::from_secs(30)));
            let mut b = [0u8; 6];
            *ready = sock.read_exact(&mut b).is_ok() && &b == b"ready\n";
            if !*ready {
                if still(pid) {
                    bad.get_or_insert(format!("rank {rank} has not initialised the fabric"));
                }
                continue;
            }
            if let Some(c) = CTLS.lock().unwrap_or_else(|p| p.into_inner()).iter_mut().find(|c| c.pid == pid) {
                c.ready = true;
            }
        }
        if !still(pid) || sock.write_all(format!("prepare {host}\n").as_bytes()).is_err() {
            continue;
        }
        // SAFETY: signalling a rank this agent started and has not reaped (checked just above; the
        // reaper removes a rank from the table before it reports its end).
        unsafe { libc::kill(pid, libc::SIGUSR2) };
        asked.push(rank);
    }
    let mut prepared: HashMap<u32, String> = HashMap::new();
    for (rank, _, sock, _) in snap.iter_mut() {
        if asked.contains(rank) {
            prepared.insert(*rank, read_line(sock, 120));
        }
    }
    // 2. Then the switches, one rank at a time.
    for (rank, pid, sock, ready) in snap.iter_mut() {
        let (rank, pid) = (*rank, *pid);
        if !*ready || !still(pid) {
            continue; // it ended meanwhile (its pid may be reused: never signal it)
        }
        if sock.write_all(format!("migrate {host}\n").as_bytes()).is_err() {
            bad.get_or_insert(format!("rank {rank} does not answer"));
            continue;
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGUSR2) };
        // A prepare answer that came after its wait is not this request's.
        let mut reply = read_line(sock, 120);
        while reply.starts_with("prepare ") {
            prepared.insert(rank, reply);
            reply = read_line(sock, 120);
        }
        if !reply.starts_with("ok") && still(pid) {
            bad.get_or_insert(format!("rank {rank}: {reply}"));
        }
        match prepared.get(&rank) {
            Some(p) if !p.is_empty() => out.push((rank, format!("{reply}; {p}"))),
            _ => out.push((rank, reply)),
        }
    }
    match bad {
        Some(b) => Err(b),
        None => Ok(out),
    }
}

/// Run the agent (never returns on success when PID 1: the guest powers off).
pub fn run(port: u16, name: &str, migratable: bool) -> Result<(), VmError> {
    MIGRATABLE.store(migratable, std::sync::atomic::Ordering::Relaxed);
    // The host's state directory (where its token is), as the host named it on our command line.
    if let Some(d) = std::fs::read_to_string("/proc/cmdline")
        .ok()
        .and_then(|c| c.split_whitespace().find_map(|w| w.strip_prefix("vmf_state=").map(str::to_owned)))
    {
        std::env::set_var("VMF_VM_DIR", d);
    }
    if migratable {
        // The host's token, kept in the guest's own memory: the host's files are not mounted.
        let p = crate::proto::token_path();
        let host = format!("{HOST_RW}{}", p.display());
        let t = with_host_files(|| std::fs::read(&host))
            .map_err(VmError::Setup)?
            .map_err(|e| VmError::Setup(format!("cannot read the host's token {} ({e})", p.display())))?;
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        std::fs::write(&p, t).map_err(|e| VmError::Setup(format!("cannot keep the token ({e})")))?;
    }
    let l = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| VmError::Setup(format!("the agent cannot listen on port {port} ({e})")))?;
    eprintln!("vmfabric-guest: {name}: agent listening on port {port}");
    crate::bell::up();
    let children: Reaped = Arc::new(Mutex::new(HashMap::new()));
    let c2 = children.clone();
    std::thread::spawn(move || reaper(c2));
    for s in l.incoming() {
        let Ok(s) = s else { continue };
        let ch = children.clone();
        let name = name.to_owned();
        std::thread::spawn(move || {
            if let Err(e) = serve(s, &ch, &name) {
                eprintln!("vmfabric-guest: {name}: {e}");
            }
        });
    }
    Ok(())
}

/// Reap every child (and, as PID 1, every orphan); tell the job that started it.
///
/// A child whose `exec` fails is waited for by `Command::spawn` itself, which panics if someone else
/// reaped it first. So the reaper only peeks (`waitid` with `WNOWAIT`), then takes the lock the spawner
/// holds from fork until it has recorded the pid, and only then reaps: by that time a failed spawn has
/// collected its child (the reap finds nothing) and a successful one has registered it.
fn reaper(children: Reaped) {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid siginfo pointer.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc != 0 {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        // SAFETY: waitid filled `info` for a child that changed state.
        let pid = unsafe { info.si_pid() };
        let map = children.lock().unwrap_or_else(|p| p.into_inner());
        // Out of the control table before its pid can be reused.
        CTLS.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.pid != pid);
        let mut st = 0;
        // SAFETY: waitpid with a valid status pointer; WNOHANG: it may already be gone (a failed spawn).
        if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } != pid {
            continue;
        }
        // An exit status, or minus the signal that killed it.
        let code = if libc::WIFEXITED(st) {
            libc::WEXITSTATUS(st)
        } else if libc::WIFSIGNALED(st) {
            -libc::WTERMSIG(st)
        } else {
            continue;
        };
        let mut map = map;
        if let Some(tx) = map.remove(&pid) {
            let _ = tx.send((pid, code));
        }
    }
}

fn reply(s: &mut TcpStream, v: serde_json::Value) -> std::io::Result<()> {
    s.write_all(format!("{v}\n").as_bytes())
}

fn serve(s: TcpStream, children: &Reaped, name: &str) -> Result<(), VmError> {
    let io = |e: std::io::Error| VmError::Io(format!("serving the host ({e})"));
    let _ = s.set_nodelay(true);
    let mut r = BufReader::new(s.try_clone().map_err(io)?);
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let req: serde_json::Value = serde_json::from_str(line.trim())
        .map_err(|e| VmError::Protocol(format!("bad request {:?} ({e})", line.trim())))?;
    let mut w = s;
    // The token of the host that booted us (read per request: `vm down` and `vm up` make a new one).
    match crate::proto::token() {
        Some(t) if req.get("token").and_then(|v| v.as_str()) == Some(t.as_str()) => {}
        _ => {
            let _ = reply(&mut w, serde_json::json!({"error": "no or wrong token"}));
            return Err(VmError::Protocol("a request without the host's token was refused".into()));
        }
    }
    match req.get("cmd").and_then(|c| c.as_str()).unwrap_or("") {
        "info" => reply(&mut w, info(name)).map_err(io),
        "poweroff" => {
            let _ = reply(&mut w, serde_json::json!({"ok": true}));
            poweroff();
            Ok(())
        }
        "leave-region" | "join-region" => {
            let host = usize::from(req["cmd"] == "leave-region");
            let t0 = std::time::Instant::now();
            let r = move_ranks(host);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let v = match r {
                Ok(ranks) => serde_json::json!({"ok": true, "ms": ms,
                    "ranks": ranks.iter().map(|(r, a)| serde_json::json!({"rank": r, "answer": a})).collect::<Vec<_>>()}),
                Err(e) => serde_json::json!({"ok": false, "error": e, "ms": ms}),
            };
            reply(&mut w, v).map_err(io)
        }
        "release-region" => {
            let r = release_region();
            reply(&mut w, serde_json::json!({"ok": r.is_ok(), "error": r.err()})).map_err(io)
        }
        "run" => {
            let ranks = req
                .get("ranks")
                .and_then(|v| v.as_array())
                .and_then(|a| a.iter().map(RankSpec::from_json).collect::<Option<Vec<_>>>())
                .ok_or_else(|| VmError::Protocol("run request without valid ranks".into()))?;
            // `vm rsh` commands are not ranks of a job that moves with the region.
            let failover = req.get("failover").and_then(|v| v.as_bool()).unwrap_or(true);
            // A migratable guest copies the job's program and libraries in first.
            let files: Vec<(String, String)> = req
                .get("stage")
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|x| Some((x.get("from")?.as_str()?.to_owned(), x.get("to")?.as_str()?.to_owned())))
                        .filter(|(f, t)| stage_path_ok(f) && stage_path_ok(t) && !t.starts_with(&format!("{HOST_RW}/")))
                        .collect()
                })
                .unwrap_or_default();
            if migratable() && !files.is_empty() {
                if let Err(e) = stage(&files) {
                    let mut g = w;
                    for spec in &ranks {
                        let _ = Frame::SpawnFailed(spec.rank, format!("cannot copy the job's files into the guest: {e}")).write_to(&mut g);
                    }
                    let _ = Frame::Done.write_to(&mut g);
                    return Err(VmError::Setup(e));
                }
            }
            run_ranks(r, w, ranks, children, failover)
        }
        c => reply(&mut w, serde_json::json!({"error": format!("unknown command {c:?}")})).map_err(io),
    }
}

/// What the host asks for with `info`.
pub fn info(name: &str) -> serde_json::Value {
    let up = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|w| w.parse::<f64>().ok()))
        .unwrap_or(0.0);
    let dev: Vec<serde_json::Value> = vmf_pal::pci::ivshmem_devices()
        .iter()
        .map(|d| {
            serde_json::json!({"address": d.address, "bar2": d.bar2.display().to_string(),
                "size": d.size, "doorbell": d.doorbell})
        })
        .collect();
    serde_json::json!({
        "name": name,
        "uptime_s": up,
        "cpus": vmf_pal::available_cpus(),
        "ivshmem": dev,
        "doorbell": crate::bell::describe(),
        "pid": std::process::id(),
    })
}

/// Zero the header of this guest's ivshmem region (the job that used it has ended everywhere): the next
/// job initialises it afresh instead of finding an earlier job's ranks in its slots.
fn release_region() -> Result<(), String> {
    let Some(d) = vmf_pal::pci::region_device() else {
        return Ok(());
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&d.bar2)
        .map_err(|e| format!("cannot open {} ({e})", d.bar2.display()))?;
    let len = 4096usize.min(d.size as usize);
    // SAFETY: a fresh shared mapping of the BAR, written and unmapped here.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(format!("cannot map {} ({})", d.bar2.display(), std::io::Error::last_os_error()));
        }
        std::ptr::write_bytes(p as *mut u8, 0, len);
        libc::munmap(p, len);
    }
    Ok(())
}

fn poweroff() {
    // SAFETY: plain system calls; as PID 1 this ends the guest.
    unsafe {
        libc::sync();
        if libc::getpid() == 1 {
            libc::kill(-1, libc::SIGKILL);
            libc::reboot(libc::RB_POWER_OFF);
        }
    }
    std::process::exit(0);
}

fn mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(4) == Some(path))
    })
}

/// Make the host's directory `cwd` the guest's `cwd`, writable: bind `/run/host<cwd>` over it.
fn bind_cwd(cwd: &str) -> Result<(), String> {
    if migratable() {
        // No host files to bind: the directory lives in the guest's memory.
        return std::fs::create_dir_all(cwd).map_err(|e| format!("cannot create the working directory {cwd} ({e})"));
    }
    let src = format!("{HOST_RW}{cwd}");
    if !std::path::Path::new(&src).is_dir() {
        return Err(format!("the working directory {cwd} is not a directory on the host"));
    }
    if !std::path::Path::new(HOST_RW).is_dir() || mounted(cwd) {
        return Ok(());
    }
    // A directory in the guest's own tmpfs (/tmp, /run, /dev/shm) must first exist to be mounted on.
    let _ = std::fs::create_dir_all(cwd);
    let c = |s: &str| std::ffi::CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"));
    let (s, d) = (c(&src)?, c(cwd)?);
    // SAFETY: valid C strings; a bind mount.
    let rc = unsafe {
        libc::mount(s.as_ptr(), d.as_ptr(), std::ptr::null(), libc::MS_BIND | libc::MS_REC, std::ptr::null())
    };
    if rc != 0 {
        return Err(format!("cannot bind the host's {cwd} into the guest ({})", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn run_ranks(
    mut r: BufReader<TcpStream>,
    w: TcpStream,
    ranks: Vec<RankSpec>,
    children: &Reaped,
    failover: bool,
) -> Result<(), VmError> {
    // The host's root is mounted with 9p's loose cache (fast starts); a program rebuilt on the host
    // since this guest last read it would be seen half old, half new. Nothing of a job runs between
    // jobs, so drop the cached pages and inodes: every job reads the host's files as they are now.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    let w = Arc::new(Mutex::new(w));
    let send = |f: Frame| {
        let mut g = w.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_to(&mut *g);
    };
    let (tx, rx) = mpsc::channel::<(i32, i32)>();
    let mut pids: HashMap<i32, u32> = HashMap::new();
    let mut readers: HashMap<u32, Vec<std::thread::JoinHandle<()>>> = HashMap::new();
    for spec in &ranks {
        if let Err(m) = bind_cwd(&spec.cwd) {
            send(Frame::SpawnFailed(spec.rank, m));
            continue;
        }
        // A control socket and the hosts table, when this guest has an ivshmem region to leave.
        let mut ctl: Option<(std::os::unix::net::UnixStream, std::os::fd::OwnedFd)> = None;
        let mut extra: Vec<(String, String)> = Vec::new();
        if let (true, false, Some(ip)) = (failover, vmf_pal::pci::region_device().is_none(), my_ip()) {
            if let Ok((ours, theirs)) = std::os::unix::net::UnixStream::pair() {
                let _ = std::fs::create_dir_all(LOCAL_DIR);
                let fd: std::os::fd::OwnedFd = theirs.into();
                extra.push(("VMF_CTL_FD".into(), std::os::fd::AsRawFd::as_raw_fd(&fd).to_string()));
                extra.push(("VMF_HOSTS_TABLE".into(), hosts_table(&ip)));
                extra.push(("VMF_HOST".into(), "0".into()));
                ctl = Some((ours, fd));
            }
        }
        let ctl_fd = ctl.as_ref().map(|c| std::os::fd::AsRawFd::as_raw_fd(&c.1));
        // A doorbell vector of its own, when this guest takes its device's interrupts.
        let mut bell = if failover { crate::bell::lend() } else { None };
        let bell_fd = bell.as_ref().map(|(_, fd)| std::os::fd::AsRawFd::as_raw_fd(fd));
        if let (Some((v, _)), Some(fd)) = (&bell, bell_fd) {
            extra.push(("VMF_IVSHMEM_BELL".into(), format!("{v}:{fd}")));
        }
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Its own process group, so kill reaches what it starts.
                libc::setpgid(0, 0);
                // The control socket and the doorbell's eventfd survive exec (in this child only: they
                // are close-on-exec, so ranks other threads start meanwhile do not get them).
                if let Some(fd) = ctl_fd {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                }
                if let Some(fd) = bell_fd {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                }
                Ok(())
            });
        }
        let mut map = children.lock().unwrap_or_else(|p| p.into_inner());
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id() as i32;
                map.insert(pid, tx.clone());
                drop(map);
                pids.insert(pid, spec.rank);
                if let Some((v, _)) = bell.take() {
                    crate::bell::lent_to(pid, v);
                }
                if let Some((sock, theirs)) = ctl.take() {
                    drop(theirs);
                    CTLS.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(RankCtl { rank: spec.rank, pid, sock, ready: false });
                }
                send(Frame::Started(spec.rank, pid as u32));
                let mut hs = Vec::new();
                for (i, pipe) in [
                    child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
                    child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
                ]
                .into_iter()
                .enumerate()
                {
                    let Some(mut p) = pipe else { continue };
                    let w = w.clone();
                    let rank = spec.rank;
                    hs.push(std::thread::spawn(move || {
                        let mut buf = vec![0u8; 16384];
                        while let Ok(n) = p.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            let d = buf[..n].to_vec();
                            let f = if i == 0 { Frame::Stdout(rank, d) } else { Frame::Stderr(rank, d) };
                            let mut g = w.lock().unwrap_or_else(|p| p.into_inner());
                            if f.write_to(&mut *g).is_err() {
                                break;
                            }
                        }
                    }));
                }
                readers.insert(spec.rank, hs);
                // The reaper owns the wait: dropping `child` neither waits nor kills.
                drop(child);
            }
            Err(e) => {
                drop(map);
                if let Some((v, _)) = bell.take() {
                    crate::bell::unlend(v);
                }
                send(Frame::SpawnFailed(spec.rank, format!("cannot start {} ({e})", spec.argv[0])));
            }
        }
    }
    drop(tx);
    // Kill requests from the host; its going away kills the ranks.
    let live: Arc<Mutex<Vec<i32>>> = Arc::new(Mutex::new(pids.keys().copied().collect()));
    let l2 = live.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        loop {
            line.clear();
            let sig = match r.read_line(&mut line) {
                Ok(0) | Err(_) => libc::SIGKILL,
                Ok(_) => match line.trim().strip_prefix("kill ").and_then(|s| s.parse::<i32>().ok()) {
                    Some(s) if (1..=64).contains(&s) => s,
                    _ => continue,
                },
            };
            for &p in l2.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                // SAFETY: signalling the process group of a rank we started and have not reaped.
                unsafe { libc::kill(-p, sig) };
            }
            if sig == libc::SIGKILL && line.is_empty() {
                return;
            }
        }
    });
    let mut left = pids.len();
    while left > 0 {
        let Ok((pid, code)) = rx.recv() else { break };
        live.lock().unwrap_or_else(|p| p.into_inner()).retain(|&p| p != pid);
        crate::bell::give_back(pid);
        CTLS.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.pid != pid);
        let Some(&rank) = pids.get(&pid) else { continue };
        // Let the output drain first (bounded: a process the rank left behind may hold its pipes).
        if let Some(hs) = readers.remove(&rank) {
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            for h in hs {
                while !h.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        send(Frame::Exit(rank, code));
        left -= 1;
    }
    send(Frame::Done);
    // No rank left in this guest: the region files ranks made in its own memory (failover) go too.
    if CTLS.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
        let _ = std::fs::remove_dir_all(LOCAL_DIR);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_paths_are_plain_absolute_paths() {
        assert!(stage_path_ok("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(stage_path_ok("/tmp/prog"));
        // (`.` and doubled slashes are what Path ignores: "/./x" is "/x".)
        for bad in ["", "/", "relative/path", "/usr/../etc/shadow", "/usr/lib/.."] {
            assert!(!stage_path_ok(bad), "{bad:?}");
        }
    }
}
