//! `vmfabric vm`: jobs across real QEMU guests (issue 24; vmf-vm).
use clap::{Args, Subcommand};
use std::time::Duration;
use vmf_vm::cluster::{Cluster, ClusterOptions};
use vmf_vm::job::JobOptions;

#[derive(Args)]
pub struct VmArgs {
    #[command(subcommand)]
    cmd: VmCmd,
}

/// How guests are made.
#[derive(Args, Clone, Debug)]
pub struct GuestArgs {
    /// Number of guests (default 2; with guests up, `vm run` uses all of them, or the first N).
    #[arg(long)]
    vms: Option<usize>,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 1)]
    vcpus: usize,
    /// Memory per guest (bytes, with K/M/G suffixes).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    mem: u64,
    /// Guests per host group: the guests of a group share one ivshmem region (0: all guests in one).
    #[arg(long, default_value_t = 0)]
    vms_per_group: usize,
    /// Size of each group's ivshmem region (a power of two).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    ivshmem_size: u64,
    /// No ivshmem device: guests share nothing and talk TCP.
    #[arg(long)]
    no_ivshmem: bool,
    /// Doorbells: a rank asleep in one guest is woken by an interrupt its peer in another raises (each
    /// group gets an ivshmem server; each guest an ivshmem-doorbell device and an emulated IOMMU for VFIO).
    #[arg(long, conflicts_with = "no_ivshmem")]
    doorbell: bool,
    /// Guests QEMU can live-migrate (`vm migrate`): they mount none of the host's files (their root is
    /// their initramfs; each job's program and libraries are copied in, and files a job writes stay
    /// in the guest).
    #[arg(long, conflicts_with = "doorbell")]
    migratable: bool,
    /// Seconds a guest may take to boot to its agent.
    #[arg(long, default_value_t = 120)]
    boot_timeout: u64,
}

impl GuestArgs {
    fn options(&self, persistent: bool) -> ClusterOptions {
        ClusterOptions {
            vms: self.vms.unwrap_or(2),
            vcpus: self.vcpus,
            mem_mb: self.mem >> 20,
            vms_per_group: self.vms_per_group,
            ivshmem: !self.no_ivshmem,
            ivshmem_size: self.ivshmem_size,
            doorbell: self.doorbell,
            boot_timeout: Duration::from_secs(self.boot_timeout),
            persistent,
            migratable: self.migratable,
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (
            &t[..i],
            match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("{s:?}: unknown suffix {c:?} (K, M or G)")),
            },
        ),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 512M)"))
}

