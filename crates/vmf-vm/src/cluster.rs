//! A set of running guests: booted for one job (`vmfabric vm run`) or kept up (`vmfabric vm up`), recorded
//! in a state file so `vm ls`, `vm run` and `vm down` find them, and torn down leaving no QEMU, tap,
//! bridge or ivshmem file behind.
use crate::qemu::{self, Accel, GuestSpec};
use crate::{image, net, proto, VmError};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Directory of the running guests' files (`VMF_VM_DIR`, default `/run/vmfabric-vm`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("VMF_VM_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/run/vmfabric-vm"), PathBuf::from)
}

/// Directory of the boot image and the accelerator probe (`VMF_VM_CACHE`, default
/// `/var/cache/vmfabric/vm`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("VMF_VM_CACHE")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("/var/cache/vmfabric/vm"), PathBuf::from)
}

/// How to boot a cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of guests (1..=[`net::MAX_VMS`]).
    pub vms: usize,
    /// vCPUs per guest.
    pub vcpus: usize,
    /// Memory per guest, MiB.
    pub mem_mb: u64,
    /// Guests per host group (sharing one ivshmem file); 0: all in one group.
    pub vms_per_group: usize,
    /// Give guests an ivshmem device at all.
    pub ivshmem: bool,
    /// Size of each group's ivshmem region (a power of two).
    pub ivshmem_size: u64,
    /// An interrupts-only ivshmem-doorbell device per guest beside its ivshmem-plain region (interrupts
    /// between guests, through a server per host group).
    pub doorbell: bool,
    /// How long a guest may take to boot to its agent.
    pub boot_timeout: Duration,
    /// Keep the guests after this process ends (`vm up`).
    pub persistent: bool,
    /// Guests that mount none of the host's files (root in their initramfs, each job's files copied in),
    /// so that QEMU can live-migrate them (`vm migrate`).
    pub migratable: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            vms: 2,
            vcpus: 1,
            mem_mb: 512,
            vms_per_group: 0,
            ivshmem: true,
            ivshmem_size: 256 << 20,
            doorbell: false,
            boot_timeout: Duration::from_secs(120),
            persistent: false,
            migratable: false,
        }
    }
}

/// What [`Cluster::migrate`] measured.
#[derive(Debug, Clone)]
pub struct MigrationReport {
    /// The unplug before it (ranks' answers, ms to move them, ms until the device was gone), when the
    /// guest was in a host group.
    pub unplug: Option<(serde_json::Value, f64, f64)>,
    /// Starting the destination QEMU until it listened.
    pub setup_ms: f64,
    /// `migrate` until QEMU reported it completed.
    pub migrate_ms: f64,
    /// The time the guest was stopped (QEMU's `downtime`).
    pub downtime_ms: f64,
    /// Guest memory sent, MiB.
    pub transferred_mib: f64,
    /// The whole command.
    pub total_ms: f64,
    /// The source QEMU's pid.
    pub old_pid: i32,
    /// The destination's.
    pub new_pid: i32,
}

/// One running guest.
#[derive(Debug, Clone)]
pub struct Guest {
    /// Index.
    pub index: usize,
    /// Name (`vm<i>`).
    pub name: String,
    /// Its address on the bridge.
    pub ip: String,
    /// QEMU's pid on the host.
    pub pid: i32,
    /// Its host group (the ivshmem file it shares), if any.
    pub group: Option<usize>,
    /// Seconds from starting QEMU until the agent answered.
    pub boot_s: f64,
    /// vCPUs.
    pub vcpus: usize,
    /// Memory, MiB.
    pub mem_mb: u64,
    /// Live migrations so far (its QEMU process, tap and files are the generation's).
    pub generation: u32,
}

/// Running guests.
pub struct Cluster {
    /// Their files.
    pub dir: PathBuf,
    /// The guests.
    pub guests: Vec<Guest>,
    /// The ivshmem file of each host group.
    pub groups: Vec<PathBuf>,
    /// With doorbells: the pid of each group's ivshmem server (its socket is `g<k>.ivs` in `dir`).
    pub servers: Vec<i32>,
    /// How they run.
    pub accel: Accel,
    /// Why that accelerator.
    pub accel_why: String,
    /// Kept after this process (`vm up`).
    pub persistent: bool,
    /// Migratable guests (see [`ClusterOptions::migratable`]).
    pub migratable: bool,
    /// The kernel and initramfs they booted (a migration's destination needs the same).
    pub image: Option<image::Image>,
    /// The agent they run (the destination's kernel command line names it as the source's did).
    pub agent: Option<PathBuf>,
    children: Vec<Child>,
    torn_down: bool,
}

