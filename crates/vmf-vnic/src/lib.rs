//! The virtual NIC (003_*'s `sm_nic`, §4.10): every node of the emulated message-passing hardware gets a
//! network namespace `vnic{i}` holding a TAP interface `smn0` at 10.77.0.{i+1}/24. A daemon per node moves
//! Ethernet frames between its TAP and the hardware through a [`vmf_mphw::Nic`]: unicast frames to the
//! node their destination MAC names, broadcast and multicast frames (so ARP) as a copy to every node.
//! Unmodified TCP/IP software runs across the namespaces.
//!
//! [`up`] creates everything and returns once every node answers a ping; [`down`] removes everything,
//! also what a crash left; [`stats`] reads the performance values live from the region.
pub mod tap;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vmf_mphw::{Hw, HwConfig, Mode, Nic, NicOptions, Snapshot, Topology};

/// Interface name in every namespace (003_* named it smn).
pub const IFNAME: &str = "smn0";
/// Ethernet header bytes carried in front of every IP packet.
pub const ETH: usize = 14;
const MAC_PREFIX: [u8; 5] = [0x02, 0x76, 0x6d, 0x66, 0x00];

/// Where the vnic keeps its state (`$VMF_VNIC_DIR`, default `/run/vmfabric-vnic`).
pub fn state_dir() -> PathBuf {
    std::env::var_os("VMF_VNIC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/vmfabric-vnic"))
}

/// The region file of the emulated hardware.
pub fn region_path() -> PathBuf {
    std::env::var_os("VMF_VNIC_REGION")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm/vmfabric-vnic"))
}

/// Namespace of node `i`.
pub fn netns(i: usize) -> String {
    format!("vnic{i}")
}

/// Address of node `i`.
pub fn address(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}

