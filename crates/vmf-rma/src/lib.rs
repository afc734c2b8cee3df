//! vmfabric one-sided communication (a layer above the core): windows of memory that every member of a
//! job exposes, and put, get, accumulate, get-accumulate, fetch-and-op and compare-and-swap on them, with
//! local and remote completion and passive-target locks, none of which needs the target to call the
//! library.
//!
//! - [`window`]: where a window's memory lives and how each origin reaches it (loads and stores on shared
//!   memory, single copy, or the target's agent over TCP), and the operations.
//! - [`agent`]: the per-process thread that serves operations arriving over TCP (a truly passive target).
//! - [`exec`]: the code every path runs on the target memory, so results agree whoever computes them.
//! - [`reduce`]: the reduction kernels (also the MPI library's, for its collectives).
//! - [`ctl`], [`attach`], [`layout`], [`wire`], [`alloc`]: control blocks (locks), the memory attached to
//!   dynamic windows, target layouts, the agent protocol, and shareable allocations for `MPI_Alloc_mem`.
//!
//! # Examples
//! Run as `vmfabric run -n 2 ./prog`; each rank adds 1 to a counter on rank 0, then rank 0 reads it:
//! ```no_run
//! use vmf_core::Fabric;
//! use vmf_rma::Win;
//! let f = Fabric::init()?;
//! let mut w = Win::allocate(&f, 64)?;
//! w.fence()?;
//! let old = w.fetch_add_u64(0, 0, 1)?;
//! w.fence()?;
//! if f.rank() == 0 {
//!     let mut b = [0u8; 8];
//!     w.get(0, 0, &mut b)?;
//!     assert_eq!(u64::from_ne_bytes(b), f.size() as u64);
//! }
//! # let _ = old;
//! drop(w);
//! f.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod agent;
pub mod alloc;
pub mod attach;
mod conn;
pub mod ctl;
pub mod exec;
pub mod layout;
pub mod ldouble;
mod native;
pub mod reduce;
pub mod service;
mod sock;
pub mod window;
pub mod wire;

pub use exec::Status;
pub use layout::{Layout, Run};
pub use native::Win;
pub use reduce::{Elem, ROp};
pub use window::{Done, Flavor, RmaCtx, WinSpec, Window};

use thiserror::Error;

/// Errors of one-sided operations, each naming the member concerned.
#[derive(Debug, Clone, Error)]
pub enum RmaError {
    /// The operation reaches outside the target's window.
    #[error("Unable to access member {target}'s window at bytes {lo}..{hi} since its window has {size} bytes")]
    Range {
        /// Member index.
        target: usize,
        /// First byte (relative to the window).
        lo: i128,
        /// One past the last byte.
        hi: i128,
        /// The window's size there.
        size: u64,
    },
    /// The operation reaches memory the member has not attached to its dynamic window.
    #[error("Unable to access member {target}'s dynamic window there since that memory is not attached to it")]
    NotAttached {
        /// Member index.
        target: usize,
    },
    /// A malformed operation.
    #[error("Unable to operate on member {target}'s window since {what}")]
    Bad {
        /// Member index.
        target: usize,
        /// What is wrong.
        what: String,
    },
    /// No path reaches the member.
    #[error("Unable to reach member {target}'s window since {why}")]
    Unreachable {
        /// Member index.
        target: usize,
        /// Why.
        why: String,
    },
    /// The member's agent reported a failure.
    #[error("Unable to complete an operation on member {target}'s window since its agent answered {status:?}")]
    Remote {
        /// Member index.
        target: usize,
        /// What the agent said.
        status: Status,
    },
    /// Creating the window failed.
    #[error("Unable to create the window since {0}")]
    Setup(String),
    /// A shared-memory window cannot be made.
    #[error("Unable to create a shared-memory window since {0}")]
    Shared(String),
    /// No memory for the window.
    #[error("Unable to allocate {0} bytes of window memory")]
    NoMem(usize),
    /// An operation that needs another flavor of window.
    #[error("Unable to do that on this window since {0}")]
    Flavor(String),
    /// Attaching or detaching memory failed.
    #[error("Unable to attach or detach since {0}")]
    Attach(String),
    /// The core reported an error (the exchanges of window creation, fences).
    #[error(transparent)]
    Core(#[from] vmf_core::Error),
}

/// Result of one-sided operations.
pub type Result<T> = std::result::Result<T, RmaError>;