/// An exclusive lock for booting and tearing down guests (`/run/vmfabric-vm.lock`), held until dropped.
fn global_lock() -> Result<std::fs::File, VmError> {
    let p = Path::new("/run/vmfabric-vm.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
        .map_err(|e| VmError::Setup(format!("cannot open {} ({e})", p.display())))?;
    // SAFETY: flock on a descriptor we own; released when the file is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) } != 0 {
        return Err(VmError::Setup(format!("cannot lock {}", p.display())));
    }
    Ok(f)
}

/// Prepare `cmd` (a QEMU or an ivshmem server) to run beside us: its output to `log`, and either in a
/// session of its own, outliving this process (`persistent`: guests of `vm up`), or killed when this
/// process ends (a `vm run` that booted guests for its own job).
fn background(cmd: &mut std::process::Command, log: &Path, persistent: bool) -> Result<(), VmError> {
    let f = std::fs::File::create(log).map_err(|e| VmError::Setup(format!("cannot create {} ({e})", log.display())))?;
    cmd.stdout(f.try_clone().map_err(|e| VmError::Setup(e.to_string()))?).stderr(f);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if persistent {
                libc::setsid();
            } else {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
            Ok(())
        });
    }
    Ok(())
}

/// True while `pid` is one of our ivshmem servers (checked by its command line).
fn server_alive(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.split(|&b| b == 0).any(|a| a == b"ivshmem-server")
    })
}

/// True while the QEMU process `pid` runs (checked by its command line, not just the pid).
pub fn qemu_alive(pid: i32) -> bool {
    pid > 0
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("qemu-system"))
}

/// Send one request to a guest's agent and read its one-line answer.
pub fn request(ip: &str, req: &serde_json::Value, timeout: Duration) -> Result<serde_json::Value, VmError> {
    let addr: SocketAddr = format!("{ip}:{}", proto::AGENT_PORT)
        .parse()
        .map_err(|e| VmError::Io(format!("address {ip} ({e})")))?;
    let io = |e: std::io::Error| VmError::Io(format!("the agent at {addr}: {e}"));
    let mut s = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(2))).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.write_all(format!("{}\n", proto::with_token(req)).as_bytes()).map_err(io)?;
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).map_err(io)?;
    serde_json::from_str(l.trim()).map_err(|e| VmError::Protocol(format!("agent answer {l:?} ({e})")))
}

/// The line of a console log that says why the guest's kernel stopped, with the faulting process.
fn panic_line(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let pick = |pat: &str| s.lines().find(|l| l.contains(pat)).map(|l| l.trim().to_owned());
    let why = pick("Kernel panic").or_else(|| pick("BUG:")).or_else(|| pick("segfault"))?;
    Some(match pick("segfault").or_else(|| pick("traps:")) {
        Some(f) if f != why => format!("{why} | {f}"),
        _ => why,
    })
}

/// Keep a failed guest's console (the state directory goes with the teardown); where it went.
fn keep_console(p: &Path, name: &str) -> String {
    let dst = cache_dir().join(format!("failed-boot-{name}.console"));
    match std::fs::create_dir_all(cache_dir()).and_then(|()| std::fs::copy(p, &dst)) {
        Ok(_) => format!(" (whole console: {})", dst.display()),
        Err(_) => String::new(),
    }
}

fn tail(p: &Path, lines: usize) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let v: Vec<&str> = s
        .lines()
        .map(|l| l.trim_matches(|c: char| c.is_control() || c == ' '))
        .filter(|l| !l.is_empty())
        .collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

/// An error for a guest in no host group (`unplug` and `plug` need one).
fn no_group(g: &Guest) -> Result<(), VmError> {
    match g.group {
        Some(_) => Ok(()),
        None if g.generation > 0 => Err(VmError::Usage(format!(
            "{} has migrated off its host group (it shares no ivshmem region on its new host)",
            g.name
        ))),
        None => Err(VmError::Usage(format!("{} has no ivshmem device", g.name))),
    }
}

