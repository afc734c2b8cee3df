//! A job across the guests of a [`Cluster`]: ranks placed in blocks of `ranks_per_vm`, started by the
//! guests' agents, bootstrapped by a PMI-1 server on the bridge (the `PMI_PORT`/`PMI_ID` form Hydra uses),
//! their output printed here, the first failure ending the job with a message naming the rank and VM.
use crate::cluster::{request, Cluster};
use crate::proto::{Frame, RankSpec, AGENT_PORT};
use crate::{net, VmError};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vmf_pmi::{serve_connection, JobKvs, PmiEvent};
use vmf_pmi::wire::Message;

/// What to run.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// Ranks.
    pub np: usize,
    /// Ranks per guest (0: spread evenly, `ceil(np / vms)`).
    pub ranks_per_vm: usize,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Prefix output lines with `[rank] `.
    pub tag_output: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
}

/// Environment variables not forwarded from the launching shell.
const NOT_FORWARDED: &[&str] = &["PMI_FD", "PMI_PORT", "PMI_ID", "PMI_RANK", "PMI_SIZE", "PMI_SPAWNED",
    "VMF_CTL_FD", "VMF_LAUNCHER_PID", "VMF_LAUNCHER_START", "VMF_HOSTS_TABLE", "VMF_HOST", "VMF_TCP_ADDR",
    "VMF_REGION_DIR", "VMF_JOB_SECRET", "SSH_AUTH_SOCK", "DISPLAY"];

/// The guest of each rank.
pub fn placement(np: usize, vms: usize, ranks_per_vm: usize) -> Result<Vec<usize>, VmError> {
    if np == 0 || np > vmf_launch::MAX_RANKS {
        return Err(VmError::Usage(format!("-n {np} is not within 1..={}", vmf_launch::MAX_RANKS)));
    }
    let per = if ranks_per_vm == 0 { np.div_ceil(vms) } else { ranks_per_vm };
    if per * vms < np {
        return Err(VmError::Usage(format!(
            "{np} ranks do not fit {vms} VMs with --ranks-per-vm {per}"
        )));
    }
    Ok((0..np).map(|r| r / per).collect())
}

enum Ev {
    Frame(usize, Frame),
    AgentGone(usize, String),
    Pmi(PmiEvent),
}

/// A stream that first yields a line already read from it.
struct Replay {
    first: std::io::Cursor<Vec<u8>>,
    s: TcpStream,
}

impl Read for Replay {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = self.first.read(b)?;
        if n > 0 {
            return Ok(n);
        }
        self.s.read(b)
    }
}

