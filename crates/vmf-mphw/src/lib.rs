//! Emulated message-passing hardware (003_*, Rebel 2009) on vmfabric's building blocks: a layer beside the
//! transports.
//!
//! - [`hw`]: the hardware. N nodes share a region (a file under `/dev/shm`, or an ivshmem-style shared
//!   file); node i owns N-1 receive buffers, one per sender and written only by it, each with a status
//!   word; a node signals another through a futex doorbell. Emulated per-signal, per-byte and per-hop
//!   costs; links declared broken; bidirectional or unidirectional status words.
//! - [`nic`]: 003_*'s `sm_nic` packet engine over it — TxFIFOs, retries, extra signals, Valiant
//!   load-balanced routing through evade nodes — which the vnic (IP over the hardware) and the `mphw`
//!   transport drive.
//! - [`counters`]: the 25 performance values of 003_*'s Figure 32, live in the region.
pub mod counters;
pub mod hw;
pub mod nic;
#[cfg(test)]
mod nic_tests;

pub use counters::{Snapshot, EXTRA_NAMES, NAMES};
pub use hw::{Hw, HwConfig, HwError, Link, Mode, Port, Topology};
pub use nic::{Nic, NicOptions, Sent, HEADER};
