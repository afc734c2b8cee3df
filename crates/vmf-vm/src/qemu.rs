//! QEMU: the guest's command line, the accelerator (KVM where a probe boot shows it works, else TCG) and
//! a QMP client for the monitor (shutdown, device hot-plug).
use crate::image::Image;
use crate::VmError;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The accelerator guests run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// The QEMU binary: `VMF_VM_QEMU` or `qemu-system-x86_64` on PATH.
pub fn binary() -> Result<PathBuf, VmError> {
    if let Some(q) = std::env::var_os("VMF_VM_QEMU").filter(|q| !q.is_empty()) {
        let q = PathBuf::from(q);
        return if q.is_file() {
            Ok(q)
        } else {
            Err(VmError::Setup(format!("VMF_VM_QEMU={} does not exist", q.display())))
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            VmError::Setup(
                "QEMU is not installed: no qemu-system-x86_64 on PATH (apt-get install qemu-system-x86; `make` does)"
                    .into(),
            )
        })
}

/// What one guest gets.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Index (its address and tap follow from it).
    pub index: usize,
    /// Name (`vm0`, ...).
    pub name: String,
    /// vCPUs.
    pub vcpus: usize,
    /// Memory in MiB.
    pub mem_mb: u64,
    /// The host file behind its ivshmem-plain device and its size, when it is in a host group.
    pub ivshmem: Option<(PathBuf, u64)>,
    /// With interrupts: the group's ivshmem server socket, for an interrupts-only `ivshmem-doorbell`
    /// device beside the region's `ivshmem-plain` one (the guest also gets an IOMMU so its agent can
    /// take the interrupts through VFIO).
    pub doorbell: Option<PathBuf>,
    /// The vmfabric executable the guest runs as its agent (a host path, seen through 9p; in a
    /// migratable guest's initramfs).
    pub agent: PathBuf,
    /// Directory of its files (console log, QMP socket, pid file).
    pub dir: PathBuf,
    /// Mounts none of the host's files (its root is its initramfs), so QEMU can migrate it.
    pub migratable: bool,
    /// How many times it has migrated: each QEMU process of the guest has its own tap and files.
    pub generation: u32,
    /// Wait for the guest's state from a migration on this Unix socket (`-incoming`) instead of booting.
    pub incoming: Option<PathBuf>,
}

/// The base name of the files of guest `name`'s QEMU process after `generation` migrations.
pub fn files_name(name: &str, generation: u32) -> String {
    if generation == 0 {
        name.to_owned()
    } else {
        format!("{name}-m{generation}")
    }
}

impl GuestSpec {
    fn file(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", files_name(&self.name, self.generation)))
    }
    /// Serial console output.
    pub fn console(&self) -> PathBuf {
        self.file("console")
    }
    /// QMP socket.
    pub fn qmp(&self) -> PathBuf {
        self.file("qmp")
    }
    /// QEMU's own messages.
    pub fn log(&self) -> PathBuf {
        self.file("log")
    }
}