impl Write for Replay {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.s.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

/// How a rank ended, from the agent's `Exit` code (an exit status, or minus the signal that killed it).
fn describe(code: i32) -> String {
    if code < 0 {
        format!("was killed by signal {} ({})", -code, vmf_launch::signals::name(-code))
    } else {
        format!("exited with status {code}")
    }
}

/// The status a command reports for that end (128 + signal, as shells do).
fn status(code: i32) -> i32 {
    if code < 0 {
        128 - code
    } else {
        code
    }
}

/// Zero the header of every host group's region (through one guest of the group).
fn release_regions(c: &Cluster) -> Result<(), VmError> {
    let mut seen = Vec::new();
    for g in &c.guests {
        let Some(k) = g.group else { continue };
        if seen.contains(&k) {
            continue;
        }
        seen.push(k);
        let a = request(&g.ip, &serde_json::json!({"cmd": "release-region"}), Duration::from_secs(5))?;
        if a.get("ok").and_then(|v| v.as_bool()) != Some(true) {
            return Err(VmError::Io(format!(
                "cannot release the ivshmem region of group {k} through {}: {}",
                g.name,
                a.get("error").and_then(|v| v.as_str()).unwrap_or("no answer")
            )));
        }
    }
    Ok(())
}

/// The files a migratable guest needs for `prog` (as the ranks' environment `env` resolves it from `cwd`):
/// the program and the shared libraries it loads, except what the guest's initramfs holds already.
fn stage_list(c: &Cluster, prog: &str, cwd: &str, env: &[(String, String)]) -> Result<Vec<serde_json::Value>, VmError> {
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
    let path = if prog.contains('/') {
        Some(std::path::Path::new(cwd).join(prog))
    } else {
        std::env::split_paths(&get("PATH")).map(|d| d.join(prog)).find(|p| p.is_file())
    };
    // Not found: the guest may have it (busybox's commands); the agent reports a failed start otherwise.
    let Some(path) = path.filter(|p| p.is_file()) else {
        return Ok(Vec::new());
    };
    // Where the rank will look for it (the path as found: `python3`, not what its link names).
    let mut files = vec![path.clone()];
    files.extend(crate::image::shared_libraries(&path, &get("LD_LIBRARY_PATH"))?);
    let agent = c.agent.as_ref().map(|a| a.canonicalize().unwrap_or_else(|_| a.clone()));
    // Each file goes where the program looks for it, copied from where it really is (through the guest's
    // view of the host an absolute symbolic link would point into the guest's own files).
    let mut out: Vec<serde_json::Value> = Vec::new();
    for f in files {
        let real = f.canonicalize().unwrap_or_else(|_| f.clone());
        if Some(&real) == agent.as_ref() {
            continue;
        }
        let e = serde_json::json!({"from": real.display().to_string(), "to": f.display().to_string()});
        if !out.contains(&e) {
            out.push(e);
        }
    }
    Ok(out)
}

/// Run the job; its exit status (0, the first failing rank's code, 128 + signal, or the abort code).
pub fn run(c: &Cluster, o: &JobOptions) -> Result<i32, VmError> {
    if o.argv.is_empty() {
        return Err(VmError::Usage("no program to run was given".into()));
    }
    let place = placement(o.np, c.guests.len(), o.ranks_per_vm)?;
    // The only job on these guests (no other `vm run` holds the lock): what an earlier job that was
    // killed left in the groups' regions is stale, release it. With another job running, leave the
    // regions alone; the ranks then find them occupied and say so.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(c.dir.join("job.lock"))
        .map_err(|e| VmError::Setup(format!("cannot open {} ({e})", c.dir.join("job.lock").display())))?;
    // SAFETY: flock on a descriptor we own.
    let alone = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if alone {
        release_regions(c)?;
    }
    // `vmfabric` is this vmfabric when PATH has none (the guests see the host's files).
    let mut argv = o.argv.clone();
    let on_path = |p: &str| {
        std::env::var_os("PATH")
            .is_some_and(|v| std::env::split_paths(&v).any(|d| d.join(p).is_file()))
    };
    if argv[0] == "vmfabric" && !on_path("vmfabric") {
        if let Ok(me) = std::env::current_exe() {
            argv[0] = me.display().to_string();
        }
    }
    let t0 = Instant::now();
    let mut id = [0u8; 4];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    let job = format!("vm{:08x}", u32::from_le_bytes(id));
    let kvs = Arc::new(JobKvs::new(&format!("vmf-{job}"), o.np));
    let l = TcpListener::bind((net::HOST_IP, 0))
        .map_err(|e| VmError::Setup(format!("cannot listen for PMI on {} ({e})", net::HOST_IP)))?;
    let pmi_port = format!("{}:{}", net::HOST_IP, l.local_addr().map_err(|e| VmError::Io(e.to_string()))?.port());
    let (tx, rx) = mpsc::channel::<Ev>();
    {
        let kvs = kvs.clone();
        let tx = tx.clone();
        let np = o.np;
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let (kvs, tx) = (kvs.clone(), tx.clone());
                std::thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    let mut r = BufReader::new(match s.try_clone() {
                        Ok(x) => x,
                        Err(_) => return,
                    });
                    let mut first = String::new();
                    if r.read_line(&mut first).is_err() {
                        return;
                    }
                    // PMI_ID clients open with `cmd=initack pmiid=<rank>`.
                    let rank = Message::parse(first.trim_end())
                        .ok()
                        .filter(|m| m.cmd == "initack")
                        .and_then(|m| m.get("pmiid").and_then(|v| v.parse::<usize>().ok()))
                        .filter(|&r| r < np);
                    let Some(rank) = rank else {
                        let _ = (&s).write_all(b"cmd=initack rc=-1 msg=expected_initack_with_a_valid_pmiid\n");
                        return;
                    };
                    let mut pre = first.into_bytes();
                    pre.extend_from_slice(r.buffer());
                    let stream = Replay { first: std::io::Cursor::new(pre), s };
                    let _ = serve_connection(stream, rank, kvs, |e| {
                        let _ = tx.send(Ev::Pmi(e));
                    });
                });
            }
        });
    }
    // The ranks' environment: the launching shell's (VMF_* included), PMI, our libmpich first.
    let cwd = std::env::current_dir()
        .map_err(|e| VmError::Setup(format!("no current directory ({e})")))?
        .display()
        .to_string();
    let mut base: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| !NOT_FORWARDED.contains(&k.as_str()))
        .filter(|(k, _)| k != "LD_LIBRARY_PATH")
        .collect();
    base.push(("LD_LIBRARY_PATH".into(), vmf_launch::library_path().to_string_lossy().into_owned()));
    // This vmfabric is `vmfabric` for the ranks' own commands too (scripts calling it).
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.display().to_string())) {
        match base.iter_mut().find(|(k, _)| k == "PATH") {
            Some((_, v)) => *v = format!("{dir}:{v}"),
            None => base.push(("PATH".into(), format!("{dir}:/usr/bin:/bin"))),
        }
    }
    // Migratable guests mount none of the host's files: the program and the libraries it loads are
    // copied in before it starts (the agent's own vmfabric is in their initramfs already).
    let stage = if c.migratable { stage_list(c, &argv[0], &cwd, &base)? } else { Vec::new() };
    let n = o.np.to_string();
    let mut writers: Vec<Option<TcpStream>> = Vec::new();
    for (vi, g) in c.guests.iter().enumerate() {
        let mine: Vec<usize> = (0..o.np).filter(|&r| place[r] == vi).collect();
        if mine.is_empty() {
            writers.push(None);
            continue;
        }
        let local = place.iter().enumerate().filter(|&(_, &v)| c.guests[v].group.is_some() && c.guests[v].group == g.group || v == vi).count();
        let ranks: Vec<serde_json::Value> = mine
            .iter()
            .map(|&r| {
                let mut env = base.clone();
                for (k, v) in [
                    ("PMI_PORT", pmi_port.clone()),
                    ("PMI_ID", r.to_string()),
                    ("PMI_RANK", r.to_string()),
                    ("PMI_SIZE", n.clone()),
                    ("PMI_JOBID", kvs.kvsname().to_owned()),
                    ("VMF_JOB_ID", job.clone()),
                    ("VMF_LOCAL_SIZE", local.to_string()),
                    ("VMF_MACHINE_RANKS", mine.len().to_string()),
                    ("VMF_HOST_CPUS", g.vcpus.to_string()),
                    ("VMF_VM", g.name.clone()),
                ] {
                    env.push((k.into(), v));
                }
                RankSpec { rank: r as u32, argv: argv.clone(), env, cwd: cwd.clone() }.to_json()
            })
            .collect();
        let req = crate::proto::with_token(&serde_json::json!({"cmd": "run", "job": job, "ranks": ranks, "stage": stage}));
        let io = |e: std::io::Error| VmError::Io(format!("cannot reach the agent of {} ({e})", g.name));
        let mut s = TcpStream::connect((g.ip.as_str(), AGENT_PORT)).map_err(io)?;
        let _ = s.set_nodelay(true);
        s.write_all(format!("{req}\n").as_bytes()).map_err(io)?;
        let mut r = s.try_clone().map_err(io)?;
        let tx = tx.clone();
        std::thread::spawn(move || loop {
            match Frame::read_from(&mut r) {
                Ok(Some(f)) => {
                    let done = f == Frame::Done;
                    let _ = tx.send(Ev::Frame(vi, f));
                    if done {
                        return;
                    }
                }
                Ok(None) => {
                    let _ = tx.send(Ev::AgentGone(vi, "the connection closed".into()));
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Ev::AgentGone(vi, e.to_string()));
                    return;
                }
            }
        });
        writers.push(Some(s));
    }
    drop(tx);
    let mut exited = vec![false; o.np];
    let mut left = o.np;
    let mut done = vec![false; c.guests.len()];
    let mut pids: Vec<i32> = c.guests.iter().map(|g| g.pid).collect();
    let mut failure: Option<(i32, String)> = None;
    let mut first_start: Option<f64> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let out = std::io::stdout();
    let err = std::io::stderr();
    let mut partial: Vec<[Vec<u8>; 2]> = vec![[Vec::new(), Vec::new()]; o.np];
    let print = |rank: usize, which: usize, data: &[u8], partial: &mut Vec<[Vec<u8>; 2]>, flush: bool| {
        let buf = &mut partial[rank][which];
        buf.extend_from_slice(data);
        let mut w: Box<dyn Write> = if which == 0 { Box::new(out.lock()) } else { Box::new(err.lock()) };
        while let Some(p) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=p).collect();
            if o.tag_output {
                let _ = write!(w, "[{rank}] ");
            }
            let _ = w.write_all(&line);
        }
        if flush && !buf.is_empty() {
            if o.tag_output {
                let _ = write!(w, "[{rank}] ");
            }
            let _ = w.write_all(buf);
            let _ = w.write_all(b"\n");
            buf.clear();
        }
        let _ = w.flush();
    };
    fn fail(
        failure: &mut Option<(i32, String)>,
        code: i32,
        why: String,
        kill_at: &mut Option<Instant>,
        writers: &mut [Option<TcpStream>],
    ) {
        if failure.is_none() {
            *failure = Some((code, why));
            *kill_at = Some(Instant::now());
            for w in writers.iter_mut().flatten() {
                let _ = w.write_all(b"kill 15\n");
            }
        }
    }
    while left > 0 && !done.iter().zip(&writers).all(|(d, w)| *d || w.is_none()) {
        if vmf_launch::signals::pending() != 0 && failure.is_none() {
            let s = vmf_launch::signals::pending();
            fail(&mut failure, 128 + s, format!("vmfabric vm run got {}", vmf_launch::signals::name(s)), &mut kill_at, &mut writers);
        }
        if let Some(t) = kill_at {
            if !killed && t.elapsed() > Duration::from_secs(1) {
                killed = true;
                for w in writers.iter_mut().flatten() {
                    let _ = w.write_all(b"kill 9\n");
                }
            }
            if t.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        let ev = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // A guest that went away (powered off, crashed) closes nothing: look at its QEMU. One that
                // migrated runs in another QEMU process, which the state file names.
                match (0..c.guests.len()).find(|&vi| {
                    !done[vi] && writers[vi].is_some() && !crate::cluster::qemu_alive(pids[vi])
                }) {
                    Some(vi) => match Cluster::current_pid(&c.dir, &c.guests[vi].name).filter(|&p| p != pids[vi] && crate::cluster::qemu_alive(p)) {
                        Some(p) => {
                            pids[vi] = p;
                            continue;
                        }
                        None => Ev::AgentGone(vi, format!("its QEMU (pid {}) is gone", pids[vi])),
                    },
                    None => continue,
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match ev {
            Ev::Frame(vi, f) => match f {
                Frame::Stdout(r, d) if (r as usize) < o.np => print(r as usize, 0, &d, &mut partial, false),
                Frame::Stderr(r, d) if (r as usize) < o.np => print(r as usize, 1, &d, &mut partial, false),
                Frame::Started(..) => {
                    first_start.get_or_insert(t0.elapsed().as_secs_f64());
                }
                Frame::Exit(r, code) if (r as usize) < o.np && !exited[r as usize] => {
                    let r = r as usize;
                    exited[r] = true;
                    left -= 1;
                    print(r, 0, &[], &mut partial, true);
                    print(r, 1, &[], &mut partial, true);
                    if code != 0 {
                        fail(&mut failure, status(code), format!("rank {r} (in VM {}) {}", c.guests[vi].name, describe(code)), &mut kill_at, &mut writers);
                    }
                }
                Frame::SpawnFailed(r, m) if (r as usize) < o.np && !exited[r as usize] => {
                    exited[r as usize] = true;
                    left -= 1;
                    fail(&mut failure, 127, format!("rank {r} could not start in VM {}: {m}", c.guests[vi].name), &mut kill_at, &mut writers);
                }
                Frame::Done => done[vi] = true,
                other => {
                    fail(&mut failure, 1, format!("the agent of {} sent {other:?} out of turn", c.guests[vi].name), &mut kill_at, &mut writers);
                }
            },
            Ev::AgentGone(vi, why) => {
                done[vi] = true;
                let lost: Vec<usize> = (0..o.np).filter(|&r| place[r] == vi && !exited[r]).collect();
                if !lost.is_empty() {
                    for &r in &lost {
                        exited[r] = true;
                        left -= 1;
                    }
                    fail(&mut failure, 1, format!("lost the agent of VM {} ({why}) with ranks {lost:?} running", c.guests[vi].name), &mut kill_at, &mut writers);
                }
            }
            Ev::Pmi(PmiEvent::Abort { rank, code, message }) => {
                let code = if code == 0 { 1 } else { code };
                fail(&mut failure, code, format!("rank {rank} (in VM {}) called abort with code {code}{}", c.guests[place[rank]].name, message.map(|m| format!(": {m}")).unwrap_or_default()), &mut kill_at, &mut writers);
            }
            Ev::Pmi(_) => {}
        }
    }
    kvs.shutdown("the job ended");
    // Our ranks are gone: close the agents' connections (they kill whatever is left), and when no other
    // job shares the guests let the next job initialise the groups' regions afresh.
    for w in writers.iter().flatten() {
        let _ = w.shutdown(std::net::Shutdown::Both);
    }
    if alone {
        std::thread::sleep(Duration::from_millis(100));
        if let Err(e) = release_regions(c) {
            eprintln!("vmfabric: warning: {e}");
        }
    }
    drop(lock);
    if !o.quiet {
        if let Some(s) = first_start {
            eprintln!("vmfabric: vm job {job}: first rank started {s:.2} s after the job was sent");
        }
    }
    match failure {
        Some((code, why)) => {
            eprintln!("vmfabric: vm job {job} failed: {why}");
            Ok(code)
        }
        None => Ok(0),
    }
}

/// `vmfabric vm rsh HOST COMMAND...`: run one command in the guest at HOST (an address, or `vmN`) through
/// its agent, as `rsh`/`ssh` would (the words joined and given to `sh -c`, this environment, this
/// directory), forwarding its output; returns its exit status. Used from inside a guest as the remote
/// shell of other launchers (Open MPI's `plm_rsh_agent`, Hydra's `-launcher-exec`).
pub fn rsh(host: &str, command: &[String]) -> Result<i32, VmError> {
    if command.is_empty() {
        return Err(VmError::Usage("vm rsh: no command".into()));
    }
    let ip = match host.strip_prefix("vm").and_then(|i| i.parse::<usize>().ok()) {
        Some(i) => net::guest_ip(i),
        None => host.to_owned(),
    };
    let cwd = std::env::current_dir().map_or_else(|_| "/".to_string(), |d| d.display().to_string());
    let spec = RankSpec {
        rank: 0,
        argv: vec!["/bin/sh".into(), "-c".into(), command.join(" ")],
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| !NOT_FORWARDED.contains(&k.as_str()) && k != "VMF_JOB_ID")
            .collect(),
        cwd,
    };
    let req = crate::proto::with_token(&serde_json::json!({"cmd": "run", "job": "rsh", "failover": false, "ranks": [spec.to_json()]}));
    let io = |e: std::io::Error| VmError::Io(format!("vm rsh: the agent at {ip}:{AGENT_PORT} ({e})"));
    let mut s = TcpStream::connect((ip.as_str(), AGENT_PORT)).map_err(io)?;
    s.write_all(format!("{req}\n").as_bytes()).map_err(io)?;
    let mut code = 255;
    loop {
        match Frame::read_from(&mut s).map_err(io)? {
            Some(Frame::Stdout(_, d)) => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(&d);
                let _ = o.flush();
            }
            Some(Frame::Stderr(_, d)) => {
                let _ = std::io::stderr().write_all(&d);
            }
            Some(Frame::Exit(_, c)) => code = status(c),
            Some(Frame::SpawnFailed(_, m)) => {
                eprintln!("vm rsh: {m}");
                code = 127;
            }
            Some(Frame::Started(..)) => {}
            Some(Frame::Done) | None => return Ok(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_in_blocks() {
        assert_eq!(placement(4, 2, 0).unwrap(), [0, 0, 1, 1]);
        assert_eq!(placement(3, 2, 0).unwrap(), [0, 0, 1]);
        assert_eq!(placement(2, 2, 1).unwrap(), [0, 1]);
        assert!(placement(5, 2, 2).is_err());
        assert!(placement(0, 2, 0).is_err());
    }

    #[test]
    fn signal_statuses_are_described() {
        assert_eq!(describe(3), "exited with status 3");
        assert!(describe(-9).contains("SIGKILL"));
        assert_eq!(describe(200), "exited with status 200");
        assert_eq!((status(-9), status(200)), (137, 200));
    }
}
