//! The guest's boot image: Debian's kernel from /boot and an initramfs made here (a static busybox, the
//! kernel modules the guest needs and an `/init` script). `/init` loads the modules, mounts the host's root
//! read-only over 9p (so the guest runs the host's own vmfabric and MPI programs), a second, writable 9p
//! view of the host under `/run/host` (from which the agent binds the job's working directory; the
//! host's /tmp is bound over the guest's, since builds and programs may live there), sets up the
//! network and hands over to `vmfabric vm agent` as PID 1.
//!
//! The image is cached under the cache directory, keyed by the kernel release and a hash of what went in.
use crate::VmError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Modules the guest loads (with their dependencies, as `modprobe --show-depends` lists them): 9p over
/// virtio for the root file systems, virtio-net for TCP between guests.
pub const MODULES: &[&str] = &["9p", "9pnet_virtio", "virtio_net", "virtio_pci"];

/// The guest's `/init`. Kernel parameters of the form `vmf_x=...` reach it as environment variables.
pub const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "vmfabric-guest: FAILED: $*"; sleep 1; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
if [ -n "$vmf_probe" ]; then echo "vmfabric-guest: probe ok"; poweroff -f; fi
for m in $(cat /modules); do insmod /lib/modules/$m || fail "cannot load module $m"; done
echo "vmfabric-guest: modules loaded at $(cut -d' ' -f1 /proc/uptime) s"
if [ -n "$vmf_migratable" ]; then
  # A guest that can migrate: no 9p file system stays mounted (QEMU refuses to migrate while one is).
  # The root stays this initramfs, in guest memory, which migrates with it; it holds the agent and its
  # libraries; each job's program and libraries are copied in from the host before it starts.
  # /tmp stays the initramfs' own (already in memory): the agent may live under it (a build in /tmp).
  mkdir -p /dev/shm /dev/pts /run /tmp
  chmod 1777 /tmp
  mount -t tmpfs -o mode=1777 shm /dev/shm
  mount -t devpts devpts /dev/pts
  mount -t tmpfs run /run || fail "no /run"
  mkdir -p /run/host
  ip link set lo up
  ip addr add "$vmf_ip" dev eth0 || fail "no eth0 (virtio-net) for $vmf_ip"
  ip link set eth0 up
  hostname "$vmf_name"
  echo "vmfabric-guest: $vmf_name up at $(cut -d' ' -f1 /proc/uptime) s (migratable), starting $vmf_agent"
  exec "$vmf_agent" vm agent --port "$vmf_port" --name "$vmf_name" --migratable
fi
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot || fail "cannot mount the host's root over 9p"
mount -t proc proc /newroot/proc || fail "no /proc"
mount -t sysfs sys /newroot/sys || fail "no /sys"
mount -t devtmpfs dev /newroot/dev || fail "no /dev"
mkdir -p /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs run /newroot/run || fail "no /run"
mkdir -p /newroot/run/host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 hostrw /newroot/run/host || fail "cannot mount the host's files read-write over 9p"
# The host's /tmp, writable: programs, libraries and vmfabric itself may live there (a build in /tmp).
mount -o bind /newroot/run/host/tmp /newroot/tmp || fail "cannot bind the host's /tmp"
ip link set lo up
ip addr add "$vmf_ip" dev eth0 || fail "no eth0 (virtio-net) for $vmf_ip"
ip link set eth0 up
hostname "$vmf_name"
echo "vmfabric-guest: $vmf_name up at $(cut -d' ' -f1 /proc/uptime) s, starting $vmf_agent"
# The agent runs through the uncached mount: run from the cached one, it would pin its path's dentry
# there, and a vmfabric rebuilt on the host while the guest is up would reach the ranks half old, half new.
exec switch_root /newroot "/run/host$vmf_agent" vm agent --port "$vmf_port" --name "$vmf_name"
"#;

/// A bootable guest: kernel and initramfs.
#[derive(Debug, Clone)]
pub struct Image {
    /// `/boot/vmlinuz-<release>`.
    pub kernel: PathBuf,
    /// The initramfs made for it.
    pub initrd: PathBuf,
    /// Kernel release (`6.1.0-56-amd64`).
    pub release: String,
}

