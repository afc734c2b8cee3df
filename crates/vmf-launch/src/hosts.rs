//! Emulated hosts: one network namespace per host (with its own address and region directory), joined by
//! veth pairs to a bridge in a per-job switch namespace. Created by `vmfabric run --hosts H`, removed when
//! the job ends (or by `vmfabric clean` after a crash).
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmarking), host `i` = 198.18.0.(i+1)/24;
//! each job has its own switch namespace, so concurrent jobs do not collide.
use crate::LaunchError;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One emulated host.
#[derive(Debug)]
pub struct Host {
    /// Network namespace name (under /run/netns), also the host name its processes see.
    pub netns: String,
    /// Its region directory.
    pub dir: PathBuf,
    /// Its address.
    pub ip: String,
    ns: File,
}

impl Host {
    /// The file its processes see as /etc/hosts.
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// Descriptor of the namespace (for `setns`).
    pub fn ns_fd(&self) -> RawFd {
        self.ns.as_raw_fd()
    }
}

/// The hosts of a job.
#[derive(Debug)]
pub struct Topology {
    /// Hosts in order.
    pub hosts: Vec<Host>,
    switch: String,
    owned: bool,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip(8): {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// MTU of the emulated links when `VMF_HOSTS_MTU` is not set: the largest a veth takes, like loopback's
/// 64 KiB, so TCP between emulated hosts moves the segments TCP on one host would (at 1500 bytes a 1 MiB
/// transfer measured 2.0-2.1 GB/s here, at 65535 4.7-5.1 GB/s; the 8-byte latency does not change).
pub const DEFAULT_MTU: u32 = 65535;

/// Whether ranks get their host's name and /etc/hosts (`VMF_HOSTS_NAMES`, default 1; 0: they keep the
/// machine's, for systems that allow network namespaces but not mount or UTS ones).
pub fn names_enabled() -> bool {
    std::env::var("VMF_HOSTS_NAMES").map_or(true, |v| v.trim() != "0")
}

/// The MTU to give the emulated links: `VMF_HOSTS_MTU`, else [`DEFAULT_MTU`].
pub fn mtu_from_env() -> Result<u32, LaunchError> {
    parse_mtu(std::env::var("VMF_HOSTS_MTU").ok().as_deref())
}

fn parse_mtu(v: Option<&str>) -> Result<u32, LaunchError> {
    let Some(v) = v else { return Ok(DEFAULT_MTU) };
    match v.trim().parse::<u32>() {
        Ok(m) if (1280..=65535).contains(&m) => Ok(m),
        _ => Err(LaunchError::InvalidOptions(format!(
            "VMF_HOSTS_MTU={v} is not an MTU between 1280 and 65535"
        ))),
    }
}

/// The machine's hosts file with the emulated hosts after it (their names are unique to the job).
fn hosts_file_text(machine: &str, hosts: &[Host]) -> String {
    let mut t = machine.to_owned();
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
    t.push_str("# vmfabric emulated hosts\n");
    for h in hosts {
        t.push_str(&format!("{}\t{}\n", h.ip, h.netns));
    }
    t
}

/// Name prefix of a job's namespaces.
pub fn netns_prefix(job: &str) -> String {
    format!("vmf-{job}-")
}

/// The string a rank gets in `VMF_HOSTS_TABLE`: `i=netns_path,region_dir,ip;...`.
pub fn table(hosts: &[Host]) -> String {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| format!("{i}=/run/netns/{},{},{}", h.netns, h.dir.display(), h.ip))
        .collect::<Vec<_>>()
        .join(";")
}

impl Topology {
    /// Create `n` hosts for job `job`, with region directories under `region_dir`.
    pub fn create(job: &str, n: usize, region_dir: &Path) -> Result<Topology, LaunchError> {
        let priv_err = |why: String| {
            LaunchError::InvalidOptions(format!(
                "--hosts needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces: {why}"
            ))
        };
        if n == 0 || n > 250 {
            return Err(LaunchError::InvalidOptions(format!(
                "--hosts {n} is not within 1..=250"
            )));
        }
        let mtu = mtu_from_env()?.to_string();
        let switch = format!("{}sw", netns_prefix(job));
        ip(&["netns", "add", &switch]).map_err(priv_err)?;
        let mut topo = Topology {
            hosts: Vec::new(),
            switch: switch.clone(),
            owned: true,
        };
        let step = |r: Result<(), String>| {
            r.map_err(|why| {
                LaunchError::InvalidOptions(format!("cannot create the emulated hosts: {why}"))
            })
        };
        step(ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]))?;
        step(ip(&["-n", &switch, "link", "set", "br0", "up"]))?;
        step(ip(&["-n", &switch, "link", "set", "lo", "up"]))?;
        for i in 0..n {
            let ns = format!("{}h{i}", netns_prefix(job));
            step(ip(&["netns", "add", &ns]))?;
            // veth names must be unique in the root namespace while being created: include the job id.
            let (a, b) = (
                format!("v{}h{i}", &job[..job.len().min(8)]),
                format!("v{}s{i}", &job[..job.len().min(8)]),
            );
            step(ip(&[
                "link", "add", &a, "mtu", &mtu, "type", "veth", "peer", "name", &b, "mtu", &mtu,
            ]))?;
            step(ip(&["link", "set", &a, "netns", &ns]))?;
            step(ip(&["link", "set", &b, "netns", &switch]))?;
            step(ip(&["-n", &switch, "link", "set", &b, "master", "br0"]))?;
            step(ip(&["-n", &switch, "link", "set", &b, "up"]))?;
            let addr = format!("198.18.0.{}", i + 1);
            step(ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &a,
            ]))?;
            step(ip(&["-n", &ns, "link", "set", &a, "up"]))?;
            step(ip(&["-n", &ns, "link", "set", "lo", "up"]))?;
            let dir = region_dir.join(format!("vmf-{job}-h{i}"));
            std::fs::create_dir_all(&dir).map_err(|e| LaunchError::Io {
                what: format!("create {}", dir.display()),
                source: e,
            })?;
            let f = File::open(format!("/run/netns/{ns}")).map_err(|e| LaunchError::Io {
                what: format!("open the namespace {ns}"),
                source: e,
            })?;
            topo.hosts.push(Host {
                netns: ns,
                dir,
                ip: addr,
                ns: f,
            });
        }
        topo.write_hosts_files()?;
        Ok(topo)
    }

    /// Each host directory's `hosts`: the machine's /etc/hosts and every emulated host's name with its
    /// address. A rank sees it as its /etc/hosts (`vmf_pal::hostid::enter`), so the host name it gets
    /// (`gethostname`, `MPI_Get_processor_name`) resolves to its host's address everywhere in the job.
    fn write_hosts_files(&self) -> Result<(), LaunchError> {
        let machine = std::fs::read_to_string("/etc/hosts")
            .unwrap_or_else(|_| "127.0.0.1\tlocalhost\n::1\tlocalhost\n".into());
        let text = hosts_file_text(&machine, &self.hosts);
        for h in &self.hosts {
            let path = h.hosts_file();
            std::fs::write(&path, &text).map_err(|e| LaunchError::Io {
                what: format!("write {}", path.display()),
                source: e,
            })?;
        }
        Ok(())
    }

    /// Remove namespaces and host directories.
    pub fn destroy(&mut self) {
        if !self.owned {
            return;
        }
        self.owned = false;
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.netns]);
            let _ = std::fs::remove_dir_all(&h.dir);
        }
        let _ = ip(&["netns", "del", &self.switch]);
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// Remove whatever a dead job `job` left: namespaces `vmf-<job>-*` and host directories under `region_dir`.
pub fn remove_leftovers(job: &str, region_dir: &Path) {
    let prefix = netns_prefix(job);
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with(&prefix) {
                let _ = ip(&["netns", "del", &name]);
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(region_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with(&format!("vmf-{job}-h")) && e.path().is_dir() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_keeps_the_machine_entries_and_names_every_emulated_host() {
        let host = |i: usize| Host {
            netns: format!("vmf-abc-h{i}"),
            dir: PathBuf::from("/nonexistent"),
            ip: format!("198.18.0.{}", i + 1),
            ns: File::open("/dev/null").unwrap(),
        };
        let hosts = [host(0), host(1)];
        assert_eq!(
            hosts_file_text("127.0.0.1 localhost", &hosts),
            "127.0.0.1 localhost\n# vmfabric emulated hosts\n198.18.0.1\tvmf-abc-h0\n198.18.0.2\tvmf-abc-h1\n"
        );
        assert!(hosts_file_text("", &hosts).starts_with("# vmfabric"));
    }

    #[test]
    fn mtu_defaults_to_the_largest_and_rejects_nonsense() {
        assert_eq!(parse_mtu(None).unwrap(), 65535);
        assert_eq!(parse_mtu(Some("9000")).unwrap(), 9000);
        assert_eq!(parse_mtu(Some(" 1500 ")).unwrap(), 1500);
        for bad in ["", "jumbo", "0", "1279", "65536", "-1"] {
            let e = parse_mtu(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("VMF_HOSTS_MTU") && e.contains("1280 and 65535"),
                "{bad}: {e}"
            );
        }
    }
}
