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
    format!("{BRIDGE}t{i}")
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
        let t = tap(i);
        ip(&["tuntap", "add", "dev", &t, "mode", "tap"])?;
        ip(&["link", "set", &t, "master", BRIDGE])?;
        ip(&["link", "set", &t, "up"])?;
    }
    Ok(())
}

/// Remove the bridge and the taps (what exists of them).
pub fn down(n: usize) {
    let exists = |d: &str| std::path::Path::new("/sys/class/net").join(d).exists();
    for i in 0..n {
        let t = tap(i);
        if exists(&t) {
            let _ = ip(&["link", "del", &t]);
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
        assert!(tap(MAX_VMS).len() <= 15, "interface names are at most 15 bytes");
        assert_eq!(mac(258), "52:54:00:79:01:02");
    }
}
