//! The guests' network: a bridge on the host (address [`HOST_IP`]) with one tap per guest. Guest `i` has
//! address `10.79.0.(10+i)`; the host side (PMI server, agent connections) uses the bridge address.
use crate::VmError;
use std::process::Command;

/// The bridge.
pub const BRIDGE: &str = "vmfvm0";
/// The host's address on it.
pub const HOST_IP: &str = "10.79.0.1";
/// Prefix length.
pub const PREFIX: u8 = 24;
/// Most guests on one bridge.
pub const MAX_VMS: usize = 200;

/// Guest `i`'s address.
pub fn guest_ip(i: usize) -> String {
    format!("10.79.0.{}", 10 + i)
}

/// Guest `i`'s tap device.
pub fn tap(i: usize) -> String {
    tap_gen(i, 0)
}

/// The tap of guest `i`'s QEMU process after `generation` migrations (each process has its own: during a
/// migration both run).
pub fn tap_gen(i: usize, generation: u32) -> String {
    if generation == 0 {
        format!("{BRIDGE}t{i}")
    } else {
        format!("{BRIDGE}t{i}m{generation}")
    }
}

/// Create tap `t` on the bridge.
pub fn add_tap(t: &str) -> Result<(), VmError> {
    ip(&["tuntap", "add", "dev", t, "mode", "tap"])?;
    ip(&["link", "set", t, "master", BRIDGE])?;
    ip(&["link", "set", t, "up"])
}

/// Remove tap `t` if it exists.
pub fn del_tap(t: &str) {
    if std::path::Path::new("/sys/class/net").join(t).exists() {
        let _ = ip(&["link", "del", t]);
    }
}

/// Guest `i`'s MAC address (locally administered).
pub fn mac(i: usize) -> String {
    format!("52:54:00:79:{:02x}:{:02x}", i >> 8, i & 0xff)
}

fn ip(args: &[&str]) -> Result<(), VmError> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| VmError::Setup(format!("cannot run ip (iproute2) ({e})")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(VmError::Setup(format!(
            "ip {} failed: {} (the VMs' network needs root: CAP_NET_ADMIN)",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )))
    }
}

/// Create the bridge and `n` taps (removing leftovers of an earlier run first).
pub fn up(n: usize) -> Result<(), VmError> {
    down(MAX_VMS);
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{HOST_IP}/{PREFIX}"), "dev", BRIDGE])?;
    ip(&["link", "set", BRIDGE, "up"])?;
    for i in 0..n {
        add_tap(&tap(i))?;
    }
    Ok(())
}

/// Remove the bridge and the taps (what exists of them).
pub fn down(n: usize) {
    let exists = |d: &str| std::path::Path::new("/sys/class/net").join(d).exists();
    for i in 0..n {
        del_tap(&tap(i));
    }
    // Taps of migrated guests' QEMU processes.
    let prefix = format!("{BRIDGE}t");
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.strip_prefix(&prefix).is_some_and(|r| r.contains('m')) {
                del_tap(&name);
            }
        }
    }
    if exists(BRIDGE) {
        let _ = ip(&["link", "del", BRIDGE]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(guest_ip(0), "10.79.0.10");
        assert_eq!(tap(3), "vmfvm0t3");
        assert_eq!(tap_gen(3, 2), "vmfvm0t3m2");
        assert!(tap_gen(MAX_VMS, 999).len() <= 15);
        assert!(tap(MAX_VMS).len() <= 15, "interface names are at most 15 bytes");
        assert_eq!(mac(258), "52:54:00:79:01:02");
    }
}