/// MAC address of node `i`.
pub fn mac(i: usize) -> [u8; 6] {
    let mut m = [0u8; 6];
    m[..5].copy_from_slice(&MAC_PREFIX);
    m[5] = i as u8;
    m
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Buffers per link of a vnic's hardware unless `--slots` says otherwise (fewer where the region would
/// pass [`SLOTS_REGION_MAX`]): with one (003_*'s) every 64 KiB TCP segment waits for its target's
/// wake-up before the next can go, one packet per interrupt; with eight a woken target takes five or
/// six (iperf3 over 2 nodes here: 5.3 Gbit/s with one, 6.8 with four, 8.6-8.9 with eight, no better
/// with sixteen).
pub const DEFAULT_SLOTS: usize = 8;

/// The region the default number of buffers per link may take.
pub const SLOTS_REGION_MAX: u64 = 256 << 20;

/// [`DEFAULT_SLOTS`], halved until the region of `c` fits [`SLOTS_REGION_MAX`].
pub fn default_slots(c: &VnicConfig) -> usize {
    let buf = c.frame_max() + vmf_mphw::HEADER;
    let mut k = DEFAULT_SLOTS;
    while k > 1 && vmf_mphw::hw::region_size(c.nodes, buf, k) > SLOTS_REGION_MAX {
        k /= 2;
    }
    k
}

/// Everything `vmfabric vnic up` accepts.
#[derive(Debug, Clone)]
pub struct VnicConfig {
    /// Nodes (2..=64; addresses 10.77.0.1.. need at most 254).
    pub nodes: usize,
    /// Interface MTU (IP bytes per frame).
    pub mtu: usize,
    /// The hardware: mode, costs, topology, broken links (its `nodes` and `buffer_size` are derived).
    pub hw: HwConfig,
    /// Engine options (its `mtu` and `vlb_next_hops` are derived per node).
    pub nic: NicOptions,
    /// Allowed evade nodes per node (empty list: all).
    pub next_hops: Vec<Vec<usize>>,
    /// Segmentation and checksum offload: the hardware carries TCP segments of up to 64 KiB whatever
    /// the MTU (as veth and virtio-net do); off, every frame is at most MTU bytes (003_*'s sm_nic).
    pub offload: bool,
}

impl VnicConfig {
    /// Defaults for `nodes` nodes at MTU 1500.
    pub fn new(nodes: usize) -> VnicConfig {
        VnicConfig {
            nodes,
            mtu: 1500,
            hw: HwConfig { slots: DEFAULT_SLOTS, ..HwConfig::new(nodes, 1500 + ETH + vmf_mphw::HEADER) },
            nic: NicOptions::default(),
            next_hops: vec![Vec::new(); nodes],
            offload: true,
        }
    }

    /// Check the combination.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=vmf_mphw::hw::MAX_NODES).contains(&self.nodes) {
            return Err(format!("--nodes {} is outside 2..={}", self.nodes, vmf_mphw::hw::MAX_NODES));
        }
        if !(68..=65_521).contains(&self.mtu) {
            return Err(format!("--mtu {} is outside 68..=65521", self.mtu));
        }
        if !(1..=vmf_mphw::hw::MAX_SLOTS).contains(&self.hw.slots) || !self.hw.slots.is_power_of_two() {
            return Err(format!("--slots {} is not a power of two in 1..={}", self.hw.slots, vmf_mphw::hw::MAX_SLOTS));
        }
        for &(a, b) in &self.hw.broken {
            if a >= self.nodes || b >= self.nodes {
                return Err(format!("--broken-links {a}-{b} names a node outside 0..{}", self.nodes));
            }
        }
        for (i, hops) in self.next_hops.iter().enumerate() {
            if let Some(h) = hops.iter().find(|&&h| h >= self.nodes) {
                return Err(format!("--vlb-next-hops for node {i} names node {h}, outside 0..{}", self.nodes));
            }
        }
        if let (Some(s), _) | (_, Some(s)) = (self.nic.log_source.filter(|&s| s >= self.nodes), self.nic.log_target.filter(|&t| t >= self.nodes)) {
            return Err(format!("--log-source/--log-target {s} is outside 0..{}", self.nodes));
        }
        if let Topology::Mesh { width } = self.hw.topology {
            if width > self.nodes {
                return Err(format!("--topology mesh:{width} is wider than {} nodes", self.nodes));
            }
        }
        Ok(())
    }

    fn to_json(&self) -> Value {
        let n = &self.nic;
        json!({
            "nodes": self.nodes,
            "mtu": self.mtu,
            "unidirectional": self.hw.mode == Mode::Unidirectional,
            "signal_cost_ns": self.hw.signal_cost_ns,
            "slots": self.hw.slots,
            "byte_cost_ps": self.hw.byte_cost_ps,
            "irq_cost_ns": self.hw.irq_cost_ns,
            "topology": match self.hw.topology { Topology::Full => "full".to_string(), Topology::Ring => "ring".into(), Topology::Mesh { width } => format!("mesh:{width}") },
            "hop_cost_ns": self.hw.hop_cost_ns,
            "broken_links": self.hw.broken.iter().map(|&(a, b)| format!("{a}-{b}")).collect::<Vec<_>>().join(","),
            "queue_size": n.queue_size,
            "max_tx_retries": n.max_tx_retries,
            "extra_signal_every": n.extra_signal_every,
            "vlb": n.vlb,
            "vlb_time_to_live": n.vlb_time_to_live,
            "vlb_randomize": n.vlb_randomize,
            "vlb_max_evade_ratio": n.vlb_max_evade_ratio,
            "vlb_max_foreigners": n.vlb_max_foreigners,
            "vlb_reduce_interrupts": n.vlb_reduce_interrupts,
            "vlb_next_hops": self.next_hops,
            "vlb_debug": n.vlb_debug,
            "vlb_evade_free_slot": n.vlb_evade_free_slot,
            "log_source": n.log_source,
            "log_target": n.log_target,
            "offload": self.offload,
        })
    }

    fn from_json(v: &Value) -> Result<VnicConfig, String> {
        let u = |k: &str| v[k].as_u64().ok_or_else(|| format!("state: '{k}' missing"));
        let b = |k: &str| v[k].as_bool().unwrap_or(false);
        let nodes = u("nodes")? as usize;
        let mut c = VnicConfig::new(nodes);
        c.mtu = u("mtu")? as usize;
        c.hw.mode = if b("unidirectional") { Mode::Unidirectional } else { Mode::Bidirectional };
        c.hw.signal_cost_ns = u("signal_cost_ns")?;
        c.hw.slots = v["slots"].as_u64().unwrap_or(1) as usize;
        c.hw.byte_cost_ps = u("byte_cost_ps")?;
        c.hw.irq_cost_ns = v["irq_cost_ns"].as_u64().unwrap_or(0);
        c.hw.topology = Topology::parse(v["topology"].as_str().unwrap_or("full"))?;
        c.hw.hop_cost_ns = u("hop_cost_ns")?;
        c.hw.broken = vmf_mphw::hw::parse_links(v["broken_links"].as_str().unwrap_or(""))?;
        c.nic.queue_size = u("queue_size")? as usize;
        c.nic.max_tx_retries = u("max_tx_retries")?;
        c.nic.extra_signal_every = u("extra_signal_every")?;
        c.nic.vlb = b("vlb");
        c.nic.vlb_time_to_live = u("vlb_time_to_live")? as u8;
        c.nic.vlb_randomize = b("vlb_randomize");
        c.nic.vlb_max_evade_ratio = u("vlb_max_evade_ratio")?;
        c.nic.vlb_max_foreigners = u("vlb_max_foreigners")?;
        c.nic.vlb_reduce_interrupts = b("vlb_reduce_interrupts");
        c.nic.vlb_debug = b("vlb_debug");
        c.nic.vlb_evade_free_slot = b("vlb_evade_free_slot");
        c.nic.log_source = v["log_source"].as_u64().map(|x| x as usize);
        c.nic.log_target = v["log_target"].as_u64().map(|x| x as usize);
        c.next_hops = serde_json::from_value(v["vlb_next_hops"].clone()).map_err(|e| format!("state: {e}"))?;
        c.offload = v["offload"].as_bool().unwrap_or(true);
        c.validate()?;
        Ok(c)
    }

    /// Largest frame the stack hands over: Ethernet header and MTU, or with offload a 64 KiB segment and
    /// its virtio-net header.
    pub fn frame_max(&self) -> usize {
        if self.offload {
            tap::VNET_HDR + ETH + 65_536
        } else {
            ETH + self.mtu
        }
    }

    fn hw_config(&self) -> HwConfig {
        let mut h = self.hw.clone();
        h.nodes = self.nodes;
        h.buffer_size = self.frame_max() + vmf_mphw::HEADER;
        h
    }

    fn nic_options(&self, node: usize) -> NicOptions {
        let mut o = self.nic.clone();
        o.mtu = self.frame_max();
        o.vlb_next_hops = self.next_hops.get(node).cloned().unwrap_or_default();
        o
    }
}

