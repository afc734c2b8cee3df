//! The job registry (`<region dir>/vmf-<job>.job`: who runs the job, where its hosts and ranks are) and
//! the control socket through which `vmfabric migrate` asks a rank to move.
//!
//! Control protocol: `vmfabric migrate` connects to the abstract Unix socket `vmf-ctl-<job>` and writes
//! `migrate <rank> <host>\n`; the launcher checks the request, writes `migrate <host>\n` on the rank's control
//! socket (`VMF_CTL_FD`), sends it SIGUSR2 (the fabric acts on it at its next progress call), relays the
//! rank's one-line answer (`ok <ms>` or `error <why>`), and records the new placement in the registry.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vmf_pal::process::ProcessId;

/// Path of a job's registry file.
pub fn registry_path(dir: &Path, job: &str) -> PathBuf {
    dir.join(format!("vmf-{job}.job"))
}

/// What the registry says about a job.
#[derive(Debug, Clone)]
pub struct JobInfo {
    /// Job id.
    pub job: String,
    /// The launcher.
    pub launcher: ProcessId,
    /// Number of ranks.
    pub ranks: usize,
    /// Hosts: (netns, region dir, address); empty without `--hosts`.
    pub hosts: Vec<(String, String, String)>,
    /// Host of each rank.
    pub placement: Vec<usize>,
    /// Registry file.
    pub path: PathBuf,
}

impl JobInfo {
    fn render(&self) -> String {
        let mut s = format!(
            "job={}\nlauncher_pid={}\nlauncher_start={}\nranks={}\nhosts={}\n",
            self.job,
            self.launcher.pid,
            self.launcher.start_time,
            self.ranks,
            self.hosts.len()
        );
        for (i, (ns, d, ip)) in self.hosts.iter().enumerate() {
            s += &format!("host.{i}={ns},{d},{ip}\n");
        }
        for (r, h) in self.placement.iter().enumerate() {
            s += &format!("rank.{r}={h}\n");
        }
        s
    }

    /// Write the registry file (atomically).
    pub fn save(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("job.tmp");
        std::fs::write(&tmp, self.render())?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Read a registry file.
    pub fn load(path: &Path) -> Option<JobInfo> {
        let text = std::fs::read_to_string(path).ok()?;
        let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let ranks: usize = kv.get("ranks")?.parse().ok()?;
        let nh: usize = kv.get("hosts")?.parse().ok()?;
        let hosts = (0..nh)
            .filter_map(|i| {
                let v = kv.get(format!("host.{i}").as_str())?;
                let mut p = v.splitn(3, ',');
                Some((
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                    p.next()?.to_string(),
                ))
            })
            .collect();
        let placement = (0..ranks)
            .map(|r| {
                kv.get(format!("rank.{r}").as_str())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            })
            .collect();
        Some(JobInfo {
            job: kv.get("job")?.to_string(),
            launcher: ProcessId {
                pid: kv.get("launcher_pid")?.parse().ok()?,
                start_time: kv
                    .get("launcher_start")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            },
            ranks,
            hosts,
            placement,
            path: path.to_path_buf(),
        })
    }
}

/// Every registry file in `dir`, with whether its launcher is alive.
pub fn list(dir: &Path) -> Vec<(JobInfo, bool)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(JobInfo, bool)> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".job"))
        .filter_map(|e| JobInfo::load(&e.path()))
        .map(|j| {
            let alive = j.launcher.is_alive();
            (j, alive)
        })
        .collect();
    v.sort_by(|a, b| a.0.job.cmp(&b.0.job));
    v
}

/// Abstract socket name of a job's control socket.
pub fn control_name(job: &str) -> String {
    format!("vmf-ctl-{job}")
}

/// The ranks' control sockets and pids, shared with the control thread.
/// Per rank: its control socket, its pid, and whether it said `ready` (its SIGUSR2 handler is in place:
/// the signal kills a process that has none, so no request is made before).
pub type RankCtl = Arc<Mutex<Vec<Option<(UnixStream, i32, bool)>>>>;

/// Serve the control socket of `info.job` until the process ends (a detached thread).
pub fn serve(info: Arc<Mutex<JobInfo>>, ranks: RankCtl) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let job = info.lock().unwrap().job.clone();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(control_name(&job).as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    std::thread::Builder::new()
        .name("vmf-ctl".into())
        .spawn(move || {
            for c in l.incoming().flatten() {
                let _ = handle(c, &info, &ranks);
            }
        })?;
    Ok(())
}