/// The QEMU command line for `g`.
pub fn command(qemu: &Path, img: &Image, accel: Accel, g: &GuestSpec) -> Command {
    let mut c = Command::new(qemu);
    let append = format!(
        "console=ttyS0 quiet panic=-1 vmf_ip={}/{} vmf_port={} vmf_name={} vmf_agent={} vmf_state={}",
        crate::net::guest_ip(g.index),
        crate::net::PREFIX,
        crate::proto::AGENT_PORT,
        g.name,
        g.agent.display(),
        g.dir.display()
    );
    let append = if g.migratable { format!("{append} vmf_migratable=1") } else { append };
    let append = if g.doorbell.is_some() {
        // The emulated IOMMU is what vfio-pci needs (Debian's kernel has no VFIO no-IOMMU mode);
        // passthrough keeps the guest's own devices off its translation.
        format!("{append} intel_iommu=on iommu=pt")
    } else {
        append
    };
    c.args(["-name", &g.name, "-machine", "q35", "-nodefaults", "-no-user-config"])
        .args(["-display", "none", "-no-reboot"]);
    if g.doorbell.is_some() {
        c.args(["-device", "intel-iommu,intremap=off"]);
    }
    // Under TCG every feature of `max` but AVX: guest libraries then take their SSE string and copy
    // routines, which TCG emulates much faster than its AVX (new in QEMU 7.2): 4 MiB between two guests
    // over ivshmem 1720-1735 MB/s against 430-440 with AVX, the same 8-byte latency (2.3-2.7 us). A
    // named older model (Nehalem) loses `max`'s clock features and sextuples small-message latency.
    let cpu = std::env::var("VMF_VM_CPU")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| match accel {
            Accel::Kvm => "host".to_string(),
            Accel::Tcg => "max,-avx,-avx2,-avx512f,-fma,-f16c,-avx-vnni".to_string(),
        });
    match accel {
        Accel::Kvm => c.args(["-accel", "kvm", "-cpu", &cpu]),
        Accel::Tcg => c.args(["-accel", "tcg,thread=multi", "-cpu", &cpu]),
    };
    // maxcpus of at least 2: with one possible vCPU, TCG translates the guest's locked instructions
    // into plain loads and stores (atomic only among its own vCPUs), and atomics on the ivshmem region
    // shared with another QEMU process would lose updates.
    let smp = format!("{},maxcpus={}", g.vcpus, g.vcpus.max(2));
    c.args(["-m", &g.mem_mb.to_string(), "-smp", &smp])
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .args(["-append", &append])
        .arg("-serial")
        .arg(format!("file:{}", g.console().display()))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", g.qmp().display()))
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap,id=hostroot",
            "-virtfs",
            "local,path=/,mount_tag=hostrw,security_model=passthrough,multidevs=remap,id=hostrw",
        ])
        .args([
            "-netdev",
            &format!("tap,id=n0,ifname={},script=no,downscript=no", crate::net::tap_gen(g.index, g.generation)),
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={}", crate::net::mac(g.index)),
        ])
        // A hot-pluggable slot for the ivshmem device.
        .args(["-device", "pcie-root-port,id=rp1,chassis=1,slot=1"]);
    if let Some((f, size)) = &g.ivshmem {
        c.args([
            "-object",
            &format!("memory-backend-file,id=ivmem,share=on,mem-path={},size={size}", f.display()),
            "-device",
            "ivshmem-plain,memdev=ivmem,bus=rp1,id=ivshmem0",
        ]);
    }
    if let (Some(sock), Some(_)) = (&g.doorbell, &g.ivshmem) {
        // Interrupts come from a second device, which stays when the region's device is unplugged:
        // QEMU 7.2 cannot unplug an ivshmem-doorbell device safely without KVM (its exit leaves the
        // eventfd handlers of its vectors registered; one that fires later runs on freed memory).
        c.args(["-device", "pcie-root-port,id=rp2,chassis=2,slot=2"]);
        c.args(["-chardev", &format!("socket,path={},id=ivsc", sock.display())]);
        c.args(["-device", &doorbell_device("ivsc")]);
    }
    if let Some(p) = &g.incoming {
        c.arg("-incoming").arg(format!("unix:{}", p.display()));
    }
    c.stdin(Stdio::null());
    c
}

/// Interrupt vectors of an `ivshmem-doorbell` device: one per rank of the guest that may sleep.
pub const DOORBELL_VECTORS: u16 = 16;

/// The `-device` text of the interrupts-only ivshmem-doorbell device on chardev `chardev`.
pub fn doorbell_device(chardev: &str) -> String {
    format!("ivshmem-doorbell,chardev={chardev},vectors={DOORBELL_VECTORS},bus=rp2,id=ivbell0")
}

/// The accelerator to use: `VMF_VM_ACCEL` (kvm or tcg) when set; TCG without a usable /dev/kvm; else what
/// a probe boot under KVM showed (cached in `cache` per kernel and QEMU), with the reason.
pub fn accel(qemu: &Path, img: &Image, cache: &Path) -> Result<(Accel, String), VmError> {
    match std::env::var("VMF_VM_ACCEL").as_deref() {
        Ok("kvm") => return Ok((Accel::Kvm, "VMF_VM_ACCEL=kvm".into())),
        Ok("tcg") => return Ok((Accel::Tcg, "VMF_VM_ACCEL=tcg".into())),
        Ok("") | Ok("auto") | Err(_) => {}
        Ok(v) => return Err(VmError::Usage(format!("VMF_VM_ACCEL={v:?} is not kvm, tcg or auto"))),
    }
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Ok((Accel::Tcg, format!("no usable /dev/kvm ({e})")));
    }
    let ver = Command::new(qemu)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_owned())
        .unwrap_or_default();
    let key: String = format!("{} {}", img.release, ver)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
        .collect();
    let cached = cache.join(format!("accel-{key}"));
    if let Ok(s) = std::fs::read_to_string(&cached) {
        let (a, why) = s.split_once(' ').unwrap_or((s.trim(), ""));
        let a = if a.trim() == "kvm" { Accel::Kvm } else { Accel::Tcg };
        return Ok((a, format!("{} (cached in {})", why.trim(), cached.display())));
    }
    let (a, why) = probe_kvm(qemu, img, cache);
    let _ = std::fs::create_dir_all(cache);
    let _ = std::fs::write(&cached, format!("{} {why}\n", a.name()));
    Ok((a, why))
}