/// The guest kernel: `VMF_VM_KERNEL` (a vmlinuz path) or the newest `/boot/vmlinuz-*` whose modules are
/// installed.
pub fn find_kernel() -> Result<(PathBuf, String), VmError> {
    let release_of = |p: &Path| {
        p.file_name()?
            .to_str()?
            .strip_prefix("vmlinuz-")
            .map(str::to_owned)
    };
    if let Some(k) = std::env::var_os("VMF_VM_KERNEL").filter(|k| !k.is_empty()) {
        let k = PathBuf::from(k);
        let rel = release_of(&k).ok_or_else(|| {
            VmError::Setup(format!(
                "VMF_VM_KERNEL={} is not a /boot/vmlinuz-<release> file",
                k.display()
            ))
        })?;
        return Ok((k, rel));
    }
    let mut found: Vec<(PathBuf, String)> = std::fs::read_dir("/boot")
        .map_err(|e| VmError::Setup(format!("cannot read /boot ({e})")))?
        .flatten()
        .map(|e| e.path())
        .filter_map(|p| {
            let r = release_of(&p)?;
            Path::new("/lib/modules").join(&r).join("kernel").is_dir().then_some((p, r))
        })
        .collect();
    found.sort_by_key(|a| natural(&a.1));
    found.pop().ok_or_else(|| {
        VmError::Setup(
            "no guest kernel: /boot has no vmlinuz-* with its modules in /lib/modules (apt-get install linux-image-amd64; `make` does)".into(),
        )
    })
}

/// Sort key comparing version strings by their numbers.
fn natural(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The module files (in load order, dependencies first) for [`MODULES`] under kernel `release`.
pub fn module_files(release: &str) -> Result<Vec<PathBuf>, VmError> {
    let o = Command::new("modprobe")
        .args(["--show-depends", "-S", release, "-a"])
        .args(MODULES)
        .output()
        .map_err(|e| VmError::Setup(format!("cannot run modprobe (kmod) ({e})")))?;
    if !o.status.success() {
        return Err(VmError::Setup(format!(
            "modprobe --show-depends for kernel {release} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    let mut v: Vec<PathBuf> = Vec::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        // "insmod /lib/modules/<rel>/kernel/.../x.ko" or "builtin x".
        if let Some(p) = l.strip_prefix("insmod ") {
            let p = PathBuf::from(p.split_whitespace().next().unwrap_or(""));
            if !v.contains(&p) {
                v.push(p);
            }
        }
    }
    Ok(v)
}

/// `exe` without its debug information (`objcopy --strip-debug`; the agent's 58 MB are 11 MB so), or
/// as it is when objcopy cannot.
fn stripped(exe: &Path) -> Result<Vec<u8>, VmError> {
    let tmp = std::env::temp_dir().join(format!("vmf-agent-{}", std::process::id()));
    let ok = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(exe)
        .arg(&tmp)
        .status()
        .is_ok_and(|s| s.success());
    let d = std::fs::read(if ok { &tmp } else { exe });
    let _ = std::fs::remove_file(&tmp);
    d.map_err(|e| VmError::Setup(format!("cannot read {} ({e})", exe.display())))
}

/// A static busybox (Debian's busybox-static).
pub fn busybox() -> Result<PathBuf, VmError> {
    let p = PathBuf::from(std::env::var_os("VMF_VM_BUSYBOX").unwrap_or_else(|| "/bin/busybox".into()));
    let data = std::fs::read(&p).map_err(|e| {
        VmError::Setup(format!(
            "no busybox at {} ({e}); apt-get install busybox-static (`make` does)",
            p.display()
        ))
    })?;
    if !is_static_elf(&data) {
        return Err(VmError::Setup(format!(
            "{} is dynamically linked; the guest's initramfs needs busybox-static",
            p.display()
        )));
    }
    Ok(p)
}

/// True for a 64-bit ELF file without a PT_INTERP program header (statically linked).
fn is_static_elf(d: &[u8]) -> bool {
    let u16_at = |o: usize| d.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |o: usize| {
        d.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
    };
    if d.len() < 64 || &d[..4] != b"\x7fELF" || d[4] != 2 {
        return false;
    }
    let (Some(phoff), Some(phsz), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    (0..phnum).all(|i| {
        let o = phoff + i * phsz;
        d.get(o..o + 4).is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) != 3)
    })
}

/// Writer of a `newc` cpio archive (the initramfs format).
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Default for Cpio {
    fn default() -> Self {
        Self::new()
    }
}

impl Cpio {
    /// An empty archive.
    pub fn new() -> Self {
        Cpio { out: Vec::new(), ino: 1 }
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name_z = name.len() + 1;
        let hdr = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino, mode, 0, 0, 1, 0, data.len(), 0, 0, 0, 0, name_z, 0
        );
        self.ino += 1;
        self.out.extend_from_slice(hdr.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }

    /// A directory.
    pub fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    /// A regular file with permission bits `perm`.
    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | (perm & 0o7777), data);
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// FNV-1a, to key the cache on what went into the image.
fn fnv(h: &mut u64, data: &[u8]) {
    for &b in data {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100000001b3);
    }
}

/// The shared libraries `exe` loads (its interpreter included), as `ldd` resolves them with
/// `LD_LIBRARY_PATH` = `ld_path`: what a guest without the host's files needs beside it. Empty for a
/// static program or a script.
pub fn shared_libraries(exe: &Path, ld_path: &str) -> Result<Vec<PathBuf>, VmError> {
    let o = Command::new("ldd")
        .arg(exe)
        .env("LD_LIBRARY_PATH", ld_path)
        .output()
        .map_err(|e| VmError::Setup(format!("cannot run ldd ({e})")))?;
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        // "not a dynamic executable": nothing to add.
        return Ok(Vec::new());
    }
    let mut v = Vec::new();
    for l in out.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)".
        let path = match l.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => l.split_whitespace().next().filter(|w| w.starts_with('/')),
        };
        match path {
            Some(p) if p.starts_with('/') => v.push(PathBuf::from(p)),
            _ if l.contains("not found") => {
                return Err(VmError::Setup(format!("{}: {}", exe.display(), l.trim())));
            }
            _ => {}
        }
    }
    Ok(v)
}

