//! `vmfabric mtx`: persistent minitransaction stores that processes (and VMs) attach to and leave
//! independently (`vmf_store_open` in C, `vmf_mtx::Store::open` in Rust).
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use vmf_mtx::{Store, StoreOptions};

#[derive(Args)]
pub struct MtxArgs {
    #[command(subcommand)]
    cmd: MtxCmd,
}

#[derive(Subcommand)]
enum MtxCmd {
    /// Create a store file at PATH (it must not exist), e.g. under /dev/shm or on an ivshmem BAR's file.
    Create {
        path: PathBuf,
        /// Memory nodes.
        #[arg(long)]
        nodes: usize,
        /// Bytes per memory node.
        #[arg(long)]
        bytes: usize,
        /// Lock granularity in bytes (a power of two, 8..=4096).
        #[arg(long, default_value_t = 64)]
        stripe: usize,
        /// Participant slots (processes attached at once).
        #[arg(long, default_value_t = 64)]
        slots: usize,
        /// Lease of a lock holder in another kernel, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        lease_ms: u64,
    },
    /// Show a store's shape, and recover the slots of participants that died (finishing or undoing
    /// their commits, releasing their locks).
    Check { path: PathBuf },
}

/// `vmfabric: store PATH: N nodes of B bytes, S-byte stripes` (what create and check both print first).
fn describe(path: &std::path::Path, s: &Store) -> String {
    format!(
        "vmfabric: store {}: {} nodes of {} bytes, {}-byte stripes",
        path.display(),
        s.nodes(),
        s.node_bytes(),
        s.stripe()
    )
}

pub fn run(a: MtxArgs) -> i32 {
    match a.cmd {
        MtxCmd::Create { path, nodes, bytes, stripe, slots, lease_ms } => {
            let o = StoreOptions { stripe, slots, lease: Duration::from_millis(lease_ms) };
            match Store::create(&path, nodes, bytes, &o) {
                Ok(s) => {
                    println!("{}, {slots} slots", describe(&path, &s));
                    0
                }
                Err(e) => {
                    eprintln!("vmfabric: {e}");
                    2
                }
            }
        }
        MtxCmd::Check { path } => match Store::open(&path).and_then(|s| s.recover_dead().map(|n| (s, n))) {
            Ok((s, n)) => {
                println!("{}; {n} dead participant(s) recovered", describe(&path, &s));
                0
            }
            Err(e) => {
                eprintln!("vmfabric: {e}");
                2
            }
        },
    }
}
