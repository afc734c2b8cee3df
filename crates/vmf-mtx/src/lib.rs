//! Minitransactions and barriers on shared memory (issue 25; the reference is Ke 2011, chapter 3, and the
//! Sinfonia paper it builds on).
//!
//! A [`Store`] is a file (normally under `/dev/shm`, or an ivshmem BAR) holding `nodes` memory nodes of
//! `node_bytes` each, a lock word per stripe of every node, and a table of participant slots. Processes
//! attach to it and leave independently; it outlives them (`vmfabric mtx create PATH`).
//!
//! A [`Mtx`] holds compare items (bytes that must equal given bytes), read items (bytes returned by the
//! commit) and write items (applied only if every compare holds), over any number of memory nodes of the
//! store. [`Mtx::commit`] locks every stripe the items touch in one global order (so blocking commits
//! never deadlock), copies the reads out, evaluates the compares, and applies the writes through a redo log
//! in the committer's slot. The commit is done by the caller with atomics: no message is exchanged.
//!
//! **Crash safety.** A process killed at any point of a commit leaves every node consistent: before its
//! writes touch a node they are in its slot's log and the slot says COMMITTING, so whoever finds the dead
//! process holding a lock (a later commit, or a process attaching) replays the log — the writes are then
//! applied entirely — or, if the slot had not reached COMMITTING, applies none; either way it releases the
//! dead process's locks. Death is exact within one kernel (pid and start time); a holder in another kernel
//! (a VM sharing an ivshmem BAR) is presumed dead when its lease — renewed at every commit — is older than
//! [`StoreOptions::lease`].
//!
//! **Validation.** The header is checked on open; a lock word naming no slot, a slot's lock list or log
//! naming bytes outside the store are [`Error::Corrupt`], never an out-of-bounds access or a hang.
//!
//! **Barriers and condition variables** ([`Barrier`], [`Cond`] with its mutex) live in small files of their
//! own, with a participant table whose liveness waiters check; they spin, block or adapt ([`WaitKind`]).
//!
//! **Progress.** [`Mode::Try`] fails with [`Outcome::LockFailed`] on the first held lock (002_*'s
//! non-blocking minitransactions). [`Mode::Blocking`] waits for held locks (spinning, then yielding) in
//! lock order; a commit that has waited longer than [`STARVE_AFTER`] raises the store's turnstile, and new
//! commits wait for it to fall before taking any lock, so no commit starves forever.
mod barrier;
mod cond;
pub mod dist;
mod shared;
mod store;

pub use barrier::{Barrier, BarrierKind};
pub use cond::{Cond, CondKind};
pub use dist::{DistMtx, DistStore, GroupInfo, StoreService};
pub use shared::{WaitKind, MAX_PARTICIPANTS};
pub use store::{Mode, Mtx, Outcome, Store, StoreOptions, STARVE_AFTER};

use thiserror::Error;

/// Errors of the store, minitransactions and barriers.
#[derive(Debug, Error)]
pub enum Error {
    /// An argument is out of range (node, offset, length, sizes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The store file could not be created, opened or mapped.
    #[error("unable to use store {path}: {why}")]
    Io {
        /// Path of the store.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// Shared state that no correct participant writes (bad header, lock word, lock list or log).
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    /// No free participant slot (all held by live processes).
    #[error("no free participant slot in the store ({0} slots, all held by live processes)")]
    NoSlot(usize),
    /// A minitransaction touches more stripes or writes more bytes than one commit can hold.
    #[error("the minitransaction is too large: {0}")]
    TooLarge(String),
    /// A memory node on another host could not be reached, or its host answered wrongly.
    #[error("a remote memory node failed: {0}")]
    Remote(String),
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;