/// Parse `--vlb-next-hops`: `a,b,c` (every node) or `i=a,b;j=c` (per node).
pub fn parse_next_hops(s: &str, nodes: usize) -> Result<Vec<Vec<usize>>, String> {
    let list = |t: &str| -> Result<Vec<usize>, String> {
        t.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.trim().parse::<usize>().map_err(|_| format!("--vlb-next-hops: '{x}' is not a node")))
            .collect()
    };
    if !s.contains('=') {
        let l = list(s)?;
        return Ok(vec![l; nodes]);
    }
    let mut out = vec![Vec::new(); nodes];
    for part in s.split(';').filter(|p| !p.is_empty()) {
        let (i, l) = part
            .split_once('=')
            .ok_or_else(|| format!("--vlb-next-hops: '{part}' is not NODE=LIST"))?;
        let i: usize = i.trim().parse().map_err(|_| format!("--vlb-next-hops: '{i}' is not a node"))?;
        if i >= nodes {
            return Err(format!("--vlb-next-hops: node {i} is outside 0..{nodes}"));
        }
        out[i] = list(l)?;
    }
    Ok(out)
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("'{}' failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn read_state() -> Option<Value> {
    let t = std::fs::read_to_string(state_dir().join("state.json")).ok()?;
    serde_json::from_str(&t).ok()
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

/// Whether `pid` is one of our node daemons (not a later process that got its pid) and not a zombie.
fn is_daemon(pid: i32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    let ours = args.windows(2).any(|w| w[0] == b"vnic" && w[1] == b"node");
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(true);
    ours && !zombie && pid_alive(pid)
}

/// The running configuration and daemon pids, if the vnic is up.
pub fn running() -> Option<(VnicConfig, Vec<i32>)> {
    let s = read_state()?;
    let cfg = VnicConfig::from_json(&s["config"]).ok()?;
    let pids: Vec<i32> = s["pids"].as_array()?.iter().filter_map(|p| p.as_i64().map(|x| x as i32)).collect();
    pids.iter().any(|&p| is_daemon(p)).then_some((cfg, pids))
}

/// Namespaces named like ours (`vnic` followed by digits).
fn our_namespaces() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.strip_prefix("vnic").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Create the namespaces, the region and the node daemons (`exe` is the vmfabric binary, started as
/// `exe vnic node --index I`), and return once every node answers a ping from node 0.
pub fn up(cfg: &VnicConfig, exe: &Path) -> Result<(), String> {
    cfg.validate()?;
    if let Some((c, _)) = running() {
        return Err(format!("a vnic of {} nodes is already up; run 'vmfabric vnic down' first", c.nodes));
    }
    down(false)?;
    let dir = state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Hw::create(&region_path(), &cfg.hw_config()).map_err(|e| e.to_string())?;
    let write_state = |pids: &[i32]| -> Result<(), String> {
        let s = json!({"config": cfg.to_json(), "region": region_path(), "pids": pids});
        // Whole or not at all: daemons read it while we add their pids.
        let tmp = dir.join("state.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(&s).unwrap())
            .and_then(|()| std::fs::rename(&tmp, dir.join("state.json")))
            .map_err(|e| format!("cannot write state: {e}"))
    };
    write_state(&[])?;
    let mut pids = Vec::new();
    let mut children = Vec::new();
    let fail = |why: String, pids: &[i32]| -> Result<(), String> {
        for &p in pids {
            // SAFETY: our own daemons.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        let _ = down(false);
        Err(why)
    };
    for i in 0..cfg.nodes {
        if let Err(e) = sh(&["ip", "netns", "add", &netns(i)]) {
            return fail(e, &pids);
        }
        let log = match std::fs::File::create(dir.join(format!("node{i}.log"))).and_then(|l| Ok((l.try_clone()?, l))) {
            Ok(l) => l,
            Err(e) => return fail(format!("cannot create node {i}'s log: {e}"), &pids),
        };
        let mut cmd = Command::new(exe);
        cmd.args(["vnic", "node", "--index", &i.to_string()])
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1);
        // SAFETY: setsid in the child before exec; async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(c) => {
                pids.push(c.id() as i32);
                children.push(c);
            }
            Err(e) => return fail(format!("cannot start the node daemon: {e}"), &pids),
        }
        if let Err(e) = write_state(&pids) {
            return fail(e, &pids);
        }
    }
    // Wait for every daemon's ready mark.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, child) in children.iter_mut().enumerate() {
        while !dir.join(format!("node{i}.ready")).exists() {
            let exited = !matches!(child.try_wait(), Ok(None));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join(format!("node{i}.log"))).unwrap_or_default();
                return fail(format!("node {i} did not come up: {}", log.trim()), &pids);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // Traffic: node 0 pings every other node (ARP through the broadcast path first).
    for j in 1..cfg.nodes {
        let mut ok = false;
        for _ in 0..5 {
            if sh(&["ip", "netns", "exec", &netns(0), "ping", "-c", "1", "-W", "2", "-q", &address(j)]).is_ok() {
                ok = true;
                break;
            }
        }
        if !ok {
            return fail(format!("node 0 cannot reach node {j} ({}) over {IFNAME}", address(j)), &pids);
        }
    }
    Ok(())
}

/// Stop the daemons, print their performance values (as the module did on unload) when `report`, and
/// remove the namespaces, the region and the state. Works after a crash too: whatever exists goes.
pub fn down(report: bool) -> Result<(), String> {
    let state = read_state();
    if report {
        if let Ok(t) = stats_text(false) {
            print!("{t}");
        }
    }
    if let Some(s) = &state {
        let pids: Vec<i32> = s["pids"].as_array().map(|a| a.iter().filter_map(|p| p.as_i64().map(|x| x as i32)).collect()).unwrap_or_default();
        let pids: Vec<i32> = pids.into_iter().filter(|&p| is_daemon(p)).collect();
        for &p in &pids {
            // SAFETY: daemons we started (recorded in our state file, checked by their command line).
            unsafe { libc::kill(p, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while pids.iter().any(|&p| is_daemon(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for &p in &pids {
            if is_daemon(p) {
                // SAFETY: as above.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }
    let mut errs = Vec::new();
    for ns in our_namespaces() {
        if let Err(e) = sh(&["ip", "netns", "del", &ns]) {
            errs.push(e);
        }
    }
    let _ = std::fs::remove_file(region_path());
    let _ = std::fs::remove_dir_all(state_dir());
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// Snapshots of every node's performance values.
pub fn snapshots() -> Result<Vec<Snapshot>, String> {
    let hw = Hw::open(&region_path()).map_err(|e| format!("no vnic is up ({e})"))?;
    Ok((0..hw.nodes()).map(|i| Snapshot::read(&hw, i)).collect())
}

/// The performance values as JSON: `{"nodes": [{"node": 0, "up": true, "AllocatedPackets_Max": ..}, ..],
/// "total": {..}}` (totals sum counts, take maxima of maxima and recompute averages).
pub fn stats_json() -> Result<Value, String> {
    let snaps = snapshots()?;
    let nodes: Vec<Value> = snaps
        .iter()
        .map(|s| {
            let mut m = serde_json::Map::new();
            m.insert("node".into(), json!(s.node));
            m.insert("up".into(), json!(s.up));
            for &(k, v) in &s.values {
                m.insert(k.into(), json!(v));
            }
            Value::Object(m)
        })
        .collect();
    Ok(json!({"nodes": nodes, "total": totals(&snaps)}))
}

fn totals(snaps: &[Snapshot]) -> Value {
    let mut m = serde_json::Map::new();
    let names = vmf_mphw::NAMES.iter().chain(vmf_mphw::EXTRA_NAMES.iter());
    for &name in names {
        let vals = snaps.iter().map(|s| s.get(name).unwrap_or(0.0));
        let v = if name.contains("Max") || name.contains("Longest") || name == "MaximumPacketSize" || name == "MaximumTxRetries" {
            vals.fold(0.0, f64::max)
        } else if name == "MinimumPacketSize" {
            vals.filter(|&v| v > 0.0).fold(f64::INFINITY, f64::min)
        } else {
            vals.sum()
        };
        m.insert(name.into(), json!(if v.is_finite() { v } else { 0.0 }));
    }
    let get = |m: &serde_json::Map<String, Value>, k: &str| m[k].as_f64().unwrap_or(0.0);
    let tx = get(&m, "tx_packets");
    m.insert("AveragePacketSize".into(), json!(if tx > 0.0 { get(&m, "tx_bytes") / tx } else { 0.0 }));
    let irq_pk: f64 = snaps.iter().map(|s| s.get("VLB_AveragePacketsPerIRQ").unwrap_or(0.0) * s.get("IRQs").unwrap_or(0.0)).sum();
    let irqs = get(&m, "IRQs");
    m.insert("VLB_AveragePacketsPerIRQ".into(), json!(if irqs > 0.0 { irq_pk / irqs } else { 0.0 }));
    Value::Object(m)
}

/// The performance values as a table: one row per value, one column per node, and a total column.
pub fn stats_text(clear: bool) -> Result<String, String> {
    let snaps = snapshots()?;
    let total = totals(&snaps);
    let mut out = String::new();
    if clear {
        out.push_str("\x1b[H\x1b[2J");
    }
    out.push_str(&format!("{:<26}", "performance value"));
    for s in &snaps {
        out.push_str(&format!("{:>12}", format!("node{}{}", s.node, if s.up { "" } else { "(down)" })));
    }
    out.push_str(&format!("{:>14}\n", "total"));
    for &name in vmf_mphw::NAMES.iter().chain(vmf_mphw::EXTRA_NAMES.iter()) {
        out.push_str(&format!("{name:<26}"));
        let fmt = |v: f64| if v.fract() == 0.0 { format!("{v}") } else { format!("{v:.2}") };
        for s in &snaps {
            out.push_str(&format!("{:>12}", fmt(s.get(name).unwrap_or(0.0))));
        }
        out.push_str(&format!("{:>14}\n", fmt(total[name].as_f64().unwrap_or(0.0))));
    }
    Ok(out)
}

fn node_of(dst: &[u8], nodes: usize) -> Option<usize> {
    (dst[..5] == MAC_PREFIX && (dst[5] as usize) < nodes).then_some(dst[5] as usize)
}

/// The daemon of node `index` (`vmfabric vnic node`): enter the namespace, create and configure `smn0`,
/// attach to the hardware, then move frames until killed.
pub fn run_node(index: usize) -> Result<(), String> {
    let state = read_state().ok_or("no vnic state: start nodes with 'vmfabric vnic up'")?;
    let cfg = VnicConfig::from_json(&state["config"])?;
    if index >= cfg.nodes {
        return Err(format!("node {index} is outside 0..{}", cfg.nodes));
    }
    let ns = std::fs::File::open(format!("/run/netns/{}", netns(index)))
        .map_err(|e| format!("cannot open namespace {}: {e}", netns(index)))?;
    // SAFETY: setns on a namespace file we opened, before any thread is started.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("cannot enter namespace {}: {}", netns(index), std::io::Error::last_os_error()));
    }
    let tap = Arc::new(tap::Tap::open(IFNAME, cfg.offload).map_err(|e| format!("cannot create {IFNAME}: {e}"))?);
    sh(&["ip", "link", "set", "lo", "up"])?;
    sh(&["ip", "link", "set", IFNAME, "address", &mac_text(mac(index)), "mtu", &cfg.mtu.to_string()])?;
    sh(&["ip", "addr", "add", &format!("{}/24", address(index)), "dev", IFNAME])?;
    sh(&["ip", "link", "set", IFNAME, "up"])?;
    let hw = Hw::open(&region_path()).map_err(|e| e.to_string())?;
    let nic = Nic::new(hw.port(index).map_err(|e| e.to_string())?, cfg.nic_options(index))?;
    let nic = Arc::new(Mutex::new(nic));
    let nodes = cfg.nodes;
    let eth_at = if cfg.offload { tap::VNET_HDR } else { 0 };
    // Transmit: frames from the stack to the hardware. The frame is read straight into the buffer of the
    // node the previous unicast frame went to when that buffer is free (one copy, by the kernel, instead of
    // two); a frame for another node, or broadcast, is then sent on from there like any other. The engine
    // is not held while the kernel copies (the buffer is held for us instead), so the receive thread
    // delivers frames meanwhile.
    tap.set_nonblocking().map_err(|e| format!("cannot make {IFNAME} non-blocking: {e}"))?;
    let tx = {
        let (tap, nic) = (tap.clone(), nic.clone());
        std::thread::Builder::new()
            .name(format!("smn{index}-tx"))
            .spawn(move || {
                let mut buf = vec![0u8; 65_536 + ETH + tap::VNET_HDR];
                let mut guess = (index + 1) % nodes;
                let mtu = nic.lock().unwrap().options().mtu;
                loop {
                    let room = nic.lock().unwrap().hold(guess);
                    let (ptr, cap) = match room {
                        Some(p) => (p, mtu),
                        None => (buf.as_mut_ptr(), buf.len()),
                    };
                    // SAFETY: `ptr` is either our held hardware room (mtu bytes, ours until commit or
                    // let_go, whoever else uses the engine meanwhile) or the local buffer; both writable
                    // for `cap` bytes.
                    let read = unsafe { tap.read_into(ptr, cap) };
                    let mut nic = nic.lock().unwrap();
                    let n = match read {
                        Ok(n) if n >= eth_at + ETH => n,
                        Ok(_) => {
                            if room.is_some() {
                                nic.let_go(guess);
                            }
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if room.is_some() {
                                nic.let_go(guess);
                            }
                            nic.poll_tx();
                            drop(nic);
                            tap.wait_readable(100);
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                            if room.is_some() {
                                nic.let_go(guess);
                            }
                            continue;
                        }
                        Err(e) => {
                            eprintln!("smn{index}: read from {IFNAME}: {e}");
                            std::process::exit(1);
                        }
                    };
                    // SAFETY: `n` bytes were just read there.
                    let frame = unsafe { std::slice::from_raw_parts(ptr, n) };
                    let dst = &frame[eth_at..eth_at + 6];
                    let to = if dst[0] & 1 != 0 { None } else { node_of(dst, nodes).filter(|&d| d != index) };
                    if room.is_some() && to == Some(guess) {
                        nic.commit(guess, n);
                    } else {
                        // From the room (an uncommitted buffer of ours, which a send may overwrite: copy it
                        // first; rare, the destination changed) or from the local buffer.
                        let owned;
                        let frame: &[u8] = if room.is_some() {
                            owned = frame.to_vec();
                            nic.let_go(guess);
                            &owned
                        } else {
                            frame
                        };
                        match to {
                            Some(d) => {
                                nic.send(d, frame);
                                guess = d;
                            }
                            None if dst[0] & 1 != 0 => nic.broadcast(frame),
                            None => {}
                        }
                    }
                    nic.poll_tx();
                }
            })
            .map_err(|e| e.to_string())?
    };
    std::fs::write(state_dir().join(format!("node{index}.ready")), b"")
        .map_err(|e| format!("cannot mark ready: {e}"))?;
    // Receive: the "interrupt handler" — sleep on the doorbell, then take every full buffer. Frames are
    // written to the TAP from the hardware buffers without holding the engine (the transmit thread uses it
    // meanwhile), and the buffers released after.
    let port_hw = hw.clone();
    let (mut local, mut done) = (Vec::with_capacity(nodes), Vec::with_capacity(nodes));
    loop {
        let bell = port_hw.doorbell(index);
        let taken = nic.lock().unwrap().take_local(&mut local);
        done.extend(local.iter().map(|l| tap.write(l.payload()).is_ok()));
        let queued = {
            let mut nic = nic.lock().unwrap();
            for (l, ok) in local.drain(..).zip(done.drain(..)) {
                nic.finish_local(l, ok);
            }
            nic.poll_tx();
            nic.queued()
        };
        if tx.is_finished() {
            return Err("the transmit thread stopped".into());
        }
        if taken > 0 {
            continue;
        }
        if queued > 0 {
            std::thread::yield_now();
            continue;
        }
        // A 1 ms tick bounds the delay of packets forwarded without a signal (vlb_reduce_interrupts).
        if port_hw.wait_doorbell(index, bell, Duration::from_millis(1)) {
            nic.lock().unwrap().irq();
        }
    }
}
