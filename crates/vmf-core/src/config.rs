//! Tunables: declared once (name, default, one-line doc), read from `VMF_<NAME>` environment variables,
//! listed by `vmfabric info`.
use std::collections::BTreeMap;
use thiserror::Error;

/// A declared tunable.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Name without the `VMF_` prefix.
    pub name: &'static str,
    /// Default value (as text).
    pub default: &'static str,
    /// One-line description.
    pub doc: &'static str,
}

/// Every tunable of the fabric.
pub const PARAMS: &[Param] = &[
    Param { name: "REGION_DIR", default: "/dev/shm", doc: "directory that holds each host's shared region file" },
    Param { name: "REGION_PATH", default: "", doc: "existing mappable file or device to use as the region (e.g. an ivshmem BAR /sys/bus/pci/devices/*/resource2); empty: inside a VM with an ivshmem device (see IVSHMEM) its BAR 2, else a file in REGION_DIR" },
    Param { name: "IVSHMEM", default: "1", doc: "1: when REGION_PATH is empty and this machine (a VM) has an ivshmem PCI device (1af4:1110), use its BAR 2 as the region, so ranks in VMs sharing the device talk through it; 0: ignore ivshmem devices" },
    Param { name: "SHM_EAGER_LIMIT", default: "auto", doc: "largest message (bytes) copied through the ring; larger ones use rendezvous; auto: this host's calibration (see CALIBRATION), else 64K" },
    Param { name: "SHM_RING_SIZE", default: "1M", doc: "largest ring (bytes) per ordered pair of co-resident ranks; shrunk to fit SHM_BUDGET" },
    Param { name: "SHM_BUDGET", default: "48M", doc: "ring memory per host region (bytes); rings get min(SHM_RING_SIZE, budget / pairs), at least 64K (pairs of the ranks sharing the region; where ranks can move between regions, of a full region)" },
    Param { name: "SHM_DUPLEX", default: "1", doc: "1: besides the rings, each pair of co-resident ranks shares one duplex box (a 128-byte area written in turn) that carries packets up to 104 bytes, so a request and its reply share one cache line; jobs on emulated hosts (where ranks can migrate) never use it; every rank must agree" },
    Param { name: "SHM_CMA", default: "1", doc: "1: large messages by a single process_vm_readv copy where the kernel allows; 0: pipelined copy through the region (the path between VMs)" },
    Param { name: "SHM_CMA_MIN", default: "auto", doc: "smallest rendezvous message (bytes) moved by single copy (process_vm_readv) when SHM_CMA=1, smaller ones by the pipelined copy; auto: every rendezvous message when this host's ranks outnumber its CPUs, else the protocol per size that this host's calibration measured fastest (pipelined, receiver-side or sender-side single copy), else pipelined" },
    Param { name: "SHM_CHUNK", default: "auto", doc: "chunk size (bytes) of the pipelined rendezvous copy; auto: this host's calibration, else 64K" },
    Param { name: "CALIBRATION", default: "auto", doc: "cache of this host's large-message calibration (`vmfabric info --calibrate`; `vmfabric run` makes it when missing): auto: $XDG_CACHE_HOME/vmfabric/calibration-<host>.json (else ~/.cache/..., else /tmp/vmfabric-<uid>/...); off: none (built-in defaults); else a file path" },
    Param { name: "SHM", default: "1", doc: "1: co-resident ranks talk through shared memory; 0: over TCP too (to measure or test TCP on one host)" },
    Param { name: "TCP", default: "1", doc: "1: reach ranks that share no region over TCP; 0: shared memory only" },
    Param { name: "TRANSPORT", default: "auto", doc: "auto: shared memory between co-resident ranks, TCP between hosts; mphw: every pair of ranks over the emulated message-passing hardware (003_*, docs/mphw.md; one host, at most 64 ranks; VMF_MPHW_* set its options)" },
    Param { name: "TCP_ADDR", default: "auto", doc: "address this rank listens on and publishes; auto: the first non-loopback IPv4 address of this host, else 127.0.0.1" },
    Param { name: "TCP_EAGER_LIMIT", default: "64K", doc: "largest message (bytes) sent eagerly over TCP; larger ones use rendezvous and are read straight into the receive buffer" },
    Param { name: "TCP_CHUNK", default: "1M", doc: "bytes per data frame of a TCP rendezvous (written straight from the send buffer; read through the connection's buffer, or straight into the receive buffer with TCP_DIRECT=1)" },
    Param { name: "TCP_DIRECT", default: "0", doc: "1: read TCP rendezvous data straight into the receive buffer; 0: through the connection's buffer and one copy (measured 1.2-1.4x the bandwidth on loopback and between emulated hosts, see docs/transports/tcp.md)" },
    Param { name: "TCP_HANDSHAKE_MS", default: "2000", doc: "an incoming TCP connection that has not authenticated within this many milliseconds is closed" },
    Param { name: "MIG_TRACE", default: "0", doc: "1: print every step of live migrations (Moved, MovedAck, Ready, TCP connections made and retired) to stderr, with CLOCK_MONOTONIC times, to diagnose a migration" },
    Param { name: "TCP_PENDING_MAX", default: "64", doc: "at most this many incoming TCP connections authenticate at once per rank; more are closed at once" },
    Param { name: "SHM_POOL", default: "16M", doc: "shared pool (bytes) per co-resident rank, for MPI_Alloc_mem (large sends from it are copied by the receiver straight out of the region) and shared-memory collectives; 0: none" },
    Param { name: "SHM_COLL", default: "1", doc: "1: small blocking MPI collectives among ranks of one region go through per-communicator areas of the shared pool; 0: always point-to-point schedules" },
    Param { name: "SHM_MAX_LOCAL", default: "256", doc: "most ranks that may share one region" },
    Param { name: "WAIT", default: "adaptive", doc: "how a rank waits: spin (poll), yield (poll, then sched_yield), block (poll briefly, then sleep until a message arrives), adaptive (spin budget learnt from observed waits and cores per rank, then yield if oversubscribed, then sleep)" },
    Param { name: "WAIT_SPIN_MAX_US", default: "1000", doc: "adaptive: longest spin (microseconds) when every rank of the host has a core (the learnt budget stays between 200 us and this)" },
    Param { name: "GANG_SLICE_US", default: "5000", doc: "adaptive: when vmfabric jobs on this machine together have more ranks than CPUs, they take turns with the CPUs in slices of this many microseconds (a rank waiting in another job's slice sleeps until its own; registry /dev/shm/vmf-gang-<uid>); 0: never" },
    Param { name: "WAIT_YIELD_US", default: "50", doc: "adaptive, when ranks outnumber cores: time (microseconds) spent yielding before sleeping" },
    Param { name: "SPIN_COUNT", default: "100", doc: "yield policy: idle polls before the first sched_yield" },
    Param { name: "BIND", default: "auto", doc: "CPU binding of each rank: auto (pin the ranks of a region to its CPUs in blocks when they outnumber them, so that waiting ranks know which peers share their CPU), core (always pin, one CPU each while there are enough), none (leave the affinity alone)" },
    Param { name: "WAIT_PEER_SPIN_US", default: "20", doc: "adaptive, when ranks outnumber cores and are pinned: longest spin (microseconds) for peers pinned to other CPUs before yielding" },
    Param { name: "HOST_CPUS", default: "auto", doc: "CPUs available to this host's ranks (set by the launcher); auto: this process's affinity mask" },
    Param { name: "MACHINE_RANKS", default: "auto", doc: "ranks of the job that share this machine's CPUs, whatever transport joins them (set by vmfabric run, which starts every rank here, emulated hosts included); auto: the ranks sharing this rank's region" },
    Param { name: "INIT_TIMEOUT", default: "30", doc: "seconds to wait for the region to be initialised by another rank" },
    Param { name: "LIVENESS_MS", default: "100", doc: "while waiting, check co-resident peers for death every this many milliseconds" },
    Param { name: "RMA_MEMFD", default: "1", doc: "1: one-sided windows' node segments are memfds co-resident ranks map through pidfd_getfd (one kernel); 0: blocks of the region's pool, as between VMs that share only the region" },
    Param { name: "RMA_SHARE_CREATE_MAX", default: "256M", doc: "MPI_Win_create and MPI_Win_attach on memory of the program's own, up to this many bytes: its whole pages move into a memfd at the same addresses (contents kept; private again at MPI_Win_free), so co-resident ranks reach them with loads and stores instead of a system call per access; 0: never" },
    Param { name: "RMA_COPY_SHARE_MIN", default: "64K", doc: "one-sided puts and gets of at least this many bytes to memory mapped here are copied by the origin and a helper thread together, each taking chunks while any are left (the emulated DMA engine; MPI_Put/MPI_Get complete at the next flush, unlock, fence or complete, other operations on return), when this host's ranks do not outnumber its CPUs and the rank may run on more than one; the helper polls 50 us after its last chunk, then sleeps; 0: never" },
    Param { name: "RMA_AGENT_SPIN_US", default: "50", doc: "one-sided agent (the thread serving operations that arrive over TCP): time (microseconds) it keeps polling after serving before it sleeps; origins poll their answers at least this long too" },
    Param { name: "VERBOSE", default: "0", doc: "1: print setup decisions (region, channels, protocols) to stderr" },
];

