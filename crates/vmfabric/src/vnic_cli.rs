//! `vmfabric vnic`: the virtual NIC over emulated message-passing hardware (issue 26; vmf-vnic).
use clap::{Args, Subcommand};
use std::time::Duration;
use vmf_mphw::{Mode, Topology};
use vmf_vnic::VnicConfig;

#[derive(Args)]
pub struct VnicArgs {
    #[command(subcommand)]
    cmd: VnicCmd,
}

/// 003_*'s module options (same names, dashes for underscores) and the hardware's parameters.
#[derive(Args, Clone, Debug)]
pub struct UpArgs {
    /// Nodes: namespaces vnic0.. each with smn0 at 10.77.0.{i+1}/24.
    #[arg(long)]
    pub nodes: usize,
    /// Interface MTU (the hardware's buffers hold one frame of it).
    #[arg(long, default_value_t = 1500)]
    pub mtu: usize,
    /// Packets the TxFIFO holds per target; more are dropped (tx_dropped).
    #[arg(long)]
    pub queue_size: Option<usize>,
    /// Fruitless TxFIFO rounds (at least 10 µs apart) before every queued packet is dropped.
    #[arg(long)]
    pub max_tx_retries: Option<u64>,
    /// Every this many fruitless rounds, signal the targets of queued packets again.
    #[arg(long)]
    pub extra_signal_every: Option<u64>,
    /// Valiant load balancing (sm_nic_vlb); implied by any --vlb-* option.
    #[arg(long)]
    pub vlb: bool,
    /// Evade hops a packet may make.
    #[arg(long)]
    pub vlb_time_to_live: Option<u8>,
    /// Scan evade nodes in random order.
    #[arg(long)]
    pub vlb_randomize: bool,
    /// Indirect packets per target between two direct ones.
    #[arg(long)]
    pub vlb_max_evade_ratio: Option<u64>,
    /// Foreign packets a node holds from each sender before refusing more.
    #[arg(long)]
    pub vlb_max_foreigners: Option<u64>,
    /// No signal for packets forwarded to their target.
    #[arg(long)]
    pub vlb_reduce_interrupts: bool,
    /// Allowed evade nodes: `a,b,c` for every node or `i=a,b;j=c` per node.
    #[arg(long)]
    pub vlb_next_hops: Option<String>,
    /// Log routing decisions (to /run/vmfabric-vnic/nodeI.log).
    #[arg(long)]
    pub vlb_debug: bool,
    /// Evade preferably to nodes whose own buffer at the destination is free (003_* §6.2.3).
    #[arg(long)]
    pub vlb_evade_free_slot: bool,
    /// Log every packet from this node.
    #[arg(long)]
    pub log_source: Option<usize>,
    /// Log every packet to this node.
    #[arg(long)]
    pub log_target: Option<usize>,
    /// Unidirectional status words (003_* §4.11, §6.2.4).
    #[arg(long)]
    pub unidirectional: bool,
    /// Buffers per link (a power of two up to 16): a sender fills the next while its target still holds
    /// the last packets, and a target woken once takes them all. 1 is 003_*'s hardware (every packet
    /// waits for its target to free the one buffer). Default 8, fewer where the region would pass 256 MiB.
    #[arg(long)]
    pub slots: Option<usize>,
    /// Emulated cost of a signal, ns.
    #[arg(long, default_value_t = 0)]
    pub signal_cost_ns: u64,
    /// Emulated cost of servicing a signal (an interrupt) at the receiving node, ns.
    #[arg(long, default_value_t = 0)]
    pub irq_cost_ns: u64,
    /// Emulated cost per byte, ps.
    #[arg(long, default_value_t = 0)]
    pub byte_cost_ps: u64,
    /// Topology for per-hop costs: full, ring, mesh:WIDTH (003_* §6.2.1).
    #[arg(long, default_value = "full")]
    pub topology: String,
    /// Emulated cost per hop beyond the first, ns.
    #[arg(long, default_value_t = 0)]
    pub hop_cost_ns: u64,
    /// No segmentation/checksum offload: every frame is at most MTU bytes, as with 003_*'s sm_nic
    /// (with offload, the default, TCP segments of up to 64 KiB cross the hardware whatever the MTU).
    #[arg(long)]
    pub no_offload: bool,
    /// Broken links `a-b,c-d` (003_* §6.2.2).
    #[arg(long, default_value = "")]
    pub broken_links: String,
}