#[derive(Subcommand)]
enum VmCmd {
    /// Boot guests (or use those `vm up` started) and run a job across them; exits with its status.
    Run {
        #[command(flatten)]
        guests: GuestArgs,
        /// Number of ranks.
        #[arg(short = 'n', long = "np")]
        np: usize,
        /// Ranks per guest (default: spread evenly, in blocks).
        #[arg(long, default_value_t = 0)]
        ranks_per_vm: usize,
        /// Prefix each output line with `[rank] `.
        #[arg(long)]
        tag_output: bool,
        /// No progress lines on stderr.
        #[arg(long)]
        quiet: bool,
        /// Program and arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Boot guests that stay up for later `vm run`s.
    Up {
        #[command(flatten)]
        guests: GuestArgs,
    },
    /// List the guests that are up.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Power the guests off and remove their network and files.
    Down,
    /// Take a guest out of its host group (before it migrates): its ranks move off the ivshmem region
    /// to TCP, then the device is hot-unplugged.
    Unplug {
        /// The guest (vm0, vm1, ...).
        vm: String,
    },
    /// Give a guest its ivshmem device back; its ranks return to shared memory.
    Plug {
        /// The guest.
        vm: String,
    },
    /// Live-migrate a guest (booted `--migratable`) to a second QEMU process, which stands in for
    /// another host, while its job runs: it leaves its host group first (as `unplug`), then QEMU sends
    /// its state over and the old process quits.
    Migrate {
        /// The guest.
        vm: String,
    },
    /// Run a command in a guest through its agent, as rsh would (for launchers inside the guests, e.g.
    /// Open MPI's `--mca plm_rsh_agent "vmfabric vm rsh"`).
    Rsh {
        /// The guest: its address or vmN.
        host: String,
        /// The command.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// A host group's ivshmem server (started by the guests' boot with --doorbell).
    #[command(hide = true)]
    IvshmemServer {
        #[arg(long)]
        socket: std::path::PathBuf,
        #[arg(long, default_value_t = vmf_vm::qemu::DOORBELL_VECTORS)]
        vectors: u16,
    },
    /// The guest agent (PID 1 of a guest; started by its /init).
    #[command(hide = true)]
    Agent {
        #[arg(long, default_value_t = vmf_vm::proto::AGENT_PORT)]
        port: u16,
        #[arg(long, default_value = "guest")]
        name: String,
        #[arg(long)]
        migratable: bool,
    },
}

fn fail(e: impl std::fmt::Display) -> i32 {
    eprintln!("vmfabric vm: {e}");
    2
}

fn describe(c: &Cluster) -> String {
    let boots: Vec<String> = c.guests.iter().map(|g| format!("{:.1}", g.boot_s)).collect();
    format!(
        "{} guests ({}: {}), booted in {} s",
        c.guests.len(),
        c.accel.name(),
        c.accel_why,
        boots.join("/")
    )
}

pub fn run(a: VmArgs) -> i32 {
    match a.cmd {
        VmCmd::IvshmemServer { socket, vectors } => match vmf_vm::ivserver::serve(&socket, vectors) {
            Ok(()) => 0,
            Err(e) => fail(e),
        },
        VmCmd::Agent { port, name, migratable } => match vmf_vm::agent::run(port, &name, migratable) {
            Ok(()) => 0,
            Err(e) => fail(e),
        },
        VmCmd::Run { guests, np, ranks_per_vm, tag_output, quiet, command } => {
            let _signals = vmf_launch::signals::Guard::install();
            let cluster = match Cluster::attach() {
                Ok(mut c) => {
                    let want = guests.vms.unwrap_or(c.guests.len());
                    if want > c.guests.len() || want == 0 {
                        return fail(format!(
                            "--vms {want} but {} guests are up (vmfabric vm down, then run again to boot them)",
                            c.guests.len()
                        ));
                    }
                    c.guests.truncate(want);
                    c
                }
                Err(_) => match Cluster::boot(&guests.options(false)) {
                    Ok(c) => c,
                    Err(e) => return fail(e),
                },
            };
            if !quiet {
                eprintln!("vmfabric: vm: {}", describe(&cluster));
            }
            let o = JobOptions { np, ranks_per_vm, argv: command, tag_output, quiet };
            let code = match vmf_vm::job::run(&cluster, &o) {
                Ok(c) => c,
                Err(e) => fail(e),
            };
            drop(cluster);
            code
        }
        VmCmd::Up { guests } => match Cluster::boot(&guests.options(true)) {
            Ok(c) => {
                println!("vm up: {}", describe(&c));
                for g in &c.guests {
                    println!("  {} {} (QEMU pid {})", g.name, g.ip, g.pid);
                }
                0
            }
            Err(e) => fail(e),
        },
        VmCmd::Ls { json } => match Cluster::attach() {
            Ok(c) => {
                let rows: Vec<serde_json::Value> = c
                    .guests
                    .iter()
                    .map(|g| {
                        let info = vmf_vm::cluster::request(
                            &g.ip,
                            &serde_json::json!({"cmd": "info"}),
                            Duration::from_secs(2),
                        )
                        .unwrap_or(serde_json::Value::Null);
                        serde_json::json!({
                            "name": g.name, "ip": g.ip, "pid": g.pid, "group": g.group,
                            "vcpus": g.vcpus, "mem_mb": g.mem_mb, "boot_s": g.boot_s,
                            "accel": c.accel.name(), "agent": info,
                        })
                    })
                    .collect();
                if json {
                    println!("{}", serde_json::json!({"guests": rows}));
                } else {
                    println!("{:<6} {:<12} {:>8} {:>5} {:>5} {:>7} {:>6} {:<5} ivshmem", "NAME", "IP", "PID", "GROUP", "VCPUS", "MEM", "BOOT", "ACCEL");
                    for r in &rows {
                        let dev = r["agent"]["ivshmem"]
                            .as_array()
                            .and_then(|a| a.first())
                            .map_or("-".to_string(), |d| {
                                format!("{} ({} MiB)", d["address"].as_str().unwrap_or("?"), d["size"].as_u64().unwrap_or(0) >> 20)
                            });
                        println!(
                            "{:<6} {:<12} {:>8} {:>5} {:>5} {:>6}M {:>5.1}s {:<5} {}{}",
                            r["name"].as_str().unwrap_or(""),
                            r["ip"].as_str().unwrap_or(""),
                            r["pid"].to_string(),
                            r["group"].as_u64().map_or("-".into(), |g| g.to_string()),
                            r["vcpus"].to_string(),
                            r["mem_mb"].to_string(),
                            r["boot_s"].as_f64().unwrap_or(0.0),
                            r["accel"].as_str().unwrap_or(""),
                            dev,
                            if r["agent"].is_null() { " (agent not answering)" } else { "" }
                        );
                    }
                }
                0
            }
            Err(e) => {
                if json {
                    println!("{}", serde_json::json!({"guests": []}));
                } else {
                    println!("{e}");
                }
                0
            }
        },
        VmCmd::Rsh { host, command } => match vmf_vm::job::rsh(&host, &command) {
            Ok(c) => c,
            Err(e) => fail(e),
        },
        VmCmd::Unplug { vm } => plug(&vm, false),
        VmCmd::Plug { vm } => plug(&vm, true),
        VmCmd::Migrate { vm } => {
            let mut c = match Cluster::attach() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            match c.migrate(&vm) {
                Ok(r) => {
                    let off = r.unplug.as_ref().map_or(String::new(), |(ranks, move_ms, dev_ms)| {
                        let answers: Vec<String> = ranks
                            .as_array()
                            .map(|a| a.iter().map(|r| format!("rank {}: {}", r["rank"], r["answer"].as_str().unwrap_or(""))).collect())
                            .unwrap_or_default();
                        format!("ranks off the region in {move_ms:.1} ms ({}), device removed after {dev_ms:.1} ms; ", answers.join("; "))
                    });
                    println!(
                        "vm migrate {vm}: {off}destination up in {:.0} ms; migrated in {:.0} ms (downtime {:.0} ms, {:.1} MiB sent); QEMU pid {} -> {}; {:.0} ms in all",
                        r.setup_ms, r.migrate_ms, r.downtime_ms, r.transferred_mib, r.old_pid, r.new_pid, r.total_ms
                    );
                    0
                }
                Err(e) => fail(e),
            }
        }
        VmCmd::Down => {
            match Cluster::attach() {
                Ok(mut c) => {
                    let n = c.guests.len();
                    c.teardown();
                    println!("vm down: {n} guests stopped");
                }
                Err(_) => {
                    Cluster::clean_leftovers();
                    println!("vm down: no guests were up");
                }
            }
            0
        }
    }
}

fn plug(vm: &str, add: bool) -> i32 {
    let c = match Cluster::attach() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let r = if add { c.plug(vm) } else { c.unplug(vm) };
    match r {
        Ok((ranks, move_ms, dev_ms)) => {
            let answers: Vec<String> = ranks
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|r| format!("rank {}: {}", r["rank"], r["answer"].as_str().unwrap_or("")))
                        .collect()
                })
                .unwrap_or_default();
            if add {
                println!(
                    "vm plug {vm}: device seen after {dev_ms:.1} ms; ranks back on the region in {move_ms:.1} ms ({})",
                    answers.join("; ")
                );
            } else {
                println!(
                    "vm unplug {vm}: ranks off the region in {move_ms:.1} ms ({}); device removed after {dev_ms:.1} ms",
                    answers.join("; ")
                );
            }
            0
        }
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
    }
}
