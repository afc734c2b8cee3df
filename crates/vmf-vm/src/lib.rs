//! vmfabric in real virtual machines (QEMU guests).
//!
//! `vmfabric vm run --vms V -n N PROG` boots V guests (KVM where it works, else TCG), each with Debian's
//! kernel, the host's root file system read-only over 9p (so the same vmfabric and MPI programs run
//! inside), the launching directory read-write, a virtio-net NIC on a host bridge (TCP between guests)
//! and an `ivshmem-plain` device backed by one host file per host group, whose BAR 2 the ranks find and
//! use as their shared region. A guest agent ([`agent`]) starts the ranks; the host side ([`job`]) serves
//! them PMI over TCP, prints their output and ends with the job's status.
//!
//! Layers: [`image`] (kernel + initramfs), [`qemu`] (command line, accelerator probe, QMP), [`net`]
//! (bridge and taps), [`cluster`] (a set of running guests: boot, attach, tear down), [`job`] (a job
//! across a cluster), [`agent`] (the guest side), [`proto`] (what host and agent say).
#![warn(missing_docs)]

pub mod agent;
pub mod bell;
pub mod cluster;
pub mod image;
pub mod ivserver;
pub mod job;
pub mod net;
pub mod proto;
pub mod qemu;

use thiserror::Error;

/// Why a VM command failed. Messages name the VM or rank concerned.
#[derive(Debug, Error)]
pub enum VmError {
    /// Something the host needs is missing or unusable (QEMU, kernel, busybox, /dev/kvm, root).
    #[error("{0}")]
    Setup(String),
    /// A guest did not boot.
    #[error("{0}")]
    Boot(String),
    /// Talking to a guest failed.
    #[error("{0}")]
    Io(String),
    /// A guest or the host said something malformed.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Bad user input (flags).
    #[error("{0}")]
    Usage(String),
}