/// How ranks are bound to CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Pin the ranks of a region in blocks when they outnumber its CPUs; otherwise leave them alone.
    Auto,
    /// Always pin (one CPU each while there are enough, blocks of consecutive ranks when not).
    Core,
    /// Never change the affinity.
    None,
}

impl Bind {
    /// Name as accepted by `VMF_BIND`.
    pub fn name(self) -> &'static str {
        match self {
            Bind::Auto => "auto",
            Bind::Core => "core",
            Bind::None => "none",
        }
    }
}

/// How a waiting rank uses the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Poll all channels continuously.
    Spin,
    /// Poll, then `sched_yield` between polls.
    Yield,
    /// Poll briefly, then sleep until a message arrives.
    Block,
    /// Spin for a budget learnt from observed waits; yield when ranks outnumber cores; then sleep.
    Adaptive,
}

impl WaitPolicy {
    /// Name as accepted by `VMF_WAIT`.
    pub fn name(self) -> &'static str {
        match self {
            WaitPolicy::Spin => "spin",
            WaitPolicy::Yield => "yield",
            WaitPolicy::Block => "block",
            WaitPolicy::Adaptive => "adaptive",
        }
    }
}

/// A tunable value that could not be parsed.
#[derive(Debug, Error)]
#[error("Unable to read VMF_{name}={value:?} since {why}")]
pub struct ConfigError {
    /// Tunable name.
    pub name: &'static str,
    /// The value given.
    pub value: String,
    /// Why it was rejected.
    pub why: String,
}

/// Effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    values: BTreeMap<&'static str, String>,
    /// REGION_DIR.
    pub region_dir: String,
    /// REGION_PATH (after IVSHMEM discovery: the BAR found, if any).
    pub region_path: String,
    /// IVSHMEM.
    pub ivshmem: bool,
    /// SHM_EAGER_LIMIT (None = auto).
    pub shm_eager_limit: Option<usize>,
    /// SHM_RING_SIZE.
    pub shm_ring_size: u64,
    /// SHM_BUDGET.
    pub shm_budget: u64,
    /// SHM_CMA.
    pub shm_cma: bool,
    /// SHM_DUPLEX.
    pub shm_duplex: bool,
    /// SHM_CMA_MIN (None = auto).
    pub shm_cma_min: Option<usize>,
    /// SHM_CHUNK (None = auto).
    pub shm_chunk: Option<usize>,
    /// CALIBRATION (the setting).
    pub calibration: String,
    /// This host's calibrated large-message choices, read from the CALIBRATION cache by
    /// [`Config::from_env`] (never by [`Config::from_lookup`], so tests do not depend on the machine).
    pub large: Option<crate::calibrate::LargePath>,
    /// SHM_MAX_LOCAL.
    pub shm_max_local: u32,
    /// SHM_POOL.
    pub shm_pool: u64,
    /// SHM_COLL.
    pub shm_coll: bool,
    /// MIG_TRACE (read where the trace is printed; validated here).
    pub mig_trace: bool,
    /// SHM.
    pub shm: bool,
    /// TCP.
    pub tcp: bool,
    /// TRANSPORT=mphw: every pair over the emulated message-passing hardware.
    pub mphw: bool,
    /// TCP_ADDR (None = auto).
    pub tcp_addr: Option<std::net::IpAddr>,
    /// TCP_EAGER_LIMIT.
    pub tcp_eager_limit: usize,
    /// TCP_CHUNK.
    pub tcp_chunk: usize,
    /// TCP_DIRECT.
    pub tcp_direct: bool,
    /// TCP_HANDSHAKE_MS.
    pub tcp_handshake_ms: u64,
    /// TCP_PENDING_MAX.
    pub tcp_pending_max: usize,
    /// WAIT.
    pub wait: WaitPolicy,
    /// GANG_SLICE_US.
    pub gang_slice_us: u64,
    /// WAIT_SPIN_MAX_US.
    pub wait_spin_max_us: u64,
    /// WAIT_YIELD_US.
    pub wait_yield_us: u64,
    /// WAIT_PEER_SPIN_US.
    pub wait_peer_spin_us: u64,
    /// BIND.
    pub bind: Bind,
    /// SPIN_COUNT.
    pub spin_count: u32,
    /// HOST_CPUS (None = auto).
    pub host_cpus: Option<usize>,
    /// MACHINE_RANKS (None = auto).
    pub machine_ranks: Option<usize>,
    /// INIT_TIMEOUT.
    pub init_timeout_s: u64,
    /// LIVENESS_MS.
    pub liveness_ms: u64,
    /// RMA_MEMFD.
    pub rma_memfd: bool,
    /// RMA_SHARE_CREATE_MAX.
    pub rma_share_create_max: u64,
    /// RMA_COPY_SHARE_MIN (0: never).
    pub rma_copy_share_min: u64,
    /// RMA_AGENT_SPIN_US.
    pub rma_agent_spin_us: u64,
    /// VERBOSE.
    pub verbose: bool,
}