/// Boot a guest under KVM far enough to run `/init` (20 s at most).
fn probe_kvm(qemu: &Path, img: &Image, dir: &Path) -> (Accel, String) {
    let _ = std::fs::create_dir_all(dir);
    let out = dir.join(format!("probe-{}.console", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let child = Command::new(qemu)
        .args(["-machine", "q35", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"])
        .args(["-accel", "kvm", "-cpu", "host", "-m", "256"])
        .arg("-kernel")
        .arg(&img.kernel)
        .arg("-initrd")
        .arg(&img.initrd)
        .args(["-append", "console=ttyS0 panic=-1 vmf_probe=1"])
        .arg("-serial")
        .arg(format!("file:{}", out.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (Accel::Tcg, format!("the KVM probe could not start QEMU ({e})")),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let ok = |o: &Path| std::fs::read_to_string(o).is_ok_and(|s| s.contains("vmfabric-guest: probe ok"));
    let res = loop {
        if ok(&out) {
            break (Accel::Kvm, "a KVM guest booted to /init".to_string());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            if ok(&out) {
                break (Accel::Kvm, "a KVM guest booted to /init".to_string());
            }
            let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
            break (Accel::Tcg, format!("QEMU under KVM exited ({st}) before /init ran: {last}"));
        }
        if Instant::now() > deadline {
            let console = std::fs::read_to_string(&out).unwrap_or_default();
            break (
                Accel::Tcg,
                format!(
                    "a KVM guest did not reach /init within 20 s (console: {} bytes; a nested or PVM host: /sys/module/kvm_pvm {})",
                    console.len(),
                    if Path::new("/sys/module/kvm_pvm").exists() { "present" } else { "absent" }
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&out);
    res
}

/// A QMP (QEMU monitor) connection.
pub struct Qmp {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Qmp {
    /// Connect and leave capabilities negotiation mode.
    pub fn connect(path: &Path) -> Result<Qmp, VmError> {
        let io = |e: std::io::Error| VmError::Io(format!("QMP {} ({e})", path.display()));
        let w = UnixStream::connect(path).map_err(io)?;
        let _ = w.set_read_timeout(Some(Duration::from_secs(30)));
        let r = BufReader::new(w.try_clone().map_err(io)?);
        let mut q = Qmp { r, w };
        let mut greeting = String::new();
        q.r.read_line(&mut greeting).map_err(io)?;
        if !greeting.contains("QMP") {
            return Err(VmError::Protocol(format!("QMP greeting {greeting:?}")));
        }
        q.execute("qmp_capabilities", serde_json::json!({}))?;
        Ok(q)
    }

    /// Wait for the event `name` (e.g. `DEVICE_DELETED`) for at most `timeout`; events seen while
    /// waiting for command answers are not kept, so call this right after the command.
    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<serde_json::Value, VmError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(VmError::Io(format!("QMP: no {name} event within {timeout:?}")));
            }
            let _ = self.w.set_read_timeout(Some(left));
            let mut l = String::new();
            match self.r.read_line(&mut l) {
                Ok(0) => return Err(VmError::Io(format!("QMP: the monitor closed while waiting for {name}"))),
                Ok(_) => {}
                Err(_) => return Err(VmError::Io(format!("QMP: no {name} event within {timeout:?}"))),
            }
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(l.trim()) {
                if v.get("event").and_then(|e| e.as_str()) == Some(name) {
                    let _ = self.w.set_read_timeout(Some(Duration::from_secs(30)));
                    return Ok(v);
                }
            }
        }
    }

    /// Run `cmd` with `args`; its `return` value, or an error with QEMU's description.
    pub fn execute(&mut self, cmd: &str, args: serde_json::Value) -> Result<serde_json::Value, VmError> {
        let io = |e: std::io::Error| VmError::Io(format!("QMP {cmd} ({e})"));
        let req = serde_json::json!({"execute": cmd, "arguments": args});
        self.w.write_all(format!("{req}\n").as_bytes()).map_err(io)?;
        loop {
            let mut l = String::new();
            if self.r.read_line(&mut l).map_err(io)? == 0 {
                return Err(VmError::Io(format!("QMP {cmd}: the monitor closed")));
            }
            let v: serde_json::Value = serde_json::from_str(l.trim())
                .map_err(|e| VmError::Protocol(format!("QMP answer {l:?} ({e})")))?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(VmError::Io(format!(
                    "QMP {cmd}: {}",
                    e.get("desc").and_then(|d| d.as_str()).unwrap_or("error")
                )));
            }
            // An event: skip.
        }
    }
}