impl Cluster {
    /// Boot guests as `o` says.
    pub fn boot(o: &ClusterOptions) -> Result<Cluster, VmError> {
        if o.vms == 0 || o.vms > net::MAX_VMS {
            return Err(VmError::Usage(format!("--vms {} is not within 1..={}", o.vms, net::MAX_VMS)));
        }
        if o.vcpus == 0 || o.vcpus > 64 {
            return Err(VmError::Usage(format!("--vcpus {} is not within 1..=64", o.vcpus)));
        }
        if o.mem_mb < 128 {
            return Err(VmError::Usage(format!("--mem {} MiB is too small (at least 128)", o.mem_mb)));
        }
        if o.ivshmem && (!o.ivshmem_size.is_power_of_two() || o.ivshmem_size < (1 << 20)) {
            return Err(VmError::Usage(format!(
                "--ivshmem-size {} is not a power of two of at least 1 MiB (a PCI BAR)",
                o.ivshmem_size
            )));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(VmError::Setup(
                "vmfabric vm needs root (the guests' bridge and taps need CAP_NET_ADMIN)".into(),
            ));
        }
        let dir = state_dir();
        // One boot or teardown at a time on this machine: the bridge, taps and ivshmem files have
        // fixed names.
        let _lock = global_lock()?;
        match Self::load(&dir) {
            Some(c) if c.guests.iter().any(|g| qemu_alive(g.pid)) => {
                return Err(VmError::Setup(format!(
                    "guests are already running (state in {}){}: `vmfabric vm ls` shows them, `vmfabric vm down` stops them",
                    dir.display(),
                    if c.persistent { "" } else { ", booted by another `vmfabric vm run`" }
                )))
            }
            _ => Self::clean_leftovers_locked(),
        }
        let qemu = qemu::binary()?;
        let cache = cache_dir();
        let agent = std::env::current_exe()
            .map_err(|e| VmError::Setup(format!("cannot find the vmfabric executable ({e})")))?;
        let img = image::image(&cache, o.migratable.then_some(agent.as_path()))?;
        let (accel, accel_why) = qemu::accel(&qemu, &img, &cache)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| VmError::Setup(format!("cannot create {} ({e})", dir.display())))?;
        let mut t = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut t))
            .map_err(|e| VmError::Setup(format!("no random numbers ({e})")))?;
        let token: String = t.iter().map(|b| format!("{b:02x}")).collect();
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(proto::token_path())
                .map_err(|e| VmError::Setup(format!("cannot write the guests' token ({e})")))?;
            f.write_all(token.as_bytes())
                .map_err(|e| VmError::Setup(format!("cannot write the guests' token ({e})")))?;
        }
        let per = if o.vms_per_group == 0 { o.vms } else { o.vms_per_group };
        let ngroups = if o.ivshmem { o.vms.div_ceil(per) } else { 0 };
        let mut c = Cluster {
            dir: dir.clone(),
            guests: Vec::new(),
            groups: (0..ngroups)
                .map(|k| PathBuf::from(format!("/dev/shm/vmfabric-vm-g{k}")))
                .collect(),
            servers: Vec::new(),
            accel,
            accel_why,
            persistent: o.persistent,
            migratable: o.migratable,
            image: Some(img.clone()),
            agent: Some(agent.clone()),
            children: Vec::new(),
            torn_down: false,
        };
        let res = c.start(o, &qemu, &img, &agent, per);
        if let Err(e) = res {
            c.teardown_locked();
            return Err(e);
        }
        Ok(c)
    }

    fn start(
        &mut self,
        o: &ClusterOptions,
        qemu: &Path,
        img: &image::Image,
        agent: &Path,
        per: usize,
    ) -> Result<(), VmError> {
        net::up(o.vms)?;
        for g in &self.groups {
            let f = std::fs::File::create(g)
                .and_then(|f| f.set_len(o.ivshmem_size).map(|()| f))
                .map_err(|e| VmError::Setup(format!("cannot create the ivshmem file {} ({e})", g.display())))?;
            drop(f);
        }
        if o.doorbell {
            self.start_servers(agent)?;
        }
        let mut started = Vec::new();
        for i in 0..o.vms {
            let group = o.ivshmem.then_some(i / per);
            let spec = GuestSpec {
                index: i,
                name: format!("vm{i}"),
                vcpus: o.vcpus,
                mem_mb: o.mem_mb,
                ivshmem: group.map(|k| (self.groups[k].clone(), o.ivshmem_size)),
                doorbell: group.filter(|_| o.doorbell).map(|k| self.server_socket(k)),
                agent: agent.to_owned(),
                dir: self.dir.clone(),
                migratable: o.migratable,
                generation: 0,
                incoming: None,
            };
            let _ = std::fs::remove_file(spec.console());
            let mut cmd = qemu::command(qemu, img, self.accel, &spec);
            background(&mut cmd, &spec.log(), o.persistent)?;
            let child = cmd
                .spawn()
                .map_err(|e| VmError::Setup(format!("cannot start QEMU {} ({e})", qemu.display())))?;
            self.guests.push(Guest {
                index: i,
                name: spec.name.clone(),
                ip: net::guest_ip(i),
                pid: child.id() as i32,
                group,
                boot_s: 0.0,
                vcpus: o.vcpus,
                mem_mb: o.mem_mb,
                generation: 0,
            });
            self.children.push(child);
            started.push((spec, Instant::now()));
        }
        self.save()?;
        // Wait for every agent.
        let deadline = Instant::now() + o.boot_timeout;
        let mut pending: Vec<usize> = (0..o.vms).collect();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for &i in &pending {
                let (spec, t0) = &started[i];
                if let Ok(Some(st)) = self.children[i].try_wait() {
                    return Err(VmError::Boot(format!(
                        "VM {} did not boot: QEMU exited ({st}): {} | console: {}{}",
                        spec.name,
                        tail(&spec.log(), 3),
                        panic_line(&spec.console()).unwrap_or_else(|| tail(&spec.console(), 3)),
                        keep_console(&spec.console(), &spec.name)
                    )));
                }
                if std::fs::read_to_string(spec.console()).is_ok_and(|s| s.contains("vmfabric-guest: FAILED")) {
                    return Err(VmError::Boot(format!(
                        "VM {} did not boot: {}",
                        spec.name,
                        tail(&spec.console(), 2)
                    )));
                }
                match request(&self.guests[i].ip, &serde_json::json!({"cmd": "info"}), Duration::from_millis(500)) {
                    Ok(_) => self.guests[i].boot_s = t0.elapsed().as_secs_f64(),
                    Err(_) => still.push(i),
                }
            }
            pending = still;
            if !pending.is_empty() {
                if Instant::now() > deadline {
                    let names: Vec<String> = pending.iter().map(|&i| self.guests[i].name.clone()).collect();
                    let c = started[pending[0]].0.console();
                    return Err(VmError::Boot(format!(
                        "VM {} did not boot within {:?} ({}); console: {}{}",
                        names.join(", "),
                        o.boot_timeout,
                        self.accel.name(),
                        tail(&c, 3),
                        keep_console(&c, &started[pending[0]].0.name)
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.save()
    }

    /// The socket of group `k`'s ivshmem server.
    pub fn server_socket(&self, k: usize) -> PathBuf {
        self.dir.join(format!("g{k}.ivs"))
    }

    /// Start an ivshmem server per host group (`vmfabric vm ivshmem-server`) and wait for its socket.
    fn start_servers(&mut self, exe: &Path) -> Result<(), VmError> {
        for k in 0..self.groups.len() {
            let sock = self.server_socket(k);
            let _ = std::fs::remove_file(&sock);
            let mut cmd = std::process::Command::new(exe);
            cmd.args(["vm", "ivshmem-server", "--socket"])
                .arg(&sock)
                .args(["--vectors", &qemu::DOORBELL_VECTORS.to_string()])
                .stdin(std::process::Stdio::null());
            // Its messages go to a log beside the guests' (not to our output, which it would hold open).
            background(&mut cmd, &self.dir.join(format!("g{k}.ivs.log")), self.persistent)?;
            let mut child = cmd
                .spawn()
                .map_err(|e| VmError::Setup(format!("cannot start the ivshmem server of group {k} ({e})")))?;
            self.servers.push(child.id() as i32);
            let t0 = Instant::now();
            while !sock.exists() {
                if let Ok(Some(st)) = child.try_wait() {
                    return Err(VmError::Setup(format!("the ivshmem server of group {k} exited ({st})")));
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(VmError::Setup(format!("the ivshmem server of group {k} did not start")));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            // Reaped by the kernel's init when this process ends; killed by teardown.
            std::mem::forget(child);
        }
        Ok(())
    }

    fn state_file(dir: &Path) -> PathBuf {
        dir.join("state.json")
    }

    fn save(&self) -> Result<(), VmError> {
        let v = serde_json::json!({
            "accel": self.accel.name(),
            "accel_why": self.accel_why,
            "persistent": self.persistent,
            "migratable": self.migratable,
            "agent": self.agent.as_ref().map(|a| a.display().to_string()),
            "image": self.image.as_ref().map(|i| serde_json::json!({"kernel": i.kernel.display().to_string(),
                "initrd": i.initrd.display().to_string(), "release": i.release})),
            "groups": self.groups.iter().map(|g| g.display().to_string()).collect::<Vec<_>>(),
            "servers": self.servers,
            "guests": self.guests.iter().map(|g| serde_json::json!({
                "index": g.index, "name": g.name, "ip": g.ip, "pid": g.pid, "group": g.group,
                "boot_s": g.boot_s, "vcpus": g.vcpus, "mem_mb": g.mem_mb, "generation": g.generation,
            })).collect::<Vec<_>>(),
        });
        // Through a new file: a job watching the state (a migrated guest's new pid) never reads half of it.
        let tmp = self.dir.join(format!(".state.json.{}", std::process::id()));
        std::fs::write(&tmp, format!("{v:#}\n"))
            .and_then(|()| std::fs::rename(&tmp, Self::state_file(&self.dir)))
            .map_err(|e| VmError::Setup(format!("cannot write {} ({e})", self.dir.display())))
    }

    fn load(dir: &Path) -> Option<Cluster> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(Self::state_file(dir)).ok()?).ok()?;
        let guests = v
            .get("guests")?
            .as_array()?
            .iter()
            .map(|g| {
                Some(Guest {
                    index: g.get("index")?.as_u64()? as usize,
                    name: g.get("name")?.as_str()?.to_owned(),
                    ip: g.get("ip")?.as_str()?.to_owned(),
                    pid: g.get("pid")?.as_i64()? as i32,
                    group: g.get("group").and_then(|x| x.as_u64()).map(|x| x as usize),
                    boot_s: g.get("boot_s").and_then(|x| x.as_f64()).unwrap_or(0.0),
                    vcpus: g.get("vcpus").and_then(|x| x.as_u64()).unwrap_or(1) as usize,
                    mem_mb: g.get("mem_mb").and_then(|x| x.as_u64()).unwrap_or(0),
                    generation: g.get("generation").and_then(|x| x.as_u64()).unwrap_or(0) as u32,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Cluster {
            dir: dir.to_owned(),
            guests,
            groups: v
                .get("groups")?
                .as_array()?
                .iter()
                .filter_map(|g| g.as_str().map(PathBuf::from))
                .collect(),
            servers: v
                .get("servers")
                .and_then(|x| x.as_array())
                .map(|a| a.iter().filter_map(|p| p.as_i64().map(|p| p as i32)).collect())
                .unwrap_or_default(),
            accel: if v.get("accel")?.as_str()? == "kvm" { Accel::Kvm } else { Accel::Tcg },
            accel_why: v.get("accel_why").and_then(|x| x.as_str()).unwrap_or("").to_owned(),
            persistent: v.get("persistent").and_then(|x| x.as_bool()).unwrap_or(false),
            migratable: v.get("migratable").and_then(|x| x.as_bool()).unwrap_or(false),
            agent: v.get("agent").and_then(|x| x.as_str()).map(PathBuf::from),
            image: v.get("image").and_then(|i| {
                Some(image::Image {
                    kernel: PathBuf::from(i.get("kernel")?.as_str()?),
                    initrd: PathBuf::from(i.get("initrd")?.as_str()?),
                    release: i.get("release")?.as_str()?.to_owned(),
                })
            }),
            children: Vec::new(),
            torn_down: false,
        })
    }

    /// The QEMU pid the state file in `dir` records for guest `name` now (a migration changes it).
    pub fn current_pid(dir: &Path, name: &str) -> Option<i32> {
        Self::load(dir)?.guests.iter().find(|g| g.name == name).map(|g| g.pid)
    }

    /// The guests `vmfabric vm up` left running (every one of them alive).
    pub fn attach() -> Result<Cluster, VmError> {
        let dir = state_dir();
        let c = Self::load(&dir)
            .ok_or_else(|| VmError::Setup("no guests are up (vmfabric vm up starts them)".into()))?;
        if let Some(g) = c.guests.iter().find(|g| !qemu_alive(g.pid)) {
            return Err(VmError::Setup(format!(
                "guest {} (QEMU pid {}) is no longer running; `vmfabric vm down` cleans up",
                g.name, g.pid
            )));
        }
        if !c.persistent {
            return Err(VmError::Setup(
                "the guests running were booted by another `vmfabric vm run` for its own job; wait for it (or `vmfabric vm down`)".into(),
            ));
        }
        Ok(c)
    }

    /// Remove what a crashed run left (QEMU processes recorded in the state file, taps, files).
    pub fn clean_leftovers() {
        let _lock = global_lock();
        Self::clean_leftovers_locked();
    }

    fn clean_leftovers_locked() {
        let dir = state_dir();
        if let Some(mut c) = Self::load(&dir) {
            c.teardown_locked();
        } else {
            net::down(net::MAX_VMS);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The guest called `name`.
    pub fn guest(&self, name: &str) -> Result<&Guest, VmError> {
        self.guests.iter().find(|g| g.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.guests.iter().map(|g| g.name.as_str()).collect();
            VmError::Usage(format!("no guest {name:?} (the guests are {})", names.join(", ")))
        })
    }

    fn qmp(&self, g: &Guest) -> Result<qemu::Qmp, VmError> {
        qemu::Qmp::connect(&self.dir.join(format!("{}.qmp", qemu::files_name(&g.name, g.generation))))
    }

    /// The id of the memory backend behind `g`'s ivshmem device (`ivmem` as booted; `plug` makes new ones).
    fn memdev(&self, g: &Guest) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.memdev", g.name)))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "ivmem".into())
    }

    /// Take guest `name` out of its host group as before a migration to another host: its ranks move
    /// their channels off the ivshmem region (to TCP, and to the guest's own memory among themselves),
    /// then the device is hot-unplugged (`device_del`). Returns (ranks' answers, ms to move them, ms
    /// until the guest released the device).
    pub fn unplug(&self, name: &str) -> Result<(serde_json::Value, f64, f64), VmError> {
        let g = self.guest(name)?;
        no_group(g)?;
        let a = request(&g.ip, &serde_json::json!({"cmd": "leave-region"}), Duration::from_secs(300))?;
        if a.get("ok").and_then(|v| v.as_bool()) != Some(true) {
            return Err(VmError::Io(format!(
                "the ranks of {name} could not leave the region: {}",
                a.get("error").and_then(|v| v.as_str()).unwrap_or("no answer")
            )));
        }
        let t0 = Instant::now();
        let mut q = self.qmp(g)?;
        q.execute("device_del", serde_json::json!({"id": "ivshmem0"}))?;
        q.wait_event("DEVICE_DELETED", Duration::from_secs(60))?;
        // QEMU cannot give the same memory backend to a second device (its RAM block keeps the first
        // one's name): drop it; `plug` makes a new one over the same file. A doorbell device stays.
        let _ = q.execute("object-del", serde_json::json!({"id": self.memdev(g)}));
        let ms = a.get("ms").and_then(|v| v.as_f64()).unwrap_or(0.0);
        Ok((a["ranks"].clone(), ms, t0.elapsed().as_secs_f64() * 1e3))
    }

    /// Give guest `name` its ivshmem device back (`device_add`) and move its ranks onto the region again.
    /// Returns (ranks' answers, ms to move them, ms until the guest saw the device).
    pub fn plug(&self, name: &str) -> Result<(serde_json::Value, f64, f64), VmError> {
        let g = self.guest(name)?;
        no_group(g)?;
        let t0 = Instant::now();
        let mut q = self.qmp(g)?;
        let file = &self.groups[g.group.unwrap_or(0)];
        let size = std::fs::metadata(file)
            .map_err(|e| VmError::Io(format!("the ivshmem file {} ({e})", file.display())))?
            .len();
        let id = format!("ivmem{}", t0.elapsed().as_nanos() ^ std::process::id() as u128);
        q.execute(
            "object-add",
            serde_json::json!({"qom-type": "memory-backend-file", "id": id,
                "mem-path": file.display().to_string(), "size": size, "share": true}),
        )?;
        if let Err(e) = q.execute(
            "device_add",
            serde_json::json!({"driver": "ivshmem-plain", "memdev": id, "bus": "rp1", "id": "ivshmem0"}),
        ) {
            let _ = q.execute("object-del", serde_json::json!({"id": id}));
            return Err(e);
        }
        let _ = std::fs::write(self.dir.join(format!("{}.memdev", g.name)), &id);
        let seen = loop {
            let i = request(&g.ip, &serde_json::json!({"cmd": "info"}), Duration::from_secs(5))?;
            if i["ivshmem"].as_array().is_some_and(|a| !a.is_empty()) {
                break t0.elapsed().as_secs_f64() * 1e3;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(VmError::Io(format!("{name} did not see its ivshmem device within 60 s")));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let a = request(&g.ip, &serde_json::json!({"cmd": "join-region"}), Duration::from_secs(300))?;
        if a.get("ok").and_then(|v| v.as_bool()) != Some(true) {
            return Err(VmError::Io(format!(
                "the ranks of {name} could not join the region: {}",
                a.get("error").and_then(|v| v.as_str()).unwrap_or("no answer")
            )));
        }
        let ms = a.get("ms").and_then(|v| v.as_f64()).unwrap_or(0.0);
        Ok((a["ranks"].clone(), ms, seen))
    }

    /// Live-migrate guest `name` to a second QEMU process, which stands in for another host, while its
    /// ranks run: first it leaves its host group as [`Cluster::unplug`] does (its ranks move to TCP), then
    /// QEMU's `migrate` sends its state to the new process (on a tap of its own, same MAC and address),
    /// which resumes it; the old one quits. Needs guests booted `--migratable` (QEMU refuses to migrate
    /// a guest with a 9p export mounted) and without doorbells.
    pub fn migrate(&mut self, name: &str) -> Result<MigrationReport, VmError> {
        let gi = self
            .guests
            .iter()
            .position(|g| g.name == name)
            .ok_or_else(|| self.guest(name).err().unwrap_or_else(|| VmError::Usage(name.into())))?;
        if !self.migratable {
            return Err(VmError::Usage(format!(
                "{name} mounts the host's files over 9p, and QEMU does not migrate a guest with a 9p export mounted: boot the guests with `vmfabric vm up --migratable`"
            )));
        }
        if !self.servers.is_empty() {
            return Err(VmError::Usage(format!(
                "{name} has an ivshmem-doorbell device: QEMU migrates only the first device of an ivshmem server (its master), and QEMU 7.2 cannot unplug one safely without KVM; boot without --doorbell to migrate"
            )));
        }
        let (img, agent) = match (&self.image, &self.agent) {
            (Some(i), Some(a)) => (i.clone(), a.clone()),
            _ => return Err(VmError::Setup("the state file does not say what the guests booted".into())),
        };
        // One boot, teardown or migration at a time (the state file, taps).
        let _lock = global_lock()?;
        let t_all = Instant::now();
        // 1. Leave the host group first (a guest on another host shares no memory with this one's).
        let g = self.guests[gi].clone();
        let has_region = g.group.is_some()
            && request(&g.ip, &serde_json::json!({"cmd": "info"}), Duration::from_secs(5))?["ivshmem"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
        let unplug = if has_region { Some(self.unplug(name)?) } else { None };
        // From here an error leaves the guest off its host group: say how to bring it back.
        let off = |e: VmError| -> VmError {
            if has_region {
                VmError::Io(format!("{e} ({name} stays off its host group: `vmfabric vm plug {name}` returns it)"))
            } else {
                e
            }
        };
        // 2. The destination: a second QEMU process waiting for the guest's state.
        let generation = g.generation + 1;
        let tap = net::tap_gen(g.index, generation);
        net::del_tap(&tap);
        net::add_tap(&tap)?;
        let spec = GuestSpec {
            index: g.index,
            name: g.name.clone(),
            vcpus: g.vcpus,
            mem_mb: g.mem_mb,
            ivshmem: None,
            doorbell: None,
            agent,
            dir: self.dir.clone(),
            migratable: true,
            generation,
            incoming: Some(self.dir.join(format!("{}.incoming", qemu::files_name(&g.name, generation)))),
        };
        let undo = |why: VmError, pid: Option<i32>| {
            if let Some(p) = pid.filter(|&p| qemu_alive(p)) {
                // SAFETY: kill of the destination QEMU we started (checked by its command line).
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            net::del_tap(&tap);
            off(why)
        };
        let qemu_bin = qemu::binary()?;
        let mut cmd = qemu::command(&qemu_bin, &img, self.accel, &spec);
        // It outlives this command, as the guests of `vm up` do.
        background(&mut cmd, &spec.log(), true).map_err(|e| undo(e, None))?;
        let mut child = cmd
            .spawn()
            .map_err(|e| undo(VmError::Setup(format!("cannot start QEMU {} ({e})", qemu_bin.display())), None))?;
        let new_pid = child.id() as i32;
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(undo(VmError::Setup(format!("the destination QEMU exited ({st}): {}", tail(&spec.log(), 3))), None));
            }
            if spec.incoming.as_ref().is_some_and(|p| p.exists()) && qemu::Qmp::connect(&spec.qmp()).is_ok() {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(undo(VmError::Setup("the destination QEMU did not start within 30 s".into()), Some(new_pid)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
        // 3. Send the state.
        let t1 = Instant::now();
        let mut src = self.qmp(&g).map_err(|e| undo(e, Some(new_pid)))?;
        let uri = format!("unix:{}", spec.incoming.as_ref().unwrap().display());
        src.execute("migrate", serde_json::json!({"uri": uri})).map_err(|e| undo(e, Some(new_pid)))?;
        let done = loop {
            let st = src.execute("query-migrate", serde_json::json!({})).map_err(|e| undo(e, Some(new_pid)))?;
            match st.get("status").and_then(|v| v.as_str()).unwrap_or("") {
                "completed" => break st,
                "failed" | "cancelled" => {
                    let why = st.get("error-desc").and_then(|v| v.as_str()).unwrap_or("no reason given").to_owned();
                    let _ = src.execute("cont", serde_json::json!({}));
                    return Err(undo(VmError::Io(format!("the migration of {name} failed: {why}")), Some(new_pid)));
                }
                _ => {}
            }
            if t1.elapsed() > Duration::from_secs(600) {
                let _ = src.execute("migrate_cancel", serde_json::json!({}));
                return Err(undo(VmError::Io(format!("the migration of {name} did not complete within 600 s")), Some(new_pid)));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let migrate_ms = t1.elapsed().as_secs_f64() * 1e3;
        // 4. The guest is the destination's now (the source is stopped for good): record it at once, so
        // that a job watching the guest's QEMU finds the new one and `vm down` stops it whatever follows.
        std::mem::forget(child);
        let old_pid = g.pid;
        let old_tap = net::tap_gen(g.index, g.generation);
        {
            let m = &mut self.guests[gi];
            m.pid = new_pid;
            m.generation = generation;
            m.group = None;
        }
        let saved = self.save();
        // The destination resumes by itself (started without -S).
        let resumed = (|| -> Result<(), VmError> {
            let mut dst = qemu::Qmp::connect(&spec.qmp())?;
            let t2 = Instant::now();
            loop {
                let st = dst.execute("query-status", serde_json::json!({}))?;
                if st.get("status").and_then(|v| v.as_str()) == Some("running") {
                    return Ok(());
                }
                if t2.elapsed() > Duration::from_secs(30) {
                    return Err(VmError::Io(format!("the destination did not resume: {st}")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })();
        // 5. The source quits (whatever the destination did: its state was sent, it cannot go on); its
        // tap goes.
        let _ = src.execute("quit", serde_json::json!({}));
        let t3 = Instant::now();
        while qemu_alive(old_pid) {
            if t3.elapsed() > Duration::from_secs(5) {
                // SAFETY: kill of the guest's old QEMU (checked by its command line).
                unsafe { libc::kill(old_pid, libc::SIGKILL) };
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        net::del_tap(&old_tap);
        saved?;
        if let Err(e) = resumed {
            return Err(VmError::Io(format!(
                "{name} migrated to QEMU pid {new_pid}, which does not run it ({e}); `vmfabric vm down` cleans up"
            )));
        }
        // 6. Its agent answers from the new process.
        let t4 = Instant::now();
        while request(&g.ip, &serde_json::json!({"cmd": "info"}), Duration::from_secs(2)).is_err() {
            if t4.elapsed() > Duration::from_secs(30) {
                return Err(VmError::Io(format!("the agent of {name} does not answer after its migration")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let num = |k: &str| done.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        Ok(MigrationReport {
            unplug,
            setup_ms,
            migrate_ms,
            downtime_ms: num("downtime"),
            transferred_mib: done["ram"]["transferred"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
            total_ms: t_all.elapsed().as_secs_f64() * 1e3,
            old_pid,
            new_pid,
        })
    }

    /// Power the guests off (QEMU killed if they do not within 3 s) and remove the network and files.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        let _lock = global_lock();
        self.teardown_locked();
    }

    /// [`Self::teardown`] by a caller that holds the global lock.
    fn teardown_locked(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for g in &self.guests {
            let _ = request(&g.ip, &serde_json::json!({"cmd": "poweroff"}), Duration::from_millis(300));
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for (i, g) in self.guests.iter().enumerate() {
            loop {
                let gone = match self.children.get_mut(i) {
                    Some(c) => c.try_wait().map_or(true, |s| s.is_some()),
                    None => !qemu_alive(g.pid),
                };
                if gone {
                    break;
                }
                if Instant::now() > deadline {
                    // SAFETY: kill of a QEMU process we started (checked by its command line).
                    unsafe { libc::kill(g.pid, libc::SIGKILL) };
                    if let Some(c) = self.children.get_mut(i) {
                        let _ = c.wait();
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for (k, &pid) in self.servers.iter().enumerate() {
            let _ = std::fs::remove_file(self.server_socket(k));
            if server_alive(pid) {
                // SAFETY: kill of an ivshmem server we started (checked by its command line).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        net::down(self.guests.len().max(net::MAX_VMS));
        for g in &self.groups {
            let _ = std::fs::remove_file(g);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.persistent {
            self.teardown();
        }
    }
}