/// Parse a size with an optional K/M/G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

impl Config {
    /// Defaults overridden by `VMF_*` variables of this process.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut c = Self::from_lookup(|k| std::env::var(k).ok())?;
        c.large = crate::calibrate::cache_path(&c.calibration)
            .and_then(|p| crate::calibrate::load(&p))
            .map(|c| c.path);
        Ok(c)
    }

    /// Defaults overridden by `lookup("VMF_<NAME>")`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut values = BTreeMap::new();
        for p in PARAMS {
            let v = lookup(&format!("VMF_{}", p.name)).unwrap_or_else(|| p.default.to_owned());
            values.insert(p.name, v);
        }
        let get = |n: &'static str| values[n].clone();
        let size = |n: &'static str, min: u64, max: u64| -> Result<u64, ConfigError> {
            let v = get(n);
            match parse_size(&v) {
                Some(x) if x >= min && x <= max => Ok(x),
                Some(_) => Err(ConfigError {
                    name: n,
                    value: v,
                    why: format!("it is out of range ({min}..={max} bytes)"),
                }),
                None => Err(ConfigError {
                    name: n,
                    value: v,
                    why: "it is not a size (e.g. 65536, 64K, 1M)".into(),
                }),
            }
        };
        // A count or a duration in `unit` (seconds, milliseconds...): a plain whole number.
        let number = |n: &'static str, min: u64, max: u64, unit: &str| -> Result<u64, ConfigError> {
            let v = get(n);
            match v.trim().parse::<u64>() {
                Ok(x) if x >= min && x <= max => Ok(x),
                Ok(_) => Err(ConfigError {
                    name: n,
                    value: v,
                    why: format!("it is out of range ({min}..={max} {unit})"),
                }),
                Err(_) => Err(ConfigError {
                    name: n,
                    value: v,
                    why: format!("it is not a whole number of {unit} ({min}..={max})"),
                }),
            }
        };
        let flag = |n: &'static str| -> Result<bool, ConfigError> {
            match get(n).as_str() {
                "1" | "yes" | "true" | "on" => Ok(true),
                "0" | "no" | "false" | "off" | "" => Ok(false),
                _ => Err(ConfigError {
                    name: n,
                    value: get(n),
                    why: "it is not 0 or 1".into(),
                }),
            }
        };
        let ring = size("SHM_RING_SIZE", 64 << 10, 1 << 30)?;
        if !ring.is_power_of_two() {
            return Err(ConfigError {
                name: "SHM_RING_SIZE",
                value: get("SHM_RING_SIZE"),
                why: "it is not a power of two".into(),
            });
        }
        Ok(Config {
            region_dir: get("REGION_DIR"),
            region_path: get("REGION_PATH"),
            ivshmem: flag("IVSHMEM")?,
            shm_eager_limit: if get("SHM_EAGER_LIMIT") == "auto" {
                None
            } else {
                Some(size("SHM_EAGER_LIMIT", 0, 1 << 30)? as usize)
            },
            shm_ring_size: ring,
            shm_budget: size("SHM_BUDGET", 1 << 20, 1 << 40)?,
            shm_cma: flag("SHM_CMA")?,
            shm_duplex: flag("SHM_DUPLEX")?,
            shm_pool: size("SHM_POOL", 0, 1 << 40)?,
            shm_coll: flag("SHM_COLL")?,
            mig_trace: flag("MIG_TRACE")?,
            shm_cma_min: if get("SHM_CMA_MIN") == "auto" {
                None
            } else {
                Some(size("SHM_CMA_MIN", 0, u64::MAX >> 1)? as usize)
            },
            shm_chunk: if get("SHM_CHUNK") == "auto" {
                None
            } else {
                Some(size("SHM_CHUNK", 4096, 1 << 30)? as usize)
            },
            calibration: get("CALIBRATION"),
            large: None,
            shm_max_local: number("SHM_MAX_LOCAL", 1, 65536, "ranks")? as u32,
            shm: flag("SHM")?,
            tcp: flag("TCP")?,
            mphw: match get("TRANSPORT").as_str() {
                "auto" | "" => false,
                "mphw" => true,
                v => {
                    return Err(ConfigError {
                        name: "TRANSPORT",
                        value: v.into(),
                        why: "it is not auto or mphw".into(),
                    })
                }
            },
            tcp_addr: match get("TCP_ADDR").as_str() {
                "auto" | "" => None,
                v => Some(v.parse().map_err(|_| ConfigError {
                    name: "TCP_ADDR",
                    value: v.into(),
                    why: "it is not an IP address".into(),
                })?),
            },
            tcp_eager_limit: size("TCP_EAGER_LIMIT", 0, 64 << 20)? as usize,
            tcp_chunk: size("TCP_CHUNK", 4096, 1 << 30)? as usize,
            tcp_direct: flag("TCP_DIRECT")?,
            tcp_handshake_ms: number("TCP_HANDSHAKE_MS", 1, 600_000, "milliseconds")?,
            gang_slice_us: number("GANG_SLICE_US", 0, 1_000_000, "microseconds")?,
            tcp_pending_max: number("TCP_PENDING_MAX", 1, 65536, "connections")? as usize,
            wait: match get("WAIT").as_str() {
                "spin" => WaitPolicy::Spin,
                "yield" => WaitPolicy::Yield,
                "block" => WaitPolicy::Block,
                "adaptive" => WaitPolicy::Adaptive,
                _ => {
                    return Err(ConfigError {
                        name: "WAIT",
                        value: get("WAIT"),
                        why: "it is not spin, yield, block or adaptive".into(),
                    })
                }
            },
            wait_spin_max_us: number("WAIT_SPIN_MAX_US", 1, 10_000_000, "microseconds")?,
            wait_yield_us: number("WAIT_YIELD_US", 0, 10_000_000, "microseconds")?,
            wait_peer_spin_us: number("WAIT_PEER_SPIN_US", 0, 10_000_000, "microseconds")?,
            bind: match get("BIND").as_str() {
                "auto" => Bind::Auto,
                "core" => Bind::Core,
                "none" => Bind::None,
                _ => {
                    return Err(ConfigError {
                        name: "BIND",
                        value: get("BIND"),
                        why: "it is not auto, core or none".into(),
                    })
                }
            },
            spin_count: number("SPIN_COUNT", 0, u32::MAX as u64, "polls")? as u32,
            host_cpus: if get("HOST_CPUS") == "auto" {
                None
            } else {
                Some(number("HOST_CPUS", 1, 1 << 20, "CPUs")? as usize)
            },
            machine_ranks: if get("MACHINE_RANKS") == "auto" {
                None
            } else {
                Some(number("MACHINE_RANKS", 1, 1 << 24, "ranks")? as usize)
            },
            init_timeout_s: number("INIT_TIMEOUT", 1, 86400, "seconds")?,
            liveness_ms: number("LIVENESS_MS", 1, 60_000, "milliseconds")?,
            rma_memfd: flag("RMA_MEMFD")?,
            rma_share_create_max: size("RMA_SHARE_CREATE_MAX", 0, 1 << 40)?,
            rma_copy_share_min: size("RMA_COPY_SHARE_MIN", 0, 1 << 40)?,
            rma_agent_spin_us: number("RMA_AGENT_SPIN_US", 0, 10_000_000, "microseconds")?,
            verbose: flag("VERBOSE")?,
            values,
        })
    }

    /// (name, effective value, default, doc) of every tunable, in declaration order.
    pub fn effective(&self) -> Vec<(String, String, &'static str, &'static str)> {
        PARAMS
            .iter()
            .map(|p| {
                (
                    format!("VMF_{}", p.name),
                    self.values[p.name].clone(),
                    p.default,
                    p.doc,
                )
            })
            .collect()
    }

    /// Ring size for a host with `n_local` co-resident ranks.
    pub fn ring_size_for(&self, n_local: usize) -> u64 {
        let pairs = (n_local.max(2) * (n_local.max(2) - 1)) as u64;
        let fit = (self.shm_budget / pairs).max(64 << 10);
        let fit = 1u64 << (63 - fit.leading_zeros());
        fit.min(self.shm_ring_size).max(64 << 10)
    }

    /// The existing file or device to use as the region: `VMF_REGION_PATH` when set, else (with
    /// `VMF_IVSHMEM=1`) BAR 2 of this VM's first ivshmem device, else None (a file in REGION_DIR).
    pub fn region_device(&self) -> Option<std::path::PathBuf> {
        if !self.region_path.is_empty() {
            return Some(self.region_path.clone().into());
        }
        if self.ivshmem {
            return vmf_pal::pci::region_device().map(|d| d.bar2);
        }
        None
    }

    /// Largest TCP frame a connection buffers: eager messages and control, and rendezvous DATA frames
    /// unless they are read straight into the receive buffer (TCP_DIRECT).
    pub fn tcp_max_frame(&self) -> usize {
        let eager = self.tcp_eager_limit.max(64 << 10);
        (if self.tcp_direct { eager } else { eager.max(self.tcp_chunk) }) + 4096
    }

    /// Region sizing for a job of `job_size` ranks (the most that may share one region).
    pub fn region_sizing(&self, job_size: usize) -> vmf_transport::shm::region::RegionSizing {
        let n = (job_size as u64).clamp(1, self.shm_max_local as u64);
        let ring_ctl = vmf_bb::ring::RING_CTL_SIZE as u64;
        let pairs = n * n.saturating_sub(1);
        let heap = (0..=n as usize)
            .map(|k| (k * k.saturating_sub(1)) as u64 * (self.ring_size_for(k) + ring_ctl))
            .max()
            .unwrap_or(0)
            .max(pairs * ring_ctl + (1 << 16));
        vmf_transport::shm::region::RegionSizing {
            max_local: n as u32,
            heap,
            pool_per_slot: self.shm_pool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region where ranks come and go keeps every pair's ring: its heap must hold a ring of the size
    /// used there (`ring_size_for(max_local)`) for every ordered pair of slots. Sizes chosen by the ranks
    /// present at the time would not fit (8 slots: 42 rings of 1 MiB and 14 of 512 KiB overrun it).
    #[test]
    fn region_heap_holds_a_ring_for_every_pair_of_slots() {
        let c = Config::from_lookup(|_| None).unwrap();
        let ctl = vmf_bb::ring::RING_CTL_SIZE as u64;
        for n in 1..=64usize {
            let s = c.region_sizing(n);
            let m = s.max_local as u64;
            assert!(
                m * m.saturating_sub(1) * (c.ring_size_for(m as usize) + ctl) <= s.heap,
                "{n} ranks"
            );
        }
        let s = c.region_sizing(8);
        assert!(42 * (c.ring_size_for(7) + ctl) + 14 * (c.ring_size_for(8) + ctl) > s.heap);
    }

    #[test]
    fn defaults_parse_works() {
        let c = Config::from_lookup(|_| None).unwrap();
        assert_eq!(c.shm_ring_size, 1 << 20);
        assert_eq!(c.effective().len(), PARAMS.len());
        assert!(c
            .effective()
            .iter()
            .all(|(n, v, d, _)| n.starts_with("VMF_") && v == d));
    }

    #[test]
    fn bad_values_fail_with_name() {
        let e = Config::from_lookup(|k| (k == "VMF_SHM_RING_SIZE").then(|| "100000".into()))
            .unwrap_err();
        assert!(e.to_string().contains("VMF_SHM_RING_SIZE"), "{e}");
        assert!(Config::from_lookup(|k| (k == "VMF_SHM_CMA").then(|| "maybe".into())).is_err());
        assert!(Config::from_lookup(|k| (k == "VMF_SHM_CHUNK").then(|| "12Q".into())).is_err());
        assert!(
            Config::from_lookup(|k| (k == "VMF_SHM_CMA_MIN").then(|| "sometimes".into())).is_err()
        );
        let e = Config::from_lookup(|k| (k == "VMF_WAIT").then(|| "nap".into())).unwrap_err();
        assert!(e.to_string().contains("VMF_WAIT"), "{e}");
        let c = Config::from_lookup(|k| (k == "VMF_WAIT").then(|| "block".into())).unwrap();
        assert_eq!(c.wait, WaitPolicy::Block);
        let c = Config::from_lookup(|k| (k == "VMF_SHM_CMA_MIN").then(|| "1M".into())).unwrap();
        assert_eq!(c.shm_cma_min, Some(1 << 20));
    }

    #[test]
    fn region_for_16_ranks_fits_64_mib() {
        let c = Config::from_lookup(|_| None).unwrap();
        let s = c.region_sizing(16);
        // Rings and tables; the pool is clamped to the free space when the region is created.
        assert!(
            s.tables() + s.heap <= 64 << 20,
            "{} bytes",
            s.tables() + s.heap
        );
        assert_eq!(s.pool_per_slot, 16 << 20);
        assert!(c.ring_size_for(2) == 1 << 20);
        assert!(c.ring_size_for(16) >= 64 << 10);
    }

    #[test]
    fn counts_and_durations_say_what_they_are() {
        let e = Config::from_lookup(|k| (k == "VMF_INIT_TIMEOUT").then(|| "-1".into())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Unable to read VMF_INIT_TIMEOUT=\"-1\" since it is not a whole number of seconds (1..=86400)"
        );
        let e = Config::from_lookup(|k| (k == "VMF_LIVENESS_MS").then(|| "0".into())).unwrap_err();
        assert!(e.to_string().ends_with("it is out of range (1..=60000 milliseconds)"), "{e}");
        let e = Config::from_lookup(|k| (k == "VMF_SHM_CHUNK").then(|| "1K".into())).unwrap_err();
        assert!(e.to_string().ends_with("it is out of range (4096..=1073741824 bytes)"), "{e}");
        let c = Config::from_lookup(|k| (k == "VMF_INIT_TIMEOUT").then(|| " 90 ".into())).unwrap();
        assert_eq!(c.init_timeout_s, 90);
    }

    #[test]
    fn sizes_parse_works() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2m"), Some(2 << 20));
        assert_eq!(parse_size("x"), None);
    }
}