impl UpArgs {
    pub fn config(&self) -> Result<VnicConfig, String> {
        let mut c = VnicConfig::new(self.nodes);
        c.mtu = self.mtu;
        c.offload = !self.no_offload;
        let n = &mut c.nic;
        if let Some(v) = self.queue_size {
            if v == 0 {
                return Err("--queue-size must be at least 1".into());
            }
            n.queue_size = v;
        }
        if let Some(v) = self.max_tx_retries {
            n.max_tx_retries = v.max(1);
        }
        if let Some(v) = self.extra_signal_every {
            n.extra_signal_every = v.max(1);
        }
        n.vlb = self.vlb
            || self.vlb_time_to_live.is_some()
            || self.vlb_randomize
            || self.vlb_max_evade_ratio.is_some()
            || self.vlb_max_foreigners.is_some()
            || self.vlb_reduce_interrupts
            || self.vlb_next_hops.is_some()
            || self.vlb_debug
            || self.vlb_evade_free_slot;
        if let Some(v) = self.vlb_time_to_live {
            n.vlb_time_to_live = v;
        }
        n.vlb_randomize = self.vlb_randomize;
        if let Some(v) = self.vlb_max_evade_ratio {
            n.vlb_max_evade_ratio = v;
        }
        if let Some(v) = self.vlb_max_foreigners {
            n.vlb_max_foreigners = v.max(1);
        }
        n.vlb_reduce_interrupts = self.vlb_reduce_interrupts;
        n.vlb_debug = self.vlb_debug;
        n.vlb_evade_free_slot = self.vlb_evade_free_slot;
        n.log_source = self.log_source;
        n.log_target = self.log_target;
        if let Some(s) = &self.vlb_next_hops {
            c.next_hops = vmf_vnic::parse_next_hops(s, self.nodes)?;
        }
        c.hw.mode = if self.unidirectional { Mode::Unidirectional } else { Mode::Bidirectional };
        c.hw.signal_cost_ns = self.signal_cost_ns;
        c.hw.slots = self.slots.unwrap_or(1);
        c.hw.byte_cost_ps = self.byte_cost_ps;
        c.hw.irq_cost_ns = self.irq_cost_ns;
        c.hw.topology = Topology::parse(&self.topology).map_err(|e| format!("--topology: {e}"))?;
        c.hw.hop_cost_ns = self.hop_cost_ns;
        c.hw.broken = vmf_mphw::hw::parse_links(&self.broken_links).map_err(|e| format!("--broken-links: {e}"))?;
        if self.slots.is_none() {
            c.hw.slots = vmf_vnic::default_slots(&c);
        }
        c.validate()?;
        Ok(c)
    }
}

#[derive(Subcommand)]
enum VnicCmd {
    /// Create namespaces vnic0..vnic{N-1} with smn0 at 10.77.0.{i+1}/24 over the emulated hardware;
    /// returns once every node answers a ping.
    Up(Box<UpArgs>),
    /// Run CMD in node I's namespace.
    Exec {
        /// The node.
        index: usize,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// The 25 performance values of 003_*'s Figure 32 (and a few more), per node and in total.
    Stats {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Refresh the table until interrupted.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// Seconds between refreshes with --watch.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Stop the nodes, print their performance values and remove everything (also after a crash).
    Down {
        /// Do not print the performance values.
        #[arg(long)]
        quiet: bool,
    },
    /// One node's daemon (started by `up`).
    #[command(hide = true)]
    Node {
        #[arg(long)]
        index: usize,
    },
}

fn fail(e: String) -> i32 {
    eprintln!("vmfabric vnic: {e}");
    1
}

pub fn run(a: VnicArgs) -> i32 {
    match a.cmd {
        VnicCmd::Up(u) => {
            let cfg = match u.config() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => return fail(format!("cannot find the vmfabric binary: {e}")),
            };
            match vmf_vnic::up(&cfg, &exe) {
                Ok(()) => {
                    println!(
                        "vnic up: {} nodes, namespaces vnic0..vnic{}, {} at 10.77.0.1..10.77.0.{}/24, mtu {}{}",
                        cfg.nodes,
                        cfg.nodes - 1,
                        vmf_vnic::IFNAME,
                        cfg.nodes,
                        cfg.mtu,
                        if cfg.nic.vlb { ", VLB on" } else { "" }
                    );
                    0
                }
                Err(e) => fail(e),
            }
        }
        VnicCmd::Exec { index, cmd } => {
            let Some((cfg, _)) = vmf_vnic::running() else {
                return fail("no vnic is up (run 'vmfabric vnic up --nodes N')".into());
            };
            if index >= cfg.nodes {
                return fail(format!("node {index} is outside 0..{}", cfg.nodes));
            }
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new("ip")
                .args(["netns", "exec", &vmf_vnic::netns(index)])
                .args(&cmd)
                .exec();
            fail(format!("cannot run ip netns exec: {e}"))
        }
        VnicCmd::Stats { json, watch, interval } => {
            if json {
                return match vmf_vnic::stats_json() {
                    Ok(v) => {
                        println!("{}", serde_json::to_string_pretty(&v).unwrap());
                        0
                    }
                    Err(e) => fail(e),
                };
            }
            if !(interval > 0.0 && interval.is_finite()) {
                return fail(format!("--interval {interval} must be a positive number of seconds"));
            }
            loop {
                match vmf_vnic::stats_text(watch) {
                    Ok(t) => print!("{t}"),
                    Err(e) => return fail(e),
                }
                if !watch {
                    return 0;
                }
                std::thread::sleep(Duration::from_secs_f64(interval));
            }
        }
        VnicCmd::Down { quiet } => match vmf_vnic::down(!quiet) {
            Ok(()) => {
                if !quiet {
                    println!("vnic down");
                }
                0
            }
            Err(e) => fail(e),
        },
        VnicCmd::Node { index } => match vmf_vnic::run_node(index) {
            Ok(()) => 0,
            Err(e) => fail(format!("node {index}: {e}")),
        },
    }
}