fn handle(c: UnixStream, info: &Arc<Mutex<JobInfo>>, ranks: &RankCtl) -> std::io::Result<()> {
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line)?;
    let reply = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["migrate", r, h] => match (r.parse::<usize>(), h.parse::<usize>()) {
            (Ok(r), Ok(h)) => migrate(info, ranks, r, h),
            _ => "error: rank and host must be numbers".to_string(),
        },
        _ => format!("error: unknown request {:?}", line.trim()),
    };
    (&c).write_all(format!("{reply}\n").as_bytes())
}

fn migrate(info: &Arc<Mutex<JobInfo>>, ranks: &RankCtl, rank: usize, host: usize) -> String {
    let (nranks, nhosts, cur) = {
        let i = info.lock().unwrap();
        (i.ranks, i.hosts.len(), i.placement.get(rank).copied())
    };
    if rank >= nranks {
        return format!("error: rank {rank} does not exist (the job has {nranks} ranks)");
    }
    if nhosts == 0 {
        return "error: the job runs without emulated hosts (start it with --hosts)".into();
    }
    if host >= nhosts {
        return format!(
            "error: host {host} does not exist (the job has {nhosts} hosts: 0..{})",
            nhosts - 1
        );
    }
    if cur == Some(host) {
        return format!("error: rank {rank} is already on host {host}");
    }
    let mut g = ranks.lock().unwrap();
    // Every rank must be alive: a migration involves all of them.
    for (r, e) in g.iter().enumerate() {
        // SAFETY: signal 0 only checks existence.
        if let Some((_, pid, _)) = e {
            if unsafe { libc::kill(*pid, 0) } != 0 {
                return format!("error: rank {r} (pid {pid}) is dead");
            }
        }
    }
    let Some(Some((sock, pid, ready))) = g.get_mut(rank) else {
        return format!("error: rank {rank} has no control channel");
    };
    if !*ready {
        if !read_ready(sock) {
            return format!(
                "error: rank {rank} is still starting (it has not initialised the fabric yet); try again in a moment"
            );
        }
        *ready = true;
    }
    if sock
        .write_all(format!("migrate {host}\n").as_bytes())
        .is_err()
    {
        return format!("error: rank {rank} does not answer");
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(*pid, libc::SIGUSR2) };
    let _ = sock.set_read_timeout(Some(Duration::from_secs(60)));
    let mut reply = String::new();
    let mut rd = BufReader::new(&*sock);
    match rd.read_line(&mut reply) {
        Ok(0) => return format!("error: rank {rank} ended before answering"),
        Ok(_) => {}
        Err(_) => {
            return format!(
                "error: rank {rank} did not answer within 60 s (it must call into the fabric to move)"
            )
        }
    }
    let reply = reply.trim().to_string();
    if reply.starts_with("ok") {
        let mut i = info.lock().unwrap();
        if let Some(p) = i.placement.get_mut(rank) {
            *p = host;
        }
        let _ = i.save();
    }
    reply
}

/// Consume the rank's `ready` line if it has written it (without waiting for it).
fn read_ready(sock: &UnixStream) -> bool {
    use std::io::Read;
    let mut b = [0u8; 6];
    let _ = sock.set_nonblocking(true);
    let first = (&*sock).read(&mut b);
    let _ = sock.set_nonblocking(false);
    match first {
        Ok(6) => &b == b"ready\n",
        Ok(k) if k > 0 => {
            let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
            (&*sock).read_exact(&mut b[k..]).is_ok() && &b == b"ready\n"
        }
        _ => false,
    }
}

/// Send a migration request to a running job (what `vmfabric migrate` does). Returns the answer line.
pub fn request_migration(job: &str, rank: usize, host: usize) -> Result<String, String> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(control_name(job).as_bytes())
        .map_err(|e| e.to_string())?;
    let c = UnixStream::connect_addr(&addr)
        .map_err(|e| format!("job {job} is not running here ({e})"))?;
    c.set_read_timeout(Some(Duration::from_secs(90)))
        .map_err(|e| e.to_string())?;
    (&c).write_all(format!("migrate {rank} {host}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&c)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Ok(line.trim().to_string())
}