/// Build (or find in `cache`) the boot image: for guests that mount the host's files (`agent` None), or
/// for migratable guests (their initramfs also holds `agent`, stripped of debug information, and its
/// libraries, at the host's paths).
pub fn image(cache: &Path, agent: Option<&Path>) -> Result<Image, VmError> {
    let (kernel, release) = find_kernel()?;
    let bb = busybox()?;
    let mods = module_files(&release)?;
    let mut h = 0xcbf29ce484222325u64;
    fnv(&mut h, INIT.as_bytes());
    let bbd = std::fs::read(&bb).map_err(|e| VmError::Setup(format!("cannot read {} ({e})", bb.display())))?;
    fnv(&mut h, &bbd);
    let mut mdata = Vec::new();
    for m in &mods {
        let d = std::fs::read(m)
            .map_err(|e| VmError::Setup(format!("cannot read module {} ({e})", m.display())))?;
        if d.starts_with(&[0xfd, b'7', b'z', b'X', b'Z']) || d.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            return Err(VmError::Setup(format!(
                "module {} is compressed; the guest's busybox insmod needs plain .ko files",
                m.display()
            )));
        }
        fnv(&mut h, &d);
        let name = m.file_name().and_then(|n| n.to_str()).unwrap_or("m.ko").to_owned();
        mdata.push((name, d));
    }
    // The agent and its libraries (migratable guests), keyed by path, size and modification time.
    let mut extra: Vec<(PathBuf, PathBuf)> = Vec::new();
    if let Some(a) = agent {
        // The guest mounts file systems over these (its /tmp stays the initramfs' own).
        if ["/run/", "/dev/", "/proc/", "/sys/"].iter().any(|d| a.starts_with(d)) {
            return Err(VmError::Setup(format!(
                "a migratable guest cannot run the agent {}: the guest mounts its own /run, /dev, /proc and /sys",
                a.display()
            )));
        }
        extra.push((a.to_owned(), a.to_owned()));
        for l in shared_libraries(a, "")? {
            extra.push((l.clone(), l));
        }
        for (p, _) in &extra {
            let m = std::fs::metadata(p).map_err(|e| VmError::Setup(format!("cannot read {} ({e})", p.display())))?;
            let t = m.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
            fnv(&mut h, format!("{}:{}:{t}", p.display(), m.len()).as_bytes());
        }
    }
    let kind = if agent.is_some() { "migratable-" } else { "" };
    let initrd = cache.join(format!("initrd-{kind}{release}-{h:016x}.cpio"));
    if initrd.is_file() {
        return Ok(Image { kernel, initrd, release });
    }
    let mut c = Cpio::new();
    for d in ["bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"] {
        c.dir(d);
    }
    let mut dirs: std::collections::BTreeSet<String> = ["bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"]
        .iter()
        .map(|d| d.to_string())
        .collect();
    for (i, (src, at)) in extra.iter().enumerate() {
        let rel = at.to_string_lossy().trim_start_matches('/').to_owned();
        let mut acc = String::new();
        for comp in rel.split('/').collect::<Vec<_>>().iter().rev().skip(1).rev() {
            acc = if acc.is_empty() { comp.to_string() } else { format!("{acc}/{comp}") };
            if dirs.insert(acc.clone()) {
                c.dir(&acc);
            }
        }
        let data = if i == 0 { stripped(src)? } else {
            std::fs::read(src).map_err(|e| VmError::Setup(format!("cannot read {} ({e})", src.display())))?
        };
        c.file(&rel, 0o755, &data);
    }
    c.file("bin/busybox", 0o755, &bbd);
    c.file("init", 0o755, INIT.as_bytes());
    let list: String = mdata.iter().map(|(n, _)| format!("{n}\n")).collect();
    c.file("modules", 0o644, list.as_bytes());
    for (n, d) in &mdata {
        c.file(&format!("lib/modules/{n}"), 0o644, d);
    }
    std::fs::create_dir_all(cache)
        .map_err(|e| VmError::Setup(format!("cannot create {} ({e})", cache.display())))?;
    let tmp = cache.join(format!(".initrd-{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&c.finish())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &initrd)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        VmError::Setup(format!("cannot write the initramfs {} ({e})", initrd.display()))
    })?;
    if agent.is_some() {
        // Each build of the agent makes its own migratable image (11 MB): keep only the newest.
        if let Ok(rd) = std::fs::read_dir(cache) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("initrd-migratable-") && e.path() != initrd {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(Image { kernel, initrd, release })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut c = Cpio::new();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let a = c.finish();
        assert!(a.starts_with(b"070701"));
        // Entry 1: header 110 + "bin\0" (4) = 114 -> padded 116, no data.
        assert_eq!(&a[116..122], b"070701");
        let s = String::from_utf8_lossy(&a);
        assert!(s.contains("init\0"));
        assert!(s.contains("TRAILER!!!"));
        assert_eq!(a.len() % 4, 0);
        // The mode of "init" is a regular executable file.
        let i = s.find("init\0").unwrap();
        let hdr = &s[i - 110..i];
        assert_eq!(&hdr[14..22], "000081ed");
    }

    #[test]
    fn static_elf_detection() {
        assert!(!is_static_elf(b"not an elf"));
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Test binaries are dynamically linked.
        assert!(!is_static_elf(&exe));
        if let Ok(bb) = std::fs::read("/bin/busybox") {
            let _ = is_static_elf(&bb);
        }
    }

    #[test]
    fn natural_order_of_releases() {
        let mut v = vec!["6.1.0-9-amd64", "6.1.0-56-amd64", "6.1.0-10-amd64"];
        v.sort_by_key(|s| natural(s));
        assert_eq!(v, ["6.1.0-9-amd64", "6.1.0-10-amd64", "6.1.0-56-amd64"]);
    }
}
